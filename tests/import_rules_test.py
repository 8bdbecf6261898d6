"""The library's parts and the directions they may import each other in.

Read from the imports themselves (every `import` and `from ... import` in
tff_personal/, at any depth of a module), so that a new import that breaks
the layering fails here rather than in a reader's head.
"""

import ast
import collections
import os

import pytest

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = 'tff_personal'
# From the bottom up; a part imports only parts of lower layers.
LAYERS = (
    ('runtime', 'privacy'),  # TFF's execution context, DP accounting
    ('training',),  # client SGD in TensorFlow
    ('models', 'attacks', 'aggregators'),  # models and TF maths
    ('tasks', 'evaluation'),  # data, per-client evaluation
    ('personal',),  # the process template, its composer, the state store
    ('nfl',),  # the NFL detector, an extension of any composed process
    ('algorithms',),
    ('program',),  # the training program
    ('reports',),  # tables, figures, export: read what the program wrote
)
LAYER_OF = {part: level for level, parts in enumerate(LAYERS) for part in parts}


def _imports():
  """{(importing module, imported module)} of tff_personal's own modules."""
  found = set()
  root = os.path.join(REPO_ROOT, PACKAGE)
  for directory, _, files in os.walk(root):
    for name in files:
      if not name.endswith('.py'):
        continue
      path = os.path.join(directory, name)
      module = os.path.relpath(path, REPO_ROOT)[:-3].replace(os.sep, '.')
      with open(path) as f:
        tree = ast.parse(f.read())
      for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
          targets = [node.module] + [f'{node.module}.{a.name}' for a in node.names]
        elif isinstance(node, ast.Import):
          targets = [a.name for a in node.names]
        else:
          continue
        for target in targets:
          found.add((module, target))
  return found


IMPORTS = _imports()


def _part(module: str):
  parts = module.split('.')
  return parts[1] if len(parts) > 2 and parts[0] == PACKAGE else None


def test_every_part_has_a_layer():
  parts = {
      name for name in os.listdir(os.path.join(REPO_ROOT, PACKAGE))
      if os.path.isfile(os.path.join(REPO_ROOT, PACKAGE, name, '__init__.py'))
  }
  assert parts == set(LAYER_OF)


def test_parts_import_only_lower_layers():
  wrong = sorted(
      f'{module} imports {target}'
      for module, target in IMPORTS
      if _part(module) and _part(target) in LAYER_OF and _part(target) != _part(module)
      and LAYER_OF[_part(target)] >= LAYER_OF[_part(module)]
  )
  assert not wrong, '\n'.join(wrong)


def test_no_cycle_between_modules():
  graph = collections.defaultdict(set)
  modules = {m for m, _ in IMPORTS}
  for module, target in IMPORTS:
    if target in modules and target != module:
      graph[module].add(target)
  visiting, done = set(), set()

  def visit(module, path):
    if module in done:
      return
    assert module not in visiting, ' -> '.join(path + [module])
    visiting.add(module)
    for target in sorted(graph[module]):
      visit(target, path + [module])
    visiting.discard(module)
    done.add(module)

  for module in sorted(graph):
    visit(module, [])


@pytest.mark.parametrize('task_module', [
    'cifar100', 'emnist', 'femnist', 'fmnist', 'shakespeare', 'stackoverflow', 'base',
])
def test_tasks_do_not_import_their_registry(task_module):
  module = f'{PACKAGE}.tasks.{task_module}'
  assert (module, f'{PACKAGE}.tasks.registry') not in IMPORTS


def test_model_spec_lives_with_the_models():
  assert not any(
      t.startswith(f'{PACKAGE}.tasks') for m, t in IMPORTS if _part(m) == 'models'
  )


def test_flags_are_defined_only_under_bin():
  """The library takes plain values; absl flags live in bin/ (experiment_flags)."""
  assert not sorted(m for m, t in IMPORTS if t == 'absl.flags')


# TFF's execution context is one per process; this module is its one owner.
PROCESS_STATE_OWNERS = ('context.py',)


def test_no_library_function_rebinds_module_state():
  """No `global` statement (but in the execution context's owner): nothing in
  the library depends on which function ran first."""
  found = []
  for directory, _, files in os.walk(os.path.join(REPO_ROOT, PACKAGE)):
    for name in files:
      if name.endswith('.py') and name not in PROCESS_STATE_OWNERS:
        with open(os.path.join(directory, name)) as f:
          tree = ast.parse(f.read())
        found += [f'{name}:{n.lineno}' for n in ast.walk(tree) if isinstance(n, ast.Global)]
  assert not found
