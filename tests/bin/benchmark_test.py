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
          '--algorithms=fedavg,ditto', '--stored_clients=10,30', '--client_steps=2',
      ],
      capture_output=True, text=True, timeout=600, check=True,
      env=dict(os.environ, PYTHONPATH=binaries.REPO_ROOT),
  )
  out = run.stdout
  assert out.startswith('femnist: 2 clients a round, 2 steps, batch 20;')
  assert re.search(
      r'compute floor \(plain TF, a process without TFF, fastest variant\): [\d.]+ s a round,'
      r' 4 SGD steps \(sequential, default threads [\d.]+ s; parallel, default threads'
      r' [\d.]+ s; parallel, 1 thread an op, \d+ ops at once [\d.]+ s; threads, default'
      r' threads [\d.]+ s; threads, 1 thread an op, \d+ ops at once [\d.]+ s\)', out)
  number = r'[\d.]+'
  def row(label, cells):
    return re.search(rf'^\| {label} \|{cells}$', out, re.MULTILINE)

  assert row(r'compute floor \(before the pairs\)', rf' {number} \| 1.00 \| \| 1.00 \|( \|){{7}}')
  # Seconds, paired ratio, CPU-seconds, CPU ratio; then 2 composed and 5 store cells.
  assert row('stock tff.learning FedAvg', rf'( {number} \|){{6}}( \|){{5}}')
  assert row('stock, DATASET_ITERATOR loops', rf'( {number} \|){{4}}( \|){{7}}')
  assert row('stock, tf.data autotuning on', rf'( {number} \|){{4}}( \|){{7}}')
  # FedAvg has no personal state, so no store.
  assert row('ours: fedavg', rf'( {number} \|){{6}}( \|){{5}}')
  # Then the store: seconds, ratios to the rounds without it (wall, CPU),
  # share of the round in its calls, the store's share of the round's CPU.
  assert row('ours: ditto', rf'( {number} \|){{9}} {number}% \| {number}% \|')
  floors = re.findall(r'^(\w+): .* its floor \((\d) floor passes; CPU', out, re.MULTILINE)
  assert floors == [('fedavg', '1'), ('ditto', '2')]
  transport = re.findall(
      r'^(\w+): .* personal states into the runtime and back ([\d.]+) s', out, re.MULTILINE
  )
  assert [name for name, _ in transport] == ['fedavg', 'ditto']
  assert float(transport[0][1]) == 0.0 and float(transport[1][1]) > 0.0  # FedAvg has no P.
  # The last column, memory a round adds, can read slightly below 0: the
  # kernel's resident-size counters lag a little behind the reset peak.
  assert re.search(r'\| 10 \| \d+ \| [\d.]+ \| [\d.]+ \| -?[\d.]+ \|', out)
  assert re.search(r'\| 30 \| \d+ \| [\d.]+ \| [\d.]+ \| -?[\d.]+ \|', out)
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
