"""Client passes iterate their data with tf.data's autotuning off.

`runtime.client_datasets.without_autotuning` says why (idle cores at the end
of every client's pass in TFF's worker). These tests read the TensorFlow
graphs of the built computations: every op that starts a pass over a dataset
must have an `OptionsDataset` with autotuning off in the same graph. Local
and FedProx run TFF's own client work, which we do not change: there the
tasks' datasets carry the option (the last tests).
"""


import numpy as np
import pytest
import tensorflow as tf

from tests import test_utils
from tff_personal.algorithms import registry as algorithm_registry
from tff_personal.runtime import client_datasets
from tff_personal.training import client_training

from tensorflow.core.framework import dataset_options_pb2  # pylint: disable=g-direct-tensorflow-import

# The op that starts a pass over a dataset: a `for` loop's iterator, `dataset.reduce`.
_ITERATING_OPS = frozenset({'MakeIterator', 'ReduceDataset'})


def count_ops(graph):
  """(iterating ops, OptionsDataset ops with autotuning off) in `graph` and its functions."""
  nodes = list(graph.node) + [n for f in graph.library.function for n in f.node_def]
  iterating = sum(n.op in _ITERATING_OPS for n in nodes)
  autotuning_off = 0
  for node in nodes:
    if node.op == 'OptionsDataset':
      options = dataset_options_pb2.Options.FromString(node.attr['serialized_options'].s)
      autotuning_off += options.autotune_options.HasField('enabled') and not options.autotune_options.enabled
  return iterating, autotuning_off


def test_without_autotuning_keeps_the_elements():
  dataset = tf.data.Dataset.range(5).batch(2)
  quiet = client_datasets.without_autotuning(dataset)
  assert quiet.options().autotune.enabled is False
  assert dataset.options().autotune.enabled is None  # Unchanged: TF's default (on).
  assert [b.tolist() for b in quiet.as_numpy_iterator()] == [[0, 1], [2, 3], [4]]


def test_reduce_batches_loop_sums_like_reduce():
  dataset = tf.data.Dataset.from_tensor_slices(np.arange(7, dtype=np.int64)).batch(3)
  total = tf.function(
      lambda: client_training.reduce_batches(
          dataset, tf.constant(0, tf.int64), lambda s, b: s + tf.reduce_sum(b)
      )
  )()
  assert int(total) == 21


TASK = test_utils.tiny_task(num_clients=3, hidden=3)
SETUP = algorithm_registry.Setup(client_learning_rate=0.1, seed=2)


@pytest.mark.parametrize('name', algorithm_registry.ALGORITHM_NAMES + ('ditto_grid',))
def test_every_client_pass_has_autotuning_off(name):
  hparams = None
  if name == 'ditto_grid':  # Validation passes (`client_training.mean_loss`) too.
    name, hparams = 'ditto', algorithm_registry.module('ditto').Hparams(lambda_grid=(0.0, 0.1))
  process = algorithm_registry.build_algorithm(name, TASK, hparams, SETUP)
  computations = {
      'next': process.next,
      'evaluate': process.evaluate,
      'finetuned': process.finetuned_evaluation(0.1),
  }
  for label, computation in computations.items():
    counts = [count_ops(g) for g in test_utils.graph_defs(computation)]
    iterating = sum(i for i, _ in counts)
    assert iterating > 0, label
    for i, off in counts:
      assert off >= i, (label, counts)


def test_the_tasks_datasets_have_autotuning_off():
  client = TASK.client_ids[0]
  assert TASK.train_dataset(client, epochs=1, batch_size=2, seed=0).options().autotune.enabled is False
  assert TASK.test_dataset(client, batch_size=2).options().autotune.enabled is False


def test_the_tasks_dataset_computation_has_autotuning_off():
  computation = TASK.train_dataset_computation(epochs=1, batch_size=2)
  counts = [count_ops(g) for g in test_utils.graph_defs(computation)]
  assert sum(off for _, off in counts) == 1, counts
