"""bin/plot_nfl.py: the series it reads, a PNG, bad input."""

import csv
import json
import subprocess
import sys

import pytest

from tests.bin import binaries

plot_nfl = binaries.load('plot_nfl')
SCRIPT = f'{binaries.REPO_ROOT}/bin/plot_nfl.py'


@pytest.fixture
def run_dir(tmp_path):
  columns = ['round', 'nfl/w_div', 'nfl/windowed_w_div', 'nfl/flagged', 'nfl/round_flagged',
             'eval/accuracy_mean', 'eval/central_accuracy']
  with open(tmp_path / 'metrics.csv', 'w', newline='') as f:
    writer = csv.writer(f)
    writer.writerow(columns)
    for r in range(1, 7):
      flagged = r >= 4
      writer.writerow([r, 0.01 * r, 0.005 * r, int(flagged), 4 if flagged else -1,
                       0.5 + 0.05 * r, '' if r == 3 else 0.4])
  (tmp_path / 'run_config.json').write_text(
      json.dumps({'nfl_threshold': 0.02, 'nfl_warmup_rounds': 2})
  )
  return tmp_path


def test_reads_the_series_and_the_first_flag(run_dir):
  series = plot_nfl.read_run(str(run_dir))
  assert series['w_div'][:2] == [(1, 0.01), (2, 0.02)]
  assert series['round_flagged'] == 4
  assert [r for r, _ in series['central']] == [1, 2, 4, 5, 6]  # Round 3 not evaluated.
  assert (series['threshold'], series['warmup']) == (0.02, 2)


def test_writes_a_png(run_dir, tmp_path):
  output = tmp_path / 'plot.png'
  result = subprocess.run(
      [sys.executable, SCRIPT, f'--run={run_dir}', f'--output={output}'],
      capture_output=True, text=True, check=False,
  )
  assert result.returncode == 0, result.stderr
  assert output.read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'


def test_a_run_without_the_detector_is_exit_2(tmp_path):
  (tmp_path / 'metrics.csv').write_text('round,eval/accuracy_mean\n1,0.5\n')
  result = subprocess.run(
      [sys.executable, SCRIPT, f'--run={tmp_path}', f'--output={tmp_path}/p.png'],
      capture_output=True, text=True, check=False,
  )
  assert result.returncode == 2
  assert result.stderr.strip().splitlines() == [
      f'plot_nfl.py: error: {tmp_path}/metrics.csv has no nfl/w_div column: run with'
      ' --nfl_detection.'
  ]
