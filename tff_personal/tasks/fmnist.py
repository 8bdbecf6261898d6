"""Fashion-MNIST and MNIST split among synthetic clients.

Fashion-MNIST (Xiao et al. 2017) and MNIST (LeCun et al. 1998) have no natural
clients. Their train and test sets are pooled (70,000 images), partitioned
among `options.num_clients` clients by `options.partition` (see
`tff_personal.tasks.partitions`: FedPer's k-classes shards, Ditto-style
log-normal devices, or Dirichlet label skew), and every client's examples are
split, stratified by label, into its own train and test sets
(`options.test_fraction`), so each client is evaluated on its own
distribution. Partition and splits are seeded by `options.seed`. The
`ditto_code` partition instead builds the devices of Ditto's data script: train
examples from the train set, test examples from the test set, one partition
whatever the seed.

Data comes from the idx files in `options.data_dir` (gzipped or plain).
Pixels stay uint8 in memory; client datasets yield the raw
`OrderedDict(label=int32, pixels=uint8 [28, 28])` and preprocessing maps them
to x = pixels / 255 as float32 [28, 28, 1] (0.0 = background), y int32.
Model: the FedAvg CNN with 10 classes, narrowed for small machines (conv 16/32,
dense 128), with the same four blocks.
"""

import collections
import os

from absl import logging
import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_personal.models import model_spec
from tff_personal.tasks import base
from tff_personal.tasks import emnist
from tff_personal.tasks import idx
from tff_personal.tasks import options as task_options
from tff_personal.tasks import partitions

IDX_FILES = (
    'train-images-idx3-ubyte',
    'train-labels-idx1-ubyte',
    't10k-images-idx3-ubyte',
    't10k-labels-idx1-ubyte',
)
NUM_CLASSES = 10
IMAGE_SHAPE = (28, 28, 1)
CNN_CONV_FILTERS = (16, 32)
CNN_DENSE_UNITS = 128


def load_idx_dataset(
    data_dir: str, task: str, hint: str
) -> tuple[np.ndarray, np.ndarray, int]:
  """Pooled (images uint8 [N, 28, 28], labels int32 [N], number of train
  examples) from the idx files: the train set's examples, then the test set's.

  Raises:
    base.DataUnavailableError: if an idx file is missing; `hint` says how to
      get the files.
  """
  data_dir = os.path.expanduser(data_dir)
  paths = {name: idx.find_idx_file(data_dir, name) for name in IDX_FILES}
  missing = [name + '[.gz]' for name, path in paths.items() if path is None]
  if missing:
    raise base.DataUnavailableError(
        f'Task {task} needs the idx files {", ".join(missing)} in {data_dir},'
        f' which are missing; point --data_dir at their folder ({hint}).'
    )
  images, labels = [], []
  for prefix in ('train', 't10k'):
    x = idx.read_idx(paths[f'{prefix}-images-idx3-ubyte'])
    y = idx.read_idx(paths[f'{prefix}-labels-idx1-ubyte'])
    if x.ndim != 3 or x.shape[1:] != IMAGE_SHAPE[:2] or y.shape != x.shape[:1]:
      raise ValueError(
          f'{data_dir}: {prefix} images {x.shape} and labels {y.shape} are not'
          ' [N, 28, 28] and [N].'
      )
    images.append(x.astype(np.uint8))
    labels.append(y.astype(np.int32))
  return np.concatenate(images), np.concatenate(labels), len(labels[0])


def partition_clients(
    labels: np.ndarray, options: task_options.TaskOptions
) -> list[np.ndarray]:
  """Client index arrays for `options.partition` (seeded by `options.seed`)."""
  if options.partition == 'k_classes':
    return partitions.k_classes(
        labels, options.num_clients, options.classes_per_client, options.seed,
        num_classes=NUM_CLASSES,
    )
  if options.partition == 'ditto':
    return partitions.ditto(
        labels, options.num_clients, options.classes_per_client, options.seed,
        num_classes=NUM_CLASSES,
    )
  if options.partition == 'dirichlet':
    return partitions.dirichlet(
        labels, options.num_clients, options.dirichlet_alpha, options.seed
    )
  raise ValueError(  # ditto_code is built by task_from_arrays, from the train/test sets.
      f'Unknown partition {options.partition!r}; allowed: k_classes, ditto, dirichlet.'
  )


def in_memory_client_data(
    images: np.ndarray, labels: np.ndarray, client_ids: list[str], indices: list[np.ndarray]
) -> base.ClientData:
  """A `ClientData` of `OrderedDict(label, pixels)` over in-memory arrays.

  Examples are stored once, grouped by client. With a Python client id the
  dataset holds only that client's slice; with a string tensor (inside a
  `tff` dataset computation) the arrays are captured in the graph and the
  client's range is looked up by id.
  """
  order = np.concatenate(indices) if indices else np.zeros([0], np.int64)
  grouped_images = np.ascontiguousarray(images[order])
  grouped_labels = np.ascontiguousarray(labels[order]).astype(np.int32)
  sizes = np.array([len(i) for i in indices], np.int64)
  ends = np.cumsum(sizes)
  starts = ends - sizes
  ranges = {cid: (int(s), int(e)) for cid, s, e in zip(client_ids, starts, ends)}

  def dataset_fn(client_id):
    if isinstance(client_id, (str, bytes)):
      key = client_id.decode() if isinstance(client_id, bytes) else client_id
      start, end = ranges[key]
      return tf.data.Dataset.from_tensor_slices(
          collections.OrderedDict(
              label=grouped_labels[start:end], pixels=grouped_images[start:end]
          )
      )
    table = tf.lookup.StaticHashTable(
        tf.lookup.KeyValueTensorInitializer(
            tf.constant(client_ids), tf.range(len(client_ids), dtype=tf.int64)
        ),
        default_value=-1,
    )
    position = table.lookup(client_id)
    check = tf.debugging.assert_non_negative(position, message='Unknown client id.')
    with tf.control_dependencies([check]):
      position = tf.identity(position)
    start = tf.gather(tf.constant(starts), position)
    end = tf.gather(tf.constant(ends), position)
    all_labels = tf.constant(grouped_labels)
    all_images = tf.constant(grouped_images)
    return tf.data.Dataset.range(start, end).map(
        lambda i: collections.OrderedDict(
            label=tf.gather(all_labels, i), pixels=tf.gather(all_images, i)
        )
    )

  return tff.simulation.datasets.ClientData.from_clients_and_tf_fn(client_ids, dataset_fn)


def element_to_xy(element):
  """Raw element -> (x [28, 28, 1] float32 in [0, 1], y int32)."""
  x = tf.reshape(tf.cast(element['pixels'], tf.float32) / 255.0, IMAGE_SHAPE)
  return x, tf.cast(element['label'], tf.int32)


preprocess_train, preprocess_eval = base.example_preprocessing(element_to_xy)


def build_model_spec() -> model_spec.ModelSpec:
  return emnist.cnn_spec(NUM_CLASSES, IMAGE_SHAPE, CNN_CONV_FILTERS, CNN_DENSE_UNITS)


def task_from_arrays(
    name: str, images: np.ndarray, labels: np.ndarray, num_train: int,
    options: task_options.TaskOptions,
) -> base.Task:
  """Partitions pooled arrays among clients, each with its own test split.

  The first `num_train` pooled examples are the dataset's train set; the
  `ditto_code` partition draws a device's train examples from it and its test
  examples from the rest, the others split a client's examples by
  `options.test_fraction`.
  """
  if options.partition == 'ditto_code':
    train_indices, test_indices = partitions.ditto_code(
        labels[:num_train], labels[num_train:], options.num_clients,
        options.classes_per_client, NUM_CLASSES,
    )
    test_indices = [num_train + t for t in test_indices]
  else:
    train_indices, test_indices = [], []
    for i, part in enumerate(partition_clients(labels, options)):
      train, test = partitions.train_test_split(
          part, labels, options.test_fraction, seed=options.seed * 100_003 + i
      )
      train_indices.append(train)
      test_indices.append(test)
  client_ids = [f'client_{i:03d}' for i in range(len(train_indices))]
  logging.info(
      '%s: %d clients, %d train and %d test examples (%s partition).',
      name, len(client_ids), sum(map(len, train_indices)), sum(map(len, test_indices)),
      options.partition,
  )
  return base.Task(
      name=name,
      train_data=in_memory_client_data(images, labels, client_ids, train_indices),
      test_data=in_memory_client_data(images, labels, client_ids, test_indices),
      model=build_model_spec(),
      preprocess_train=preprocess_train,
      preprocess_eval=preprocess_eval,
      default_personal_blocks=1,
      examples_in_memory=True,
  )


def build_fmnist_task(options: task_options.TaskOptions) -> base.Task:
  """Fashion-MNIST from `options.data_dir`; see the module docstring.

  Raises:
    base.DataUnavailableError: if the idx files are missing.
  """
  images, labels, num_train = load_idx_dataset(
      options.data_dir, 'fmnist',
      'on Debian: apt-get install dataset-fashion-mnist, which installs them in'
      f' {task_options.DEFAULT_FMNIST_DIR}',
  )
  return task_from_arrays('fmnist', images, labels, num_train, options)


def build_mnist_task(options: task_options.TaskOptions) -> base.Task:
  """MNIST from the idx files the user puts in `options.data_dir`.

  MNIST's files have the same names as Fashion-MNIST's, so the default
  `data_dir` (Fashion-MNIST's Debian folder) is refused.

  Raises:
    base.DataUnavailableError: if the idx files are missing or `data_dir` is
      the Fashion-MNIST folder.
  """
  hint = 'download the four MNIST idx files from http://yann.lecun.com/exdb/mnist/'
  data_dir = os.path.expanduser(options.data_dir)
  if os.path.realpath(data_dir) == os.path.realpath(task_options.DEFAULT_FMNIST_DIR):
    raise base.DataUnavailableError(
        f'Task mnist needs the MNIST idx files ({", ".join(IDX_FILES)}, .gz or'
        f' plain); {data_dir} holds Fashion-MNIST. Point --data_dir at a folder'
        f' with the MNIST files ({hint}).'
    )
  images, labels, num_train = load_idx_dataset(data_dir, 'mnist', hint)
  return task_from_arrays('mnist', images, labels, num_train, options)
