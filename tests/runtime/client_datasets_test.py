"""Composed dataset computations: same keys, same batches, same round."""

import collections

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tests import test_utils
from tff_personal.algorithms import common
from tff_personal.algorithms import ditto
from tff_personal.runtime import client_datasets

TASK = test_utils.tiny_task(num_clients=3, hidden=3)
EPOCHS, BATCH = 2, 3


def keys():
  return [collections.OrderedDict(client_id=c, seed=7 + i) for i, c in enumerate(TASK.client_ids)]


def datasets():
  return [
      TASK.train_dataset(c, epochs=EPOCHS, batch_size=BATCH, seed=7 + i)
      for i, c in enumerate(TASK.client_ids)
  ]


@pytest.fixture(scope='module')
def dataset_computation():
  return TASK.train_dataset_computation(epochs=EPOCHS, batch_size=BATCH)


def test_plain_dataset_input(dataset_computation):
  sequence = dataset_computation.type_signature.result
  server = tff.FederatedType(np.int32, tff.SERVER)
  clients = tff.FederatedType(sequence, tff.CLIENTS)

  @tff.tensorflow.computation(sequence)
  def label_sum(dataset):
    return dataset.reduce(tf.constant(0, tf.int32), lambda s, b: s + tf.reduce_sum(b[1]))

  @tff.federated_computation(server, clients, tff.FederatedType(np.int32, tff.CLIENTS))
  def next_fn(state, data, personal):
    return state, tff.federated_sum(tff.federated_map(label_sum, data)), personal

  composed = client_datasets.compose_client_datasets(dataset_computation, next_fn)
  assert str(composed.type_signature.parameter[1]) == '{<client_id=str,seed=int64>}@CLIENTS'
  expected = next_fn(1, datasets(), [0, 0, 0])
  assert composed(1, keys(), [0, 0, 0]) == expected
  assert expected[1] > 0


def test_ditto_round_with_roles_is_the_same(dataset_computation):
  process = ditto.build(
      TASK.model, ditto.Hparams(lambda_=0.5),
      common.Common(client_learning_rate=0.1, seed=3),
  )
  composed = client_datasets.compose_client_datasets(dataset_computation, process.next)
  assert str(composed.type_signature.parameter[1]) == (
      '{<data=<client_id=str,seed=int64>,role=int32,seed=int64>}@CLIENTS'
  )
  state = process.initialize()
  weights = process.get_model_weights(state)
  personal = [process.initial_personal_state(c, weights) for c in TASK.client_ids]
  serialized = process.next(state, [process.client_input(d) for d in datasets()], personal)
  from_keys = composed(state, [process.client_input(k) for k in keys()], personal)
  for a, b in zip(tf.nest.flatten(process.get_model_weights(serialized.state)),
                  tf.nest.flatten(process.get_model_weights(from_keys.state))):
    np.testing.assert_array_equal(a, b)
  for a, b in zip(serialized.personal_states, from_keys.personal_states):
    for x, y in zip(tf.nest.flatten(a), tf.nest.flatten(b)):
      np.testing.assert_array_equal(x, y)


def test_mismatched_dataset_type_is_an_error():
  other = test_utils.tiny_task(num_clients=3, hidden=3)
  process = ditto.build(
      test_utils.tiny_model_spec(input_dim=5), ditto.Hparams(lambda_=0.5),
      common.Common(client_learning_rate=0.1, seed=3),
  )
  with pytest.raises(TypeError, match='dataset computation returns'):
    client_datasets.compose_client_datasets(
        other.train_dataset_computation(epochs=1, batch_size=2), process.next
    )
