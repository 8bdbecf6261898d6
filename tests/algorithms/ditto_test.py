"""Ditto: exact proximal steps, the lambda limits, the global model is FedAvg's."""

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tests import test_utils
from tests.algorithms import numpy_reference
from tests.algorithms.fedavg_test import batches_dataset, client_batches, run_next
from tff_personal.algorithms import ditto
from tff_personal.algorithms import fedavg
from tff_personal.personal import process as process_lib

LEARNING_RATE = 0.1
MODEL = test_utils.tiny_model_spec()  # Linear softmax: [kernel 2x2, bias 2].
ModelWeights = tff.learning.models.ModelWeights


def build(ditto_lambda, personal_steps=1, personal_learning_rate=0.05):
  return ditto.build_ditto(
      MODEL, ditto_lambda=ditto_lambda, client_learning_rate=LEARNING_RATE,
      personal_learning_rate=personal_learning_rate, personal_steps=personal_steps, seed=8,
  )


def personal(kernel_value, bias_value):
  return ModelWeights(
      trainable=[np.full((2, 2), kernel_value, np.float32), np.full((2,), bias_value, np.float32)],
      non_trainable=[],
  )


def numpy_proximal_steps(v, w, batches, learning_rate, ditto_lambda):
  v = [p.astype(np.float64) for p in v]
  for x, y in batches:
    _, d_kernel, d_bias = numpy_reference.loss_and_gradients(v[0], v[1], x, y)
    v = [p - learning_rate * (g + ditto_lambda * (p - c))
         for p, g, c in zip(v, (d_kernel, d_bias), w)]
  return v


@pytest.mark.parametrize('ditto_lambda', [0.0, 0.5, 3.0])
def test_one_round_exact_numbers(ditto_lambda):
  process = build(ditto_lambda, personal_steps=3)
  state = process.initialize()
  w = process.get_model_weights(state).trainable
  start = personal(0.4, -0.2)
  batches = client_batches(5, [2, 3])  # 3 steps: both batches, then the first again.
  output = run_next(process, state, [batches_dataset(batches)], [start])
  expected_v = numpy_proximal_steps(
      start.trainable, w, batches + batches[:1], 0.05, ditto_lambda
  )
  for actual, expected in zip(output.personal_states[0].trainable, expected_v):
    np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=1e-6)
  expected_w = numpy_reference.sgd(w[0], w[1], batches, LEARNING_RATE)
  for actual, expected in zip(process.get_model_weights(output.state).trainable, expected_w):
    np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=1e-6)


def test_zero_lambda_is_local_training_of_the_personal_model():
  process = build(0.0, personal_steps=2, personal_learning_rate=LEARNING_RATE)
  state = process.initialize()
  start = personal(0.4, -0.2)
  batches = client_batches(6, [3, 3])
  output = run_next(process, state, [batches_dataset(batches)], [start])
  kernel, bias = numpy_reference.sgd(*start.trainable, batches, LEARNING_RATE)
  np.testing.assert_allclose(output.personal_states[0].trainable[0], kernel, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(output.personal_states[0].trainable[1], bias, rtol=1e-5, atol=1e-6)


def test_large_lambda_holds_the_personal_model_at_the_global_model():
  distances = []
  for ditto_lambda in (0.0, 1.0, 1.0 / 0.05):  # eta_p * lambda = 1: v is reset to w each step.
    process = build(ditto_lambda, personal_steps=4)
    state = process.initialize()
    w = process.get_model_weights(state).trainable
    output = run_next(process,
        state, [batches_dataset(client_batches(7, [4, 4]))], [personal(2.0, 2.0)]
    )
    v = output.personal_states[0].trainable
    distances.append(np.sqrt(sum(np.sum((a - b) ** 2) for a, b in zip(v, w))))
  assert distances[0] > distances[1] > distances[2]
  # With eta_p * lambda = 1 a step gives v = w - eta_p * grad F(v): within
  # eta_p * |grad| (< 0.05 * 2 here, softmax gradients) of w.
  assert distances[2] < 0.1


def test_global_model_is_fedavgs():
  data = [batches_dataset(client_batches(i, [3, 2])) for i in range(3)]
  fedavg_process = fedavg.build_fedavg(MODEL, client_learning_rate=LEARNING_RATE, seed=8)
  ditto_process = build(0.5)
  fedavg_state = run_next(fedavg_process,
      fedavg_process.initialize(), data, process_lib.empty_personal_states(3)
  ).state
  ditto_state = run_next(ditto_process,
      ditto_process.initialize(), data, [personal(0.1 * i, 0.0) for i in range(3)]
  ).state
  for a, b in zip(
      tf.nest.flatten(fedavg_process.get_model_weights(fedavg_state)),
      tf.nest.flatten(ditto_process.get_model_weights(ditto_state)),
  ):
    np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


def test_new_clients_start_from_the_current_global_model():
  process = build(0.5)
  weights = process.get_model_weights(process.initialize())
  start = process.initial_personal_state('new', weights)
  for a, b in zip(tf.nest.flatten(start), tf.nest.flatten(weights)):
    np.testing.assert_array_equal(a, b)


def test_evaluate_uses_the_personal_model():
  process = build(0.5)
  weights = process.get_model_weights(process.initialize())
  (x, y), = client_batches(9, [6])
  result, = process.evaluate(weights, [batches_dataset([(x, y)])], [personal(0.3, -0.3)])
  loss, _, _ = numpy_reference.loss_and_gradients(
      np.full((2, 2), 0.3), np.full((2,), -0.3), x, y
  )
  np.testing.assert_allclose(result['loss'], loss, rtol=1e-5)


def test_negative_lambda_is_refused():
  with pytest.raises(ValueError, match='ditto_lambda must be >= 0'):
    build(-0.1)
