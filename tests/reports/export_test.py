"""Every algorithm's exported computations give the same results in a fresh process."""

import os
import pickle
import subprocess
import sys

import numpy as np
import pytest
import tensorflow_federated as tff

from tests import test_utils
from tests.reports import export_child
from tff_personal.algorithms import registry as algorithm_registry
from tff_personal.reports import export

_REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_DATASETS = dict(num_clients=3, hidden=3, seed=1)


def flatten(structure):
  """Leaves in type order (tf.nest would sort dict keys)."""
  return tff.structure.flatten(tff.structure.from_container(structure, recursive=True))


def assert_same(expected, actual):
  expected_flat = flatten(expected)
  actual_flat = flatten(actual)
  assert len(expected_flat) == len(actual_flat)
  for e, a in zip(expected_flat, actual_flat):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(e))


@pytest.mark.parametrize(
    'algorithm, options',
    [(name, {}) for name in algorithm_registry.ALGORITHM_NAMES]
    + [('ditto', {'lambda_grid': (0.0, 0.5)}), ('fedper', {'nfl_detection': True}),
       ('lindt', {'nfl_detection': True, 'mode': 'on_detection'})],
)
def test_export_round_trip_in_fresh_process(algorithm, options, tmp_path):
  task = test_utils.tiny_task(num_clients=3, hidden=3)
  module = algorithm_registry.module(algorithm)
  hparams = {k: v for k, v in options.items() if k != 'nfl_detection'}
  process = algorithm_registry.build_algorithm(
      algorithm, task, module.Hparams(**hparams),
      algorithm_registry.Setup(
          client_learning_rate=0.1, seed=7, nfl_detection=options.get('nfl_detection', False)
      ),
  )
  train_data, test_data = test_utils.tiny_datasets(**_DATASETS)
  initial_weights = process.get_model_weights(process.initialize())
  initial_personal_states = [
      process.initial_personal_state(c, initial_weights) for c in task.client_ids
  ]
  expected = export_child.run_rounds(
      {name: getattr(process, name) for name in export.COMPUTATION_NAMES},
      train_data,
      test_data,
      initial_personal_states,
  )

  export_dir = str(tmp_path / 'export')
  manifest = export.export_process(process, export_dir, description={'algorithm': algorithm})
  assert set(manifest['computations']) == set(export.COMPUTATION_NAMES)
  assert manifest['computations']['next']['type_signature'] == str(
      process.next.type_signature
  )
  inputs_path, outputs_path = tmp_path / 'inputs.pkl', tmp_path / 'outputs.pkl'
  with open(inputs_path, 'wb') as f:
    pickle.dump(
        {'datasets': _DATASETS, 'initial_personal_states': initial_personal_states}, f
    )
  subprocess.run(
      [sys.executable, export_child.__file__, export_dir, inputs_path, outputs_path],
      check=True,
      env=dict(os.environ, PYTHONPATH=_REPO_ROOT),
      timeout=300,
  )
  with open(outputs_path, 'rb') as f:
    actual = pickle.load(f)

  assert set(actual) == set(expected)
  for key in expected:
    assert_same(expected[key], actual[key])
  # The rounds did train: the model moved and was evaluated on every client.
  moved = not np.array_equal(
      flatten(expected['initial_weights'])[0], flatten(expected['final_weights'])[0]
  )
  assert moved == (algorithm != 'local')  # Local's server keeps only W0.
  if process.has_personal_state:  # Personal states were trained and came back.
    assert not np.array_equal(
        flatten(initial_personal_states)[0], flatten(expected['personal_states_2'])[0]
    )
  assert [e['num_examples'] for e in expected['evaluation']] == [8, 8, 8]
