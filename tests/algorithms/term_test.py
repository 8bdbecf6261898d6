"""TERM: exact one-round numbers against NumPy, t = 0 is FedAvg, the tilt's direction."""

import collections

import numpy as np
import pytest
import tensorflow as tf

from tests import test_utils
from tests.algorithms import numpy_reference
from tests.algorithms.fedavg_test import batches_dataset, client_batches, run_next
from tff_personal.algorithms import common
from tff_personal.algorithms import fedavg
from tff_personal.algorithms import term
from tff_personal.personal import compose
from tff_personal.personal import process as process_lib

LEARNING_RATE = 0.1
CLIENTS = [client_batches(1, [3, 2]), client_batches(2, [4])]  # 5 and 4 examples.
OPTIONS = common.Common(client_learning_rate=LEARNING_RATE, seed=11)


def one_round(process, clients=CLIENTS):
  state = process.initialize()
  kernel, bias = process.get_model_weights(state).trainable
  output = run_next(process, state, [batches_dataset(b) for b in clients],
                    process_lib.empty_personal_states(len(clients)))
  return (kernel, bias), process.get_model_weights(output.state).trainable, output.metrics


def tilted_reference(kernel, bias, t, clients=CLIENTS):
  """One round: the mean of the SGD updates under weights n_k exp(t F_k(w^t))."""
  weights, trained = [], []
  for batches in clients:
    n = sum(len(y) for _, y in batches)
    weights.append(n * np.exp(t * numpy_reference.mean_loss(kernel, bias, batches)))
    trained.append(numpy_reference.sgd(kernel, bias, batches, LEARNING_RATE))
  weights = np.array(weights) / np.sum(weights)
  new_kernel = sum(w * k for w, (k, _) in zip(weights, trained))
  new_bias = sum(w * b for w, (_, b) in zip(weights, trained))
  return new_kernel, new_bias


@pytest.mark.parametrize('t', [-2.0, 1.5])
def test_one_round_is_the_tilted_mean(t):
  (kernel, bias), (new_kernel, new_bias), _ = one_round(term.build(
      test_utils.tiny_model_spec(), term.Hparams(t=t), OPTIONS))
  expected_kernel, expected_bias = tilted_reference(kernel, bias, t)
  np.testing.assert_allclose(new_kernel, expected_kernel, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(new_bias, expected_bias, rtol=1e-5, atol=1e-6)


def test_t_zero_is_fedavg():
  _, tilted, _ = one_round(term.build(test_utils.tiny_model_spec(), term.Hparams(t=0.0), OPTIONS))
  _, averaged, _ = one_round(fedavg.build(test_utils.tiny_model_spec(), fedavg.Hparams(), OPTIONS))
  np.testing.assert_allclose(tilted[0], averaged[0], rtol=1e-6)
  np.testing.assert_allclose(tilted[1], averaged[1], rtol=1e-6)


def test_a_negative_tilt_discounts_the_client_with_the_higher_loss():
  (kernel, bias), _, _ = one_round(term.build(test_utils.tiny_model_spec(), term.Hparams(), OPTIONS))
  losses = [numpy_reference.mean_loss(kernel, bias, batches) for batches in CLIENTS]
  worse, better = int(np.argmax(losses)), int(np.argmin(losses))
  loss_of_better = {}
  for t in (-5.0, 5.0):
    _, new_weights, _ = one_round(
        term.build(test_utils.tiny_model_spec(), term.Hparams(t=t), OPTIONS))
    loss_of_better[t] = numpy_reference.mean_loss(*new_weights, CLIENTS[better])
  assert losses[worse] > losses[better]
  assert loss_of_better[-5.0] < loss_of_better[5.0]


def test_a_huge_tilt_stays_finite():
  """t F_k far beyond float32's exp range is clipped: the result is still a mean."""
  (kernel, bias), (new_kernel, new_bias), metrics = one_round(
      term.build(test_utils.tiny_model_spec(), term.Hparams(t=1e4), OPTIONS))
  assert np.all(np.isfinite(new_kernel)) and np.all(np.isfinite(new_bias))
  assert metrics['non_finite_clients'] == 0
  # Both exponents clip at 60: equal tilts, so the result is FedAvg's round.
  expected = tilted_reference(kernel, bias, 0.0)
  np.testing.assert_allclose(new_kernel, expected[0], rtol=1e-5, atol=1e-6)


def test_a_client_whose_weight_is_not_finite_is_refused():
  result = collections.OrderedDict(
      update=[tf.ones(2)], update_weight=tf.constant(3.0),
      personal_state=collections.OrderedDict(), model_output=collections.OrderedDict(),
      non_finite=tf.constant(0),
  )
  kept = compose.with_update_weight(result, tf.constant(5.0))
  np.testing.assert_array_equal(kept['update'][0], [1.0, 1.0])
  assert (float(kept['update_weight']), int(kept['non_finite'])) == (5.0, 0)
  refused = compose.with_update_weight(result, tf.constant(np.inf))
  np.testing.assert_array_equal(refused['update'][0], [0.0, 0.0])
  assert (float(refused['update_weight']), int(refused['non_finite'])) == (0.0, 1)
