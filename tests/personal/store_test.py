"""ClientStateStore: round-trips, versions, checkpoint/restore and bad stores."""

import hashlib
import io
import os
import sqlite3
import threading

import numpy as np
import pytest

from tff_personal.personal import store as store_lib


def state(value: float):
  return [np.full((2, 3), value, np.float32), np.array([value], np.float64), np.int64(7)]


def test_serialization_round_trip_keeps_dtypes_and_shapes():
  arrays = state(1.5) + [np.zeros((0,), np.int32)]
  restored = store_lib.deserialize_state(store_lib.serialize_state(arrays))
  assert [a.dtype for a in restored] == [np.float32, np.float64, np.int64, np.int32]
  assert [a.shape for a in restored] == [(2, 3), (1,), (), (0,)]
  for a, b in zip(arrays, restored):
    np.testing.assert_array_equal(a, b)


def test_serialization_is_np_save_format_and_reads_old_rows():
  arrays = state(2.5) + [np.asfortranarray(np.arange(6, dtype=np.int32).reshape(2, 3))]
  saved = io.BytesIO()
  for array in arrays:
    np.save(saved, array, allow_pickle=False)
  # Rows written by np.save (the store's first format) still read back...
  restored = store_lib.deserialize_state(saved.getvalue())
  for a, b in zip(arrays, restored):
    np.testing.assert_array_equal(a, b)
  # ... and C-ordered arrays serialize to exactly np.save's bytes.
  c_ordered = [np.ascontiguousarray(a) if np.ndim(a) else a for a in arrays]
  expected = io.BytesIO()
  for array in c_ordered:
    np.save(expected, array, allow_pickle=False)
  assert store_lib.serialize_state(c_ordered) == expected.getvalue()
  restored[0][0, 0] = -1.0  # Writable arrays.


def test_truncated_or_object_state_is_an_error():
  blob = store_lib.serialize_state(state(1.0))
  with pytest.raises(EOFError):
    store_lib.deserialize_state(blob[:-4])
  with pytest.raises(ValueError, match='Python objects'):
    store_lib.serialize_state([np.array([{}], dtype=object)])


def test_new_store_uses_large_pages(tmp_path):
  path = str(tmp_path / 's.sqlite')
  store_lib.ClientStateStore(path).write(1, {'a': state(1.0)})
  (page_size,) = sqlite3.connect(path).execute('PRAGMA page_size;').fetchone()
  assert page_size == 65536


def test_read_returns_none_for_unseen_clients_and_newest_version(tmp_path):
  store = store_lib.ClientStateStore(str(tmp_path / 's.sqlite'))
  store.write(1, {'a': state(1.0)})
  store.write(3, {'a': state(3.0), 'b': state(30.0)})
  a, b, c = store.read(['a', 'b', 'c'])
  assert a[0][0, 0] == 3.0 and b[0][0, 0] == 30.0 and c is None
  # Reading for round 3 sees only what rounds 1 and 2 wrote.
  a, b = store.read(['a', 'b'], before_round=3)
  assert a[0][0, 0] == 1.0 and b is None


def test_client_ids_lists_every_client_with_a_state_once(tmp_path):
  store = store_lib.ClientStateStore(str(tmp_path / 's.sqlite'))
  assert store.client_ids() == []
  store.write(1, {'b': state(1.0)})
  store.write(2, {'b': state(2.0), 'a': state(3.0)})
  assert store.client_ids() == ['a', 'b']  # Pending or committed alike.
  store.flush()
  assert store.client_ids() == ['a', 'b']
  store.close()
  assert store_lib.ClientStateStore(str(tmp_path / 's.sqlite'), create=False).client_ids() == [
      'a', 'b'
  ]


def test_checkpoint_keeps_one_row_per_client(tmp_path):
  path = str(tmp_path / 's.sqlite')
  store = store_lib.ClientStateStore(path)
  for round_num in range(1, 5):
    store.write(round_num, {'a': state(round_num), 'b': state(10 * round_num)})
  fingerprint = store.checkpoint(4)
  assert fingerprint == store_lib.StoreFingerprint(4, 2, 4)
  rows = sqlite3.connect(path).execute(
      'SELECT client_id, round FROM personal_states ORDER BY client_id'
  ).fetchall()
  assert rows == [('a', 4), ('b', 4)]


def test_checkpoints_compact_only_what_was_written_since_the_last(tmp_path):
  path = str(tmp_path / 's.sqlite')
  rows = lambda: sqlite3.connect(path).execute(
      'SELECT client_id, round FROM personal_states ORDER BY client_id, round'
  ).fetchall()
  store = store_lib.ClientStateStore(path)
  store.write(1, {'a': state(1.0), 'b': state(1.0), 'c': state(1.0)})
  store.write(2, {'a': state(2.0)})
  store.close()
  # A new process: its first checkpoint searches every round.
  store = store_lib.ClientStateStore(path, create=False)
  store.write(3, {'b': state(3.0)})
  assert store.checkpoint(3) == store_lib.StoreFingerprint(3, 3, 3)
  assert rows() == [('a', 2), ('b', 3), ('c', 1)]
  store.write(4, {'c': state(4.0)})
  store.write(5, {'c': state(5.0), 'a': state(5.0)})
  store.write(6, {'b': state(6.0)})  # After the checkpoint's round: kept.
  assert store.checkpoint(5) == store_lib.StoreFingerprint(5, 3, 5)
  assert rows() == [('a', 5), ('b', 3), ('b', 6), ('c', 5)]
  a, b, c = store.read(['a', 'b', 'c'], before_round=6)
  assert (a[0][0, 0], b[0][0, 0], c[0][0, 0]) == (5.0, 3.0, 5.0)


def test_checkpoint_and_fingerprint_read_indexes_not_the_table(tmp_path):
  # Each row keeps up to 64 KiB of its state in the table's leaf pages: a
  # scan of the table at 100,000 clients took 0.7 s a checkpoint.
  path = str(tmp_path / 's.sqlite')
  store = store_lib.ClientStateStore(path)
  store.write(1, {'a': state(1.0)})
  statements = []
  store._connection.set_trace_callback(statements.append)  # pylint: disable=protected-access
  store.checkpoint(1)
  store._connection.set_trace_callback(None)  # pylint: disable=protected-access
  queries = [s for s in statements if s.lstrip().startswith(('DELETE', 'SELECT'))]
  assert len(queries) == 2
  connection = sqlite3.connect(path)
  for query in queries:
    plan = [row[3] for row in connection.execute('EXPLAIN QUERY PLAN ' + query)]
    table_reads = [
        step for step in plan if step.startswith('SCAN') and 'COVERING INDEX' not in step
    ]
    assert not table_reads, (query, plan)


def test_restore_rolls_back_rounds_after_the_checkpoint(tmp_path):
  path = str(tmp_path / 's.sqlite')
  store = store_lib.ClientStateStore(path)
  store.write(1, {'a': state(1.0)})
  store.write(2, {'a': state(2.0), 'b': state(2.0)})
  fingerprint = store.checkpoint(2)
  store.write(3, {'a': state(3.0), 'c': state(3.0)})  # Lost with the crash.
  store.close()

  reopened = store_lib.ClientStateStore(path, create=False)
  reopened.restore(fingerprint)
  a, b, c = reopened.read(['a', 'b', 'c'])
  assert a[0][0, 0] == 2.0 and b[0][0, 0] == 2.0 and c is None


def test_missing_store_is_an_error(tmp_path):
  with pytest.raises(store_lib.StoreMismatchError, match='is missing'):
    store_lib.ClientStateStore(str(tmp_path / 'absent.sqlite'), create=False)


def test_replaced_store_is_an_error_not_a_reinitialization(tmp_path):
  path = str(tmp_path / 's.sqlite')
  store = store_lib.ClientStateStore(path)
  store.write(1, {'a': state(1.0), 'b': state(1.0)})
  fingerprint = store.checkpoint(1)
  store.close()
  os.remove(path)
  empty = store_lib.ClientStateStore(path)
  with pytest.raises(store_lib.StoreMismatchError, match='expects 2'):
    empty.restore(fingerprint)


def test_corrupt_store_is_an_error(tmp_path):
  path = str(tmp_path / 's.sqlite')
  with open(path, 'wb') as f:
    f.write(b'this is not a database' * 100)
  with pytest.raises(store_lib.StoreMismatchError):
    store = store_lib.ClientStateStore(path, create=False)
    store.restore(store_lib.StoreFingerprint(1, 1, 1))


def test_fingerprint_array_round_trip():
  fingerprint = store_lib.StoreFingerprint(5, 12, 4)
  assert store_lib.StoreFingerprint.from_array(fingerprint.as_array()) == fingerprint


def test_concurrent_readers_see_committed_rounds(tmp_path):
  path = str(tmp_path / 's.sqlite')
  writer = store_lib.ClientStateStore(path)
  errors = []

  def read_many():
    reader = store_lib.ClientStateStore(path, create=False)
    try:
      for _ in range(50):
        (value,) = reader.read(['a'])
        if value is not None and value[0][0, 0] not in range(1, 21):
          errors.append(value[0][0, 0])
    finally:
      reader.close()

  threads = [threading.Thread(target=read_many) for _ in range(2)]
  for t in threads:
    t.start()
  for round_num in range(1, 21):
    writer.write(round_num, {'a': state(round_num)})
  for t in threads:
    t.join()
  assert not errors
  assert writer.read(['a'])[0][0][0, 0] == 20.0


def test_reads_and_writes_of_one_round_from_many_threads(tmp_path):
  store = store_lib.ClientStateStore(str(tmp_path / 's.sqlite'))
  store.write(1, {f'c{i}': state(i) for i in range(40)})
  errors = []

  def train_clients(first):
    try:
      for i in range(first, 40, 4):
        (old,) = store.read([f'c{i}'], before_round=2)
        store.write(2, {f'c{i}': state(old[0][0, 0] + 100)})
    except Exception as e:  # pylint: disable=broad-except
      errors.append(e)

  threads = [threading.Thread(target=train_clients, args=(k,)) for k in range(4)]
  for t in threads:
    t.start()
  for t in threads:
    t.join()
  assert not errors
  values = [s[0][0, 0] for s in store.read([f'c{i}' for i in range(40)])]
  assert values == [i + 100.0 for i in range(40)]
  assert store.fingerprint(2) == store_lib.StoreFingerprint(2, 40, 2)


def test_corrupt_row_is_a_clear_error(tmp_path):
  path = str(tmp_path / 's.sqlite')
  store = store_lib.ClientStateStore(path)
  store.write(1, {'a': state(1.0), 'b': state(2.0)})
  store.flush()  # Corrupt the committed row.
  with sqlite3.connect(path) as connection:
    connection.execute(
        "UPDATE personal_states SET state = x'00ff00ff' WHERE client_id = 'b';"
    )
  assert store.read(['a'])[0][0][0, 0] == 1.0
  with pytest.raises(store_lib.StoreMismatchError, match="client 'b' written in round 1"):
    store.read(['a', 'b'])


def test_write_behind_serves_pending_rows_and_commits_in_the_background(tmp_path, monkeypatch):
  path = str(tmp_path / 's.sqlite')
  store = store_lib.ClientStateStore(path)
  store.write(1, {'a': state(1.0)})
  store.flush()
  release = threading.Event()
  insert = store_lib.ClientStateStore._insert

  def slow_insert(connection, rows):
    assert release.wait(10)
    insert(connection, rows)

  monkeypatch.setattr(store_lib.ClientStateStore, '_insert', staticmethod(slow_insert))
  arrays = state(2.0)
  store.write(2, {'a': arrays, 'b': state(20.0)})
  with pytest.raises(ValueError, match='read-only'):  # The store took the arrays.
    arrays[0][:] = -1.0
  other = store_lib.ClientStateStore(path, create=False, write_behind=False)
  assert other.read(['a', 'b'])[0][0][0, 0] == 1.0  # Not committed yet...
  assert other.read(['b']) == [None]
  a, b = store.read(['a', 'b'])  # ... but the writing store serves it,
  assert a[0][0, 0] == 2.0 and b[0][0, 0] == 20.0
  a[0][0, 0] = -1.0  # as a copy of its own.
  assert store.read(['a'], before_round=2)[0][0][0, 0] == 1.0
  release.set()
  assert store.fingerprint(2) == store_lib.StoreFingerprint(2, 2, 2)  # Waits for the write.
  (a,) = other.read(['a'])
  assert a[0][0, 0] == 2.0
  a[0][0, 0] = -1.0  # Read from its file: writable, and the file keeps 2.0.
  assert other.read(['a'])[0][0][0, 0] == 2.0
  store.close()
  other.close()


def test_failed_background_write_is_raised_by_the_next_call(tmp_path, monkeypatch):
  path = str(tmp_path / 's.sqlite')
  store = store_lib.ClientStateStore(path)
  store.write(1, {'a': state(1.0)})
  fingerprint = store.checkpoint(1)

  def full_disk(connection, rows):
    raise sqlite3.OperationalError('database or disk is full')

  monkeypatch.setattr(store_lib.ClientStateStore, '_insert', staticmethod(full_disk))
  store.write(2, {'a': state(2.0)})
  with pytest.raises(store_lib.StoreWriteError, match='disk is full.*resume'):
    store.flush()
  with pytest.raises(store_lib.StoreWriteError):
    store.write(3, {'a': state(3.0)})
  with pytest.raises(store_lib.StoreWriteError):
    store.checkpoint(2)
  with pytest.raises(store_lib.StoreWriteError):
    store.close()
  monkeypatch.undo()
  reopened = store_lib.ClientStateStore(path, create=False)
  reopened.restore(fingerprint)  # The checkpointed state is intact.
  assert reopened.read(['a'])[0][0][0, 0] == 1.0
  reopened.close()


def test_states_are_files_named_by_their_rows(tmp_path):
  """Each state is a file; a checkpoint makes the files of the rows it drops
  spares, `restore` removes those of later rounds, and a missing file is an
  error."""
  path = str(tmp_path / 's.sqlite')
  files = lambda: sorted(
      os.path.relpath(os.path.join(root, name), path + '-states')
      for root, _, names in os.walk(path + '-states') for name in names
  )
  name = lambda client: hashlib.sha256(client.encode()).hexdigest()
  store = store_lib.ClientStateStore(path)
  store.write(1, {'a': state(1.0), 'b': state(1.0)})
  store.write(2, {'a': state(2.0)})
  store.flush()
  assert files() == sorted([f'1/{name("a")}', f'1/{name("b")}', f'2/{name("a")}'])
  blobs = sqlite3.connect(path).execute('SELECT DISTINCT state FROM personal_states').fetchall()
  assert blobs == [(b'file',)]
  fingerprint = store.checkpoint(2)
  assert files() == sorted([f'1/{name("b")}', f'2/{name("a")}', f'spare/1-{name("a")}'])
  store.write(3, {'b': state(3.0)})
  store.flush()
  assert files() == sorted([f'1/{name("b")}', f'2/{name("a")}', f'3/{name("b")}'])
  store.close()
  reopened = store_lib.ClientStateStore(path, create=False)
  reopened.restore(fingerprint)
  assert files() == sorted([f'1/{name("b")}', f'2/{name("a")}'])
  assert not os.path.exists(os.path.join(path + '-states', '3'))
  a, b = reopened.read(['a', 'b'])
  assert a[0][0, 0] == 2.0 and b[0][0, 0] == 1.0
  os.remove(os.path.join(path + '-states', '1', name('b')))
  with pytest.raises(store_lib.StoreMismatchError, match="client 'b' written in round 1"):
    reopened.read(['b'])
  reopened.close()


def test_rows_holding_their_state_still_read(tmp_path):
  """A store written before states became files keeps them in the BLOB."""
  path = str(tmp_path / 's.sqlite')
  store_lib.ClientStateStore(path).close()
  with sqlite3.connect(path) as connection:
    connection.execute('INSERT INTO personal_states VALUES (?, ?, ?);',
                       ('a', 1, store_lib.serialize_state(state(4.0))))
  store = store_lib.ClientStateStore(path, create=False)
  assert store.read(['a'])[0][0][0, 0] == 4.0
  store.write(2, {'a': state(5.0)})
  store.checkpoint(2)  # Drops the BLOB row; there is no file to remove.
  assert store.read(['a'])[0][0][0, 0] == 5.0
  store.close()


def test_a_write_rewrites_a_file_a_checkpoint_dropped(tmp_path):
  """A spare is rewritten in place (same file, cut to the new state's size)
  and `close` removes the spares left, unless the store only read."""
  path = str(tmp_path / 's.sqlite')
  spare_dir = os.path.join(path + '-states', 'spare')
  store = store_lib.ClientStateStore(path)
  store.write(1, {'a': state(1.0) + [np.zeros(1000, np.float32)], 'b': state(1.0)})
  store.write(2, {'a': state(2.0), 'b': state(2.0)})
  store.checkpoint(2)
  spares = {os.stat(os.path.join(spare_dir, n)).st_ino for n in os.listdir(spare_dir)}
  assert len(spares) == 2
  store.write(3, {'c': state(3.0)})
  store.flush()
  (file_c,) = os.listdir(os.path.join(path + '-states', '3'))
  written = os.stat(os.path.join(path + '-states', '3', file_c))
  assert written.st_ino in spares
  assert written.st_size == len(store_lib.serialize_state(state(3.0)))
  assert len(os.listdir(spare_dir)) == 1
  reader = store_lib.ClientStateStore(path, create=False, write_behind=False)
  assert reader.read(['c'])[0][0][0, 0] == 3.0
  reader.close()  # Only reads: leaves the writing store's spares.
  assert len(os.listdir(spare_dir)) == 1
  (c,) = store.read(['c'])
  assert c[0].tolist() == [[3.0] * 3] * 2 and c[1].tolist() == [3.0] and c[2] == 7
  store.close()
  assert not os.path.exists(spare_dir)
  reopened = store_lib.ClientStateStore(path, create=False)
  assert [s[0][0, 0] for s in reopened.read(['a', 'b', 'c'])] == [2.0, 2.0, 3.0]
  reopened.close()


@pytest.mark.parametrize('race_after', ['lookup', 'open'])
def test_a_read_racing_another_stores_checkpoint_reads_the_newer_row(
    tmp_path, monkeypatch, race_after
):
  """Another process's checkpoint drops the row a read looked up and a write
  rewrites its file in place, before the read opens the file or while it
  reads it: the read finds the newer row, never the other client's state."""
  path = str(tmp_path / 's.sqlite')
  writer = store_lib.ClientStateStore(path, write_behind=False)
  writer.write(1, {'a': state(1.0)})
  reader = store_lib.ClientStateStore(path, create=False, write_behind=False)
  opened = []

  def race():
    opened.append('raced')
    writer.write(2, {'a': state(2.0)})
    writer.checkpoint(2)  # Drops a's row of round 1: its file becomes a spare,
    writer.write(3, {'b': state(30.0)})  # which b's state now overwrites.

  newest_row = reader._newest_row

  def lookup_then_race(client_id, limit):
    row = newest_row(client_id, limit)
    if race_after == 'lookup' and not opened:
      race()
    return row

  def open_then_race(file, *args, **kwargs):
    f = open(file, *args, **kwargs)
    if race_after == 'open' and not opened and file.endswith(hashlib.sha256(b'a').hexdigest()):
      opened.append(os.fstat(f.fileno()).st_ino)
      race()
    return f

  monkeypatch.setattr(reader, '_newest_row', lookup_then_race)
  monkeypatch.setattr(store_lib, 'open', open_then_race, raising=False)
  (a,) = reader.read(['a'])
  assert a[0][0, 0] == 2.0
  if race_after == 'open':  # The file the read had open now holds b's state.
    (b_file,) = os.listdir(os.path.join(path + '-states', '3'))
    assert os.stat(os.path.join(path + '-states', '3', b_file)).st_ino == opened[0]
  reader.close()
  writer.close()


class _ReadsByThread:
  """Records which thread read each state file (`store._read_file`)."""

  def __init__(self, monkeypatch):
    self.threads = []
    self.prefetched = threading.Semaphore(0)
    read_file = store_lib._read_file

    def recording(path):
      data = read_file(path)
      name = threading.current_thread().name
      self.threads.append(name)
      if name.startswith('personal-state-prefetch'):
        self.prefetched.release()
      return data

    monkeypatch.setattr(store_lib, '_read_file', recording)

  def wait(self, count: int) -> None:
    """Waits for `count` more reads in the prefetch thread (a read in the
    test's own thread is not one: counting it let a wait end before the
    prefetch it waited for had read)."""
    for _ in range(count):
      assert self.prefetched.acquire(timeout=10)


def test_a_read_takes_the_states_prefetched_for_its_round(tmp_path, monkeypatch):
  store = store_lib.ClientStateStore(str(tmp_path / 's.sqlite'), write_behind=False)
  store.write(1, {'a': state(1.0), 'b': state(2.0)})
  reads = _ReadsByThread(monkeypatch)
  store.prefetch(['a', 'b', 'c'], before_round=2)
  reads.wait(2)
  a, b, c = store.read(['a', 'b', 'c'], before_round=2)
  assert (a[0][0, 0], b[0][0, 0], c) == (1.0, 2.0, None)
  assert len(reads.threads) == 2
  assert all(t.startswith('personal-state-prefetch') for t in reads.threads)
  a[0][0, 0] = -1.0  # A writable copy, taken once:
  assert store.read(['a'], before_round=2)[0][0][0, 0] == 1.0
  assert reads.threads[-1] == threading.current_thread().name  # read again here.
  store.prefetch(['a'], before_round=2)
  reads.wait(1)
  store.read(['a'], before_round=3)  # Another round: not the prefetched state.
  assert reads.threads[-1] == threading.current_thread().name
  store.close()


@pytest.mark.parametrize('write_behind', [False, True])
def test_a_write_after_a_prefetch_is_what_the_read_returns(tmp_path, monkeypatch, write_behind):
  store = store_lib.ClientStateStore(str(tmp_path / 's.sqlite'), write_behind=write_behind)
  store.write(1, {'a': state(1.0), 'b': state(2.0)})
  store.flush()
  reads = _ReadsByThread(monkeypatch)
  store.prefetch(['a', 'b'], before_round=3)
  reads.wait(2)  # Both read ahead, from round 1's files.
  store.write(2, {'a': state(10.0)})
  a, b = store.read(['a', 'b'], before_round=3)
  assert (a[0][0, 0], b[0][0, 0]) == (10.0, 2.0)
  store.close()


def test_a_restore_drops_what_was_prefetched(tmp_path, monkeypatch):
  store = store_lib.ClientStateStore(str(tmp_path / 's.sqlite'), write_behind=False)
  store.write(1, {'a': state(1.0)})
  fingerprint = store.checkpoint(1)
  store.write(2, {'a': state(2.0)})
  reads = _ReadsByThread(monkeypatch)
  store.prefetch(['a'], before_round=3)
  reads.wait(1)
  store.restore(fingerprint)  # Round 2 rolled back: its state is gone.
  assert store.read(['a'], before_round=3)[0][0][0, 0] == 1.0
  store.close()


def test_a_prefetch_replaces_the_previous_ones_states(tmp_path, monkeypatch):
  store = store_lib.ClientStateStore(str(tmp_path / 's.sqlite'), write_behind=False)
  store.write(1, {'a': state(1.0), 'b': state(2.0)})
  reads = _ReadsByThread(monkeypatch)
  store.prefetch(['a'], before_round=2)
  store.prefetch(['b'], before_round=2)
  reads.wait(1)
  store.read(['a', 'b'], before_round=2)  # Waits for 'b's prefetch.
  # 'a' read here (its prefetch dropped, run or not), 'b' in the prefetcher.
  assert reads.threads.count(threading.current_thread().name) == 1
  store.close()


def test_threads_cpu_seconds_counts_the_writer_and_the_prefetcher(tmp_path, monkeypatch):
  store = store_lib.ClientStateStore(str(tmp_path / 's.sqlite'))
  assert len(store._threads) == 1  # The writer.
  big = [np.ones((512, 1024), np.float32)]  # 2 MiB a state.
  store.write(1, {f'c{i}': big for i in range(20)})
  store.flush()
  after_writes = store.threads_cpu_seconds()
  assert after_writes > 0.0
  reads = _ReadsByThread(monkeypatch)
  store.prefetch([f'c{i}' for i in range(20)], before_round=2)
  reads.wait(20)
  assert len(store._threads) == 2  # And the prefetcher.
  assert store.threads_cpu_seconds() > after_writes
  store.close()
  assert store.threads_cpu_seconds() == 0.0  # Both ended.
