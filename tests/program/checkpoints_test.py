"""Checkpoints: save/load of program states and refusal of mismatches."""

import collections

import numpy as np
import pytest

from tff_personal.program import checkpoints


def state(kernel_shape=(2, 3), value=1.0):
  server = collections.OrderedDict(
      weights=[np.full(kernel_shape, value, np.float32)], step=np.int32(4)
  )
  return checkpoints.program_state(5, server, np.array([5, 2, 5]), 12.5)


def test_latest_round_and_round_trip(tmp_path):
  manager = checkpoints.CheckpointManager(str(tmp_path))
  assert manager.latest_round() is None
  assert manager.load_latest(state()) is None
  manager.save(checkpoints.program_state(3, state()['server_state'], [3, 1, 3], 1.0))
  manager.save(state(value=7.0))
  assert manager.latest_round() == 5
  loaded = manager.load_latest(state())
  assert int(loaded['round_num']) == 5
  np.testing.assert_array_equal(loaded['server_state']['weights'][0], np.full((2, 3), 7.0))
  np.testing.assert_array_equal(loaded['store_fingerprint'], [5, 2, 5])
  assert float(loaded['elapsed_seconds']) == 12.5


def test_loads_a_kept_older_round_and_refuses_one_not_kept(tmp_path):
  manager = checkpoints.CheckpointManager(str(tmp_path))
  for round_num, value in ((2, 2.0), (4, 4.0)):
    server = state(value=value)['server_state']
    manager.save(checkpoints.program_state(round_num, server, [round_num, 0, 0], 0.0))
  assert manager.rounds() == [2, 4]
  loaded = manager.load(2, state())
  assert int(loaded['round_num']) == 2
  np.testing.assert_array_equal(loaded['server_state']['weights'][0], np.full((2, 3), 2.0))
  with pytest.raises(ValueError, match='No checkpoint of round 3 is kept; the kept rounds are 2, 4'):
    manager.load(3, state())


def test_keeps_the_newest_three(tmp_path):
  manager = checkpoints.CheckpointManager(str(tmp_path))
  for round_num in range(1, 6):
    manager.save(checkpoints.program_state(round_num, state()['server_state'], [0, 0, 0], 0.0))
  assert sorted(p.name for p in tmp_path.iterdir()) == ['round_3', 'round_4', 'round_5']


def test_another_model_shape_is_refused(tmp_path):
  manager = checkpoints.CheckpointManager(str(tmp_path))
  manager.save(state(kernel_shape=(2, 3)))
  with pytest.raises(checkpoints.CheckpointMismatchError, match='round 5'):
    manager.load_latest(state(kernel_shape=(4, 3)))


def test_another_structure_is_refused(tmp_path):
  manager = checkpoints.CheckpointManager(str(tmp_path))
  manager.save(state())
  other = checkpoints.program_state(0, collections.OrderedDict(a=np.float32(0)), [0, 0, 0], 0.0)
  with pytest.raises(checkpoints.CheckpointMismatchError):
    manager.load_latest(other)
