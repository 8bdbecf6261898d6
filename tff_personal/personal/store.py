"""Personal client states keyed by client id, in an embedded SQLite database.

A run's memory stays proportional to the clients of a round, not to the
population: the program reads the states of the round's clients, runs the
round, and writes their new states back. Each row holds one client's state
(a flat list of NumPy arrays, serialized with `np.save`, no pickle) and the
round that wrote it:

  personal_states(client_id TEXT, round INTEGER, state BLOB,
                  PRIMARY KEY (client_id, round))

The store may be shared by the threads of a round (one connection, a lock);
other processes may read it concurrently (WAL journal).

Checkpoints and the store agree through versions. Between two checkpoints a
client may have a row per round it trained in; `checkpoint(r)` then keeps,
per client, only its newest row of round <= r (one row per client), and
`restore(r, fingerprint)` deletes rows written after round r, so a resumed run
continues with exactly the personal states of the checkpointed round. The
fingerprint saved with the program checkpoint detects a missing, replaced or
corrupt store: that is an error, never a silent re-initialization.
"""

import contextlib
import dataclasses
import io
import os
import sqlite3
import threading
from typing import Mapping, Optional, Sequence

import numpy as np

FlatState = list[np.ndarray]


class StoreMismatchError(Exception):
  """The store does not hold the personal states the checkpoint expects."""


@dataclasses.dataclass(frozen=True)
class StoreFingerprint:
  """What a checkpoint of round `round_num` expects to find in the store."""

  round_num: int
  num_clients: int
  last_write_round: int

  def as_array(self) -> np.ndarray:
    return np.array([self.round_num, self.num_clients, self.last_write_round], np.int64)

  @classmethod
  def from_array(cls, array) -> 'StoreFingerprint':
    round_num, num_clients, last_write_round = (int(v) for v in np.asarray(array))
    return cls(round_num, num_clients, last_write_round)


def serialize_state(arrays: Sequence[np.ndarray]) -> bytes:
  buffer = io.BytesIO()
  for array in arrays:
    np.save(buffer, np.asarray(array), allow_pickle=False)
  return buffer.getvalue()


def deserialize_state(blob: bytes) -> FlatState:
  buffer = io.BytesIO(blob)
  arrays = []
  while buffer.tell() < len(blob):
    arrays.append(np.load(buffer, allow_pickle=False))
  return arrays


class ClientStateStore:
  """Versioned personal states; see the module docstring."""

  def __init__(self, path: str, *, create: bool = True):
    """Opens the store at `path`; with `create=False` it must already exist."""
    if not create and not os.path.isfile(path):
      raise StoreMismatchError(f'The personal state store {path} is missing.')
    self._path = path
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    # One connection, shared by the threads of a round under a lock.
    self._lock = threading.RLock()
    self._connection = sqlite3.connect(
        path, isolation_level=None, check_same_thread=False
    )
    try:
      self._connection.execute('PRAGMA journal_mode=WAL;')
      self._connection.execute('PRAGMA synchronous=NORMAL;')
      self._connection.execute(
          'CREATE TABLE IF NOT EXISTS personal_states (client_id TEXT NOT NULL,'
          ' round INTEGER NOT NULL, state BLOB NOT NULL, PRIMARY KEY (client_id,'
          ' round));'
      )
    except sqlite3.DatabaseError as e:
      self._connection.close()
      raise StoreMismatchError(f'{path} is not a personal state store: {e}') from e

  @property
  def path(self) -> str:
    return self._path

  def close(self) -> None:
    self._connection.close()

  def read(
      self, client_ids: Sequence[str], *, before_round: Optional[int] = None
  ) -> list[Optional[FlatState]]:
    """The newest state of each client (written before `before_round`).

    Returns `None` for a client with no state yet (seen for the first time).
    """
    limit = np.iinfo(np.int64).max if before_round is None else before_round
    states = []
    for client_id in client_ids:
      with self._lock:
        row = self._connection.execute(
            'SELECT round, state FROM personal_states WHERE client_id = ? AND'
            ' round < ? ORDER BY round DESC LIMIT 1;',
            (client_id, limit),
        ).fetchone()
      if row is None:
        states.append(None)
        continue
      try:
        states.append(deserialize_state(row[1]))
      except (ValueError, EOFError, OSError) as e:
        raise StoreMismatchError(
            f'The personal state of client {client_id!r} written in round'
            f' {row[0]} in {self._path} is corrupt ({e}).'
        ) from e
    return states

  def write(self, round_num: int, states: Mapping[str, Sequence[np.ndarray]]) -> None:
    """Stores the states the clients computed in `round_num`, atomically."""
    rows = [(cid, round_num, serialize_state(s)) for cid, s in states.items()]
    with self._transaction():
      self._connection.executemany(
          'INSERT OR REPLACE INTO personal_states VALUES (?, ?, ?);', rows
      )

  def checkpoint(self, round_num: int) -> StoreFingerprint:
    """Keeps one row per client as of `round_num`; returns its fingerprint.

    Call after the program checkpoint of `round_num` is safely written; rows
    of later rounds (none in a sequential run) are kept.
    """
    with self._transaction():
      self._connection.execute(
          'DELETE FROM personal_states WHERE round <= ? AND round < (SELECT'
          ' MAX(p.round) FROM personal_states p WHERE p.client_id ='
          ' personal_states.client_id AND p.round <= ?);',
          (round_num, round_num),
      )
    return self.fingerprint(round_num)

  def fingerprint(self, round_num: int) -> StoreFingerprint:
    with self._lock:
      num_clients, last_round = self._connection.execute(
          'SELECT COUNT(DISTINCT client_id), COALESCE(MAX(round), 0) FROM'
          ' personal_states WHERE round <= ?;',
          (round_num,),
      ).fetchone()
    return StoreFingerprint(round_num, num_clients, last_round)

  def restore(self, expected: StoreFingerprint) -> None:
    """Rolls back to the checkpointed round; raises `StoreMismatchError`."""
    try:
      with self._lock:
        (integrity,) = self._connection.execute('PRAGMA quick_check;').fetchone()
      if integrity != 'ok':
        raise StoreMismatchError(f'{self._path} is corrupt: {integrity}')
      with self._transaction():
        self._connection.execute(
            'DELETE FROM personal_states WHERE round > ?;', (expected.round_num,)
        )
      found = self.fingerprint(expected.round_num)
    except sqlite3.DatabaseError as e:
      raise StoreMismatchError(f'{self._path} is unreadable: {e}') from e
    if found != expected:
      raise StoreMismatchError(
          f'{self._path} does not match the checkpoint of round'
          f' {expected.round_num}: it holds {found.num_clients} clients (last'
          f' written in round {found.last_write_round}), the checkpoint expects'
          f' {expected.num_clients} (last written in round'
          f' {expected.last_write_round}).'
      )

  @contextlib.contextmanager
  def _transaction(self):
    with self._lock:
      self._connection.execute('BEGIN IMMEDIATE;')
      try:
        yield
      except BaseException:
        self._connection.execute('ROLLBACK;')
        raise
      self._connection.execute('COMMIT;')
