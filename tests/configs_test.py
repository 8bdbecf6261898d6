"""Every flagfile in configs/ parses with the experiment flags."""

import glob
import os

from absl.testing import flagsaver
import pytest
import experiment_flags as ef  # bin/experiment_flags.py (pytest.ini puts bin/ on the path)


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
