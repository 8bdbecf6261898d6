"""bin/demo.py: trains the algorithms, prints the comparison table, writes the PNG."""

import os
import re
import subprocess

from tests.bin import binaries
from tests.bin.train_test import run_main

demo = binaries.load('demo')
DEMO_FLAGS = os.path.join(binaries.REPO_ROOT, 'configs', 'demo_fmnist.flags')


def test_make_demo_runs_the_demo_flagfile():
  dry_run = subprocess.run(
      ['make', '--no-print-directory', '-n', '-o', 'setup', 'demo'],
      cwd=binaries.REPO_ROOT, capture_output=True, text=True, check=True,
  )
  assert dry_run.stdout.split()[-2:] == ['bin/demo.py', '--flagfile=configs/demo_fmnist.flags']
  with open(DEMO_FLAGS) as f:
    flags_text = f.read()
  for line in ('--task=fmnist', '--partition=k_classes', '--classes_per_client=2'):
    assert line in flags_text.splitlines()


def test_demo_prints_the_table_and_writes_the_figure(capsys, tmp_path):
  run_main(
      [f'--flagfile={DEMO_FLAGS}', f'--root_output_dir={tmp_path}', '--population=4',
       '--clients_per_round=2', '--total_rounds=2', '--demo_algorithms=fedavg,ditto'],
      binary=demo,
  )
  out = capsys.readouterr().out
  assert 'Task fmnist: 4 clients with 2 classes each, 2 a round, 2 rounds.' in out
  assert 'Mean per-client test accuracy after 2 rounds (4 clients;' in out
  rows = {
      m.group(1): m for m in re.finditer(
          r'^(fedavg|ditto) +([0-9.]+) +[0-9.]+ +[0-9.]+ +[0-9.]+ +(?:([+-][0-9.]+) pts)? +(\S+)$',
          out, re.MULTILINE,
      )
  }
  assert set(rows) == {'fedavg', 'ditto'}, out
  gain = 100 * (float(rows['ditto'].group(2)) - float(rows['fedavg'].group(2)))
  assert abs(float(rows['ditto'].group(3)) - gain) <= 0.1 + 1e-9
  assert rows['fedavg'].group(3) is None
  assert rows['ditto'].group(4) == f'{tmp_path}/fmnist_ditto_seed0'
  with open(tmp_path / 'demo.png', 'rb') as f:
    assert f.read(8) == b'\x89PNG\r\n\x1a\n'
  assert f'Figure: {tmp_path}/demo.png' in out


def test_unknown_demo_algorithm_is_one_line_and_exit_code_2(capsys, tmp_path):
  try:
    run_main([f'--root_output_dir={tmp_path}', '--demo_algorithms=fedavg,fedsgd'], binary=demo)
  except SystemExit as e:
    assert e.code == 2
  else:
    raise AssertionError('expected SystemExit')
  err = capsys.readouterr().err.strip()
  assert err.count('\n') == 0 and '--demo_algorithms: unknown fedsgd' in err
