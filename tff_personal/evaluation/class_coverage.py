"""Personal against global accuracy, split by whether a client trained on the class.

A client's personal model learns its client's label distribution; on a
test example whose class the client's training split lacks, it can only
lose to a global model that saw the class elsewhere. This module splits each
client's test examples into `seen` (the class is in the client's training
split) and `unseen`, and the per-client mean accuracy gap

  mean_k (acc_k(personal) - acc_k(global))

exactly into the part its seen examples contribute and the part its unseen
ones do: for client k with n_k test examples,

  acc_k(personal) - acc_k(global)
      = (c_k^seen(personal) - c_k^seen(global)) / n_k
      + (c_k^unseen(personal) - c_k^unseen(global)) / n_k,

c counting correct predictions (or summing, over examples, the share of
dropout masks under which the prediction is right, for a model evaluated with
dropout active). `bin/class_coverage.py` computes the inputs from a run's
checkpoint and personal states.
"""

import dataclasses
from typing import Iterable, Sequence

import numpy as np


@dataclasses.dataclass(frozen=True)
class ClientPredictions:
  """One client's test labels and how right each model is on each example.

  `global_correct` and `personal_correct` are per test example: 1 right, 0
  wrong (booleans), or the share of dropout masks under which it is right.
  """

  client_id: str
  train_classes: frozenset
  labels: np.ndarray
  global_correct: np.ndarray
  personal_correct: np.ndarray

  def __post_init__(self):
    n = len(self.labels)
    if not len(self.global_correct) == len(self.personal_correct) == n:
      raise ValueError(
          f'client {self.client_id}: {n} labels but {len(self.global_correct)} global and'
          f' {len(self.personal_correct)} personal predictions.'
      )

  @property
  def seen(self) -> np.ndarray:
    """Per test example: whether its class is in the client's training split."""
    return np.array([int(y) in self.train_classes for y in self.labels], bool)


@dataclasses.dataclass(frozen=True)
class Part:
  """The test examples of one kind (seen or unseen classes), pooled over clients."""

  examples: int
  global_accuracy: float  # NaN when `examples` is 0.
  personal_accuracy: float
  per_client_gap: float  # Its share of the mean per-client gap (module docstring).


@dataclasses.dataclass(frozen=True)
class Coverage:
  """The split of the personal-global gap by class coverage."""

  clients: int
  global_accuracy_mean: float  # Mean per-client accuracy.
  personal_accuracy_mean: float
  seen: Part
  unseen: Part

  def pooled_accuracies(self) -> tuple[float, float]:
    """(global, personal) accuracy over all test examples together."""
    examples = self.seen.examples + self.unseen.examples
    pooled = lambda seen, unseen: (
        self.seen.examples * np.nan_to_num(seen) + self.unseen.examples * np.nan_to_num(unseen)
    ) / examples
    return (
        float(pooled(self.seen.global_accuracy, self.unseen.global_accuracy)),
        float(pooled(self.seen.personal_accuracy, self.unseen.personal_accuracy)),
    )

  @property
  def gap(self) -> float:
    """Mean per-client personal minus global accuracy (= seen + unseen shares)."""
    return self.personal_accuracy_mean - self.global_accuracy_mean


def _part(clients: Sequence[ClientPredictions], want_seen: bool) -> Part:
  masks = [c.seen == want_seen for c in clients]
  examples = int(sum(m.sum() for m in masks))
  global_correct = sum(float(c.global_correct[m].sum()) for c, m in zip(clients, masks))
  personal_correct = sum(float(c.personal_correct[m].sum()) for c, m in zip(clients, masks))
  shares = [
      (float(c.personal_correct[m].sum()) - float(c.global_correct[m].sum())) / len(c.labels)
      for c, m in zip(clients, masks)
  ]
  return Part(
      examples=examples,
      global_accuracy=global_correct / examples if examples else float('nan'),
      personal_accuracy=personal_correct / examples if examples else float('nan'),
      per_client_gap=float(np.mean(shares)),
  )


def coverage(clients: Iterable[ClientPredictions]) -> Coverage:
  """The gap split of `clients`; clients without test examples are skipped."""
  clients = [c for c in clients if len(c.labels)]
  if not clients:
    raise ValueError('No client has a test example.')
  return Coverage(
      clients=len(clients),
      global_accuracy_mean=float(np.mean([c.global_correct.mean() for c in clients])),
      personal_accuracy_mean=float(np.mean([c.personal_correct.mean() for c in clients])),
      seen=_part(clients, True),
      unseen=_part(clients, False),
  )


def markdown(result: Coverage) -> str:
  """The split as a markdown table (accuracies as fractions, gaps in points)."""
  lines = [
      '| test examples | count | global | personal | share of the mean per-client gap, points |',
      '|---|---|---|---|---|',
  ]
  for name, part in (('class in the client\'s training split', result.seen),
                     ('class not in it', result.unseen)):
    lines.append(
        f'| {name} | {part.examples} | {part.global_accuracy:.4f} |'
        f' {part.personal_accuracy:.4f} | {100 * part.per_client_gap:+.2f} |'
    )
  lines.append(
      f'| all ({result.clients} clients, mean per-client accuracy) |'
      f' {result.seen.examples + result.unseen.examples} | {result.global_accuracy_mean:.4f} |'
      f' {result.personal_accuracy_mean:.4f} | {100 * result.gap:+.2f} |'
  )
  global_pooled, personal_pooled = result.pooled_accuracies()
  lines.append('')
  lines.append(
      f'Over all {result.seen.examples + result.unseen.examples} test examples pooled:'
      f' global {global_pooled:.4f}, personal {personal_pooled:.4f}.'
  )
  return '\n'.join(lines)
