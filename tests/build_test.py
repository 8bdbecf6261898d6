"""Bazel: the BUILD files are current and list a target for every Python file."""

import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, 'tools'))
import update_build  # pylint: disable=g-import-not-at-top,wrong-import-position


def test_build_files_are_up_to_date():
  assert update_build.main(['--check']) == 0


@pytest.mark.skipif(shutil.which('bazel') is None, reason='bazel-bootstrap not installed')
def test_bazel_query_lists_every_module_binary_and_test(tmp_path):
  result = subprocess.run(
      ['bazel', f'--output_user_root={tmp_path}', '--batch', 'query', '//...',
       '--output=label_kind'],
      cwd=ROOT, capture_output=True, text=True, timeout=600, check=True,
  )
  kinds = dict(reversed(line.rsplit(' ', 1)) for line in result.stdout.splitlines())
  expected = {}
  for path in update_build.python_files():
    if path.startswith('bin/') and update_build.is_program(path):
      kind = 'py_binary rule'
    elif path.endswith('_test.py'):
      kind = 'py_test rule'
    else:
      kind = 'py_library rule'
    expected[update_build.label_of(path)] = kind
  expected['//configs:configs'] = 'filegroup rule'
  assert kinds == expected
  assert kinds['//bin:train'] == 'py_binary rule'
  assert kinds['//bin:experiment_flags'] == 'py_library rule'
  assert kinds['//tests/program:training_loop_test'] == 'py_test rule'
