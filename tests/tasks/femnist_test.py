"""Tests of the FEMNIST sample task: npz -> TFF's EMNIST SQLite -> real loader."""

import os
import sqlite3

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tff_personal.tasks import base
from tff_personal.tasks import femnist
from tff_personal.tasks import options as task_options

_REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
REAL_NPZ = os.path.join(_REPO_ROOT, '..', 'shared', 'data', 'femnist105.npz')


def write_tiny_npz(path, extra_writer=False):
  """Three writers (two with digits), 255 = background, ink marks the index."""
  writers = ['w_b', 'w_b', 'w_b', 'w_b', 'w_a', 'w_a', 'w_a', 'w_c', 'w_c']
  splits = ['train', 'train', 'train', 'test', 'train', 'test', 'test', 'train', 'test']
  labels = [1, 40, 9, 12, 61, 3, 35, 20, 30]
  if extra_writer:
    writers, splits, labels = writers + ['w_d'] * 2, splits + ['train', 'test'], labels + [0, 1]
  x = np.full((len(labels), 784), 255, np.uint8)
  for i in range(len(labels)):
    x[i, i] = 0
    x[i, 783] = 51
  np.savez(path, x=x, y=np.array(labels, np.uint8), writer=np.array(writers),
           split=np.array(splits))


@pytest.fixture(scope='module')
def tiny(tmp_path_factory):
  folder = tmp_path_factory.mktemp('femnist')
  npz = str(folder / 'tiny.npz')
  write_tiny_npz(npz)
  options = task_options.TaskOptions(cache_dir=str(folder / 'cache'), femnist_path=npz)
  return femnist.build_femnist_task(options), options


def test_tiny_clients_and_splits(tiny):
  task, _ = tiny
  assert task.name == 'femnist'
  assert task.client_ids == ['w_a', 'w_b', 'w_c']
  assert task.test_data.client_ids == ['w_a', 'w_b', 'w_c']

  def labels(data, client):
    return [int(e['label']) for e in data.create_tf_dataset_for_client(client)]

  assert labels(task.train_data, 'w_b') == [1, 40, 9]
  assert labels(task.test_data, 'w_b') == [12]
  assert labels(task.train_data, 'w_a') == [61]
  assert labels(task.test_data, 'w_a') == [3, 35]


def test_tiny_pixels_follow_tff_convention(tiny):
  task, _ = tiny
  element = next(iter(task.train_data.create_tf_dataset_for_client('w_a')))
  assert element['pixels'].dtype == tf.float32 and element['pixels'].shape == (28, 28)
  pixels = element['pixels'].numpy().reshape(-1)
  assert pixels[4] == 0.0  # Row 4 of the npz is w_a's train example.
  assert pixels[783] == pytest.approx(0.2)
  assert pixels[0] == 1.0
  x, y = next(iter(task.test_dataset('w_c', batch_size=4)))
  assert x.shape == (1, 28, 28, 1) and y.numpy().tolist() == [30]


def test_tiny_digits_only_splits(tiny):
  _, options = tiny
  folder = femnist.femnist_cache_folder(options.cache_dir)
  train, test = tff.simulation.datasets.emnist.load_data(only_digits=True, cache_dir=folder)
  assert train.client_ids == ['w_b']
  assert test.client_ids == ['w_a']
  assert [int(e['label']) for e in train.create_tf_dataset_for_client('w_b')] == [1, 9]


def test_file_is_tff_format(tiny):
  _, options = tiny
  path = os.path.join(femnist.femnist_cache_folder(options.cache_dir), 'emnist_all.sqlite')
  with sqlite3.connect(path) as db:
    rows = db.execute(
        'SELECT client_id, split_name, num_examples FROM client_metadata'
        ' ORDER BY split_name, client_id'
    ).fetchall()
    proto = db.execute('SELECT serialized_example_proto FROM examples LIMIT 1').fetchone()[0]
  assert ('w_b', 'all_train', 3) in rows and ('w_c', 'all_test', 1) in rows
  assert ('w_b', 'digits_only_train', 2) in rows
  example = tf.train.Example.FromString(proto)
  assert set(example.features.feature) == {'pixels', 'label'}
  assert len(example.features.feature['pixels'].float_list.value) == 784
  assert len(example.features.feature['label'].int64_list.value) == 1


def test_written_once_and_rebuilt_for_another_npz(tmp_path):
  npz = str(tmp_path / 'sample.npz')
  write_tiny_npz(npz)
  cache = str(tmp_path / 'cache')
  database = os.path.join(femnist.femnist_cache_folder(cache), 'emnist_all.sqlite')
  assert femnist.prepare_femnist_sqlite(npz, cache) == os.path.dirname(database)
  first = os.stat(database).st_mtime_ns
  femnist.prepare_femnist_sqlite(npz, cache)
  assert os.stat(database).st_mtime_ns == first  # Up to date: not rewritten.

  write_tiny_npz(npz, extra_writer=True)
  options = task_options.TaskOptions(cache_dir=cache, femnist_path=npz)
  assert femnist.build_femnist_task(options).client_ids == ['w_a', 'w_b', 'w_c', 'w_d']

  os.remove(database + '.source.json')  # As if interrupted before the marker.
  os.truncate(database, 100)
  assert femnist.build_femnist_task(options).client_ids == ['w_a', 'w_b', 'w_c', 'w_d']


def test_missing_npz(tmp_path):
  missing = str(tmp_path / 'nowhere' / 'femnist105.npz')
  options = task_options.TaskOptions(cache_dir=str(tmp_path), femnist_path=missing)
  with pytest.raises(base.DataUnavailableError) as error:
    femnist.build_femnist_task(options)
  assert missing in str(error.value) and '--femnist_path' in str(error.value)


@pytest.fixture(scope='module')
def real(tmp_path_factory):
  if not os.path.isfile(REAL_NPZ):
    pytest.skip(f'{REAL_NPZ} is not available.')
  options = task_options.TaskOptions(
      cache_dir=str(tmp_path_factory.mktemp('real_cache')), femnist_path=REAL_NPZ
  )
  return femnist.build_femnist_task(options)


def _count(data, client_id):
  return int(data.create_tf_dataset_for_client(client_id).reduce(0, lambda n, _: n + 1))


def test_real_sample(real):
  assert len(real.client_ids) == 105
  assert real.test_data.client_ids == real.client_ids
  assert real.client_ids[:2] == ['f1501_00', 'f1521_17']
  everything = real.train_data.create_tf_dataset_from_all_clients()
  assert int(everything.reduce(0, lambda n, _: n + 1)) == 14_708
  assert _count(real.train_data, 'f1501_00') == 144
  assert _count(real.test_data, 'f1501_00') == 17
  x, y = next(iter(real.train_dataset('f1501_00', epochs=1, batch_size=20, seed=0)))
  assert x.shape == (20, 28, 28, 1)
  assert 0 <= int(tf.reduce_min(y)) and int(tf.reduce_max(y)) < 62
  assert float(tf.reduce_max(x)) == 1.0 and float(tf.reduce_mean(x)) > 0.5  # Mostly background.
