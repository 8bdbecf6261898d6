"""bin/worker.py and bin/train.py --workers: same results as a local run.

Two workers on localhost, one round's clients spread over both by TFF's
mergeable computation context. A worker that dies mid-run gives a one-line
error (exit 1) and leaves the checkpoints usable: the run resumes on the
local runtime to the uninterrupted results.
"""

import csv
import os
import signal
import sqlite3
import subprocess
import sys
import time

import portpicker
import pytest

from tests.bin import binaries

_ENV = dict(os.environ, PYTHONPATH=binaries.REPO_ROOT)
_RUN = [
    '--task=femnist', '--clients_per_round=3', '--eval_clients=6', '--client_batch_size=20',
    '--client_learning_rate=0.05', '--rounds_per_eval=3', '--rounds_per_checkpoint=1',
    '--total_rounds=3',
]


def start_worker() -> tuple[subprocess.Popen, str]:
  port = portpicker.pick_unused_port()
  worker = subprocess.Popen(
      [sys.executable, os.path.join(binaries.REPO_ROOT, 'bin', 'worker.py'), f'--port={port}'],
      stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=_ENV,
  )
  line = worker.stdout.readline()
  assert f'serving on port {port}' in line, line
  return worker, f'localhost:{port}'


def stop_worker(worker: subprocess.Popen) -> None:
  worker.send_signal(signal.SIGTERM)
  assert worker.wait(timeout=30) == 0  # A clean stop.


def train(args, tmp_path, **kwargs) -> subprocess.CompletedProcess:
  return subprocess.run(
      [sys.executable, os.path.join(binaries.REPO_ROOT, 'bin', 'train.py')]
      + _RUN + [f'--cache_dir={tmp_path}/cache', f'--root_output_dir={tmp_path}'] + args,
      capture_output=True, text=True, env=_ENV, timeout=600, **kwargs,
  )


def results(tmp_path, name) -> dict[str, list[dict[str, str]]]:
  """The run's round metrics and per-client evaluation, without timings."""
  tables = {}
  for filename in ('metrics.csv', 'eval_per_client.csv'):
    with open(os.path.join(tmp_path, name, filename)) as f:
      rows = list(csv.DictReader(f))
    tables[filename] = [{k: v for k, v in r.items() if 'seconds' not in k} for r in rows]
  return tables


@pytest.fixture(scope='module')
def local_results(tmp_path_factory):
  """The local runtime's results of an algorithm (one run each, shared)."""
  root, cache = tmp_path_factory.mktemp('local'), {}

  def get(algorithm, args=()):
    key = (algorithm,) + tuple(args)
    if key not in cache:
      path = root / '_'.join(key).replace('-', '').replace('=', '')
      train([f'--algorithm={algorithm}', '--experiment_name=local', *args], path, check=True)
      cache[key] = results(path, 'local')
    return cache[key]

  return get


@pytest.fixture(scope='module')
def workers():
  started = [start_worker(), start_worker()]
  yield [address for _, address in started]
  for worker, _ in started:
    if worker.poll() is None:
      stop_worker(worker)


@pytest.mark.parametrize('algorithm, args, remote_args', [
    ('fedavg', [], []),
    ('ditto', [], []),
    # 3 clients a worker: the split round's server phase runs on this
    # machine's worker, so the updates are summed in the local order.
    ('ditto', ['--clients_per_round=6'], []),
    ('ditto', [], ['--nosplit_rounds']),  # `next`, through TFF's mergeable form.
], ids=['fedavg', 'ditto', 'ditto_3_clients_a_worker', 'ditto_next'])
def test_two_workers_give_the_local_results(algorithm, args, remote_args, workers, local_results,
                                            tmp_path):
  remote = train(
      [f'--algorithm={algorithm}', '--experiment_name=remote', f'--workers={",".join(workers)}',
       *args, *remote_args],
      tmp_path, check=True,
  )
  assert 'round 3/3' in remote.stdout
  remote_results = results(tmp_path, 'remote')
  assert len(remote_results['eval_per_client.csv']) == 6
  assert remote_results == local_results(algorithm, args)


def test_unreachable_worker_is_a_usage_error(tmp_path):
  port = portpicker.pick_unused_port()
  run = train(['--algorithm=fedavg', f'--workers=localhost:{port}'], tmp_path)
  assert run.returncode == 2
  assert run.stderr.strip().splitlines()[-1] == (
      f'train.py: error: --workers=localhost:{port}: No TFF worker answers at'
      f' localhost:{port} within 30 s; start one there with bin/worker.py --port={port}.'
  )
  bad = train(['--algorithm=fedavg', '--workers=localhost'], tmp_path)
  assert bad.returncode == 2
  assert "'localhost' is not host:port" in bad.stderr


_CHECK_READ = """
import sys
import numpy as np
import tensorflow as tf
from tff_personal.runtime import context

context.install_remote_context([sys.argv[1]])
readable = tf.data.Dataset.from_tensor_slices(np.arange(3))
context.check_workers_read([readable])
for path in sys.argv[2:]:
  unreadable = tf.data.experimental.SqlDataset(
      'sqlite', path, 'SELECT label FROM examples', (tf.int64,))
  try:
    context.check_workers_read([readable, unreadable])
  except context.WorkerDataError as e:
    print(e)
"""


def test_a_worker_that_cannot_read_the_data_is_named(tmp_path):
  """A worker without the files a dataset's graph names (README, "Data on
  the workers"): an empty database, then a missing one, which kills TFF's
  worker. bin/train.py turns these errors into a one-line exit 2."""
  empty = tmp_path / 'empty.sqlite'
  sqlite3.connect(empty).close()
  worker, address = start_worker()
  try:
    run = subprocess.run(
        [sys.executable, '-c', _CHECK_READ, address, str(empty), str(tmp_path / 'absent' / 'x')],
        capture_output=True, text=True, env=_ENV, timeout=300, check=True,
    )
  finally:
    if worker.poll() is None:
      stop_worker(worker)
  assert run.stdout.strip().splitlines() == [
      f"the TFF worker at {address} cannot read the task's data: Failed to run computation:"
      ' Prepare() failed: [1] no such table: examples: SELECT label FROM examples.',
      f"the TFF worker at {address} stopped while reading the task's data (it does where a"
      ' database file is missing).',
  ], run.stdout


def test_a_worker_dying_mid_run_leaves_a_resumable_checkpoint(local_results, tmp_path):
  first, first_address = start_worker()
  second, second_address = start_worker()
  try:
    run = subprocess.Popen(
        [sys.executable, os.path.join(binaries.REPO_ROOT, 'bin', 'train.py')] + _RUN + [
            f'--cache_dir={tmp_path}/cache', f'--root_output_dir={tmp_path}',
            '--algorithm=ditto', '--experiment_name=run',
            f'--workers={first_address},{second_address}',
        ],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_ENV,
    )
    for line in run.stdout:
      if line.startswith('round 2/3'):  # Round 2 is checkpointed.
        second.kill()
        break
    started = time.monotonic()
    assert run.wait(timeout=120) == 1
    assert time.monotonic() - started < 60
    error = run.stderr.read().strip().splitlines()[-1]
    assert error.startswith(f'train.py: error: Lost the TFF worker at {second_address}')
    assert 'checkpoints in' in error and 'are intact' in error
  finally:
    for worker in (first, second):
      if worker.poll() is None:
        stop_worker(worker)

  resumed = train(['--algorithm=ditto', '--experiment_name=run'], tmp_path, check=True)
  assert 'after round 2' in resumed.stdout
  assert results(tmp_path, 'run') == local_results('ditto')
