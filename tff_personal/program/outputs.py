"""The files a run writes under `<root_output_dir>/<experiment_name>/`.

  flags.txt            the resolved flags (a flagfile that reruns the run)
  run_config.json      what a resumed run must agree with
  metrics.csv          one row per round: training metrics, round time, and
                       on evaluation rounds the summary of per-client metrics
  eval_per_client.csv  one row per (evaluation round, client)
  tensorboard/         the same round metrics as TensorBoard scalars
  checkpoints/         program state (TFF's FileProgramStateManager)
  personal_states.sqlite  the clients' personal states (algorithms with any): an
                       index, each state a file in personal_states.sqlite-states/
                       (its spare/ folder: files a checkpoint dropped, reused)
  summary.json         the run summary, written at the end
"""

import collections
import csv
import json
import math
import os
from typing import Any, Iterable, Mapping, Sequence

import numpy as np
import tensorflow as tf


class ExperimentDir:
  """Paths of one run's outputs (see the module docstring)."""

  def __init__(self, root_output_dir: str, experiment_name: str):
    self.path = os.path.join(root_output_dir, experiment_name)
    self.flags_path = os.path.join(self.path, 'flags.txt')
    self.config_path = os.path.join(self.path, 'run_config.json')
    self.metrics_path = os.path.join(self.path, 'metrics.csv')
    self.eval_path = os.path.join(self.path, 'eval_per_client.csv')
    self.tensorboard_dir = os.path.join(self.path, 'tensorboard')
    self.checkpoint_dir = os.path.join(self.path, 'checkpoints')
    self.store_path = os.path.join(self.path, 'personal_states.sqlite')
    self.summary_path = os.path.join(self.path, 'summary.json')

  def make(self) -> None:
    os.makedirs(self.path, exist_ok=True)


def flatten_metrics(structure: Any, prefix: str = '') -> collections.OrderedDict:
  """`{'a': {'b': 1}}` -> `{'a/b': 1}`, scalars as Python numbers, empties dropped."""
  flat = collections.OrderedDict()
  if isinstance(structure, Mapping):
    items = structure.items()
  elif isinstance(structure, (tuple, list)) and hasattr(structure, '_fields'):
    items = zip(structure._fields, structure)
  elif isinstance(structure, (tuple, list)):
    items = ((str(i), v) for i, v in enumerate(structure))
  else:
    value = np.asarray(structure)
    if value.size == 1:
      flat[prefix] = value.item()
    return flat
  for key, value in items:
    flat.update(flatten_metrics(value, f'{prefix}/{key}' if prefix else str(key)))
  return flat


class RoundCsv:
  """A CSV with a `round` column; rows after a resumed round are dropped.

  Columns may grow (evaluation rounds add some); the file is rewritten then.
  """

  def __init__(self, path: str):
    self._path = path
    self._fieldnames: list[str] = []
    if os.path.exists(path):
      with open(path, newline='') as f:
        self._fieldnames = list(csv.DictReader(f).fieldnames or [])

  def read(self) -> list[dict[str, str]]:
    if not os.path.exists(self._path):
      return []
    with open(self._path, newline='') as f:
      return list(csv.DictReader(f))

  def truncate_after(self, round_num: int) -> None:
    rows = [r for r in self.read() if int(r['round']) <= round_num]
    self._rewrite(self._fieldnames, rows)

  def append(self, rows: Iterable[Mapping[str, Any]]) -> None:
    rows = [dict(r) for r in rows]
    if not rows:
      return
    new_fields = [k for r in rows for k in r if k not in self._fieldnames]
    if new_fields or not os.path.exists(self._path):
      fieldnames = self._fieldnames + list(dict.fromkeys(new_fields))
      self._rewrite(fieldnames, self.read() + rows)
      return
    with open(self._path, 'a', newline='') as f:
      csv.DictWriter(f, self._fieldnames).writerows(rows)

  def _rewrite(self, fieldnames: Sequence[str], rows: Sequence[Mapping[str, Any]]):
    tmp = self._path + '.tmp'
    with open(tmp, 'w', newline='') as f:
      writer = csv.DictWriter(f, fieldnames)
      writer.writeheader()
      writer.writerows(rows)
    os.replace(tmp, self._path)
    self._fieldnames = list(fieldnames)


class TensorBoardWriter:
  """Round metrics as TensorBoard scalars (step = round)."""

  def __init__(self, directory: str):
    self._writer = tf.summary.create_file_writer(directory)

  def write(self, round_num: int, metrics: Mapping[str, Any]) -> None:
    with self._writer.as_default():
      for name, value in metrics.items():
        if isinstance(value, (int, float)) and math.isfinite(value):
          tf.summary.scalar(name, value, step=round_num)
    self._writer.flush()

  def close(self) -> None:
    self._writer.close()


def write_json(path: str, value: Any) -> None:
  tmp = path + '.tmp'
  with open(tmp, 'w') as f:
    json.dump(value, f, indent=2, sort_keys=True, default=_json_default)
    f.write('\n')
  os.replace(tmp, path)


def read_json(path: str) -> Any:
  with open(path) as f:
    return json.load(f)


def _json_default(value):
  if isinstance(value, np.generic):
    return value.item()
  if isinstance(value, np.ndarray):
    return value.tolist()
  raise TypeError(f'Not JSON serializable: {type(value)}')
