"""Tests of the idx reader and writer."""

import gzip
import os

import numpy as np
import pytest

from tff_personal.tasks import idx


@pytest.mark.parametrize('name', ['images-idx3-ubyte', 'images-idx3-ubyte.gz'])
def test_uint8_round_trip(tmp_path, name):
  array = np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4)
  path = str(tmp_path / name)
  idx.write_idx(path, array)
  back = idx.read_idx(path)
  assert back.dtype == np.uint8 and back.shape == (2, 3, 4)
  np.testing.assert_array_equal(back, array)


def test_file_layout_is_idx(tmp_path):
  path = str(tmp_path / 'labels-idx1-ubyte')
  idx.write_idx(path, np.array([7, 2, 1], np.uint8))
  with open(path, 'rb') as f:
    assert f.read() == bytes([0, 0, 8, 1, 0, 0, 0, 3, 7, 2, 1])


def test_gzip_is_detected_from_content(tmp_path):
  plain = str(tmp_path / 'a')
  idx.write_idx(plain, np.array([[1, 2], [3, 4]], np.uint8))
  with open(plain, 'rb') as f, gzip.open(str(tmp_path / 'b'), 'wb') as g:
    g.write(f.read())
  np.testing.assert_array_equal(idx.read_idx(str(tmp_path / 'b')), [[1, 2], [3, 4]])


@pytest.mark.parametrize('dtype', [np.int8, np.int16, np.int32, np.float32, np.float64])
def test_other_dtypes_round_trip(tmp_path, dtype):
  array = (np.arange(6) - 3).astype(dtype).reshape(3, 2)
  path = str(tmp_path / 'x.gz')
  idx.write_idx(path, array)
  back = idx.read_idx(path)
  assert back.dtype == np.dtype(dtype)
  np.testing.assert_array_equal(back, array)


def test_bad_magic(tmp_path):
  path = tmp_path / 'bad'
  path.write_bytes(b'\x01\x02\x08\x01\x00\x00\x00\x01\x05')
  with pytest.raises(ValueError, match='magic'):
    idx.read_idx(str(path))


def test_truncated_data(tmp_path):
  path = tmp_path / 'short'
  path.write_bytes(bytes([0, 0, 8, 1, 0, 0, 0, 5, 1, 2]))
  with pytest.raises(ValueError, match='5 bytes'):
    idx.read_idx(str(path))


def test_find_idx_file(tmp_path):
  assert idx.find_idx_file(str(tmp_path), 'f') is None
  idx.write_idx(str(tmp_path / 'f.gz'), np.zeros([1], np.uint8))
  assert idx.find_idx_file(str(tmp_path), 'f') == os.path.join(str(tmp_path), 'f.gz')
  idx.write_idx(str(tmp_path / 'f'), np.zeros([1], np.uint8))
  assert idx.find_idx_file(str(tmp_path), 'f') == os.path.join(str(tmp_path), 'f')
