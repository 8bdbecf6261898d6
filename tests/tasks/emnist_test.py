"""Tests of the EMNIST task through TFF's real loader, on a tiny cache file."""

import os
import socket
import urllib.request

import numpy as np
import pytest
import tensorflow as tf

from tff_personal.tasks import base
from tff_personal.tasks import emnist
from tff_personal.tasks import options as task_options
from tff_personal.tasks import registry
from tff_personal.tasks import sqlite_format

# client -> split -> labels; pixel values encode (client, split, position).
CLIENTS = {
    'f0001_01': {'train': [3, 61, 10], 'test': [5]},
    'f0002_02': {'train': [0, 36], 'test': [7, 20]},
}


def _pixels(client_index, split, position):
  value = 0.1 * client_index + (0.05 if split == 'test' else 0.0) + 0.01 * position
  pixels = np.ones(784, np.float32)  # 1.0 = background.
  pixels[:10] = value
  return pixels


def write_tiny_emnist(folder):
  rows = []
  for c, (client_id, splits) in enumerate(CLIENTS.items()):
    for split, labels in splits.items():
      for i, label in enumerate(labels):
        example = sqlite_format.serialize_example(
            {'pixels': _pixels(c, split, i), 'label': label}
        )
        rows.append((f'all_{split}', client_id, example))
        if label < 10:
          rows.append((f'digits_only_{split}', client_id, example))
  sqlite_format.write_client_data(os.path.join(folder, 'emnist_all.sqlite'), rows)


@pytest.fixture(scope='module')
def task(tmp_path_factory):
  folder = str(tmp_path_factory.mktemp('tff_cache'))
  write_tiny_emnist(folder)
  return emnist.build_emnist_task(task_options.TaskOptions(cache_dir=folder))


@pytest.fixture
def no_network(monkeypatch):
  def refuse(*args, **kwargs):
    raise AssertionError('network access attempted')

  monkeypatch.setattr(socket.socket, 'connect', refuse)
  monkeypatch.setattr(urllib.request, 'urlopen', refuse)


def test_clients_and_raw_elements(task):
  assert task.name == 'emnist'
  assert task.client_ids == sorted(CLIENTS)
  assert task.test_data.client_ids == sorted(CLIENTS)
  assert task.default_personal_blocks == 1
  ds = task.train_data.create_tf_dataset_for_client('f0001_01')
  assert ds.element_spec['pixels'] == tf.TensorSpec([28, 28], tf.float32)
  assert ds.element_spec['label'] == tf.TensorSpec([], tf.int32)
  elements = list(ds.as_numpy_iterator())
  assert [int(e['label']) for e in elements] == [3, 61, 10]
  np.testing.assert_allclose(elements[1]['pixels'].reshape(-1), _pixels(0, 'train', 1))


def test_eval_batches(task):
  x, y = next(iter(task.test_dataset('f0002_02', batch_size=8)))
  assert x.shape == (2, 28, 28, 1) and x.dtype == tf.float32
  assert y.dtype == tf.int32
  np.testing.assert_array_equal(y.numpy(), [7, 20])
  np.testing.assert_allclose(x.numpy()[1, 0, :10, 0], _pixels(1, 'test', 1)[:10])
  assert x.numpy()[0, 27, 27, 0] == 1.0  # TFF convention: background is 1.0.


def test_train_batches_are_seeded(task):
  def labels(seed):
    ds = task.train_dataset('f0001_01', epochs=4, batch_size=5, seed=seed)
    return np.concatenate([y.numpy() for _, y in ds]).tolist()

  first = labels(seed=1)
  assert len(first) == 12 and sorted(first) == sorted([3, 61, 10] * 4)
  assert labels(seed=1) == first
  assert any(labels(seed=s) != first for s in (2, 3, 4))


def test_model_spec(task):
  spec = task.model
  assert [list(b) for b in spec.blocks] == [
      ['conv1', 'pool1'], ['conv2', 'pool2', 'flatten'], ['dense'], ['logits']
  ]
  model = spec.build()
  assert model.count_params() == 1_690_046
  x, y = next(iter(task.train_dataset('f0001_01', epochs=1, batch_size=3, seed=0)))
  assert spec.input_spec[0].is_compatible_with(x)
  assert spec.input_spec[1].is_compatible_with(y)
  loss = spec.loss()(y, model(x))
  assert np.isfinite(loss.numpy())
  metric = spec.metrics()[0]
  assert isinstance(metric, tf.keras.metrics.SparseCategoricalAccuracy)


def test_initial_weights_reproducible(task):
  a = task.model.initial_weights(seed=11)
  b = task.model.initial_weights(seed=11)
  c = task.model.initial_weights(seed=12)
  assert [w.shape for w in a.trainable] == [
      (5, 5, 1, 32), (32,), (5, 5, 32, 64), (64,), (3136, 512), (512,), (512, 62), (62,)
  ]
  assert not a.non_trainable
  assert all(np.array_equal(u, v) for u, v in zip(a.trainable, b.trainable))
  assert not np.array_equal(a.trainable[0], c.trainable[0])


def test_tff_model_fn(task):
  model = task.model.tff_model_fn()
  assert len(model.trainable_variables) == 8


def test_missing_file_is_a_clear_error_without_network(tmp_path, no_network):
  cache_dir = str(tmp_path / 'empty')
  with pytest.raises(base.DataUnavailableError) as error:
    emnist.build_emnist_task(task_options.TaskOptions(cache_dir=cache_dir))
  message = str(error.value)
  assert '\n' not in message
  assert os.path.join(cache_dir, 'emnist_all.sqlite') in message
  assert emnist.EMNIST_URL in message
  assert 'xz -d' in message and '--cache_dir' in message
  assert not os.path.exists(os.path.join(cache_dir, 'emnist_all.sqlite'))


def test_registry_builds_it(tmp_path, no_network):
  with pytest.raises(base.DataUnavailableError, match='emnist_all.sqlite'):
    registry.build_task('emnist', task_options.TaskOptions(cache_dir=str(tmp_path)))


def test_every_cnn_flag_value_has_a_model():
  # options.py lists the names without importing TensorFlow; emnist.py maps them.
  assert tuple(emnist.CNN_SHAPES) == task_options.CNNS
  with pytest.raises(ValueError, match="Unknown cnn 'wide'"):
    emnist.emnist_cnn_spec('wide')
