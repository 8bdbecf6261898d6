"""FedAvg: type signature, seeded initialization and exact one-round numbers."""

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tests import test_utils
from tests.algorithms import numpy_reference
from tff_personal.algorithms import common
from tff_personal.algorithms import fedavg
from tff_personal.personal import process as process_lib

LEARNING_RATE = 0.1


def batches_dataset(batches):
  """A dataset yielding exactly `batches` (lists of (x, y))."""
  datasets = [tf.data.Dataset.from_tensors(batch) for batch in batches]
  dataset = datasets[0]
  for other in datasets[1:]:
    dataset = dataset.concatenate(other)
  return dataset


def run_next(process, state, datasets, personal_states):
  """`process.next` with each dataset as the client's (honest) input."""
  return process.next(
      state, [process.client_input(d) for d in datasets], personal_states
  )


def client_batches(seed, sizes):
  rng = np.random.default_rng(seed)
  return [
      (rng.normal(size=(n, 2)).astype(np.float32), rng.integers(0, 2, n).astype(np.int32))
      for n in sizes
  ]


@pytest.fixture(scope='module')
def process():
  return fedavg.build(
      test_utils.tiny_model_spec(), fedavg.Hparams(),
      common.Common(client_learning_rate=LEARNING_RATE, seed=11),
  )


def test_type_signature(process):
  signature = process.next.type_signature
  assert str(signature.parameter[1]) == (
      '{<data=<float32[?,2],int32[?]>*,role=int32,seed=int64>}@CLIENTS'
  )
  assert str(signature.parameter[2]) == '{<>}@CLIENTS'
  assert str(signature.result[1]) == '{<>}@CLIENTS'
  assert signature.result[0].placement is tff.SERVER
  assert not process.has_personal_state


def test_initialize_uses_the_seeded_weights(process):
  expected = test_utils.tiny_model_spec().initial_weights(11)
  weights = process.get_model_weights(process.initialize())
  for e, a in zip(tf.nest.flatten(expected), tf.nest.flatten(weights)):
    np.testing.assert_array_equal(e, a)
  other = fedavg.build(
      test_utils.tiny_model_spec(), fedavg.Hparams(),
      common.Common(client_learning_rate=0.1, seed=12),
  )
  assert not np.array_equal(
      weights.trainable[0], other.get_model_weights(other.initialize()).trainable[0]
  )


def test_one_round_is_the_example_weighted_mean_of_client_sgd(process):
  state = process.initialize()
  kernel, bias = process.get_model_weights(state).trainable
  clients = [client_batches(1, [3, 2]), client_batches(2, [4])]  # 5 and 4 examples.

  output = run_next(process,
      state, [batches_dataset(b) for b in clients], process_lib.empty_personal_states(2)
  )

  trained = [numpy_reference.sgd(kernel, bias, b, LEARNING_RATE) for b in clients]
  expected_kernel = (5 * trained[0][0] + 4 * trained[1][0]) / 9
  expected_bias = (5 * trained[0][1] + 4 * trained[1][1]) / 9
  new_kernel, new_bias = process.get_model_weights(output.state).trainable
  np.testing.assert_allclose(new_kernel, expected_kernel, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(new_bias, expected_bias, rtol=1e-5, atol=1e-6)
  train = output.metrics['client_work']['train']
  assert train['num_examples'] == 9
  assert train['num_batches'] == 3
  assert len(output.personal_states) == 2
  assert all(not s for s in output.personal_states)  # FedAvg keeps nothing.


def test_evaluate_gives_each_client_the_global_model_metrics(process):
  state = process.initialize()
  weights = process.get_model_weights(state)
  kernel, bias = weights.trainable
  clients = [client_batches(3, [6]), client_batches(4, [5])]
  results = process.evaluate(
      weights, [batches_dataset(b) for b in clients], process_lib.empty_personal_states(2)
  )
  for (x, y), metrics in zip([b[0] for b in clients], results):
    loss, _, _ = numpy_reference.loss_and_gradients(kernel, bias, x, y)
    assert metrics['num_examples'] == len(y)
    np.testing.assert_allclose(metrics['loss'], loss, rtol=1e-5)
    np.testing.assert_allclose(
        metrics['sparse_categorical_accuracy'],
        numpy_reference.accuracy(kernel, bias, x, y),
    )


def assert_same_as_tff_for_three_rounds(process, tff_process):
  """Both processes from the same weights, over the same 3 rounds: bit-equal weights."""
  ours = process.initialize()
  theirs = tff_process.set_model_weights(
      tff_process.initialize(), process.get_model_weights(ours)
  )
  for round_num in range(3):
    data = [batches_dataset(client_batches(10 * round_num + i, [4, 3])) for i in range(3)]
    ours = run_next(process, ours, data, process_lib.empty_personal_states(3)).state
    theirs = tff_process.next(theirs, data).state
    for a, b in zip(
        tf.nest.flatten(process.get_model_weights(ours)),
        tf.nest.flatten(tff_process.get_model_weights(theirs)),
    ):
      np.testing.assert_array_equal(a, b)


def test_equals_tffs_build_weighted_fed_avg_for_three_rounds(process):
  assert_same_as_tff_for_three_rounds(process, tff.learning.algorithms.build_weighted_fed_avg(
      test_utils.tiny_model_spec().tff_model_fn,
      client_optimizer_fn=tff.learning.optimizers.build_sgdm(LEARNING_RATE),
      server_optimizer_fn=tff.learning.optimizers.build_sgdm(1.0),
  ))


def test_model_replacement_client_sends_its_boosted_update():
  process = fedavg.build(
      test_utils.tiny_model_spec(), fedavg.Hparams(),
      common.Common(client_learning_rate=LEARNING_RATE, seed=11, attack_boost=5.0),
  )
  state = process.initialize()
  kernel, bias = process.get_model_weights(state).trainable
  clients = [client_batches(1, [3, 2]), client_batches(2, [4])]  # 5 and 4 examples.
  inputs = [
      process.client_input(batches_dataset(clients[0])),
      process.client_input(batches_dataset(clients[1]), role=2, seed=1),  # A3.
  ]
  output = process.next(state, inputs, process_lib.empty_personal_states(2))
  trained = [numpy_reference.sgd(kernel, bias, b, LEARNING_RATE) for b in clients]
  # Deltas w - w_k; the attacker's is boosted 5x, weights stay 5 and 4.
  delta_kernel = (5 * (kernel - trained[0][0]) + 4 * 5.0 * (kernel - trained[1][0])) / 9
  np.testing.assert_allclose(
      process.get_model_weights(output.state).trainable[0], kernel - delta_kernel,
      rtol=1e-5, atol=1e-5,
  )


def test_finetuned_evaluation_trains_each_client_copy_then_evaluates(process):
  evaluate = process.finetuned_evaluation(0.5)
  assert str(evaluate.type_signature.parameter[1]) == (
      '{<train=<float32[?,2],int32[?]>*,test=<float32[?,2],int32[?]>*>}@CLIENTS'
  )
  state = process.initialize()
  weights = process.get_model_weights(state)
  kernel, bias = weights.trainable
  train = [client_batches(5, [4, 3]), client_batches(6, [5])]
  test = [client_batches(7, [6])[0], client_batches(8, [5])[0]]
  client_data = [
      {'train': batches_dataset(t), 'test': batches_dataset([x])} for t, x in zip(train, test)
  ]
  results = evaluate(weights, client_data, process_lib.empty_personal_states(2))
  for batches, (x, y), metrics in zip(train, test, results):
    tuned_kernel, tuned_bias = numpy_reference.sgd(kernel, bias, batches, 0.5)
    tuned_loss, _, _ = numpy_reference.loss_and_gradients(tuned_kernel, tuned_bias, x, y)
    loss, _, _ = numpy_reference.loss_and_gradients(kernel, bias, x, y)
    np.testing.assert_allclose(metrics['loss'], tuned_loss, rtol=1e-5)
    np.testing.assert_allclose(
        metrics['sparse_categorical_accuracy'],
        numpy_reference.accuracy(tuned_kernel, tuned_bias, x, y),
    )
    np.testing.assert_allclose(metrics['before_finetune']['loss'], loss, rtol=1e-5)
    assert metrics['num_examples'] == metrics['before_finetune']['num_examples'] == len(y)
    assert not np.isclose(tuned_loss, loss)
  # Fine-tuning changes no state: the global model is what it was.
  for a, b in zip(tf.nest.flatten(weights), tf.nest.flatten(process.get_model_weights(state))):
    np.testing.assert_array_equal(a, b)
