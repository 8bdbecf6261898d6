"""The personal states of a round's clients, read from and written to the store.

The training program and `bin/benchmark.py` move states between a
`PersonalizedProcess` and a `ClientStateStore` through `PersonalStates`.
"""

from typing import Any, Optional

import numpy as np
import tensorflow as tf

from tff_personal.personal import process as process_lib
from tff_personal.personal import store as store_lib


def flatten(structure: Any) -> list[np.ndarray]:
  """A personal state as the flat list of arrays the store keeps."""
  return [np.asarray(v) for v in tf.nest.flatten(structure)]


class PersonalStates:
  """Reads and writes the personal states of a round's clients.

  Between a process and its `ClientStateStore`: states go in flat and come
  back in the process's structure, a client seen for the first time gets the
  process's initial personal state, and a process whose personal state holds
  no tensor (FedAvg) needs no store at all.
  """

  def __init__(
      self, process: process_lib.PersonalizedProcess, store_path: str, *, resuming: bool
  ):
    self._process = process
    self._store = None
    if process.has_personal_state:
      # A checkpoint's personal states must be there: never start afresh.
      self._store = store_lib.ClientStateStore(store_path, create=not resuming)
    self._template = None

  def read(self, client_ids, before_round: int, model_weights_fn) -> list[Any]:
    """The clients' states; new clients get `initial_personal_state`."""
    if self._store is None:  # P holds no tensor: the same (empty) P for all.
      if self._template is None:
        self._template = self._process.initial_personal_state(client_ids[0], None)
      return [self._template] * len(client_ids)
    flat_states = self._store.read(client_ids, before_round=before_round)
    model_weights = None
    if self._template is None or any(f is None for f in flat_states):
      model_weights = model_weights_fn()
    if self._template is None:
      self._template = self._process.initial_personal_state(client_ids[0], model_weights)
    return [
        self._process.initial_personal_state(client_id, model_weights)
        if flat is None
        else tf.nest.pack_sequence_as(self._template, flat)
        for client_id, flat in zip(client_ids, flat_states)
    ]

  def prefetch(self, client_ids, before_round: int) -> None:
    """Starts reading the clients' states for a later `read` (the store's
    `prefetch`): the next round's, while this one trains."""
    if self._store is not None:
      self._store.prefetch(client_ids, before_round=before_round)

  def write(self, round_num: int, client_ids, states) -> None:
    if self._store is not None:
      self._store.write(round_num, {c: flatten(s) for c, s in zip(client_ids, states)})

  def fingerprint(self, round_num: int) -> np.ndarray:
    if self._store is None:
      return store_lib.StoreFingerprint(round_num, 0, 0).as_array()
    return self._store.fingerprint(round_num).as_array()

  def after_checkpoint(self, round_num: int) -> None:
    if self._store is not None:
      self._store.checkpoint(round_num)

  def restore(self, fingerprint: np.ndarray) -> None:
    if self._store is not None:
      self._store.restore(store_lib.StoreFingerprint.from_array(fingerprint))

  @property
  def store(self) -> Optional[store_lib.ClientStateStore]:
    """The store; None for a process without personal state."""
    return self._store

  def close(self) -> None:
    if self._store is not None:
      self._store.close()
