"""The documentation: current flag reference, working links, no project diary."""

import os
import re
import subprocess
import sys

import pytest

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The parts the users read; the words are split so that this file does not match.
USER_FACING = ('tff_personal', 'bin', 'tests', 'docs', 'configs', 'tools', 'README.md', 'Makefile')
HISTORY = re.compile(
    '(sess' + r'ions? [0-9]|iss' + r'ues? #?[0-9]|iss' + r"ue's|comm" + r'it [0-9a-f]{7})',
    re.IGNORECASE,
)
MARKDOWN_LINK = re.compile(r'\]\(([^)#\s]+)(#[^)]*)?\)')


def _text_files():
  for top in USER_FACING:
    path = os.path.join(REPO_ROOT, top)
    if os.path.isfile(path):
      yield path
    for directory, subdirectories, files in os.walk(path):
      subdirectories[:] = [d for d in subdirectories if d != '__pycache__']
      for name in files:
        if name.endswith(('.py', '.md', '.flags', '.sh', '.txt', 'BUILD')):
          yield os.path.join(directory, name)


def test_flag_reference_is_current():
  run = subprocess.run(
      [sys.executable, os.path.join(REPO_ROOT, 'tools', 'flags_reference.py'), '--check'],
      capture_output=True, text=True, timeout=600,
  )
  assert run.returncode == 0, run.stderr


def test_no_file_speaks_of_the_projects_history():
  found = []
  for path in _text_files():
    with open(path, encoding='utf-8') as f:
      for number, line in enumerate(f, 1):
        if HISTORY.search(line):
          found.append(f'{os.path.relpath(path, REPO_ROOT)}:{number}: {line.strip()}')
  assert not found, '\n'.join(found)


def test_readme_is_a_short_product_page():
  with open(os.path.join(REPO_ROOT, 'README.md')) as f:
    assert len(f.readlines()) <= 160


@pytest.mark.parametrize(
    'page',
    ['README.md'] + sorted(
        os.path.relpath(os.path.join(d, n), REPO_ROOT)
        for d, _, names in os.walk(os.path.join(REPO_ROOT, 'docs')) for n in names
        if n.endswith('.md')
    ),
)
def test_relative_links_lead_to_files(page):
  path = os.path.join(REPO_ROOT, page)
  with open(path) as f:
    targets = [m.group(1) for m in MARKDOWN_LINK.finditer(f.read())]
  missing = [
      t for t in targets
      if '://' not in t and not t.startswith('mailto:')
      and not os.path.exists(os.path.normpath(os.path.join(os.path.dirname(path), t)))
  ]
  assert not missing, f'{page}: {missing}'
