"""Writes a report of finished runs: report.md and its figures, for a paper.

  bin/report.py --run=output/fmnist_fedavg --run=output/fmnist_ditto \
      --label=FedAvg --label=Ditto --output=output/report

Reads each run's metrics.csv, eval_per_client.csv and summary.json (the
directories bin/train.py writes) and writes into --output the figures
(accuracy and training loss per round, the distribution of the benign
clients' final accuracies, and the NFL statistic and epsilon per round where
a run has them) and report.md: the runs, a table of their final results and
the figures with captions (tff_personal/reports/run_report.py). Prints the
path of report.md; exit code 2 with one line on bad input.
"""

import os
import sys

from absl import app
from absl import flags

from tff_personal.reports import run_report

RUNS = flags.DEFINE_multi_string(
    'run', [], 'A run directory written by bin/train.py; repeat for several runs.'
)
LABELS = flags.DEFINE_multi_string(
    'label', [],
    'The name of each --run in the report, in the same order (one per --run);'
    ' none: the directory names.',
)
OUTPUT = flags.DEFINE_string('output', None, 'Directory to write report.md and the PNGs to.')

REPORT_FILE = 'report.md'


def write_report(run_dirs: list[str], labels: list[str], output: str) -> str:
  """Writes <output>/report.md and its figures; returns the path of report.md.

  Raises:
    ValueError: bad input (no run, a directory that is not a run, a label count mismatch).
    OSError: `output` cannot be written.
  """
  if not run_dirs:
    raise ValueError('--run is required: a run directory (repeat for several).')
  if not output:
    raise ValueError('--output is required: the directory to write the report to.')
  if labels and len(labels) != len(run_dirs):
    raise ValueError(
        f'{len(labels)} --label for {len(run_dirs)} --run: give one per run, or none.'
    )
  runs = [
      run_report.load_run(path, label)
      for path, label in zip(run_dirs, labels or [None] * len(run_dirs))
  ]
  text = run_report.markdown_report(runs, output)
  path = os.path.join(output, REPORT_FILE)
  with open(path, 'w') as f:
    f.write(text)
  return path


def main(argv):
  try:
    if len(argv) > 1:
      raise ValueError(f'unexpected arguments: {" ".join(argv[1:])}')
    path = write_report(RUNS.value, LABELS.value, OUTPUT.value)
  except (ValueError, OSError) as e:
    print(f'report.py: error: {e}', file=sys.stderr)
    sys.exit(2)
  print(path)


if __name__ == '__main__':
  app.run(main)
