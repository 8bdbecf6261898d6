"""Plots a run's NFL statistic Delta and its accuracy against rounds (PNG).

  bin/plot_nfl.py --run=output/nfl_table/fmnist__classes_2__lindt_detect \
      --output=docs/nfl_on_detection.png

Top: w_div (the detector's Delta, `nfl/w_div`) every round, its windowed mean,
the threshold and the warm-up; bottom: the benign clients' mean local accuracy
and the global model's central accuracy at every evaluated round (evaluate
every round, --rounds_per_eval=1, for a curve). A vertical line marks the
round the detector flagged NFL (where LINDT's on_detection mode turns on the
dual model). Reads the run's metrics.csv and run_config.json; exit code 2
with one line on bad input.
"""

import csv
import json
import os
import sys

from absl import app
from absl import flags

RUN = flags.DEFINE_string('run', None, 'Output directory of a run with --nfl_detection.')
OUTPUT = flags.DEFINE_string('output', None, 'The PNG to write.')
TITLE = flags.DEFINE_string('title', None, 'Plot title (default: the run directory name).')


def _floats(rows, column):
  return [(int(r['round']), float(r[column])) for r in rows if r.get(column) not in (None, '')]


def read_run(run_dir: str) -> dict:
  """The series to plot, from the run's metrics.csv and run_config.json."""
  metrics_path = os.path.join(run_dir, 'metrics.csv')
  if not os.path.exists(metrics_path):
    raise ValueError(f'{metrics_path} does not exist (not a run directory?).')
  with open(metrics_path, newline='') as f:
    rows = list(csv.DictReader(f))
  if not rows or 'nfl/w_div' not in rows[0]:
    raise ValueError(f'{metrics_path} has no nfl/w_div column: run with --nfl_detection.')
  with open(os.path.join(run_dir, 'run_config.json')) as f:
    config = json.load(f)
  flagged_rounds = [r for _, r in _floats(rows, 'nfl/round_flagged') if r > 0]
  return {
      'w_div': _floats(rows, 'nfl/w_div'),
      'windowed': _floats(rows, 'nfl/windowed_w_div'),
      'local': _floats(rows, 'eval/accuracy_mean'),
      'central': _floats(rows, 'eval/central_accuracy'),
      'threshold': config.get('nfl_threshold'),
      'warmup': config.get('nfl_warmup_rounds'),
      'round_flagged': int(flagged_rounds[0]) if flagged_rounds else None,
  }


def plot(series: dict, output: str, title: str) -> None:
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use('Agg')
  from matplotlib import pyplot  # pylint: disable=g-import-not-at-top
  from matplotlib import ticker  # pylint: disable=g-import-not-at-top

  figure, (top, bottom) = pyplot.subplots(2, 1, sharex=True, figsize=(7, 6))
  top.plot(*zip(*series['w_div']), 'o-', markersize=3, label='Delta (w_div)')
  top.plot(*zip(*series['windowed']), '-', label='windowed mean')
  if series['threshold'] is not None:
    top.axhline(series['threshold'], color='grey', linestyle='--', label='threshold')
  if series['warmup']:
    top.axvspan(0.5, series['warmup'] + 0.5, color='grey', alpha=0.15, label='warm-up')
  top.set_ylabel('Delta')
  if series['local']:
    bottom.plot(*zip(*series['local']), 'o-', markersize=3, label='mean local accuracy')
  if series['central']:
    bottom.plot(*zip(*series['central']), 's-', markersize=3, label='central accuracy')
  bottom.set_ylabel('accuracy (benign clients)')
  bottom.set_xlabel('round')
  bottom.xaxis.set_major_locator(ticker.MaxNLocator(integer=True))
  for axis in (top, bottom):
    if series['round_flagged'] is not None:
      axis.axvline(series['round_flagged'], color='red', linestyle=':',
                   label=f'NFL flagged (round {series["round_flagged"]})')
    axis.legend(fontsize='small')
    axis.grid(alpha=0.3)
  top.set_title(title)
  figure.tight_layout()
  figure.savefig(output, dpi=100)
  pyplot.close(figure)


def main(argv):
  del argv
  try:
    if not RUN.value or not OUTPUT.value:
      raise ValueError('--run and --output are required.')
    series = read_run(RUN.value)
  except ValueError as e:
    print(f'plot_nfl.py: error: {e}', file=sys.stderr)
    sys.exit(2)
  plot(series, OUTPUT.value, TITLE.value or os.path.basename(os.path.normpath(RUN.value)))
  print(f'wrote {OUTPUT.value}')


if __name__ == '__main__':
  app.run(main)
