"""Personal models against their own global model, per evaluated round, over seeds.

  bin/personal_gap.py --runs=output/<root>/<run>__seed0,output/<root>/<run>__seed1,...

Reads each run's eval_per_client.csv, where Ditto writes every client's
test accuracy with its personal model (`--accuracy`) and with the round's
global model (`global_model/<accuracy>`), and prints per run a markdown
table: per evaluated round the mean per-client accuracy of both, their gap
in points, the pooled accuracies (weighted by test examples) and how many
clients the personal model puts above and below the global one. With
several runs (one per seed) it adds the gap over runs at the rounds all of
them evaluated: each run's gap and the mean with the half-width of its 95%
Student-t interval, per-client mean and pooled. Exit code 2 with one line
on bad input. No TensorFlow here.
"""

import dataclasses
import os
import sys

from absl import app
from absl import flags

from tff_personal.evaluation import gain
from tff_personal.reports import results_table

RUNS = flags.DEFINE_list('runs', None, 'Output directories of the runs (e.g. one per seed).')
ACCURACY = flags.DEFINE_string(
    'accuracy', 'sparse_categorical_accuracy', "The personal models' accuracy column."
)
BASELINE = flags.DEFINE_string(
    'baseline_accuracy', None,
    "The global model's accuracy column; default: global_model/<--accuracy>.",
)


@dataclasses.dataclass(frozen=True)
class RoundGap:
  """Personal against global accuracy over the clients evaluated at one round."""

  gains: tuple[gain.ClientGain, ...]  # federated: personal model; private: global model.

  @property
  def personal(self) -> float:
    return sum(g.federated for g in self.gains) / len(self.gains)

  @property
  def global_(self) -> float:
    return sum(g.private for g in self.gains) / len(self.gains)

  def pooled(self, accuracy) -> float:
    total = sum(g.num_examples for g in self.gains)
    return sum(g.num_examples * accuracy(g) for g in self.gains) / total

  @property
  def gap(self) -> float:
    return gain.beta(self.gains, 'uniform')

  @property
  def pooled_gap(self) -> float:
    return gain.beta(self.gains, 'examples')

  @property
  def above_below(self) -> tuple[int, int]:
    return sum(g.gain > 0 for g in self.gains), sum(g.gain < 0 for g in self.gains)


def read_run(run_dir: str, accuracy: str, baseline: str) -> dict[int, RoundGap]:
  """{round: RoundGap} of every round a run evaluated."""
  path = os.path.join(run_dir, 'eval_per_client.csv')
  if not os.path.exists(path):
    raise ValueError(f'{path} does not exist (not a run directory, or no evaluation yet?).')
  personal, global_ = gain.read_rounds(path, accuracy), gain.read_rounds(path, baseline)
  return {
      r: RoundGap(tuple(gain.client_gains(personal[r], global_[r]))) for r in sorted(personal)
  }


def run_table(gaps: dict[int, RoundGap]) -> list[str]:
  lines = [
      '| round | personal | global | personal - global, points'
      ' | pooled: personal / global | clients with personal above / below global |',
      '|---|---|---|---|---|---|',
  ]
  for r, g in sorted(gaps.items()):
    above, below = g.above_below
    lines.append(
        f'| {r:,} | {g.personal:.3f} | {g.global_:.3f} | {100 * g.gap:+.1f}'
        f' | {g.pooled(lambda c: c.federated):.3f} / {g.pooled(lambda c: c.private):.3f}'
        f' | {above} / {below} |'
    )
  return lines


def seeds_table(runs: list[dict[int, RoundGap]]) -> list[str]:
  """The gap in points over runs at the rounds every run evaluated."""

  def over_runs(values):
    points = [100 * v for v in values]
    mean = sum(points) / len(points)
    interval = results_table.interval95(points)
    return ' / '.join(f'{p:+.1f}' for p in points), f'{mean:+.2f} ± {interval:.2f}'

  lines = [
      '| round | personal - global, points, per run | mean ± 95% interval'
      ' | pooled, per run | pooled: mean ± 95% interval |',
      '|---|---|---|---|---|',
  ]
  for r in sorted(set.intersection(*(set(run) for run in runs))):
    per_run, mean = over_runs([run[r].gap for run in runs])
    pooled_per_run, pooled_mean = over_runs([run[r].pooled_gap for run in runs])
    lines.append(f'| {r:,} | {per_run} | {mean} | {pooled_per_run} | {pooled_mean} |')
  return lines


def main(argv):
  del argv
  baseline = BASELINE.value or f'global_model/{ACCURACY.value}'
  try:
    if not RUNS.value:
      raise ValueError('--runs is required: one or more run output directories.')
    runs = [read_run(d, ACCURACY.value, baseline) for d in RUNS.value]
  except ValueError as e:
    print(f'personal_gap.py: error: {e}', file=sys.stderr)
    sys.exit(2)
  for run_dir, gaps in zip(RUNS.value, runs):
    print(f'{run_dir}: personal models ({ACCURACY.value}) against the global model ({baseline})\n')
    print('\n'.join(run_table(gaps)) + '\n')
  if len(runs) > 1:
    print(f'Over the {len(runs)} runs, at the rounds all of them evaluated:\n')
    print('\n'.join(seeds_table(runs)))


if __name__ == '__main__':
  app.run(main)
