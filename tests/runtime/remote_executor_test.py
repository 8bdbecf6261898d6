"""In-place serialization gives TFF's proto; the context's executor uses it."""

import collections

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff
from tensorflow_federated.proto.v0 import executor_pb2
from tensorflow_federated.python.core.impl.executors import value_serialization

from tff_personal.runtime import context
from tff_personal.runtime import remote_executor

WEIGHTS = tff.StructWithPythonType(
    [('kernel', tff.TensorType(np.float32, (3, 2))), ('bias', tff.TensorType(np.float32, (2,)))],
    collections.OrderedDict,
)


def weights(seed):
  rng = np.random.default_rng(seed)
  return collections.OrderedDict(
      kernel=rng.normal(size=(3, 2)).astype(np.float32), bias=rng.normal(size=2).astype(np.float32)
  )


# (value, type): a round's argument in small, and the leaf kinds around it.
CASES = {
    'round argument': (
        [[collections.OrderedDict(w=weights(0), step=np.int32(3)),
          [collections.OrderedDict(role=np.int32(r), seed=np.int64(r)) for r in range(3)],
          [weights(i) for i in range(3)]],
         [0, 1, 2]],
        tff.StructType([
            tff.StructType([
                tff.FederatedType(
                    tff.StructType([('w', WEIGHTS), ('step', np.int32)]), tff.SERVER
                ),
                tff.FederatedType(
                    tff.StructType([('role', np.int32), ('seed', np.int64)]), tff.CLIENTS
                ),
                tff.FederatedType(WEIGHTS, tff.CLIENTS),
            ]),
            tff.FederatedType(np.int64, tff.CLIENTS),
        ]),
    ),
    'all-equal at clients': (np.float32(2.5), tff.FederatedType(np.float32, tff.CLIENTS, True)),
    'empty struct at clients': ([(), ()], tff.FederatedType(tff.StructType([]), tff.CLIENTS)),
    'strings': ((np.str_('a'), np.array([b'x', b'yz'], object)),
                tff.StructType([np.str_, tff.TensorType(np.str_, (2,))])),
    # Written straight into the message: C and Fortran order, a transposed
    # view, other dtypes, no elements.
    'arrays': (
        (np.arange(6, dtype=np.float32).reshape(2, 3),
         np.asfortranarray(np.arange(6, dtype=np.float32).reshape(2, 3)),
         np.arange(6, dtype=np.float32).reshape(3, 2).T,
         np.arange(4, dtype=np.int64), np.array([True, False]), np.linspace(0, 1, 3),
         np.zeros((0, 2), np.float32)),
        tff.StructType([
            tff.TensorType(np.float32, (2, 3)), tff.TensorType(np.float32, (2, 3)),
            tff.TensorType(np.float32, (2, 3)), tff.TensorType(np.int64, (4,)),
            tff.TensorType(np.bool_, (2,)), tff.TensorType(np.float64, (3,)),
            tff.TensorType(np.float32, (0, 2)),
        ]),
    ),
    # Left to TFF: a list, a shape TFF checks, a scalar array.
    'other tensor values': (
        ([1.0, 2.0], np.ones(3, np.float32), np.array(4, np.int32)),
        tff.StructType([
            tff.TensorType(np.float32, (2,)), tff.TensorType(np.float32, (None,)),
            tff.TensorType(np.int32, ()),
        ]),
    ),
}


@pytest.mark.parametrize('case', sorted(CASES))
def test_same_proto_as_tff(case):
  value, type_spec = CASES[case]
  expected, _ = value_serialization.serialize_value(value, type_spec)
  actual = executor_pb2.Value()
  remote_executor.serialize_into(value, type_spec, actual)
  assert actual.SerializeToString(deterministic=True) == expected.SerializeToString(
      deterministic=True
  )


def test_arrays_of_their_type_are_not_left_to_tff(monkeypatch):
  left_to_tff = []
  original = value_serialization.serialize_value

  def counting(value, type_spec):
    left_to_tff.append(str(type_spec))
    return original(value, type_spec)

  monkeypatch.setattr(value_serialization, 'serialize_value', counting)
  value, type_spec = CASES['round argument']
  remote_executor.serialize_into(value, type_spec, executor_pb2.Value())
  # Only the scalars: every kernel and bias went straight into the message.
  assert left_to_tff == ['int32'] + ['int32', 'int64'] * 3 + ['int64'] * 3


def test_bad_values_are_type_errors():
  with pytest.raises(TypeError, match='struct value of 1 elements to a struct type of 2'):
    remote_executor.serialize_into((np.int32(1),), tff.StructType([np.int32, np.int32]),
                                   executor_pb2.Value())
  with pytest.raises(TypeError, match='must be a list'):
    remote_executor.serialize_into(
        (np.int32(1),), tff.FederatedType(np.int32, tff.CLIENTS), executor_pb2.Value()
    )
  with pytest.raises(TypeError):
    remote_executor.serialize_into(
        np.zeros(3, np.float32), tff.TensorType(np.float32, (2,)), executor_pb2.Value()
    )


def test_the_local_context_runs_through_it(monkeypatch):
  context.install_local_context()
  calls = []
  original = remote_executor.serialize_into

  def counting(value, type_spec, message):
    calls.append(type_spec)
    original(value, type_spec, message)

  monkeypatch.setattr(remote_executor, 'serialize_into', counting)

  @tff.tensorflow.computation(WEIGHTS)
  def double(w):
    return tf.nest.map_structure(lambda t: 2 * t, w)

  @tff.federated_computation(tff.FederatedType(WEIGHTS, tff.CLIENTS))
  def double_at_clients(states):
    return tff.federated_map(double, states)

  result = double_at_clients([weights(1), weights(2)])
  assert str(calls[0]) == '{<kernel=float32[3,2],bias=float32[2]>}@CLIENTS'
  for got, seed in zip(result, (1, 2)):
    np.testing.assert_allclose(got['kernel'], 2 * weights(seed)['kernel'])
    np.testing.assert_allclose(got['bias'], 2 * weights(seed)['bias'])
