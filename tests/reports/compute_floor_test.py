"""The compute floor runs the round's exact steps, in a process without TFF."""

import json
import os
import subprocess
import sys

import numpy as np
import tensorflow as tf

from tests import test_utils
from tff_personal.reports import compute_floor

_REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_floor_counts_the_round_steps_without_loading_tff(tmp_path):
  spec = test_utils.tiny_model_spec(hidden=3)
  rng = np.random.default_rng(0)
  clients = [
      (rng.normal(size=(n, 2)).astype(np.float32), rng.integers(0, 2, n).astype(np.int32))
      for n in (7, 3, 12)
  ]
  model = spec.build()
  compute_floor.write_round(
      str(tmp_path), model, spec.loss(), 0.1, batch_size=5, rounds=1,
      client_examples=clients,
  )
  with open(tmp_path / 'round.json') as f:
    assert json.load(f)['loss']['class_name'] == 'SparseCategoricalCrossentropy'
  checksums = []
  for mode, threads in (('sequential', 0), ('parallel', 1), ('threads', 1)):
    run = subprocess.run(
        [sys.executable, '-m', 'tff_personal.reports.compute_floor', str(tmp_path),
         f'--mode={mode}', f'--intra_op_threads={threads}'],
        capture_output=True, text=True, timeout=300, check=True,
        env=dict(os.environ, PYTHONPATH=_REPO_ROOT),
    )
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert result['steps'] == 2 + 1 + 3  # ceil(7/5) + ceil(3/5) + ceil(12/5).
    assert result['seconds'] > 0
    checksums.append(result['checksum'])
  # Every mode runs the same SGD steps and the same weighted mean.
  np.testing.assert_allclose(checksums, checksums[0], rtol=1e-6)
  initial = sum(np.abs(w).sum() for w in model.get_weights())
  assert abs(checksums[0] - initial) > 1e-3  # The rounds changed the weights.
  # --serve: a round per line of stdin, timed; the same rounds, the same weights.
  run = subprocess.run(
      [sys.executable, '-m', 'tff_personal.reports.compute_floor', str(tmp_path), '--serve'],
      input='round\n', capture_output=True, text=True, timeout=300, check=True,
      env=dict(os.environ, PYTHONPATH=_REPO_ROOT),
  )
  lines = [json.loads(line) for line in run.stdout.strip().splitlines()]
  assert lines[0] == {'ready': True} and len(lines) == 3
  assert lines[1]['seconds'] > 0 and lines[1]['cpu_seconds'] > 0
  np.testing.assert_allclose(lines[2]['checksum'], checksums[0], rtol=1e-6)


def test_a_for_loop_over_a_dataset_is_found_and_one_over_an_iterator_is_not():
  # The floor refuses a round that runs a dataset function a client (its docstring).
  dataset = tf.data.Dataset.from_tensor_slices(np.zeros((4, 2), np.float32)).batch(2)

  @tf.function
  def over_dataset(data):
    total = tf.constant(0.0)
    for x in data:
      total += tf.reduce_sum(x)
    return total

  @tf.function
  def over_iterator(data):
    total = tf.constant(0.0)
    for x in iter(data):
      total += tf.reduce_sum(x)
    return total

  graph = lambda fn: fn.get_concrete_function(dataset).graph
  assert compute_floor._dataset_function_ops([graph(over_dataset)]) == {
      'ReduceDataset', 'ScanDataset'
  }
  assert compute_floor._dataset_function_ops([graph(over_iterator)]) == set()
