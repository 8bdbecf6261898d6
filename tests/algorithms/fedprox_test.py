"""FedProx: our proximal client work on the composed round equals TFF's builder."""

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tests import test_utils
from tests.algorithms import numpy_reference
from tests.algorithms.fedavg_test import assert_same_as_tff_for_three_rounds
from tests.algorithms.fedavg_test import batches_dataset, client_batches, run_next
from tff_personal.algorithms import common
from tff_personal.algorithms import fedavg
from tff_personal.algorithms import fedprox
from tff_personal.personal import process as process_lib

LEARNING_RATE = 0.1
MU = 0.5


def build(mu):
  return fedprox.build(
      test_utils.tiny_model_spec(), fedprox.Hparams(mu=mu),
      common.Common(client_learning_rate=LEARNING_RATE, seed=11),
  )


@pytest.fixture(scope='module')
def process():
  return build(MU)


def _weights(process, state):
  return tf.nest.flatten(process.get_model_weights(state))


def test_type_signature(process):
  signature = process.next.type_signature
  assert str(signature.parameter[1]) == (
      '{<data=<float32[?,2],int32[?]>*,role=int32,seed=int64>}@CLIENTS'
  )
  assert str(signature.parameter[2]) == '{<>}@CLIENTS'
  assert not process.has_personal_state


def _one_round_reference(kernel, bias, clients, strength):
  """The server's new (kernel, bias): the example-weighted mean of the clients'
  proximal SGD from (kernel, bias), applied with server learning rate 1."""
  sizes = np.array([sum(len(y) for _, y in batches) for batches in clients], np.float64)
  trained = [
      numpy_reference.proximal_sgd(kernel, bias, batches, LEARNING_RATE, strength)
      for batches in clients
  ]
  weights = sizes / sizes.sum()
  return (sum(w * k for w, (k, _) in zip(weights, trained)),
          sum(w * b for w, (_, b) in zip(weights, trained)))


def _tff_fed_prox(mu):
  return tff.learning.algorithms.build_weighted_fed_prox(
      test_utils.tiny_model_spec().tff_model_fn,
      proximal_strength=mu,
      client_optimizer_fn=tff.learning.optimizers.build_sgdm(LEARNING_RATE),
      server_optimizer_fn=tff.learning.optimizers.build_sgdm(1.0),
      loop_implementation=tff.learning.LoopImplementation.DATASET_ITERATOR,
  )


CLIENTS = [client_batches(1, [3, 2]), client_batches(2, [4])]


def test_one_round_is_the_papers_proximal_step(process):
  """w <- w - eta (grad F(w) + mu (w - w^t)) on each client (Li et al. 2020, eq. 2)."""
  state = process.initialize()
  kernel, bias = process.get_model_weights(state).trainable
  output = run_next(process, state, [batches_dataset(b) for b in CLIENTS],
                    process_lib.empty_personal_states(2))
  new_kernel, new_bias = process.get_model_weights(output.state).trainable
  expected_kernel, expected_bias = _one_round_reference(kernel, bias, CLIENTS, MU)
  np.testing.assert_allclose(new_kernel, expected_kernel, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(new_bias, expected_bias, rtol=1e-5, atol=1e-6)


def test_tffs_fed_prox_pushes_away_from_the_received_model(process):
  """TFF 0.87's `build_weighted_fed_prox` adds mu (w^t - w) to the gradient,
  the paper's term with the opposite sign: it matches the reference with -mu.
  So ours equals TFF's only at mu = 0 (next test)."""
  tff_process = _tff_fed_prox(MU)
  ours = process.initialize()
  theirs = tff_process.set_model_weights(tff_process.initialize(), process.get_model_weights(ours))
  kernel, bias = process.get_model_weights(ours).trainable
  new_kernel, new_bias = tff_process.get_model_weights(
      tff_process.next(theirs, [batches_dataset(b) for b in CLIENTS]).state
  ).trainable
  flipped_kernel, flipped_bias = _one_round_reference(kernel, bias, CLIENTS, -MU)
  np.testing.assert_allclose(new_kernel, flipped_kernel, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(new_bias, flipped_bias, rtol=1e-5, atol=1e-6)


def test_equals_tffs_build_weighted_fed_prox_at_mu_zero_for_three_rounds():
  assert_same_as_tff_for_three_rounds(build(0.0), _tff_fed_prox(0.0))


def test_mu_zero_is_fedavg_bit_for_bit():
  prox = build(0.0)
  avg = fedavg.build(
      test_utils.tiny_model_spec(), fedavg.Hparams(),
      common.Common(client_learning_rate=LEARNING_RATE, seed=11),
  )
  prox_state, avg_state = prox.initialize(), avg.initialize()
  for round_num in range(2):
    data = [batches_dataset(client_batches(10 * round_num + i, [4, 3])) for i in range(3)]
    prox_state = run_next(prox, prox_state, data, process_lib.empty_personal_states(3)).state
    avg_state = run_next(avg, avg_state, data, process_lib.empty_personal_states(3)).state
  for a, b in zip(_weights(prox, prox_state), _weights(avg, avg_state)):
    np.testing.assert_array_equal(a, b)


def test_the_proximal_term_pulls_toward_the_received_model(process):
  state = process.initialize()
  start = _weights(process, state)
  data = [batches_dataset(client_batches(i, [4, 3])) for i in range(3)]
  nothing = process_lib.empty_personal_states(3)
  prox_moved = _weights(process, run_next(process, state, data, nothing).state)
  plain = build(0.0)
  plain_moved = _weights(plain, run_next(plain, plain.initialize(), data, nothing).state)
  prox_step = np.sqrt(sum(np.sum((a - s) ** 2) for a, s in zip(prox_moved, start)))
  plain_step = np.sqrt(sum(np.sum((a - s) ** 2) for a, s in zip(plain_moved, start)))
  assert 0 < prox_step < plain_step
