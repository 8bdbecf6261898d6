"""No model op runs inside a tf.data function, so a GPU worker can run it.

TFF's worker (`session_provider.cc`, v0.87) pins the top-level ops of a
computation's graph to its first GPU when it finds one; the ops of a function
that a dataset op calls (`dataset.reduce`'s reducer, a `map`'s function) run
on the CPU device of that dataset op. TFF's default `DATASET_REDUCE` client
loop therefore trains on the CPU of a GPU machine. Our clients loop over the
batches instead (`client_training.reduce_batches`), and Local and FedProx ask
TFF's client work for the same (`DATASET_ITERATOR`). These tests read every
algorithm's graphs and fail if a matrix multiplication (the tiny model's
dense layers, forward or backward) sits in a function a dataset op calls.
"""


import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tests import test_utils
from tff_personal.algorithms import registry as algorithm_registry

_MODEL_OPS = frozenset({'MatMul', 'BatchMatMulV2', 'Conv2D', 'Conv2DBackpropFilter', 'Conv2DBackpropInput'})


def _called_functions(node) -> set[str]:
  """Names of the functions a node calls: its op itself or a function-valued attr."""
  names = {node.op}
  for value in node.attr.values():
    if value.HasField('func'):
      names.add(value.func.name)
    names.update(f.name for f in value.list.func)
  return names


def model_op_counts(graph) -> tuple[int, int]:
  """(model ops in `graph`, model ops in functions that a dataset op calls)."""
  functions = {f.signature.name: f for f in graph.library.function}
  all_nodes = list(graph.node) + [n for f in functions.values() for n in f.node_def]
  pending = [
      name
      for node in all_nodes
      if node.op.endswith('Dataset') or node.op.endswith('DatasetV2')
      for name in _called_functions(node)
      if name in functions
  ]
  in_datasets = set()
  while pending:  # Every function reachable from a dataset op's functions.
    name = pending.pop()
    if name in in_datasets:
      continue
    in_datasets.add(name)
    for node in functions[name].node_def:
      pending.extend(n for n in _called_functions(node) if n in functions)
  total = sum(n.op in _MODEL_OPS for n in all_nodes)
  inside = sum(n.op in _MODEL_OPS for name in in_datasets for n in functions[name].node_def)
  return total, inside


def _counts(computation) -> tuple[int, int]:
  counts = [model_op_counts(g) for g in test_utils.graph_defs(computation)]
  return sum(t for t, _ in counts), sum(i for _, i in counts)


def test_a_reduce_over_the_dataset_is_caught():
  @tff.tensorflow.computation(tff.SequenceType(tff.TensorType(np.float32, [None, 2])))
  def with_reduce(dataset):
    weights = tf.ones([2, 2])
    return dataset.reduce(tf.zeros([2]), lambda s, x: s + tf.reduce_sum(tf.matmul(x, weights), 0))

  @tff.tensorflow.computation(tff.SequenceType(tff.TensorType(np.float32, [None, 2])))
  def with_loop(dataset):
    weights = tf.ones([2, 2])

    @tf.function
    def loop():
      total = tf.zeros([2])
      for x in iter(dataset):
        total += tf.reduce_sum(tf.matmul(x, weights), 0)
      return total

    return loop()

  assert _counts(with_reduce) == (1, 1)
  assert _counts(with_loop) == (1, 0)


TASK = test_utils.tiny_task(num_clients=3, hidden=3)
SETUP = algorithm_registry.Setup(client_learning_rate=0.1, seed=2)


@pytest.mark.parametrize('name', algorithm_registry.ALGORITHM_NAMES + ('ditto_grid',))
def test_no_model_op_runs_inside_a_dataset_function(name):
  hparams = None
  if name == 'ditto_grid':  # Ditto's validation passes too.
    name, hparams = 'ditto', algorithm_registry.module('ditto').Hparams(lambda_grid=(0.0, 0.1))
  process = algorithm_registry.build_algorithm(name, TASK, hparams, SETUP)
  computations = {
      'next': process.next,
      'evaluate': process.evaluate,
      'finetuned': process.finetuned_evaluation(0.1),
  }
  for label, computation in computations.items():
    total, inside = _counts(computation)
    assert total > 0, label
    assert inside == 0, (label, total, inside)
