"""Task names and their builders; the registry imports the tasks, never the reverse."""

import dataclasses
import os
from typing import TYPE_CHECKING, Callable

from tff_personal.tasks import options as task_options

if TYPE_CHECKING:  # The registry itself imports no TensorFlow (fast flag checks).
  from tff_personal.tasks import base


def _builders() -> dict[str, Callable[[task_options.TaskOptions], 'base.Task']]:
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
def build_task(name: str, options: task_options.TaskOptions) -> 'base.Task':
  """Builds the task `name`; raises `base.DataUnavailableError` if data is missing."""
  builders = _builders()
  if name not in builders:
    raise ValueError(f'Unknown task {name!r}; allowed: {", ".join(TASK_NAMES)}.')
  options = dataclasses.replace(
      options, cache_dir=os.path.expanduser(options.cache_dir)
  )
  return builders[name](options)
