"""Task names and the options that select and shape their data."""

import dataclasses
import os
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:  # The registry itself imports no TensorFlow (fast flag checks).
  from tff_personal.tasks import base

_REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEFAULT_FEMNIST_PATH = os.path.join(_REPO_ROOT, '..', 'shared', 'data', 'femnist105.npz')
DEFAULT_FMNIST_DIR = '/usr/share/datasets/fashion-mnist'
DEFAULT_CACHE_DIR = os.path.join('~', '.tff')


@dataclasses.dataclass(frozen=True)
class TaskOptions:
  """Everything that selects a task's data, besides its name.

  Attributes:
    seed: seeds synthetic partitions and train/test splits of natural clients.
    cache_dir: TFF's dataset cache (`<cache_dir>/<name>.sqlite`); tasks built
      from offline sources write their SQLite files under
      `<cache_dir>/tff_personal/`.
    data_dir: folder of idx files for `fmnist`/`mnist`.
    femnist_path: the FEMNIST sample (`femnist105.npz`).
    partition: synthetic partition of `fmnist`/`mnist`: `k_classes`
      (FedPer), `ditto` (many devices, few classes, log-normal sizes) or
      `dirichlet` (label skew).
    num_clients: clients of a synthetic partition.
    classes_per_client: k of `k_classes`, classes per device of `ditto`.
    dirichlet_alpha: concentration of `dirichlet`.
    test_fraction: share of each client's examples kept as its own test split
      where the source has no per-client test split.
    stackoverflow_task: `word` (next-word prediction) or `tag`.
    stackoverflow_vocab_source: `auto` (TFF's count files when cached, else
      counted from the training clients), `count_files` or `clients`.
    sequence_length: tokens per example for text tasks (0 = task default).
  """

  seed: int = 0
  cache_dir: str = DEFAULT_CACHE_DIR
  data_dir: str = DEFAULT_FMNIST_DIR
  femnist_path: str = DEFAULT_FEMNIST_PATH
  partition: str = 'k_classes'
  num_clients: int = 10
  classes_per_client: int = 2
  dirichlet_alpha: float = 0.5
  test_fraction: float = 0.2
  stackoverflow_task: str = 'word'
  stackoverflow_vocab_source: str = 'auto'
  sequence_length: int = 0


def _builders() -> dict[str, Callable[[TaskOptions], 'base.Task']]:
  # Imported here so that importing the registry stays cheap.
  from tff_personal.tasks import cifar100
  from tff_personal.tasks import emnist
  from tff_personal.tasks import femnist
  from tff_personal.tasks import fmnist
  from tff_personal.tasks import shakespeare
  from tff_personal.tasks import stackoverflow

  return {
      'femnist': femnist.build_femnist_task,
      'shakespeare': shakespeare.build_shakespeare_task,
      'emnist': emnist.build_emnist_task,
      'stackoverflow': stackoverflow.build_stackoverflow_task,
      'cifar100': cifar100.build_cifar100_task,
      'fmnist': fmnist.build_fmnist_task,
      'mnist': fmnist.build_mnist_task,
  }


TASK_NAMES = (
    'femnist', 'shakespeare', 'emnist', 'stackoverflow', 'cifar100', 'fmnist', 'mnist'
)
PARTITIONS = ('k_classes', 'ditto', 'dirichlet')
STACKOVERFLOW_TASKS = ('word', 'tag')
STACKOVERFLOW_VOCAB_SOURCES = ('auto', 'count_files', 'clients')


def build_task(name: str, options: TaskOptions) -> 'base.Task':
  """Builds the task `name`; raises `base.DataUnavailableError` if data is missing."""
  builders = _builders()
  if name not in builders:
    raise ValueError(f'Unknown task {name!r}; allowed: {", ".join(TASK_NAMES)}.')
  options = dataclasses.replace(
      options, cache_dir=os.path.expanduser(options.cache_dir)
  )
  return builders[name](options)
