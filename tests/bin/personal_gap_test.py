"""bin/personal_gap.py: personal against global accuracy per round, and over seeds."""

import csv
import os
import subprocess
import sys

import pytest

from tests.bin import binaries

PERSONAL_GAP = os.path.join(binaries.REPO_ROOT, 'bin', 'personal_gap.py')
HEADER = [
    'round', 'client_id', 'sparse_categorical_accuracy',
    'global_model/sparse_categorical_accuracy', 'num_examples',
]


def write_run(path, rows):
  path.mkdir()
  with open(path / 'eval_per_client.csv', 'w', newline='') as f:
    writer = csv.writer(f)
    writer.writerow(HEADER)
    writer.writerows(rows)
  return str(path)


@pytest.fixture
def runs(tmp_path):
  """Two seeds of a run: seed 0 evaluated at rounds 5 and 10, seed 1 at 10."""
  seed0 = write_run(tmp_path / 'seed0', [
      [5, 'a', 0.5, 0.7, 10], [5, 'b', 0.9, 0.8, 30],
      [10, 'a', 0.6, 0.6, 10], [10, 'b', 1.0, 0.7, 30],
  ])
  seed1 = write_run(tmp_path / 'seed1', [[10, 'a', 0.4, 0.6, 10], [10, 'b', 0.8, 0.8, 30]])
  return seed0, seed1


def personal_gap(*args):
  return subprocess.run(
      [sys.executable, PERSONAL_GAP, *args], capture_output=True, text=True, cwd=binaries.REPO_ROOT
  )


def test_one_run_per_round(runs):
  result = personal_gap(f'--runs={runs[0]}')
  assert result.returncode == 0, result.stderr
  # Round 5: means 0.7 / 0.75; pooled (5 + 27) / 40 and (7 + 24) / 40.
  assert '| 5 | 0.700 | 0.750 | -5.0 | 0.800 / 0.775 | 1 / 1 |' in result.stdout
  # Round 10: client a level with the global model, b 30 points above it.
  assert '| 10 | 0.800 | 0.650 | +15.0 | 0.900 / 0.675 | 1 / 0 |' in result.stdout
  assert 'Over the' not in result.stdout


def test_seeds_at_the_rounds_all_runs_evaluated(runs):
  result = personal_gap(f'--runs={",".join(runs)}')
  assert result.returncode == 0, result.stderr
  assert '| 10 | 0.600 | 0.700 | -10.0 | 0.700 / 0.750 | 0 / 1 |' in result.stdout
  over_seeds = result.stdout.split('Over the 2 runs')[1]
  # Gaps +15 and -10: mean 2.5, 95% interval t(0.975, 1) = 12.706 times 12.5;
  # pooled +22.5 and -5: mean 8.75 +- 12.706 * 13.75.
  assert '| 10 | +15.0 / -10.0 | +2.50 ± 158.83 | +22.5 / -5.0 | +8.75 ± 174.71 |' in over_seeds
  assert '| 5 |' not in over_seeds


@pytest.mark.parametrize('args, message', [
    ([], '--runs is required'),
    (['--runs=nowhere'], 'nowhere/eval_per_client.csv does not exist'),
    (['--runs={seed0}', '--accuracy=loss'], "has no column 'loss'"),
    (['--runs={seed0},{empty}'], 'empty/eval_per_client.csv has no evaluation rows'),
])
def test_bad_input_is_one_line_and_exit_2(runs, tmp_path, args, message):
  empty = write_run(tmp_path / 'empty', [])
  result = personal_gap(*(a.format(seed0=runs[0], empty=empty) for a in args))
  assert result.returncode == 2
  lines = result.stderr.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith('personal_gap.py: error: ')
  assert message in lines[0]
