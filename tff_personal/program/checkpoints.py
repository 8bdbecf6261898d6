"""Checkpoints of the whole program state, via TFF's FileProgramStateManager.

The program state of round r is

  <round_num, server_state, store_fingerprint, elapsed_seconds>

saved as version r once round r is complete. Loading needs a template of the
same structure (from the process's `initialize`); a checkpoint written by
another algorithm, task or model does not match it and is refused with a
clear `CheckpointMismatchError`.
"""

import asyncio
import collections
from typing import Any, Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff


class CheckpointMismatchError(Exception):
  """The checkpoint on disk was written by an incompatible run."""


def program_state(
    round_num: int, server_state: Any, store_fingerprint: np.ndarray, elapsed: float
) -> collections.OrderedDict:
  return collections.OrderedDict(
      round_num=np.int64(round_num),
      server_state=server_state,
      store_fingerprint=np.asarray(store_fingerprint, np.int64),
      elapsed_seconds=np.float64(elapsed),
  )


class CheckpointManager:
  """Saves and loads program states under one directory."""

  def __init__(self, directory: str, keep_total: int = 3):
    self._manager = tff.program.FileProgramStateManager(
        directory, prefix='round_', keep_total=keep_total, keep_first=False
    )

  def rounds(self) -> list[int]:
    """The rounds whose checkpoints are kept, oldest first."""
    return sorted(asyncio.run(self._manager.get_versions()) or [])

  def latest_round(self) -> Optional[int]:
    rounds = self.rounds()
    return rounds[-1] if rounds else None

  def save(self, state: collections.OrderedDict) -> None:
    asyncio.run(self._manager.save(state, int(state['round_num'])))

  def load_latest(self, template: collections.OrderedDict) -> Optional[collections.OrderedDict]:
    """The newest program state, shaped like `template`; None if there is none."""
    version = self.latest_round()
    return None if version is None else self.load(version, template)

  def load(self, round_num: int, template: collections.OrderedDict) -> collections.OrderedDict:
    """The program state of round `round_num`, shaped like `template`.

    Raises:
      CheckpointMismatchError: if it does not match `template`.
      ValueError: if no checkpoint of that round is kept.
    """
    if round_num not in self.rounds():
      raise ValueError(
          f'No checkpoint of round {round_num} is kept; the kept rounds are'
          f' {", ".join(map(str, self.rounds())) or "none"}.'
      )
    try:
      state = asyncio.run(self._manager.load(round_num, template))
      _check_same_shapes(template, state)
    except (TypeError, ValueError) as e:
      raise CheckpointMismatchError(
          f'The checkpoint of round {round_num} does not match this run\'s'
          f' algorithm, task or model: {str(e).splitlines()[0]}'
      ) from e
    return state


def _check_same_shapes(template: Any, loaded: Any) -> None:
  expected = tf.nest.flatten(template)
  found = tf.nest.flatten(loaded)
  for e, f in zip(expected, found):
    e, f = np.asarray(e), np.asarray(f)
    if e.shape != f.shape or e.dtype != f.dtype:
      raise ValueError(
          f'a value of shape {f.shape} ({f.dtype}) where the model has'
          f' {e.shape} ({e.dtype})'
      )
