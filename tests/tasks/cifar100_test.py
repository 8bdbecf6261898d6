"""Tests of the CIFAR-100 task through TFF's real loader, on a tiny cache file."""

import os
import socket
import urllib.request

import numpy as np
import pytest
import tensorflow as tf

from tff_personal.tasks import base
from tff_personal.tasks import cifar100
from tff_personal.tasks import options as task_options
from tff_personal.tasks import sqlite_format

# Train clients and their sizes; each example's fine label is unique.
SIZES = {'0': 10, '1': 7, '2': 2}


def _image(label):
  image = np.zeros((32, 32, 3), np.int64)
  image[0, 0] = [label, 255, 0]
  image[31, 31, 2] = 128
  return image


def write_tiny_cifar100(folder):
  rows = []
  label = 0
  for client_id, size in SIZES.items():
    for _ in range(size):
      rows.append(('train', client_id, sqlite_format.serialize_example(
          {'image': _image(label), 'label': label, 'coarse_label': label // 5})))
      label += 1
  rows.append(('test', '500', sqlite_format.serialize_example(
      {'image': _image(99), 'label': 99, 'coarse_label': 19})))
  sqlite_format.write_client_data(os.path.join(folder, 'cifar100.sqlite'), rows)


@pytest.fixture(scope='module')
def cache_dir(tmp_path_factory):
  folder = str(tmp_path_factory.mktemp('tff_cache'))
  write_tiny_cifar100(folder)
  return folder


@pytest.fixture(scope='module')
def task(cache_dir):
  return cifar100.build_cifar100_task(
      task_options.TaskOptions(cache_dir=cache_dir, test_fraction=0.2, seed=3)
  )


def _labels(data, client_id):
  return sorted(int(e['label']) for e in data.create_tf_dataset_for_client(client_id))


def test_clients_and_raw_elements(task):
  assert task.name == 'cifar100'
  assert task.client_ids == ['0', '1', '2']  # TFF's test clients are not used.
  assert task.test_data.client_ids == ['0', '1', '2']
  spec = task.train_data.element_type_structure
  assert spec['image'] == tf.TensorSpec([32, 32, 3], tf.uint8)
  assert spec['label'] == tf.TensorSpec([], tf.int64)
  assert spec['coarse_label'] == tf.TensorSpec([], tf.int64)


def test_each_client_split_into_own_train_and_test(task):
  start = 0
  for client_id, size in SIZES.items():
    train, test = _labels(task.train_data, client_id), _labels(task.test_data, client_id)
    assert sorted(train + test) == list(range(start, start + size))
    assert len(test) == max(1, round(0.2 * size))
    start += size


def test_split_is_seeded(cache_dir, task):
  again = cifar100.build_cifar100_task(
      task_options.TaskOptions(cache_dir=cache_dir, test_fraction=0.2, seed=3)
  )
  assert _labels(again.test_data, '0') == _labels(task.test_data, '0')
  others = [
      _labels(cifar100.build_cifar100_task(
          task_options.TaskOptions(cache_dir=cache_dir, test_fraction=0.2, seed=s)
      ).test_data, '0')
      for s in (4, 5, 6)
  ]
  assert any(o != _labels(task.test_data, '0') for o in others)


def test_split_works_in_graph_mode(task):
  @tf.function
  def label_sum(client_id):
    return task.test_data.serializable_dataset_fn(client_id).reduce(
        tf.constant(0, tf.int64), lambda s, e: s + e['label']
    )

  assert int(label_sum(tf.constant('0'))) == sum(_labels(task.test_data, '0'))


def test_preprocessing(task):
  x, y = next(iter(task.test_dataset('0', batch_size=5)))
  assert x.shape == (2, 32, 32, 3) and x.dtype == tf.float32
  assert y.dtype == tf.int32
  np.testing.assert_allclose(x.numpy()[:, 0, 0, 0], y.numpy() / 255.0, rtol=1e-6)
  assert x.numpy()[0, 0, 0, 1] == 1.0 and x.numpy()[0, 31, 31, 2] == pytest.approx(128 / 255)
  batches = list(task.train_dataset('0', epochs=2, batch_size=4, seed=0))
  assert [b[0].shape[0] for b in batches] == [4, 4, 4, 4]


def test_model(task):
  assert task.default_personal_blocks == 1
  assert len(task.model.blocks) == 5 and list(task.model.blocks[-1]) == ['pool', 'logits']
  model = task.model.build()
  x, y = next(iter(task.test_dataset('1', batch_size=5)))
  logits = model(x)
  assert logits.shape == (x.shape[0], 100)
  assert np.isfinite(task.model.loss()(y, logits).numpy())


def test_missing_file_is_a_clear_error_without_network(tmp_path, monkeypatch):
  def refuse(*args, **kwargs):
    raise AssertionError('network access attempted')

  monkeypatch.setattr(socket.socket, 'connect', refuse)
  monkeypatch.setattr(urllib.request, 'urlopen', refuse)
  with pytest.raises(base.DataUnavailableError) as error:
    cifar100.build_cifar100_task(task_options.TaskOptions(cache_dir=str(tmp_path)))
  message = str(error.value)
  assert os.path.join(str(tmp_path), 'cifar100.sqlite') in message
  assert cifar100.CIFAR100_URL in message and '--cache_dir' in message
  assert 'xz -d' in message


def test_bad_test_fraction(cache_dir):
  with pytest.raises(ValueError, match='test_fraction'):
    cifar100.build_cifar100_task(task_options.TaskOptions(cache_dir=cache_dir, test_fraction=0.0))
