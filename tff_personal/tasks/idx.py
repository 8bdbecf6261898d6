"""Reads and writes idx files, the format of MNIST and Fashion-MNIST.

The format (LeCun et al., http://yann.lecun.com/exdb/mnist/): a 4-byte magic
number `0x00 0x00 <type> <ndim>`, then `ndim` big-endian uint32 dimensions,
then the values, big-endian, row-major. Files may be gzip-compressed
(`*.gz`); compression is detected from the content, not the name.
"""

import gzip
import os
import struct
from typing import Optional

import numpy as np

_DTYPES = {
    0x08: np.dtype('u1'),
    0x09: np.dtype('i1'),
    0x0B: np.dtype('>i2'),
    0x0C: np.dtype('>i4'),
    0x0D: np.dtype('>f4'),
    0x0E: np.dtype('>f8'),
}
_CODES = {dtype.newbyteorder('>'): code for code, dtype in _DTYPES.items()}
_GZIP_MAGIC = b'\x1f\x8b'


def _open(path: str):
  with open(path, 'rb') as f:
    compressed = f.read(2) == _GZIP_MAGIC
  return gzip.open(path, 'rb') if compressed else open(path, 'rb')


def read_idx(path: str) -> np.ndarray:
  """Returns the array stored in the idx file `path` (gzipped or plain).

  Raises:
    ValueError: if the file is not a well-formed idx file.
  """
  with _open(path) as f:
    data = f.read()
  if len(data) < 4 or data[0] != 0 or data[1] != 0:
    raise ValueError(f'{path} is not an idx file (bad magic number).')
  code, ndim = data[2], data[3]
  if code not in _DTYPES:
    raise ValueError(f'{path}: unknown idx element type 0x{code:02x}.')
  header_size = 4 + 4 * ndim
  if len(data) < header_size:
    raise ValueError(f'{path}: truncated idx header.')
  shape = struct.unpack(f'>{ndim}I', data[4:header_size])
  dtype = _DTYPES[code]
  expected = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
  if len(data) - header_size != expected:
    raise ValueError(
        f'{path}: idx header says {expected} bytes of data for shape {shape},'
        f' found {len(data) - header_size}.'
    )
  array = np.frombuffer(data, dtype=dtype, offset=header_size).reshape(shape)
  return array.astype(dtype.newbyteorder('='))


def write_idx(path: str, array: np.ndarray) -> None:
  """Writes `array` as an idx file; gzipped when `path` ends with `.gz`."""
  array = np.asarray(array)
  dtype = array.dtype.newbyteorder('>')
  if dtype not in _CODES:
    raise ValueError(f'idx cannot store dtype {array.dtype}.')
  header = bytes([0, 0, _CODES[dtype], array.ndim])
  header += struct.pack(f'>{array.ndim}I', *array.shape)
  payload = header + array.astype(dtype).tobytes()
  opener = gzip.open if path.endswith('.gz') else open
  with opener(path, 'wb') as f:
    f.write(payload)


def find_idx_file(directory: str, name: str) -> Optional[str]:
  """The path of `name` or `name.gz` in `directory`, or None if neither exists."""
  for candidate in (name, name + '.gz'):
    path = os.path.join(directory, candidate)
    if os.path.isfile(path):
      return path
  return None
