"""APFL: exact local steps of w, v and alpha; the evaluated mixture; limits."""

import numpy as np
import pytest
import tensorflow_federated as tff

from tests import test_utils
from tests.algorithms import numpy_reference
from tests.algorithms.fedavg_test import batches_dataset, client_batches, run_next
from tff_personal.algorithms import apfl
from tff_personal.algorithms import common

LEARNING_RATE = 0.1
MODEL = test_utils.tiny_model_spec()  # Linear softmax: [kernel 2x2, bias 2].
ModelWeights = tff.learning.models.ModelWeights


def build(adaptive_alpha=True, alpha=0.4):
  return apfl.build(
      MODEL, apfl.Hparams(alpha=alpha, adaptive_alpha=adaptive_alpha, alpha_learning_rate=0.5),
      common.Common(client_learning_rate=LEARNING_RATE, seed=8),
  )


def personal(kernel_value, bias_value, alpha):
  return {
      'model': ModelWeights(
          trainable=[np.full((2, 2), kernel_value, np.float32),
                     np.full((2,), bias_value, np.float32)],
          non_trainable=[],
      ),
      'alpha': np.float32(alpha),
  }


def numpy_apfl(w, v, alpha, batches, adaptive):
  w = [p.astype(np.float64) for p in w]
  v = [p.astype(np.float64) for p in v]
  for x, y in batches:
    _, gw_k, gw_b = numpy_reference.loss_and_gradients(w[0], w[1], x, y)
    mixed = [alpha * p + (1 - alpha) * q for p, q in zip(v, w)]
    _, gm_k, gm_b = numpy_reference.loss_and_gradients(mixed[0], mixed[1], x, y)
    new_w = [w[0] - LEARNING_RATE * gw_k, w[1] - LEARNING_RATE * gw_b]
    new_v = [v[0] - LEARNING_RATE * alpha * gm_k, v[1] - LEARNING_RATE * alpha * gm_b]
    if adaptive:
      inner = np.sum((v[0] - w[0]) * gm_k) + np.sum((v[1] - w[1]) * gm_b)
      alpha = float(np.clip(alpha - 0.5 * inner, 0.0, 1.0))
    w, v = new_w, new_v
  return w, v, alpha


@pytest.mark.parametrize('adaptive', [True, False])
def test_one_round_exact_numbers(adaptive):
  process = build(adaptive_alpha=adaptive)
  state = process.initialize()
  w = process.get_model_weights(state).trainable
  start = personal(0.7, -0.4, 0.4)
  batches = client_batches(5, [3, 4])
  output = run_next(process, state, [batches_dataset(batches)], [start])
  expected_w, expected_v, expected_alpha = numpy_apfl(
      w, start['model'].trainable, 0.4, batches, adaptive
  )
  new = output.personal_states[0]
  for actual, expected in zip(new['model'].trainable, expected_v):
    np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=1e-6)
  assert new['alpha'] == pytest.approx(expected_alpha, rel=1e-5)
  if not adaptive:
    assert new['alpha'] == np.float32(0.4)
  else:
    assert new['alpha'] != np.float32(0.4)
  for actual, expected in zip(process.get_model_weights(output.state).trainable, expected_w):
    np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=1e-6)
  assert output.metrics['client_work']['train']['num_examples'] == 7


def test_personal_state_type_and_new_clients():
  process = build()
  assert str(process.personal_state_type.member) == (
      '<model=<trainable=<float32[2,2],float32[2]>,non_trainable=<>>,alpha=float32>'
  )
  weights = process.get_model_weights(process.initialize())
  new = process.initial_personal_state('new', weights)
  assert new['alpha'] == np.float32(0.4)
  np.testing.assert_array_equal(new['model'].trainable[0], weights.trainable[0])


def test_evaluate_uses_the_mixture_with_the_current_global_model():
  process = build()
  weights = process.get_model_weights(process.initialize())
  (x, y), = client_batches(9, [6])
  result, = process.evaluate(weights, [batches_dataset([(x, y)])], [personal(0.3, -0.3, 0.25)])
  kernel = 0.25 * np.full((2, 2), 0.3) + 0.75 * weights.trainable[0]
  bias = 0.25 * np.full((2,), -0.3) + 0.75 * weights.trainable[1]
  loss, _, _ = numpy_reference.loss_and_gradients(kernel, bias, x, y)
  np.testing.assert_allclose(result['loss'], loss, rtol=1e-5)


def test_bad_alpha():
  with pytest.raises(ValueError, match=r'alpha must be in \[0, 1\]'):
    build(alpha=1.5)
