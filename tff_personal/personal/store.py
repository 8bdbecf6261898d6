"""Personal client states keyed by client id: an SQLite index, a file a state.

A run's memory stays proportional to the clients of a round, not to the
population: the program reads the states of the round's clients, runs the
round, and writes their new states back. Each row of the database names
one client's state and the round that wrote it:

  personal_states(client_id TEXT, round INTEGER, state BLOB,
                  PRIMARY KEY (client_id, round))

The state (a flat list of NumPy arrays, serialized with `np.save`, no
pickle) is the file `<store>-states/<round>/<sha256 of the client id>`,
written before its row commits (to a temporary name, then renamed), and the
row's BLOB is the marker `file`; stores written by older versions of this
module hold the state in the BLOB itself, and read as before. Files cost one copy
to write and an unlink to drop, where a BLOB of megabytes went through the
WAL and the database and was freed page by page (10 FEMNIST CNN states a
round: 70 ms of CPU to write, 0.5 s per 100 rows to drop; docs/results_scale.md).
A read copies each file once, into a buffer its arrays then share.

The store may be shared by the threads of a round (one connection, a lock);
other processes may read it concurrently (WAL journal; a read whose file a
checkpoint moved away meanwhile looks up the client's newer row).

Writes happen behind the round (`write_behind=True`, the default): `write`
takes the states' arrays (it marks them read-only, so later changes by the
caller cannot reach the store, and copies nothing) and hands them to one
writer thread with its own connection, which writes the files straight from
the arrays while the next round trains. Until a write commits, `read`
serves those clients from the pending rows (as copies); `flush`, `checkpoint`,
`fingerprint`, `restore` and `close` wait for every pending write first, so a
checkpoint's fingerprint counts only committed rows. A failed background
write raises `StoreWriteError` from the next call. A crash loses at most the
pending rows of rounds after the last checkpoint, which a resumed run rolls
back anyway.

Checkpoints and the store agree through versions. Between two checkpoints a
client may have a row per round it trained in; `checkpoint(r)` then keeps,
per client, only its newest row of round <= r (one row per client), and
`restore(r, fingerprint)` deletes rows written after round r, so a resumed run
continues with exactly the personal states of the checkpointed round. The
fingerprint saved with the program checkpoint detects a missing, replaced or
corrupt store: that is an error, never a silent re-initialization; so is a
row whose file is missing. A checkpoint moves the files of the rows it
deleted to `<store>-states/spare/` after committing, and `restore` removes
those of rounds after the checkpoint's: a crash can leave files that no row
names, never a row without its file.

Cost. A round reads and writes its cohort's rows by primary key, and a
checkpoint touches only the clients written since the previous one (found
through an index on round), so neither grows with the population. The
queries of `checkpoint` and `fingerprint` read indexes only: in a store of
BLOB rows (the older format; 64 KiB pages) each row kept 8-64 KiB of its
state in the table's own leaf pages, and a scan of the table at 100,000
clients took 0.7 s.

A new file costs the kernel more than the copy of its bytes: each of its
pages is allocated and accounted as it is written (10 FEMNIST CNN states,
68 MB: 85-95 ms of CPU a round in the writer thread, where rewriting
existing files took 10 ms; docs/results_scale.md). So a write
takes a spare file (one a checkpoint dropped) when there is one, moves it
to its temporary name and rewrites it in place. Spares never outnumber the
most states written between two checkpoints, and `close` removes them.

A read is on the round's path: the program cannot send the clients' states
before it has them (10 FEMNIST CNN states, 68 MB: 22 ms a round). The
program knows the next round's clients, so `prefetch` reads their states
in a background thread while the current round trains, and the next `read`
with the same `before_round` takes them. A write of a client, a `restore`
or the next `prefetch` drops what was read ahead for it, so a read never
returns an older state than it would have read itself.
"""

import concurrent.futures
import contextlib
import dataclasses
import hashlib
import io
import os
import queue
import shutil
import sqlite3
import threading
import time
from typing import Mapping, Optional, Sequence

import numpy as np

FlatState = list[np.ndarray]


class StoreMismatchError(Exception):
  """The store does not hold the personal states the checkpoint expects."""


class StoreWriteError(RuntimeError):
  """Writing personal states failed (e.g. a full disk); nothing after it is stored."""


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
  """The arrays in `np.save`'s format, one after the other, copied once."""
  return b''.join(_parts(_c_ordered(arrays)))


def _c_ordered(arrays: Sequence[np.ndarray]) -> FlatState:
  """The arrays as C-ordered NumPy arrays (a non-contiguous one copied)."""
  ordered = []
  for array in arrays:
    array = np.asarray(array)
    if array.dtype.hasobject:
      raise ValueError(f'Cannot store an array of Python objects ({array.dtype}).')
    ordered.append(array if array.flags.c_contiguous else array.copy(order='C'))
  return ordered


def _taken(arrays: Sequence[np.ndarray]) -> FlatState:
  """The arrays as C-ordered NumPy arrays, read-only from now on.

  The store writes a state from the caller's arrays without copying them
  first (a copy of 10 FEMNIST CNN states took 30 ms of CPU in the round's
  thread): the caller cannot change them in place afterwards, so nothing
  but what was written reaches the store.
  """
  taken = _c_ordered(arrays)
  for array in taken:
    array.flags.writeable = False
  return taken


def _parts(arrays: FlatState) -> list:
  """`serialize_state`'s bytes in pieces: each array's header, then its data."""
  parts = []
  for array in arrays:
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, np.lib.format.header_data_from_array_1_0(array))
    parts.append(header.getvalue())
    parts.append(memoryview(array).cast('B') if array.size else b'')
  return parts


# The BLOB of a row whose state is in its file (`ClientStateStore._file_path`).
_IN_FILE = b'file'


# NumPy parses an array header with `ast.literal_eval`, and the AST
# constructor of CPython 3.11.7 is not thread-safe: threads of a round
# reading states at once raised "SystemError: AST constructor recursion
# depth mismatch" (seen once in CI). Headers are parsed one at a time.
_HEADER_LOCK = threading.Lock()


def deserialize_state(blob: bytes) -> FlatState:
  """The arrays of `serialize_state` (or `np.save`), sharing one writable copy."""
  return _arrays_in(bytearray(blob))


class _Cursor:
  """Reads a buffer like a file, for NumPy's header parsers, without copying
  it (`io.BytesIO` copies a writable buffer whole)."""

  def __init__(self, data):
    self._view = memoryview(data)
    self._position = 0

  def read(self, size: int) -> bytes:
    chunk = self._view[self._position:self._position + size].tobytes()
    self._position += len(chunk)
    return chunk

  def tell(self) -> int:
    return self._position

  def seek(self, position: int) -> None:
    self._position = position


def _arrays_in(data) -> FlatState:
  """The arrays of `serialize_state`'s bytes: views of the writable buffer
  `data` (a bytearray or a uint8 array), not copies."""
  buffer = _Cursor(data)
  arrays = []
  while buffer.tell() < len(data):
    version = np.lib.format.read_magic(buffer)
    with _HEADER_LOCK:
      if version == (1, 0):
        shape, fortran_order, dtype = np.lib.format.read_array_header_1_0(buffer)
      else:
        shape, fortran_order, dtype = np.lib.format.read_array_header_2_0(buffer)
    if dtype.hasobject:
      raise ValueError(f'An array of Python objects ({dtype}) in a personal state.')
    count = int(np.prod(shape, dtype=np.int64))
    offset = buffer.tell()
    if offset + count * dtype.itemsize > len(data):
      raise EOFError(f'The state ends inside an array of shape {shape}.')
    array = np.frombuffer(data, dtype=dtype, count=count, offset=offset)
    arrays.append(array.reshape(shape, order='F' if fortran_order else 'C'))
    buffer.seek(offset + count * dtype.itemsize)
  return arrays


class ClientStateStore:
  """Versioned personal states; see the module docstring."""

  def __init__(self, path: str, *, create: bool = True, write_behind: bool = True):
    """Opens the store at `path`; with `create=False` it must already exist."""
    if not create and not os.path.isfile(path):
      raise StoreMismatchError(f'The personal state store {path} is missing.')
    self._path = path
    self._files_dir = path + '-states'
    # Files of rows a checkpoint dropped, each rewritten in place by a later
    # write (module docstring, "Cost"); removed by `close` if this object
    # wrote or checkpointed (a process that only reads leaves them).
    self._spare_dir = os.path.join(self._files_dir, 'spare')
    self._spares = sorted(os.listdir(self._spare_dir)) if os.path.isdir(self._spare_dir) else []
    self._spares_lock = threading.Lock()
    self._wrote = False
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    # One connection, shared by the threads of a round under a lock.
    self._lock = threading.RLock()
    self._connection = self._connect()
    # Rows handed to the writer thread and not yet committed:
    # client id -> {round: the arrays `write` took}.
    self._pending: dict[str, dict[int, FlatState]] = {}
    self._pending_lock = threading.Lock()
    self._write_error: Optional[BaseException] = None
    # The round of the last `checkpoint` or `restore` through this object.
    self._checkpointed_round: Optional[int] = None
    # States read ahead (`prefetch`): client id -> the read's future, for a
    # `read` with `before_round` = `self._prefetch_limit`.
    self._prefetched: dict[str, concurrent.futures.Future] = {}
    self._prefetch_limit: Optional[int] = None
    self._prefetch_lock = threading.RLock()
    self._prefetcher: Optional[concurrent.futures.ThreadPoolExecutor] = None
    # The store's own threads (writer, prefetcher), for `threads_cpu_seconds`.
    self._threads: list[threading.Thread] = []
    self._queue: Optional[queue.Queue] = None
    if write_behind:
      # At most two batches of rows waiting: a faster producer blocks in `write`.
      self._queue = queue.Queue(maxsize=2)
      self._writer = threading.Thread(
          target=self._write_loop, args=(self._connect(),), name='personal-state-writer',
          daemon=True,
      )
      self._writer.start()
      self._threads.append(self._writer)

  def _connect(self) -> sqlite3.Connection:
    connection = sqlite3.connect(self._path, isolation_level=None, check_same_thread=False)
    try:
      # Large pages: a state is megabytes, and 4 KiB pages (the default) make
      # every BLOB a long overflow chain (a Ditto FEMNIST round's writes took
      # 1.7x as long). Takes effect only for a new file, before WAL is set.
      connection.execute('PRAGMA page_size=65536;')
      connection.execute('PRAGMA journal_mode=WAL;')
      connection.execute('PRAGMA synchronous=NORMAL;')
      connection.execute(
          'CREATE TABLE IF NOT EXISTS personal_states (client_id TEXT NOT NULL,'
          ' round INTEGER NOT NULL, state BLOB NOT NULL, PRIMARY KEY (client_id,'
          ' round));'
      )
      # Rows by round: a checkpoint finds the clients written since the last
      # one without reading the table (module docstring, "Cost").
      connection.execute(
          'CREATE INDEX IF NOT EXISTS personal_states_by_round ON'
          ' personal_states (round, client_id);'
      )
    except sqlite3.DatabaseError as e:
      connection.close()
      raise StoreMismatchError(f'{self._path} is not a personal state store: {e}') from e
    return connection

  @property
  def path(self) -> str:
    return self._path

  def close(self) -> None:
    """Waits for pending writes, then closes (raises if one failed)."""
    try:
      self._drop_prefetched()
      if self._prefetcher is not None:
        self._prefetcher.shutdown(wait=True, cancel_futures=True)
      if self._queue is not None and self._writer.is_alive():
        self._queue.put(None)
        self._writer.join()
      self._raise_if_a_write_failed()
    finally:
      self._connection.close()
      if self._wrote:
        shutil.rmtree(self._spare_dir, ignore_errors=True)

  def threads_cpu_seconds(self) -> float:
    """CPU time the store's own threads (the writer, the prefetcher) have
    used so far, while they run (for measurements: bin/benchmark.py)."""
    return sum(
        time.clock_gettime(time.pthread_getcpuclockid(thread.ident))
        for thread in list(self._threads) if thread.is_alive()  # Both end in `close`.
    )

  def flush(self) -> None:
    """Returns once every write so far is committed; raises `StoreWriteError`."""
    if self._queue is not None:
      self._queue.join()
    self._raise_if_a_write_failed()

  def client_ids(self) -> list[str]:
    """Every client with a state (committed or pending), sorted."""
    self._raise_if_a_write_failed()
    with self._pending_lock:
      ids = {c for c, rounds in self._pending.items() if rounds}
    with self._lock:
      ids.update(row[0] for row in self._connection.execute(
          'SELECT DISTINCT client_id FROM personal_states;'
      ))
    return sorted(ids)

  def read(
      self, client_ids: Sequence[str], *, before_round: Optional[int] = None
  ) -> list[Optional[FlatState]]:
    """The newest state of each client (written before `before_round`).

    Returns `None` for a client with no state yet (seen for the first time).
    """
    self._raise_if_a_write_failed()
    limit = _limit(before_round)
    return [self._prefetched_or_read(client_id, limit) for client_id in client_ids]

  def prefetch(self, client_ids: Sequence[str], *, before_round: Optional[int] = None) -> None:
    """Starts reading the clients' states in a background thread, for the
    next `read` with the same `before_round` (module docstring, "Cost").

    Drops what an earlier `prefetch` read that no `read` took. A read takes
    a prefetched state once; one of a client written since, not at all.
    """
    self._raise_if_a_write_failed()
    with self._prefetch_lock:
      self._drop_prefetched()
      if self._prefetcher is None:
        self._prefetcher = concurrent.futures.ThreadPoolExecutor(
            1, thread_name_prefix='personal-state-prefetch',
            initializer=lambda: self._threads.append(threading.current_thread()),
        )
      self._prefetch_limit = _limit(before_round)
      for client_id in dict.fromkeys(client_ids):
        self._prefetched[client_id] = self._prefetcher.submit(
            self._read_one, client_id, self._prefetch_limit
        )

  def _drop_prefetched(self, client_ids: Optional[Sequence[str]] = None) -> None:
    """Forgets the prefetched states of `client_ids` (None: all)."""
    with self._prefetch_lock:
      for client_id in list(self._prefetched) if client_ids is None else client_ids:
        future = self._prefetched.pop(client_id, None)
        if future is not None:
          future.cancel()  # Its result, if it has run, is never used.

  def _prefetched_or_read(self, client_id: str, limit: int) -> Optional[FlatState]:
    with self._prefetch_lock:
      future = self._prefetched.pop(client_id, None) if limit == self._prefetch_limit else None
    if future is not None:
      return future.result()
    return self._read_one(client_id, limit)

  def _newest_row(self, client_id: str, limit: int):
    """(round, arrays | BLOB) of the client's newest row before `limit`, or None."""
    # Pending rows first: a row leaves `_pending` only after it committed.
    with self._pending_lock:
      rounds = [r for r in self._pending.get(client_id, {}) if r < limit]
      if rounds:
        return max(rounds), self._pending[client_id][max(rounds)]
    with self._lock:
      return self._connection.execute(
          'SELECT round, state FROM personal_states WHERE client_id = ? AND'
          ' round < ? ORDER BY round DESC LIMIT 1;',
          (client_id, limit),
      ).fetchone()

  def _read_one(self, client_id: str, limit: int) -> Optional[FlatState]:
    """The client's newest state before round `limit` (None: no state).

    Another process's checkpoint may drop a row between its lookup and the
    read of its file, and a later write rewrite that file in place (module
    docstring, "Cost"): a file that left its path before its read ended is
    read again through a new lookup, which finds the newer row.
    """
    row = self._newest_row(client_id, limit)
    while row is not None:
      path = self._file_path(client_id, row[0])
      try:
        state = self._state_of(row[1], path)
        if state is not None:
          return state
        newer = self._newest_row(client_id, limit)
        if newer is None or newer[0] == row[0]:  # Not dropped: missing or replaced.
          raise FileNotFoundError(f'{path} is missing or was replaced while it was read')
        row = newer
      except (ValueError, EOFError, OSError) as e:
        raise StoreMismatchError(
            f'The personal state of client {client_id!r} written in round'
            f' {row[0]} in {self._path} is corrupt ({e}).'
        ) from e
    return None

  @staticmethod
  def _state_of(written, path: str) -> Optional[FlatState]:
    """A row's state; None if its file left `path` before it was read whole."""
    if isinstance(written, list):  # Pending: the arrays `write` took.
      return [np.array(a) for a in written]
    if written != _IN_FILE:  # A row of the older format: the state in its BLOB.
      return deserialize_state(written)
    try:
      data = _read_file(path)
    except FileNotFoundError:
      return None
    return None if data is None else _arrays_in(data)

  def write(self, round_num: int, states: Mapping[str, Sequence[np.ndarray]]) -> None:
    """Stores the states the clients computed in `round_num`, atomically.

    The store takes the states' arrays: they become read-only (`_taken`).
    With write-behind, returns at once; the states' files and rows are
    written in the background (see the module docstring).
    """
    self._raise_if_a_write_failed()
    self._wrote = True
    self._drop_prefetched(list(states))  # Read ahead before this write: stale.
    rows = [(cid, round_num, _taken(s)) for cid, s in states.items()]
    if self._queue is None:
      file_rows = self._write_files(rows)
      with self._transaction():
        self._insert(self._connection, file_rows)
      return
    with self._pending_lock:
      for cid, _, arrays in rows:
        self._pending.setdefault(cid, {})[round_num] = arrays
    self._queue.put(rows)

  @staticmethod
  def _insert(connection: sqlite3.Connection, rows) -> None:
    connection.executemany('INSERT OR REPLACE INTO personal_states VALUES (?, ?, ?);', rows)

  def _file_path(self, client_id: str, round_num: int) -> str:
    name = hashlib.sha256(client_id.encode('utf-8')).hexdigest()
    return os.path.join(self._files_dir, str(round_num), name)

  def _write_files(self, rows):
    """Writes each row's state to its file; returns the rows that name them."""
    for client_id, round_num, arrays in rows:
      path = self._file_path(client_id, round_num)
      os.makedirs(os.path.dirname(path), exist_ok=True)
      parts = _parts(arrays)
      size = sum(len(p) for p in parts)
      reused = self._take_spare(path + '.tmp')
      with open(path + '.tmp', 'r+b' if reused else 'wb', buffering=0) as f:
        if not reused:
          _reserve(f, size)
        for part in parts:
          view = memoryview(part)
          while view:
            view = view[f.write(view):]
        f.truncate(size)  # A larger spare's tail.
      os.replace(path + '.tmp', path)
    return [(client_id, round_num, _IN_FILE) for client_id, round_num, _ in rows]

  def _take_spare(self, path: str) -> bool:
    """Moves a spare file to `path`, if there is one; returns whether it did."""
    while True:
      with self._spares_lock:
        if not self._spares:
          return False
        name = self._spares.pop()
      with contextlib.suppress(FileNotFoundError):  # Gone: try the next.
        os.replace(os.path.join(self._spare_dir, name), path)
        return True

  def _spare_files(self, client_rounds) -> None:
    """Moves the files of dropped rows to the spares, for later writes."""
    os.makedirs(self._spare_dir, exist_ok=True)
    folders, spared = set(), []
    for client_id, round_num in client_rounds:
      path = self._file_path(client_id, round_num)
      folders.add(os.path.dirname(path))
      name = f'{round_num}-{os.path.basename(path)}'
      with contextlib.suppress(FileNotFoundError):
        os.replace(path, os.path.join(self._spare_dir, name))
        spared.append(name)
    with self._spares_lock:
      self._spares.extend(spared)
    for folder in folders:
      with contextlib.suppress(OSError):  # Not empty: another client's state.
        os.rmdir(folder)

  def _write_loop(self, connection: sqlite3.Connection) -> None:
    """The writer thread: commits queued rows in order, one transaction each."""
    try:
      while True:
        rows = self._queue.get()
        try:
          if rows is None:
            return
          if self._write_error is None:
            try:
              file_rows = self._write_files(rows)
              with _immediate_transaction(connection):
                self._insert(connection, file_rows)
            except Exception as e:  # pylint: disable=broad-except
              self._write_error = e
              continue  # Keep the rows pending: reads stay consistent.
            with self._pending_lock:
              for cid, round_num, arrays in rows:
                versions = self._pending.get(cid, {})
                if versions.get(round_num) is arrays:
                  del versions[round_num]
                  if not versions:
                    del self._pending[cid]
        finally:
          self._queue.task_done()
    finally:
      connection.close()

  def _remove_files_of_later_rounds(self, round_num: int) -> None:
    """Removes the files of rounds after `round_num` (their rows are gone)."""
    if not os.path.isdir(self._files_dir):
      return
    for name in os.listdir(self._files_dir):
      if name.isdigit() and int(name) > round_num:
        shutil.rmtree(os.path.join(self._files_dir, name), ignore_errors=True)

  def _raise_if_a_write_failed(self) -> None:
    if self._write_error is not None:
      raise StoreWriteError(
          f'Writing personal states to {self._path} failed: {self._write_error}. The'
          ' last checkpoint and the states it expects are intact; resume from it.'
      ) from self._write_error

  def checkpoint(self, round_num: int) -> StoreFingerprint:
    """Keeps one row per client as of `round_num`; returns its fingerprint.

    Call after the program checkpoint of `round_num` is safely written; rows
    of later rounds (none in a sequential run) are kept.
    """
    self.flush()
    self._wrote = True
    # Only a client written in (last checkpoint, round_num] can have more than
    # one row <= round_num. Both indexes cover the search, so the table's
    # pages (where each row keeps kilobytes of its state) are read only for
    # the rows deleted. After opening, the first checkpoint searches all rounds.
    since = self._checkpointed_round if self._checkpointed_round is not None else -1
    with self._transaction():
      deleted = self._connection.execute(
          'DELETE FROM personal_states WHERE rowid IN (SELECT old.rowid FROM'
          ' personal_states AS new JOIN personal_states AS old ON old.client_id ='
          ' new.client_id AND old.round < new.round WHERE new.round > ? AND'
          ' new.round <= ?) RETURNING client_id, round;',
          (since, round_num),
      ).fetchall()
    # After the commit: a crash in between leaves files no row names, never
    # a row without its file.
    self._spare_files(deleted)
    self._checkpointed_round = round_num
    return self.fingerprint(round_num)

  def fingerprint(self, round_num: int) -> StoreFingerprint:
    """What the store holds as of `round_num`, once pending writes commit."""
    self.flush()
    with self._lock:
      num_clients, last_round = self._connection.execute(
          'SELECT COUNT(DISTINCT client_id), COALESCE(MAX(round), 0) FROM'
          ' personal_states WHERE round <= ?;',
          (round_num,),
      ).fetchone()
    return StoreFingerprint(round_num, num_clients, last_round)

  def restore(self, expected: StoreFingerprint) -> None:
    """Rolls back to the checkpointed round; raises `StoreMismatchError`."""
    self._drop_prefetched()
    self.flush()
    try:
      with self._lock:
        (integrity,) = self._connection.execute('PRAGMA quick_check;').fetchone()
      if integrity != 'ok':
        raise StoreMismatchError(f'{self._path} is corrupt: {integrity}')
      with self._transaction():
        self._connection.execute(
            'DELETE FROM personal_states WHERE round > ?;', (expected.round_num,)
        )
      self._remove_files_of_later_rounds(expected.round_num)
      self._checkpointed_round = expected.round_num
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
    with self._lock, _immediate_transaction(self._connection):
      yield


def _limit(before_round: Optional[int]) -> int:
  """The round a read's rows must be older than (`read`'s `before_round`)."""
  return np.iinfo(np.int64).max if before_round is None else before_round


def _read_file(path: str) -> Optional[np.ndarray]:
  """The file's bytes, read into one writable buffer (not zeroed first);
  None if the file left `path` before the read ended (a checkpoint made it
  a spare, which a write may be rewriting)."""
  with open(path, 'rb', buffering=0) as f:
    data = np.empty(os.fstat(f.fileno()).st_size, np.uint8)
    view = memoryview(data)
    while view:
      read = f.readinto(view)
      if not read:
        raise EOFError(f'{path} ended early.')
      view = view[read:]
    try:
      still_there = os.stat(path).st_ino == os.fstat(f.fileno()).st_ino
    except FileNotFoundError:
      still_there = False
  return data if still_there else None


def _reserve(f, size: int) -> None:
  """Allocates a new file's blocks before it is written, in one call.

  On ext4 the blocks of a file are otherwise allocated page by page as it is
  written: 10 new 6.8 MB files took 84-159 ms of CPU to write while the
  kernel had many dirty pages to flush, 10 ms with their blocks reserved
  first; 20 against 14 ms in the store's own round of 10 FEMNIST CNN states.
  Where the file system cannot allocate ahead, the C library writes a byte
  a block instead, and an error leaves the file to be written as before.
  """
  if size and hasattr(os, 'posix_fallocate'):
    with contextlib.suppress(OSError):
      os.posix_fallocate(f.fileno(), 0, size)


@contextlib.contextmanager
def _immediate_transaction(connection: sqlite3.Connection):
  """A write transaction on `connection`: committed, or rolled back on error."""
  connection.execute('BEGIN IMMEDIATE;')
  try:
    yield
  except BaseException:
    connection.execute('ROLLBACK;')
    raise
  connection.execute('COMMIT;')
