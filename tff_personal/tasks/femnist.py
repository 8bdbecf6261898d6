"""FEMNIST sample: 105 real LEAF writers through TFF's EMNIST loader.

LEAF's FEMNIST (Caldas et al. 2018, "LEAF: A Benchmark for Federated
Settings") is federated EMNIST: one client per writer, 62 classes. The sample
`femnist105.npz` (x uint8 [N, 784] with 255 = background, y, writer, split)
is written once into TFF's EMNIST SQLite format,
`<cache_dir>/tff_personal/femnist105/emnist_all.sqlite` (`pixels` = x / 255,
so 1.0 = background as in TFF; `label` int64; splits `all_train`/`all_test`
and `digits_only_train`/`digits_only_test`), then read by the real
`tff.simulation.datasets.emnist.load_data`. Model and preprocessing are those
of the `emnist` task.

A sidecar `emnist_all.sqlite.source.json`, written after the database, holds
the SHA-256 of the npz it came from: a database without a matching sidecar
(a different npz, or an interrupted preparation) is rebuilt.
"""

import hashlib
import json
import os

from absl import logging
import numpy as np

from tff_personal.tasks import base
from tff_personal.tasks import emnist
from tff_personal.tasks import options as task_options
from tff_personal.tasks import sqlite_format

FORMAT_VERSION = 1
_DIGITS = 10


def femnist_cache_folder(cache_dir: str) -> str:
  return os.path.join(os.path.expanduser(cache_dir), 'tff_personal', 'femnist105')


def _sha256(path: str) -> str:
  digest = hashlib.sha256()
  with open(path, 'rb') as f:
    for chunk in iter(lambda: f.read(1 << 20), b''):
      digest.update(chunk)
  return digest.hexdigest()


def _rows(npz_path: str):
  """(split_name, client_id, serialized tf.Example) rows of the npz."""
  with np.load(npz_path) as data:
    x, y, writers, splits = data['x'], data['y'], data['writer'], data['split']
  if x.shape[1:] != (784,) or not len(x) == len(y) == len(writers) == len(splits):
    raise ValueError(f'{npz_path}: expected x [N, 784], y, writer, split of length N.')
  unknown = set(np.unique(splits)) - {'train', 'test'}
  if unknown:
    raise ValueError(f'{npz_path}: unknown split values {sorted(unknown)}.')
  pixels = x.astype(np.float32) / 255.0
  for i in range(len(x)):
    label = int(y[i])
    example = sqlite_format.serialize_example({'pixels': pixels[i], 'label': label})
    writer, split = str(writers[i]), str(splits[i])
    yield f'all_{split}', writer, example
    if label < _DIGITS:
      yield f'digits_only_{split}', writer, example


def prepare_femnist_sqlite(npz_path: str, cache_dir: str) -> str:
  """Writes the npz as TFF's `emnist_all.sqlite` unless already up to date.

  Returns:
    The folder holding `emnist_all.sqlite`, to pass as TFF's `cache_dir`.
  """
  folder = femnist_cache_folder(cache_dir)
  database = os.path.join(folder, emnist.EMNIST_FILENAME)
  marker_path = database + '.source.json'
  marker = {'format': FORMAT_VERSION, 'sha256': _sha256(npz_path)}
  if os.path.isfile(database) and os.path.isfile(marker_path):
    with open(marker_path) as f:
      try:
        if json.load(f) == marker:
          return folder
      except ValueError:
        pass
  logging.info('Writing %s from %s.', database, npz_path)
  if os.path.exists(marker_path):
    os.remove(marker_path)
  counts = sqlite_format.write_client_data(database, _rows(npz_path))
  tmp_marker = marker_path + '.tmp'
  with open(tmp_marker, 'w') as f:
    json.dump(marker, f)
  os.replace(tmp_marker, marker_path)
  logging.info(
      'Wrote %d examples of %d writers.',
      sum(n for (s, _), n in counts.items() if s.startswith('all_')),
      len({c for _, c in counts}),
  )
  return folder


def build_femnist_task(options: task_options.TaskOptions) -> base.Task:
  """The FEMNIST sample as a task; see the module docstring.

  Raises:
    base.DataUnavailableError: if `options.femnist_path` does not exist.
  """
  path = os.path.expanduser(options.femnist_path)
  if not os.path.isfile(path):
    raise base.DataUnavailableError(
        f'Task femnist needs the FEMNIST sample {path}, which is missing;'
        ' point --femnist_path at femnist105.npz.'
    )
  folder = prepare_femnist_sqlite(path, options.cache_dir)
  return emnist.emnist_task_from_cache_dir('femnist', folder, options.cnn)
