"""Writes client data in the SQLite format read by TFF's dataset loaders.

`tff.simulation.datasets.{emnist,shakespeare,stackoverflow,cifar100}.load_data`
read `<cache_dir>/<name>.sqlite` (and only download when it is missing). The
format, as `tff.simulation.datasets.SqlClientData` reads it:

  examples(split_name TEXT, client_id TEXT, serialized_example_proto BLOB)
  client_metadata(client_id TEXT, split_name TEXT, num_examples INTEGER)

one `tf.train.Example` per row. Unlike TFF's `save_to_sql_client_data`, a
client may appear in several splits (EMNIST's `all_train`/`all_test`).
"""

import collections
import os
import sqlite3
import tempfile
from typing import Iterable, Mapping, Sequence, Union

import numpy as np
import tensorflow as tf

FeatureValue = Union[bytes, str, float, int, Sequence, np.ndarray]


def _feature(value: FeatureValue) -> tf.train.Feature:
  array = np.asarray(value)
  if array.dtype.kind in ('S', 'U', 'O'):
    values = [v.encode() if isinstance(v, str) else bytes(v) for v in array.reshape(-1)]
    return tf.train.Feature(bytes_list=tf.train.BytesList(value=values))
  # .tolist(): protobuf copies Python floats/ints far faster than NumPy scalars.
  if array.dtype.kind == 'f':
    return tf.train.Feature(float_list=tf.train.FloatList(value=array.reshape(-1).tolist()))
  if array.dtype.kind in ('i', 'u', 'b'):
    return tf.train.Feature(int64_list=tf.train.Int64List(value=array.reshape(-1).tolist()))
  raise TypeError(f'Unsupported feature dtype {array.dtype}.')


def serialize_example(features: Mapping[str, FeatureValue]) -> bytes:
  """A `tf.train.Example` proto with one feature per key, serialized."""
  return tf.train.Example(
      features=tf.train.Features(
          feature={k: _feature(v) for k, v in features.items()}
      )
  ).SerializeToString()


def write_client_data(
    database_path: str, rows: Iterable[tuple[str, str, bytes]]
) -> dict[tuple[str, str], int]:
  """Writes `(split_name, client_id, serialized_example)` rows atomically.

  The database appears at `database_path` only once complete (it is written
  to a temporary file in the same directory, then renamed), so an interrupted
  preparation never leaves a half-written dataset for the loader to trust.

  Returns:
    The number of examples per `(split_name, client_id)`.
  """
  directory = os.path.dirname(os.path.abspath(database_path))
  os.makedirs(directory, exist_ok=True)
  fd, tmp_path = tempfile.mkstemp(dir=directory, suffix='.sqlite.tmp')
  os.close(fd)
  counts = collections.Counter()
  try:
    with sqlite3.connect(tmp_path) as connection:
      connection.execute(
          'CREATE TABLE examples (split_name TEXT NOT NULL, client_id TEXT NOT'
          ' NULL, serialized_example_proto BLOB NOT NULL);'
      )
      connection.execute(
          'CREATE TABLE client_metadata (client_id TEXT NOT NULL, split_name'
          ' TEXT NOT NULL, num_examples INTEGER NOT NULL);'
      )

      def checked_rows():
        for split_name, client_id, example in rows:
          if "'" in client_id or "'" in split_name:
            # SqlClientData splices ids into its SQL query unescaped.
            raise ValueError(f'Client id or split contains a quote: {client_id!r}')
          counts[(split_name, client_id)] += 1
          yield split_name, client_id, example

      connection.executemany(
          'INSERT INTO examples VALUES (?, ?, ?);', checked_rows()
      )
      connection.executemany(
          'INSERT INTO client_metadata VALUES (?, ?, ?);',
          [(c, s, n) for (s, c), n in sorted(counts.items())],
      )
      connection.execute(
          'CREATE INDEX examples_by_client ON examples (client_id, split_name);'
      )
    connection.close()
    os.chmod(tmp_path, 0o644)  # mkstemp creates it private to its owner.
    os.replace(tmp_path, database_path)
  except BaseException:
    os.remove(tmp_path)
    raise
  return dict(counts)
