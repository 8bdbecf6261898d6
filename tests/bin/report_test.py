"""bin/report.py: report.md and its figures from run directories, bad input."""

import subprocess
import sys

import pytest

from tests.bin import binaries
from tests.reports import run_report_test

SCRIPT = f'{binaries.REPO_ROOT}/bin/report.py'


def _report(*args):
  return subprocess.run(
      [sys.executable, SCRIPT, *args], cwd=binaries.REPO_ROOT,
      capture_output=True, text=True, check=False,
  )


def test_writes_report_md_and_the_figures(tmp_path):
  run_report_test.write_run(tmp_path / 'fmnist_fedavg')
  run_report_test.write_run(tmp_path / 'fmnist_ditto', algorithm='ditto', nfl=True)
  output = tmp_path / 'report'
  result = _report(f'--run={tmp_path}/fmnist_fedavg', f'--run={tmp_path}/fmnist_ditto',
                   '--label=FedAvg', '--label=Ditto', f'--output={output}')
  assert result.returncode == 0, result.stderr
  assert result.stdout.strip() == f'{output}/report.md'
  report = (output / 'report.md').read_text()
  assert '| FedAvg | 5 | 0.7200 | 0.1720 | 0.5400 | 0.5000 | 0.6200 | - |' in report
  assert '| Ditto | 5 | 0.7200 | 0.1720 | 0.5400 | 0.5000 | 0.6200 | round 3 |' in report
  for name in ('accuracy_per_round.png', 'final_accuracy_distribution.png', 'nfl.png'):
    assert (output / name).read_bytes()[:8] == run_report_test.PNG
  assert not (output / 'epsilon.png').exists()


def test_labels_default_to_the_directory_names(tmp_path):
  run_report_test.write_run(tmp_path / 'fmnist_local', algorithm='local')
  result = _report(f'--run={tmp_path}/fmnist_local', f'--output={tmp_path}/out')
  assert result.returncode == 0, result.stderr
  assert '| fmnist_local | fmnist | local | 4 |' in (tmp_path / 'out' / 'report.md').read_text()


@pytest.mark.parametrize('args, error', [
    (['--output={tmp}/out'], '--run is required'),
    (['--run={tmp}/run'], '--output is required'),
    (['--run={tmp}', '--output={tmp}/out'],
     '{tmp}/metrics.csv does not exist: {tmp} is not a finished run'),
    (['--run={tmp}/run', '--label=a', '--label=b', '--output={tmp}/out'],
     '2 --label for 1 --run'),
    (['--run={tmp}/run', '--output={tmp}/run/summary.json/report'], 'Not a directory'),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, args, error):
  run_report_test.write_run(tmp_path / 'run')
  result = _report(*[a.format(tmp=tmp_path) for a in args])
  assert result.returncode == 2
  lines = result.stderr.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith('report.py: error: ')
  assert error.format(tmp=tmp_path) in lines[0]
