"""Local training: each client's own SGD on its own model, nothing shared."""

import numpy as np
import pytest
import tensorflow as tf

from tests import test_utils
from tests.algorithms import numpy_reference
from tests.algorithms.fedavg_test import batches_dataset, client_batches, run_next
from tff_personal.algorithms import common
from tff_personal.algorithms import local
from tff_personal.nfl import detector

LEARNING_RATE = 0.1


@pytest.fixture(scope='module')
def process():
  return local.build(
      test_utils.tiny_model_spec(), local.Hparams(),
      common.Common(client_learning_rate=LEARNING_RATE, seed=5),
  )


def personal(kernel_value, bias_value):
  return (
      np.full((2, 2), kernel_value, np.float32),
      np.full((2,), bias_value, np.float32),
  )


def as_model_weights(kernel, bias):
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top

  return tff.learning.models.ModelWeights(trainable=[kernel, bias], non_trainable=[])


def test_type_signature_keeps_the_model_at_clients(process):
  signature = process.next.type_signature
  personal_type = '{<trainable=<float32[2,2],float32[2]>,non_trainable=<>>}@CLIENTS'
  assert str(signature.parameter[2]) == personal_type
  assert str(signature.result[1]) == personal_type
  assert process.has_personal_state


def test_each_client_runs_sgd_on_its_own_model(process):
  state = process.initialize()
  starts = [personal(0.5, -0.1), personal(-0.3, 0.2)]
  clients = [client_batches(1, [3, 2]), client_batches(2, [4])]
  output = run_next(process,
      state,
      [batches_dataset(b) for b in clients],
      [as_model_weights(*s) for s in starts],
  )
  for start, batches, new_state in zip(starts, clients, output.personal_states):
    kernel, bias = numpy_reference.sgd(*start, batches, LEARNING_RATE)
    np.testing.assert_allclose(new_state.trainable[0], kernel, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(new_state.trainable[1], bias, rtol=1e-5, atol=1e-6)
  # The server keeps the initial model: nothing is aggregated into it.
  for before, after in zip(
      tf.nest.flatten(process.get_model_weights(state)),
      tf.nest.flatten(process.get_model_weights(output.state)),
  ):
    np.testing.assert_array_equal(before, after)
  assert output.metrics['client_work']['train']['num_examples'] == 9


def test_a_client_is_not_influenced_by_the_others(process):
  state = process.initialize()
  first = [personal(0.5, -0.1)], [client_batches(1, [3])]
  alone = run_next(process, state, [batches_dataset(first[1][0])], [as_model_weights(*first[0][0])])
  together = run_next(process,
      state,
      [batches_dataset(first[1][0]), batches_dataset(client_batches(9, [7]))],
      [as_model_weights(*first[0][0]), as_model_weights(*personal(3.0, 3.0))],
  )
  for a, b in zip(
      tf.nest.flatten(alone.personal_states[0]), tf.nest.flatten(together.personal_states[0])
  ):
    np.testing.assert_array_equal(a, b)


def test_new_clients_start_from_the_initial_model(process):
  weights = process.get_model_weights(process.initialize())
  expected = test_utils.tiny_model_spec().initial_weights(5)
  start = process.initial_personal_state('anyone', weights)
  for e, a in zip(tf.nest.flatten(expected), tf.nest.flatten(start)):
    np.testing.assert_array_equal(e, a)


def test_evaluate_uses_each_clients_own_model(process):
  weights = process.get_model_weights(process.initialize())
  models = [personal(0.5, -0.1), personal(-0.3, 0.2)]
  clients = [client_batches(3, [6]), client_batches(4, [5])]
  results = process.evaluate(
      weights,
      [batches_dataset(b) for b in clients],
      [as_model_weights(*m) for m in models],
  )
  for (kernel, bias), ((x, y),), metrics in zip(models, clients, results):
    loss, _, _ = numpy_reference.loss_and_gradients(kernel, bias, x, y)
    np.testing.assert_allclose(metrics['loss'], loss, rtol=1e-5)
    assert metrics['num_examples'] == len(y)


def test_canary_personal_model_never_reaches_the_server(process):
  state = process.initialize()
  clients = [client_batches(1, [3]), client_batches(2, [4])]
  data = [batches_dataset(b) for b in clients] + [batches_dataset(client_batches(0, [1])).take(0)]
  normal = [as_model_weights(*personal(v, 0.0)) for v in (0.1, 0.2, 0.3)]
  canary = normal[:2] + [as_model_weights(*personal(1e30, -1e30))]
  without = run_next(process, state, data, normal)
  with_canary = run_next(process, state, data, canary)
  for a, b in zip(
      tf.nest.flatten([without.state, without.metrics]),
      tf.nest.flatten([with_canary.state, with_canary.metrics]),
  ):
    np.testing.assert_array_equal(a, b)
  np.testing.assert_array_equal(with_canary.personal_states[2].trainable[0], 1e30)


def test_finetuned_evaluation_starts_from_each_clients_own_model(process):
  weights = process.get_model_weights(process.initialize())
  models = [personal(0.5, -0.1), personal(-0.3, 0.2)]
  train = [client_batches(5, [4, 3]), client_batches(6, [5])]
  test = [client_batches(3, [6])[0], client_batches(4, [5])[0]]
  results = process.finetuned_evaluation(0.2)(
      weights,
      [{'train': batches_dataset(t), 'test': batches_dataset([x])} for t, x in zip(train, test)],
      [as_model_weights(*m) for m in models],
  )
  for model, batches, (x, y), metrics in zip(models, train, test, results):
    tuned = numpy_reference.sgd(*model, batches, 0.2)
    np.testing.assert_allclose(
        metrics['loss'], numpy_reference.loss_and_gradients(*tuned, x, y)[0], rtol=1e-5
    )
    np.testing.assert_allclose(
        metrics['before_finetune']['loss'],
        numpy_reference.loss_and_gradients(*model, x, y)[0],
        rtol=1e-5,
    )


def test_local_sends_no_update_and_its_clients_train_independently():
  process = local.build(
      test_utils.tiny_model_spec(), local.Hparams(),
      common.Common(client_learning_rate=LEARNING_RATE),
  )
  assert not process.sends_updates
  assert process.clients_train_independently  # Its rounds may run several a call.
  # With the NFL detector the server state changes every round.
  with_detector = local.build(
      test_utils.tiny_model_spec(), local.Hparams(),
      common.Common(client_learning_rate=LEARNING_RATE, nfl_detector=detector.DetectorConfig(1, 2, 0.0)),
  )
  assert not with_detector.clients_train_independently
