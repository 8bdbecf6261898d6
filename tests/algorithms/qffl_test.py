"""q-FFL (q-FedAvg): exact one-round numbers against NumPy, and q = 0 is uniform FedAvg."""

import numpy as np
import pytest

from tests import test_utils
from tests.algorithms import numpy_reference
from tests.algorithms.fedavg_test import batches_dataset, client_batches, run_next
from tff_personal.algorithms import common
from tff_personal.algorithms import qffl
from tff_personal.personal import process as process_lib

LEARNING_RATE = 0.1
CLIENTS = [client_batches(1, [3, 2]), client_batches(2, [4])]  # 5 and 4 examples.


def build(q):
  return qffl.build(
      test_utils.tiny_model_spec(), qffl.Hparams(q=q),
      common.Common(client_learning_rate=LEARNING_RATE, seed=11),
  )


def one_round(process):
  state = process.initialize()
  kernel, bias = process.get_model_weights(state).trainable
  output = run_next(process, state, [batches_dataset(b) for b in CLIENTS],
                    process_lib.empty_personal_states(len(CLIENTS)))
  return (kernel, bias), process.get_model_weights(output.state).trainable


def q_fedavg_reference(kernel, bias, q):
  """The paper's Algorithm 3, one round, with L = 1 / learning rate."""
  lipschitz = 1.0 / LEARNING_RATE
  deltas, hs = [], []
  for batches in CLIENTS:
    trained = numpy_reference.sgd(kernel, bias, batches, LEARNING_RATE)
    delta_w = [lipschitz * (kernel - trained[0]), lipschitz * (bias - trained[1])]
    loss = numpy_reference.mean_loss(kernel, bias, batches)
    squared = sum(np.sum(d**2) for d in delta_w)
    deltas.append([loss**q * d for d in delta_w])
    hs.append(q * loss ** (q - 1) * squared + lipschitz * loss**q)
  total_h = sum(hs)
  return [p - sum(d[i] for d in deltas) / total_h for i, p in enumerate((kernel, bias))]


@pytest.mark.parametrize('q', [1.0, 2.0])
def test_one_round_is_q_fedavg(q):
  (kernel, bias), (new_kernel, new_bias) = one_round(build(q))
  expected_kernel, expected_bias = q_fedavg_reference(kernel, bias, q)
  np.testing.assert_allclose(new_kernel, expected_kernel, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(new_bias, expected_bias, rtol=1e-5, atol=1e-6)


def test_q_zero_is_fedavg_with_clients_weighted_alike():
  (kernel, bias), (new_kernel, new_bias) = one_round(build(0.0))
  trained = [numpy_reference.sgd(kernel, bias, batches, LEARNING_RATE) for batches in CLIENTS]
  np.testing.assert_allclose(new_kernel, np.mean([k for k, _ in trained], axis=0), rtol=1e-5)
  np.testing.assert_allclose(new_bias, np.mean([b for _, b in trained], axis=0), rtol=1e-5)
  assert q_fedavg_reference(kernel, bias, 0.0)[0] == pytest.approx(
      np.mean([k for k, _ in trained], axis=0)
  )


def test_a_larger_q_favours_the_client_with_the_higher_loss():
  (kernel, bias), _ = one_round(build(1.0))
  losses = [numpy_reference.mean_loss(kernel, bias, batches) for batches in CLIENTS]
  worse = int(np.argmax(losses))
  moved = {}
  for q in (0.0, 4.0):
    _, new_weights = one_round(build(q))
    moved[q] = numpy_reference.mean_loss(*new_weights, CLIENTS[worse])
  assert moved[4.0] < moved[0.0]


def test_negative_q_is_refused():
  with pytest.raises(ValueError, match='--qffl_q must be >= 0'):
    build(-1.0)
