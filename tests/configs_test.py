"""Every flagfile in configs/ parses with the experiment flags."""

import glob
import os
import subprocess
import sys

from absl.testing import flagsaver
import pytest
import experiment_flags as ef  # bin/experiment_flags.py (pytest.ini puts bin/ on the path)
from tff_personal.algorithms import registry as algorithm_registry


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = sorted(glob.glob(os.path.join(ROOT, 'configs', '*.flags')))


def test_there_are_configs():
  assert len(CONFIGS) >= 10


@pytest.mark.parametrize('path', CONFIGS, ids=os.path.basename)
def test_config_parses(path, monkeypatch):
  monkeypatch.chdir(ROOT)  # Nested --flagfile paths are relative to the root.
  with flagsaver.flagsaver():
    ef.parse_flags_or_exit(['train.py', f'--flagfile={os.path.relpath(path, ROOT)}'])
    assert ef.TASK.value in ('femnist', 'fmnist', 'shakespeare')
    assert ef.TOTAL_ROUNDS.value >= 1
    if os.path.basename(path).startswith(('fedavg_', 'fedper_', 'local_')):
      assert ef.ALGORITHM.value == os.path.basename(path).split('_')[0]


TABLE_CELLS = sorted(glob.glob(os.path.join(ROOT, 'configs', '*', '*__*__*.flags')))


def test_there_are_table_cells():
  assert len(TABLE_CELLS) >= 110


@pytest.mark.parametrize('path', TABLE_CELLS, ids=lambda p: os.path.relpath(p, ROOT))
def test_table_cell_parses_and_its_combination_is_accepted(path, monkeypatch):
  monkeypatch.chdir(ROOT)
  with flagsaver.flagsaver():
    ef.parse_flags_or_exit(['train.py', f'--flagfile={os.path.relpath(path, ROOT)}'])
    assert ef.EXPERIMENT_NAME.value == os.path.basename(path)[:-len('.flags')]
    algorithm_registry.check(ef.ALGORITHM.value, ef.setup())


def test_ditto_protocol_configs_are_current():
  tool = os.path.join(ROOT, 'tools', 'ditto_protocol_configs.py')
  result = subprocess.run([sys.executable, tool, '--check'], capture_output=True, text=True)
  assert result.returncode == 0, result.stdout
