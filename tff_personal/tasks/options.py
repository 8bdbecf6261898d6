"""The options that select and shape a task's data (no TensorFlow: fast flag checks)."""

import dataclasses
import os

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
    cnn: the CNN of `emnist` and `femnist`: `fedavg` (McMahan et al. 2017,
      1.7M parameters) or `ditto` (Ditto's code's FEMNIST CNN: 16 and 32
      channels, 128 units, dropout 0.25 and 0.5; 0.2M parameters).
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
  cnn: str = 'fedavg'


PARTITIONS = ('k_classes', 'ditto', 'ditto_code', 'dirichlet')
STACKOVERFLOW_TASKS = ('word', 'tag')
STACKOVERFLOW_VOCAB_SOURCES = ('auto', 'count_files', 'clients')
CNNS = ('fedavg', 'ditto')
CNN_TASKS = ('emnist', 'femnist')
