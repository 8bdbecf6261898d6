"""FedPer: signatures, privacy canary, exact one-round numbers, reduction to FedAvg."""

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tests import test_utils
from tests.algorithms import numpy_reference
from tests.algorithms.fedavg_test import batches_dataset, client_batches, run_next
from tff_personal.algorithms import common
from tff_personal.algorithms import fedavg
from tff_personal.algorithms import fedper
from tff_personal.personal import process as process_lib

LEARNING_RATE = 0.1
MODEL = test_utils.tiny_model_spec(hidden=3)  # Blocks: [hidden], [logits].
ModelWeights = tff.learning.models.ModelWeights


@pytest.fixture(scope='module')
def process():
  return fedper.build(
      MODEL, fedper.Hparams(personal_layers=1),
      common.Common(client_learning_rate=LEARNING_RATE, seed=4),
  )


def personal(kernel_value, bias_value):
  return ModelWeights(
      trainable=[np.full((3, 2), kernel_value, np.float32), np.full((2,), bias_value, np.float32)],
      non_trainable=[],
  )


def empty_dataset():
  return batches_dataset(client_batches(0, [1])).take(0)


def contains_shape(type_spec, shape):
  return tff.types.contains(
      type_spec, lambda t: isinstance(t, tff.TensorType) and tuple(t.shape) == shape
  )


def test_personal_layers_only_at_clients(process):
  signature = process.next.type_signature
  personal_type = '{<trainable=<float32[3,2],float32[2]>,non_trainable=<>>}@CLIENTS'
  assert str(signature.parameter[2]) == personal_type
  assert str(signature.result[1]) == personal_type
  # The classifier's kernel [3, 2] is nowhere in the server state, the
  # metrics, or the shared weights that clients send and the server averages.
  for server_part in (signature.parameter[0], signature.result[0], signature.result[2]):
    assert server_part.placement is tff.SERVER
    assert not contains_shape(server_part, (3, 2))
  assert contains_shape(signature.result[0], (2, 3))  # The base is shared.
  assert str(process.get_model_weights.type_signature.result) == (
      '<trainable=<float32[2,3],float32[3]>,non_trainable=<>>'
  )


def test_canary_personal_weights_never_reach_the_server(process):
  state = process.initialize()
  clients = [client_batches(1, [3, 2]), client_batches(2, [4])]
  data = [batches_dataset(b) for b in clients] + [empty_dataset()]
  normal = [personal(0.1, 0.0), personal(-0.2, 0.1), personal(0.3, 0.3)]
  canary = normal[:2] + [personal(1e30, -1e30)]

  without = run_next(process, state, data, normal)
  with_canary = run_next(process, state, data, canary)
  for a, b in zip(tf.nest.flatten(without.state), tf.nest.flatten(with_canary.state)):
    np.testing.assert_array_equal(a, b)
  for a, b in zip(tf.nest.flatten(without.metrics), tf.nest.flatten(with_canary.metrics)):
    np.testing.assert_array_equal(a, b)
  # The canary's personal layers came back to it untouched.
  np.testing.assert_array_equal(with_canary.personal_states[2].trainable[0], 1e30)


@pytest.mark.parametrize('finetune_passes', [0, 1])
def test_one_round_exact_numbers(finetune_passes):
  process = fedper.build(
      MODEL, fedper.Hparams(personal_layers=1, finetune_epochs=finetune_passes),
      common.Common(client_learning_rate=LEARNING_RATE, seed=4),
  )
  state = process.initialize()
  w1, b1 = process.get_model_weights(state).trainable
  starts = [personal(0.1, 0.0), personal(-0.2, 0.1)]
  clients = [client_batches(1, [3, 2]), client_batches(2, [4])]  # 5 and 4 examples.
  output = run_next(process, state, [batches_dataset(b) for b in clients], starts)

  trained = []
  for start, batches in zip(starts, clients):
    params = [w1, b1, *start.trainable]
    for _ in range(finetune_passes):  # Personal layers only, base frozen.
      params = numpy_reference.mlp_sgd(params, batches, LEARNING_RATE, trainable=(2, 3))
    trained.append(numpy_reference.mlp_sgd(params, batches, LEARNING_RATE))
  new_w1, new_b1 = process.get_model_weights(output.state).trainable
  np.testing.assert_allclose(new_w1, (5 * trained[0][0] + 4 * trained[1][0]) / 9, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(new_b1, (5 * trained[0][1] + 4 * trained[1][1]) / 9, rtol=1e-5, atol=1e-6)
  for expected, new_state in zip(trained, output.personal_states):
    np.testing.assert_allclose(new_state.trainable[0], expected[2], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(new_state.trainable[1], expected[3], rtol=1e-5, atol=1e-6)
  assert output.metrics['client_work']['train']['num_examples'] == 9
  assert output.metrics['non_finite_clients'] == 0


def test_evaluate_uses_the_shared_base_and_each_clients_layers(process):
  base_weights = process.get_model_weights(process.initialize())
  layers = [personal(0.5, -0.1), personal(-0.3, 0.2)]
  clients = [client_batches(3, [6]), client_batches(4, [5])]
  results = process.evaluate(base_weights, [batches_dataset(b) for b in clients], layers)
  for layer, ((x, y),), metrics in zip(layers, clients, results):
    loss, _ = numpy_reference.mlp_loss_and_gradients(
        [*base_weights.trainable, *layer.trainable], x, y
    )
    np.testing.assert_allclose(metrics['loss'], loss, rtol=1e-5)


def test_new_clients_get_seeded_fresh_personal_layers(process):
  base_weights = process.get_model_weights(process.initialize())
  a = process.initial_personal_state('a', base_weights)
  assert [w.shape for w in a.trainable] == [(3, 2), (2,)]
  np.testing.assert_array_equal(
      a.trainable[0], process.initial_personal_state('a', base_weights).trainable[0]
  )
  assert not np.array_equal(
      a.trainable[0], process.initial_personal_state('b', base_weights).trainable[0]
  )


def test_with_no_personal_layers_fedper_is_fedavg_for_three_rounds():
  fedper_process = fedper.build(
      MODEL, fedper.Hparams(personal_layers=0),
      common.Common(client_learning_rate=LEARNING_RATE, seed=6),
  )
  fedavg_process = fedavg.build(
      MODEL, fedavg.Hparams(),
      common.Common(client_learning_rate=LEARNING_RATE, seed=6),
  )
  assert not fedper_process.has_personal_state
  fedper_state, fedavg_state = fedper_process.initialize(), fedavg_process.initialize()
  empty = fedper_process.initial_personal_state('x', None)
  for round_num in range(3):
    data = [batches_dataset(client_batches(10 * round_num + i, [4, 3])) for i in range(3)]
    fedper_state = run_next(fedper_process, fedper_state, data, [empty] * 3).state
    fedavg_state = run_next(fedavg_process,
        fedavg_state, data, process_lib.empty_personal_states(3)
    ).state
    for a, b in zip(
        tf.nest.flatten(fedper_process.get_model_weights(fedper_state)),
        tf.nest.flatten(fedavg_process.get_model_weights(fedavg_state)),
    ):
      np.testing.assert_array_equal(a, b)


def test_non_finite_client_keeps_its_layers_and_is_counted(process):
  state = process.initialize()
  poisoned = batches_dataset([(np.full((2, 2), np.inf, np.float32), np.zeros(2, np.int32))])
  start = personal(0.1, 0.0)
  output = run_next(process, state, [poisoned], [start])
  assert output.metrics['non_finite_clients'] == 1
  np.testing.assert_array_equal(output.personal_states[0].trainable[0], start.trainable[0])


def test_dp_noise_reaches_the_base_only():
  """DP clips and noises the base update; personal layers take no noise."""
  from tff_personal.aggregators import dp  # pylint: disable=g-import-not-at-top

  def one_round(noise_multiplier):
    process = fedper.build(
        MODEL, fedper.Hparams(personal_layers=1),
        common.Common(
            client_learning_rate=LEARNING_RATE, seed=3,
            model_aggregator=dp.build_dp_aggregator(
                noise_multiplier=noise_multiplier, clients_per_round=2, clip_norm=0.5
            ),
        ),
    )
    state = process.initialize()
    data = [batches_dataset(client_batches(i, [4, 3])) for i in (1, 2)]
    start = [process.initial_personal_state(c, None) for c in ('a', 'b')]
    output = run_next(process, state, data, start)
    return process.get_model_weights(output.state), output.personal_states

  clean_base, clean_personal = one_round(0.0)
  noisy_base, noisy_personal = one_round(20.0)
  for a, b in zip(tf.nest.flatten(clean_personal), tf.nest.flatten(noisy_personal)):
    np.testing.assert_array_equal(a, b)
  assert not np.allclose(clean_base.trainable[0], noisy_base.trainable[0])
