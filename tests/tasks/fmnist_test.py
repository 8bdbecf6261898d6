"""Tests of the Fashion-MNIST / MNIST tasks on tiny idx files (and the real ones)."""

import dataclasses
import os

import numpy as np
import pytest
import tensorflow as tf

from tff_personal.tasks import base
from tff_personal.tasks import fmnist
from tff_personal.tasks import idx
from tff_personal.tasks import options as task_options
from tff_personal.tasks import registry

# 40 examples of each of 10 classes: 300 "train" + 100 "t10k". Pixel [0, 0] of
# pooled example i is i % 256 and pixel [0, 1] is i // 256, identifying it.
NUM = 400
LABELS = np.random.default_rng(0).permutation(np.repeat(np.arange(10), NUM // 10)).astype(np.uint8)


def _images():
  images = np.zeros((NUM, 28, 28), np.uint8)
  images[:, 0, 0] = np.arange(NUM) % 256
  images[:, 0, 1] = np.arange(NUM) // 256
  images[:, 27, 27] = 255
  return images


def write_tiny_idx(folder, gzip_train=True):
  os.makedirs(folder, exist_ok=True)
  images = _images()
  suffix = '.gz' if gzip_train else ''
  idx.write_idx(os.path.join(folder, 'train-images-idx3-ubyte' + suffix), images[:300])
  idx.write_idx(os.path.join(folder, 'train-labels-idx1-ubyte' + suffix), LABELS[:300])
  idx.write_idx(os.path.join(folder, 't10k-images-idx3-ubyte'), images[300:])
  idx.write_idx(os.path.join(folder, 't10k-labels-idx1-ubyte'), LABELS[300:])


def _ids(data, client_id):
  """Pooled indices of a client's examples, read back from the pixels."""
  return sorted(
      int(e['pixels'][0, 0]) + 256 * int(e['pixels'][0, 1])
      for e in data.create_tf_dataset_for_client(client_id)
  )


@pytest.fixture(scope='module')
def data_dir(tmp_path_factory):
  folder = str(tmp_path_factory.mktemp('fmnist'))
  write_tiny_idx(folder)
  return folder


@pytest.fixture(scope='module')
def options(data_dir):
  return task_options.TaskOptions(data_dir=data_dir, num_clients=4, classes_per_client=2)


@pytest.fixture(scope='module')
def task(options):
  return fmnist.build_fmnist_task(options)


def test_k_classes_clients_with_own_test_split(task):
  assert task.name == 'fmnist'
  assert task.client_ids == ['client_000', 'client_001', 'client_002', 'client_003']
  assert task.test_data.client_ids == task.client_ids
  seen = []
  for client_id in task.client_ids:
    train, test = _ids(task.train_data, client_id), _ids(task.test_data, client_id)
    assert len(train) == 64 and len(test) == 16  # 2 whole classes of 40, 20% test.
    assert set(LABELS[train].tolist()) == set(LABELS[test].tolist())
    assert len(set(LABELS[train + test].tolist())) == 2
    # Stratified: 8 test examples of each of the client's 2 classes.
    assert sorted(np.bincount(LABELS[test]).tolist())[-2:] == [8, 8]
    seen += train + test
  assert len(seen) == len(set(seen)) == 320  # 8 of the 10 classes are used.


def test_raw_elements_and_preprocessing(task):
  spec = task.train_data.element_type_structure
  assert spec['pixels'] == tf.TensorSpec([28, 28], tf.uint8)
  assert spec['label'] == tf.TensorSpec([], tf.int32)
  element = next(iter(task.train_data.create_tf_dataset_for_client('client_001')))
  i = int(element['pixels'][0, 0]) + 256 * int(element['pixels'][0, 1])
  assert int(element['label']) == LABELS[i]
  x, y = next(iter(task.test_dataset('client_001', batch_size=3)))
  assert x.shape == (3, 28, 28, 1) and x.dtype == tf.float32 and y.dtype == tf.int32
  assert float(tf.reduce_max(x)) == 1.0 and float(tf.reduce_min(x)) == 0.0
  first = [e for e in task.test_data.create_tf_dataset_for_client('client_001').take(3)]
  np.testing.assert_allclose(
      x.numpy()[:, 0, 0, 0], [int(e['pixels'][0, 0]) / 255.0 for e in first], rtol=1e-6
  )


def test_train_batches_are_seeded(task):
  def labels(seed):
    ds = task.train_dataset('client_002', epochs=2, batch_size=10, seed=seed)
    return np.concatenate([y.numpy() for _, y in ds]).tolist()

  assert len(labels(0)) == 128
  assert labels(0) == labels(0)
  assert labels(0) != labels(1)


def test_graph_mode_matches_eager(task):
  @tf.function
  def pixel_sum(client_id):
    return task.train_data.serializable_dataset_fn(client_id).reduce(
        tf.constant(0, tf.int64), lambda s, e: s + tf.cast(e['pixels'][0, 0], tf.int64)
    )

  eager = sum(int(e['pixels'][0, 0]) for e in
              task.train_data.create_tf_dataset_for_client('client_003'))
  assert int(pixel_sum(tf.constant('client_003'))) == eager


def test_dataset_computation_gives_the_same_batches(task):
  computation = task.train_dataset_computation(epochs=2, batch_size=10)
  assert str(computation.type_signature) == (
      '(<client_id=str,seed=int64> -> <float32[?,28,28,1],int32[?]>*)'
  )
  inside = computation(('client_002', 5))
  outside = task.train_dataset('client_002', epochs=2, batch_size=10, seed=5)
  inside_x, inside_y = zip(*[(x.numpy(), y.numpy()) for x, y in inside])
  outside_x, outside_y = zip(*[(x.numpy(), y.numpy()) for x, y in outside])
  assert [len(y) for y in inside_y] == [10] * 12 + [8]
  np.testing.assert_array_equal(np.concatenate(inside_x), np.concatenate(outside_x))
  np.testing.assert_array_equal(np.concatenate(inside_y), np.concatenate(outside_y))


def test_dataset_computation_cut_to_steps_gives_the_first_batches(task):
  computation = task.train_dataset_computation(epochs=2, batch_size=10, steps=3)
  inside = [(x.numpy(), y.numpy()) for x, y in computation(('client_002', 5))]
  outside = task.train_dataset('client_002', epochs=2, batch_size=10, seed=5)
  assert [len(y) for _, y in inside] == [10, 10, 10]
  for (inside_x, inside_y), (outside_x, outside_y) in zip(inside, outside.take(3)):
    np.testing.assert_array_equal(inside_x, outside_x.numpy())
    np.testing.assert_array_equal(inside_y, outside_y.numpy())


def _batches(dataset):
  return [tuple(part.tolist() for part in batch) for batch in dataset.as_numpy_iterator()]


def _serialized_graph_bytes(dataset) -> int:
  policy = tf.data.experimental.ExternalStatePolicy.FAIL
  return len(dataset._as_serialized_graph(external_state_policy=policy).numpy())  # pylint: disable=protected-access


def test_a_client_dataset_holds_its_own_examples_only(task):
  """The graph of a client's dataset, serialized into every TFF call, holds
  that client's examples (once an epoch: `base.shuffled_epochs` concatenates
  the passes): read by a string tensor (`examples_in_memory` off), it would
  hold every client's."""
  assert task.examples_in_memory
  client = task.client_ids[0]
  all_bytes = NUM * 28 * 28
  own_bytes = len(_ids(task.train_data, client)) * 28 * 28
  assert own_bytes < all_bytes / 5
  train = task.train_dataset(client, epochs=2, batch_size=4, seed=3)
  test = task.test_dataset(client, batch_size=4)
  assert _serialized_graph_bytes(train) < 2 * own_bytes + 20_000  # Once an epoch.
  assert _serialized_graph_bytes(test) < own_bytes + 20_000
  by_id = dataclasses.replace(task, examples_in_memory=False)
  assert _serialized_graph_bytes(by_id.train_dataset(client, epochs=2, batch_size=4, seed=3)) > all_bytes
  assert _batches(train) == _batches(by_id.train_dataset(client, epochs=2, batch_size=4, seed=3))
  assert _batches(test) == _batches(by_id.test_dataset(client, batch_size=4))


def test_deterministic_given_seed(options, task):
  again = fmnist.build_fmnist_task(options)
  assert _ids(again.test_data, 'client_000') == _ids(task.test_data, 'client_000')
  other = fmnist.build_fmnist_task(dataclasses.replace(options, seed=1))
  assert any(
      _ids(other.train_data, c) != _ids(task.train_data, c) for c in task.client_ids
  )


@pytest.mark.parametrize(
    'changes,num_clients',
    [
        (dict(partition='k_classes', classes_per_client=10), 4),
        (dict(partition='ditto', num_clients=6, classes_per_client=2), 6),
        (dict(partition='dirichlet', num_clients=5, dirichlet_alpha=0.5), 5),
    ],
)
def test_other_partitions(options, changes, num_clients):
  task = fmnist.build_fmnist_task(dataclasses.replace(options, **changes))
  assert len(task.client_ids) == num_clients
  everything = []
  for client_id in task.client_ids:
    train, test = _ids(task.train_data, client_id), _ids(task.test_data, client_id)
    assert train and test and not set(train) & set(test)
    everything += train + test
  assert len(everything) == len(set(everything))
  if changes['partition'] != 'ditto':
    assert len(everything) == NUM


def test_ditto_code_devices_train_on_the_train_set_and_test_on_the_test_set(options):
  task = fmnist.build_fmnist_task(
      dataclasses.replace(options, partition='ditto_code', num_clients=200, classes_per_client=5)
  )
  assert len(task.client_ids) == 200
  for device, client_id in enumerate(task.client_ids[:20]):
    train, test = _ids(task.train_data, client_id), _ids(task.test_data, client_id)
    assert max(train) < 300 <= min(test)  # The files' train set, then their t10k set.
    window = {(device + j) % 10 for j in range(5)}
    assert set(LABELS[train].tolist()) == set(LABELS[test].tolist()) == window


def test_iid_clients_have_every_class(options):
  task = fmnist.build_fmnist_task(dataclasses.replace(options, classes_per_client=10))
  for client_id in task.client_ids:
    counts = np.bincount(LABELS[_ids(task.train_data, client_id)], minlength=10)
    assert counts.tolist() == [8] * 10


def test_bad_partition(options):
  with pytest.raises(ValueError, match='Unknown partition'):
    fmnist.build_fmnist_task(dataclasses.replace(options, partition='shards'))
  with pytest.raises(ValueError, match='classes_per_client'):
    fmnist.build_fmnist_task(dataclasses.replace(options, classes_per_client=11))


def test_plain_files_work(tmp_path):
  write_tiny_idx(str(tmp_path), gzip_train=False)
  images, labels, num_train = fmnist.load_idx_dataset(str(tmp_path), 'fmnist', '')
  np.testing.assert_array_equal(images, _images())
  np.testing.assert_array_equal(labels, LABELS)
  assert images.dtype == np.uint8 and labels.dtype == np.int32


def test_model(task):
  assert [list(b) for b in task.model.blocks] == [
      ['conv1', 'pool1'], ['conv2', 'pool2', 'flatten'], ['dense'], ['logits']
  ]
  model = task.model.build()
  assert model.get_layer('conv1').filters == 16 and model.get_layer('dense').units == 128
  x, y = next(iter(task.test_dataset('client_000', batch_size=4)))
  assert model(x).shape == (4, 10)
  assert task.default_personal_blocks == 1


def test_missing_files(tmp_path):
  idx.write_idx(str(tmp_path / 'train-images-idx3-ubyte.gz'), np.zeros([1, 28, 28], np.uint8))
  options = task_options.TaskOptions(data_dir=str(tmp_path))
  with pytest.raises(base.DataUnavailableError) as error:
    fmnist.build_fmnist_task(options)
  message = str(error.value)
  assert 'train-labels-idx1-ubyte' in message and 't10k-images-idx3-ubyte' in message
  assert 'train-images-idx3-ubyte' not in message
  assert str(tmp_path) in message and '--data_dir' in message
  assert 'apt-get install dataset-fashion-mnist' in message
  with pytest.raises(base.DataUnavailableError, match='mnist needs the idx files.*--data_dir'):
    fmnist.build_mnist_task(options)


def test_mnist(data_dir, options):
  task = fmnist.build_mnist_task(options)
  assert task.name == 'mnist' and len(task.client_ids) == 4
  with pytest.raises(base.DataUnavailableError, match='holds Fashion-MNIST.*--data_dir'):
    fmnist.build_mnist_task(task_options.TaskOptions())


@pytest.mark.skipif(
    not os.path.isdir(task_options.DEFAULT_FMNIST_DIR),
    reason='Debian dataset-fashion-mnist is not installed.',
)
def test_real_fashion_mnist_defaults():
  task = registry.build_task('fmnist', task_options.TaskOptions())
  assert len(task.client_ids) == 10
  sizes = [
      (int(task.train_data.create_tf_dataset_for_client(c).cardinality()),
       int(task.test_data.create_tf_dataset_for_client(c).cardinality()))
      for c in task.client_ids
  ]
  assert sizes == [(5600, 1400)] * 10  # All 70,000 images, 2 classes per client.
  labels = {int(e['label']) for e in task.test_data.create_tf_dataset_for_client('client_000')}
  assert len(labels) == 2
