"""PersonalizedProcess: its type checks and the LearningProcess adapter."""

import collections

import numpy as np
import pytest
import tensorflow_federated as tff

from tff_personal.personal import process as process_lib

STATE = tff.FederatedType(np.float32, tff.SERVER)
DATA = tff.FederatedType(tff.SequenceType(np.float32), tff.CLIENTS)
PERSONAL = tff.FederatedType(np.float32, tff.CLIENTS)


@tff.federated_computation
def initialize():
  return tff.federated_value(np.float32(0.0), tff.SERVER)


@tff.tensorflow.computation(np.float32)
def identity(x):
  return x


def build(next_fn):
  return process_lib.PersonalizedProcess(
      initialize,
      next_fn,
      get_model_weights=identity,
      evaluate_fn=identity,
      initial_personal_state_fn=lambda client_id, weights: np.float32(0.0),
  )


def test_accepts_personal_states_at_clients():
  @tff.federated_computation(STATE, DATA, PERSONAL)
  def next_fn(state, data, personal):
    del data
    return process_lib.PersonalizedProcessOutput(state, personal, state)

  process = build(next_fn)
  assert process.has_personal_state
  assert process.personal_state_type == PERSONAL
  output = process.next(np.float32(1.0), [[1.0], [2.0]], [np.float32(3.0), np.float32(4.0)])
  assert list(output.personal_states) == [3.0, 4.0]


def test_rejects_personal_states_at_server():
  @tff.federated_computation(STATE, DATA, tff.FederatedType(np.float32, tff.SERVER))
  def next_fn(state, data, personal):
    del data
    return process_lib.PersonalizedProcessOutput(state, personal, state)

  with pytest.raises(TypeError, match='CLIENTS'):
    build(next_fn)


def test_rejects_personal_states_returned_at_server():
  @tff.federated_computation(STATE, DATA, PERSONAL)
  def next_fn(state, data, personal):
    del data, personal
    return process_lib.PersonalizedProcessOutput(state, state, state)

  with pytest.raises(TypeError, match='personal states'):
    build(next_fn)


def test_rejects_metrics_at_clients():
  @tff.federated_computation(STATE, DATA, PERSONAL)
  def next_fn(state, data, personal):
    del data
    return process_lib.PersonalizedProcessOutput(state, personal, personal)

  with pytest.raises(TypeError, match='metrics'):
    build(next_fn)


def test_empty_personal_states():
  assert process_lib.empty_personal_states(3) == [collections.OrderedDict()] * 3
