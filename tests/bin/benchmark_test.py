"""bin/benchmark.py runs end to end (its times are printed, never asserted)."""

import os
import re
import subprocess
import sys

from tests.bin import binaries


def test_benchmark_prints_every_ratio(tmp_path):
  run = subprocess.run(
      [
          sys.executable, os.path.join(binaries.REPO_ROOT, 'bin', 'benchmark.py'),
          f'--cache_dir={tmp_path}', '--clients_per_round=2', '--rounds=1',
          '--algorithms=fedavg,ditto', '--stored_clients=10,30',
      ],
      capture_output=True, text=True, timeout=600, check=True,
      env=dict(os.environ, PYTHONPATH=binaries.REPO_ROOT),
  )
  out = run.stdout
  assert re.search(r'compute floor \(plain TF, one tf.function\): [\d.]+ s a round, \d+ SGD steps', out)
  assert re.search(r'\| stock tff.learning FedAvg \| [\d.]+ \| [\d.]+ \| [\d.]+ \| \|', out)
  assert re.search(r'\| ours: fedavg \| [\d.]+ \| [\d.]+ \| [\d.]+ \| 0.0% \|', out)
  floors = re.findall(r'\| ours: (\w+) \| [\d.]+ \| ([\d.]+) \|', out)
  assert [name for name, _ in floors] == ['fedavg', 'ditto']
  assert abs(float(floors[1][1]) - 2 * float(floors[0][1])) <= 0.002  # Two passes, rounded.
  assert re.search(r'\| 10 \| \d+ \| [\d.]+ \| [\d.]+ \| \d+ \|', out)
  assert re.search(r'\| 30 \| \d+ \| [\d.]+ \| [\d.]+ \| \d+ \|', out)
  assert 'start-up: importing TensorFlow and TFF' in out


def test_unknown_algorithm_is_an_error():
  run = subprocess.run(
      [sys.executable, os.path.join(binaries.REPO_ROOT, 'bin', 'benchmark.py'),
       '--algorithms=fedavg,fedsgd'],
      capture_output=True, text=True, timeout=600,
      env=dict(os.environ, PYTHONPATH=binaries.REPO_ROOT),
  )
  assert run.returncode == 1
  assert run.stderr.strip().splitlines()[-1] == 'benchmark.py: error: --algorithms: unknown fedsgd'
