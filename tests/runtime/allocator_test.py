"""The program's process runs with the malloc settings; TensorFlow's processes do not."""

import json
import os
import subprocess
import sys

from tff_personal.runtime import allocator

_CHILD = os.path.join(os.path.dirname(__file__), 'allocator_child.py')
_REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_OURS = allocator.PROGRAM_SETTINGS
_NONE = {name: None for name in _OURS}


def run_child(*args, **extra_env) -> tuple[dict, int]:
  """Runs allocator_child.py; returns its report and the pid it was started as."""
  env = {
      k: v for k, v in os.environ.items()
      if k not in _OURS and not k.startswith('TFF_PERSONAL_')
  }
  env.update(PYTHONPATH=_REPO_ROOT, **extra_env)
  child = subprocess.Popen(
      [sys.executable, _CHILD, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
      env=env, text=True,
  )
  stdout, stderr = child.communicate(timeout=300)
  assert child.returncode == 0, stderr[-3000:]
  return json.loads(stdout.strip().splitlines()[-1]), child.pid


def test_the_program_reexecutes_itself_with_the_settings_and_the_worker_runs_without():
  report, started_pid = run_child('worker', '--flag=a b')
  assert report['env'] == _OURS
  assert report['args'] == ['worker', '--flag=a b']
  assert report['pid'] == started_pid  # The same process, re-executed once.
  assert report['worker_env'] == _NONE


def test_a_setting_the_user_made_is_kept_and_passed_on():
  report, _ = run_child('x', MALLOC_ARENA_MAX='4')
  assert report['env'] == dict(_OURS, MALLOC_ARENA_MAX='4')
  user_env = {'MALLOC_ARENA_MAX': '4', 'OTHER': 'y'}
  added = {name: value for name, value in _OURS.items() if name != 'MALLOC_ARENA_MAX'}
  environ = dict(user_env, **added, TFF_PERSONAL_MALLOC_ADDED=','.join(added))
  assert allocator.child_environment(environ) == user_env


def test_opting_out_keeps_glibcs_defaults():
  report, _ = run_child('x', TFF_PERSONAL_SYSTEM_MALLOC='1')
  assert report['env'] == _NONE


def test_child_environment_without_the_reexecution_is_the_environment():
  environ = {'MALLOC_ARENA_MAX': '1', 'PATH': '/bin'}
  assert allocator.child_environment(environ) == environ
