"""No TFF worker process outlives the run that started it, however it ends."""

import os
import signal
import subprocess
import sys
import time

import pytest

_CHILD = os.path.join(os.path.dirname(__file__), 'context_child.py')
_REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def children_of(pid: int) -> set[int]:
  children = set()
  for task in os.listdir(f'/proc/{pid}/task'):
    with open(f'/proc/{pid}/task/{task}/children') as f:
      children.update(int(p) for p in f.read().split())
  return children


def is_running(pid: int) -> bool:
  """True unless the process is gone or a zombie (dead, not yet reaped)."""
  try:
    with open(f'/proc/{pid}/stat') as f:
      state = f.read().rsplit(')', 1)[1].split()[0]
  except FileNotFoundError:
    return False
  return state not in ('Z', 'X')


def command_name(pid: int) -> str:
  with open(f'/proc/{pid}/comm') as f:
    return f.read().strip()


def start_run(mode: str) -> tuple[subprocess.Popen, int, set[int]]:
  env = dict(os.environ, PYTHONPATH=_REPO_ROOT)
  run = subprocess.Popen(
      [sys.executable, _CHILD, mode],
      # Modes exit and raise end only once stdin closes (communicate() below):
      # until then the worker is certainly alive for the checks.
      stdin=subprocess.PIPE,
      stdout=subprocess.PIPE,
      stderr=subprocess.PIPE,
      env=env,
      text=True,
      # A foreground run: SIGINT raises KeyboardInterrupt even if the test
      # runner was started in the background (which ignores SIGINT).
      preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
  )
  line = run.stdout.readline()
  assert line.startswith('READY'), (line, run.stderr.read())
  worker_pid = int(line.split()[1])
  children = children_of(run.pid)
  return run, worker_pid, children


def wait_until_gone(pids, timeout=20.0) -> set[int]:
  deadline = time.monotonic() + timeout
  while time.monotonic() < deadline:
    alive = {p for p in pids if is_running(p)}
    if not alive:
      return alive
    time.sleep(0.1)
  return alive


@pytest.mark.parametrize(
    'mode, signum, expected_returncode',
    [
        ('exit', None, 0),
        ('here', None, 0),
        ('raise', None, 1),
        ('wait', signal.SIGINT, None),
        ('wait', signal.SIGTERM, 128 + signal.SIGTERM),
        ('wait', signal.SIGKILL, -signal.SIGKILL),
    ],
    ids=['normal_exit', 'started_on_demand', 'exception', 'sigint', 'sigterm', 'sigkill'],
)
def test_no_worker_survives_the_run(mode, signum, expected_returncode):
  run, worker_pid, children = start_run(mode)
  assert worker_pid in children
  assert command_name(worker_pid) == 'worker_binary'
  if signum is not None:
    run.send_signal(signum)
  # communicate() returns only when nobody holds the run's stdout/stderr open.
  _, stderr = run.communicate(timeout=60)
  if expected_returncode is not None:
    assert run.returncode == expected_returncode, stderr
  else:  # KeyboardInterrupt: Python exits by SIGINT or with code 130/1.
    assert run.returncode in (-signal.SIGINT, 130, 1), stderr
  assert wait_until_gone(children) == set()


@pytest.mark.parametrize(
    'signum, expected_returncodes',
    [(signal.SIGTERM, (128 + signal.SIGTERM,)), (signal.SIGINT, (-signal.SIGINT, 130, 1))],
    ids=['sigterm', 'sigint'],
)
def test_a_signal_landing_in_a_destructor_still_ends_the_loop(signum, expected_returncodes):
  """Python ignores an exception raised in __del__; the loop must still end."""
  run, _, children = start_run('swallow')
  time.sleep(0.3)
  run.send_signal(signum)
  _, stderr = run.communicate(timeout=60)
  assert 'Exception ignored' in stderr  # The handler's exception was swallowed...
  assert run.returncode in expected_returncodes, stderr  # ...and the run ended anyway.
  if signum == signal.SIGINT:
    assert 'KeyboardInterrupt' in stderr
  assert wait_until_gone(children) == set()
