"""Federated CIFAR-100 (Reddi et al. 2021) with a small GroupNorm ResNet.

The data is TFF's `tff.simulation.datasets.cifar100.load_data`, read from
`<cache_dir>/cifar100.sqlite` (features `image` [32, 32, 3], fine `label`,
`coarse_label`): 500 training clients of 100 examples, drawn by a Pachinko
allocation over the labels. TFF's `test` split holds 100 *other* clients, so
for personalization every training client's examples are split into its own
train and test sets (`test_fraction`, seeded, the same split in every run
and in graph mode). TFF's test clients are not used.

Preprocessing: x = image / 255 as float32 [32, 32, 3], y = fine label (int32);
no random augmentation, so runs are reproducible. Model: ResNet-8 with
GroupNorm (`tff_personal.models.resnet`), 100 logits.
"""

import functools
import os

import tensorflow as tf
import tensorflow_federated as tff

from tff_personal.models import model_spec
from tff_personal.models import resnet
from tff_personal.tasks import base
from tff_personal.tasks import emnist
from tff_personal.tasks import options as task_options

CIFAR100_FILENAME = 'cifar100.sqlite'
CIFAR100_URL = 'https://storage.googleapis.com/tff-datasets-public/cifar100.sqlite.lzma'
CIFAR100_NUM_CLASSES = 100
CIFAR100_SHAPE = (32, 32, 3)


def _client_split(
    client_data: base.ClientData, client_id, test_fraction: float, seed: int, test: bool
) -> tf.data.Dataset:
  """The train (`test=False`) or test part of one client's examples.

  Example i of a client of n examples goes to test when its rank under a
  stateless random permutation, seeded by `seed` and a fingerprint of the
  client id, is below round(n * test_fraction), clamped to [1, n - 1] when
  n >= 2. Pure TF, so it also works on a client id tensor inside a graph.
  """
  dataset = client_data.serializable_dataset_fn(client_id)
  n = dataset.reduce(tf.constant(0, tf.int64), lambda count, _: count + 1)
  n_test = tf.cast(tf.round(tf.cast(n, tf.float64) * test_fraction), tf.int64)
  if test_fraction > 0:
    n_test = tf.where(n >= 2, tf.clip_by_value(n_test, 1, tf.maximum(n - 1, 1)), n_test)
  client_hash = tf.strings.to_hash_bucket_fast(client_id, 2**31 - 1)
  keys = tf.random.stateless_uniform(
      [n], seed=tf.stack([tf.constant(seed, tf.int64), client_hash])
  )
  rank = tf.argsort(tf.argsort(keys))
  in_test = rank < tf.cast(n_test, tf.int32)
  keep = in_test if test else tf.logical_not(in_test)
  return (
      dataset.enumerate()
      .filter(lambda i, _: tf.gather(keep, i))
      .map(lambda _, element: element)
  )


def split_clients(
    client_data: base.ClientData, test_fraction: float, seed: int
) -> tuple[base.ClientData, base.ClientData]:
  """(train, test) `ClientData` of the same clients, each example in one."""
  if not 0 < test_fraction < 1:
    raise ValueError(f'test_fraction must be in (0, 1), got {test_fraction}.')
  make = functools.partial(
      _client_split, client_data, test_fraction=test_fraction, seed=seed
  )
  from_fn = tff.simulation.datasets.ClientData.from_clients_and_tf_fn
  return (
      from_fn(client_data.client_ids, functools.partial(make, test=False)),
      from_fn(client_data.client_ids, functools.partial(make, test=True)),
  )


def cifar100_element_to_xy(element):
  """TFF CIFAR-100 element -> (x [32, 32, 3] float32 in [0, 1], fine label int32)."""
  x = tf.cast(element['image'], tf.float32) / 255.0
  y = tf.cast(element['label'], tf.int32)
  return x, y


cifar100_preprocess_train, cifar100_preprocess_eval = base.example_preprocessing(
    cifar100_element_to_xy
)


def resnet_spec() -> model_spec.ModelSpec:
  return emnist.classifier_spec(
      build=lambda: resnet.build_resnet(CIFAR100_NUM_CLASSES, CIFAR100_SHAPE),
      blocks=resnet.resnet_blocks(),
      input_shape=CIFAR100_SHAPE,
  )


def build_cifar100_task(options: task_options.TaskOptions) -> base.Task:
  """Federated CIFAR-100 from TFF's cached `cifar100.sqlite`.

  Raises:
    base.DataUnavailableError: if `<options.cache_dir>/cifar100.sqlite` is
      missing (we never download).
  """
  cache_dir = os.path.expanduser(options.cache_dir)
  emnist.require_cached_file(cache_dir, CIFAR100_FILENAME, CIFAR100_URL, 'cifar100')
  train, _ = tff.simulation.datasets.cifar100.load_data(cache_dir=cache_dir)
  train_data, test_data = split_clients(train, options.test_fraction, options.seed)
  return base.Task(
      name='cifar100',
      train_data=train_data,
      test_data=test_data,
      model=resnet_spec(),
      preprocess_train=cifar100_preprocess_train,
      preprocess_eval=cifar100_preprocess_eval,
      default_personal_blocks=1,
  )
