"""Client-placed results are matched to their clients by key, not by position."""

import numpy as np
import pytest
import tensorflow_federated as tff

from tests import test_utils
from tests.algorithms.fedavg_test import batches_dataset, client_batches
from tff_personal.algorithms import common
from tff_personal.algorithms import ditto
from tff_personal.runtime import client_keys
from tff_personal.runtime import context


@pytest.fixture(scope='module')
def process():
  context.install_local_context()
  return ditto.build(
      test_utils.tiny_model_spec(),
      ditto.Hparams(lambda_=0.5, personal_learning_rate=0.05, personal_steps=1),
      common.Common(client_learning_rate=0.1, seed=8),
  )


def personal(value):
  return tff.learning.models.ModelWeights(
      trainable=[np.full((2, 2), value, np.float32), np.full((2,), -value, np.float32)],
      non_trainable=[],
  )


def test_type_signature_adds_keys_at_clients(process):
  keyed = client_keys.with_client_keys(process.next)
  parameter, result = keyed.type_signature.parameter, keyed.type_signature.result
  assert parameter[0] == process.next.type_signature.parameter
  assert parameter[1] == tff.FederatedType(np.int64, tff.CLIENTS)
  assert result[0] == process.next.type_signature.result
  assert result[1] == tff.FederatedType(np.int64, tff.CLIENTS)


def test_results_come_back_in_key_order_even_when_the_runtime_permutes(process):
  keyed = client_keys.with_client_keys(process.next)
  state = process.initialize()
  data = [process.client_input(batches_dataset(client_batches(s, [2, 3]))) for s in (1, 2, 3)]
  starts = [personal(0.1), personal(0.2), personal(0.3)]
  keys = [7, 3, 5]
  plain = process.next(state, data, starts)
  keyed_output = client_keys.call_in_key_order(keyed, (state, data, starts), keys)
  for a, b in zip(plain.personal_states, keyed_output.personal_states):
    np.testing.assert_array_equal(a.trainable[0], b.trainable[0])

  # What the mergeable context does with 2 workers finishing in reverse order:
  # the second worker's clients (key 5) first, then the first worker's.
  result, returned = keyed((state, data, starts), [np.int64(k) for k in keys])
  assert returned == keys
  permuted = result._replace(personal_states=[result.personal_states[i] for i in (2, 0, 1)])
  restored = client_keys.in_key_order(
      permuted, keyed.type_signature.result[0], [5, 7, 3], keys
  )
  for i in range(3):
    np.testing.assert_array_equal(
        restored.personal_states[i].trainable[0], plain.personal_states[i].trainable[0]
    )
  # Reading the permuted list by position would give client 7 the state of client 5.
  assert not np.array_equal(
      permuted.personal_states[0].trainable[0], plain.personal_states[0].trainable[0]
  )
  assert restored.state is permuted.state  # Server values are left alone.


@pytest.mark.parametrize('returned', [[7, 3], [7, 3, 3], [7, 3, 6]])
def test_keys_that_are_not_the_keys_sent_are_an_error(returned):
  type_spec = tff.FederatedType(np.int32, tff.CLIENTS)
  with pytest.raises(client_keys.ClientKeyMismatchError, match=r'not for the clients sent'):
    client_keys.in_key_order([1] * len(returned), type_spec, returned, [7, 3, 5])


def test_a_client_list_inside_a_struct_is_reordered():
  type_spec = tff.StructType([
      ('metrics', tff.FederatedType(np.float32, tff.SERVER)),
      ('per_client', tff.FederatedType(np.int32, tff.CLIENTS)),
      ('same', tff.FederatedType(np.int32, tff.CLIENTS, all_equal=True)),
  ])
  value = {'metrics': 1.5, 'per_client': [50, 70, 30], 'same': 9}
  assert client_keys.in_key_order(value, type_spec, [5, 7, 3], [7, 3, 5]) == {
      'metrics': 1.5, 'per_client': [70, 30, 50], 'same': 9,
  }
