"""Federated EMNIST-62 (Caldas et al. 2018, LEAF) with the FedAvg CNN.

The data is TFF's `tff.simulation.datasets.emnist.load_data(only_digits=False)`:
3,400 writers, each with its own `all_train`/`all_test` split, read from
`<cache_dir>/emnist_all.sqlite`. That loader downloads the file when it is
missing; we refuse to (no network, no hanging) and say where to get it.

Also the image-classification helpers shared with `femnist`, `fmnist` and
`cifar100`: the EMNIST preprocessing and `classifier_spec`.

Preprocessing follows TFF's EMNIST baselines: x = `pixels` as [28, 28, 1]
float32, kept in TFF's convention (1.0 = background, 0.0 = ink); y = `label`
(int32). Training data is shuffled with a seed, repeated and batched;
evaluation data is only batched. The model is the CNN of McMahan et al. 2017
(`tff_personal.models.cnn`) with 62 logits, or Ditto's smaller one with
dropout (`TaskOptions.cnn`).
"""

import os
from typing import Callable, Sequence

import tensorflow as tf
import tensorflow_federated as tff

from tff_personal.models import cnn
from tff_personal.models import model_spec
from tff_personal.tasks import base
from tff_personal.tasks import options as task_options

EMNIST_FILENAME = 'emnist_all.sqlite'
EMNIST_URL = 'https://storage.googleapis.com/tff-datasets-public/emnist_all.sqlite.lzma'
EMNIST_NUM_CLASSES = 62
EMNIST_SHAPE = (28, 28, 1)


def require_cached_file(cache_dir: str, filename: str, url: str, task: str) -> str:
  """Returns `<cache_dir>/<filename>`; raises DataUnavailableError if missing.

  TFF's loaders download a missing file from `url`; callers check first so
  that a missing file is a clear error instead of a network access.
  """
  path = os.path.join(os.path.expanduser(cache_dir), filename)
  if not os.path.isfile(path):
    raise base.DataUnavailableError(
        f'Task {task} needs {path}, which is missing: download {url},'
        f' decompress it with `xz -d {os.path.basename(url)}`, and put'
        f' {filename} in the folder given by --cache_dir (now {cache_dir}).'
    )
  return path


def classifier_spec(
    build: Callable[[], tf.keras.Model],
    blocks: Sequence[Sequence[str]],
    input_shape: Sequence[int],
) -> model_spec.ModelSpec:
  """A `ModelSpec` for a logits classifier of images with int32 labels."""
  return model_spec.ModelSpec(
      build=build,
      blocks=tuple(tuple(block) for block in blocks),
      loss=lambda: tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
      metrics=lambda: [tf.keras.metrics.SparseCategoricalAccuracy()],
      input_spec=(
          tf.TensorSpec([None, *input_shape], tf.float32),
          tf.TensorSpec([None], tf.int32),
      ),
  )


# The CNNs of `TaskOptions.cnn` for EMNIST and FEMNIST.
CNN_SHAPES = {'fedavg': cnn.FEDAVG, 'ditto': cnn.DITTO_FEMNIST}


def cnn_spec(
    num_classes: int = EMNIST_NUM_CLASSES,
    input_shape: Sequence[int] = EMNIST_SHAPE,
    conv_filters: Sequence[int] = cnn.FEDAVG.conv_filters,
    dense_units: int = cnn.FEDAVG.dense_units,
    dropout_rates: Sequence[float] = (0.0, 0.0),
) -> model_spec.ModelSpec:
  """The CNN as a `ModelSpec` (defaults: FedAvg's EMNIST-62 model)."""
  return classifier_spec(
      build=lambda: cnn.build_cnn(
          num_classes, input_shape, conv_filters, dense_units, dropout_rates
      ),
      blocks=cnn.cnn_blocks(with_dropout=any(dropout_rates)),
      input_shape=input_shape,
  )


def emnist_cnn_spec(name: str) -> model_spec.ModelSpec:
  """The EMNIST-62 CNN named `name` in `CNN_SHAPES` (`TaskOptions.cnn`)."""
  if name not in CNN_SHAPES:
    raise ValueError(f'Unknown cnn {name!r}; allowed: {", ".join(CNN_SHAPES)}.')
  return cnn_spec(EMNIST_NUM_CLASSES, EMNIST_SHAPE, *CNN_SHAPES[name])


def emnist_element_to_xy(element):
  """TFF EMNIST element -> (x [28, 28, 1] float32, 1.0 = background; y int32)."""
  x = tf.reshape(tf.cast(element['pixels'], tf.float32), EMNIST_SHAPE)
  y = tf.cast(element['label'], tf.int32)
  return x, y


emnist_preprocess_train, emnist_preprocess_eval = base.example_preprocessing(
    emnist_element_to_xy
)


def emnist_task_from_cache_dir(name: str, cache_dir: str, cnn_name: str = 'fedavg') -> base.Task:
  """The EMNIST-62 task over `<cache_dir>/emnist_all.sqlite`, which must exist.

  `cnn_name` picks the model from `CNN_SHAPES`.
  """
  train, test = tff.simulation.datasets.emnist.load_data(
      only_digits=False, cache_dir=cache_dir
  )
  return base.Task(
      name=name,
      train_data=train,
      test_data=test,
      model=emnist_cnn_spec(cnn_name),
      preprocess_train=emnist_preprocess_train,
      preprocess_eval=emnist_preprocess_eval,
      default_personal_blocks=1,
  )


def build_emnist_task(options: task_options.TaskOptions) -> base.Task:
  """Federated EMNIST-62 from TFF's cached `emnist_all.sqlite`.

  Raises:
    base.DataUnavailableError: if `<options.cache_dir>/emnist_all.sqlite` is
      missing (we never download).
  """
  cache_dir = os.path.expanduser(options.cache_dir)
  require_cached_file(cache_dir, EMNIST_FILENAME, EMNIST_URL, 'emnist')
  return emnist_task_from_cache_dir('emnist', cache_dir, options.cnn)
