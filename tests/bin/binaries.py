"""Loads bin/*.py scripts as modules (bin/ is not a package)."""

import importlib.util
import os

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def load(name: str):
  path = os.path.join(REPO_ROOT, 'bin', f'{name}.py')
  spec = importlib.util.spec_from_file_location(f'bin_{name}', path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module
