"""The gain of federation over Local training, per client and weighted (beta).

  bin/compare.py --run=output/fedavg_run --local=output/local_run
  bin/compare.py --run=... --local=... --weighting=examples --per_client_csv=gains.csv

Reads both runs' eval_per_client.csv at the same round (default: the last
of --run) and prints beta = sum_i alpha_i (V_i^G - V_i^P) (LINDT's NFL
measure; tff_personal/evaluation/gain.py) and the share of clients with a
negative gain. Exit code 2 with one line on bad input.
"""

import csv
import os
import sys

from absl import app
from absl import flags

from tff_personal.evaluation import gain

RUN = flags.DEFINE_string('run', None, 'Output directory of the federated run.')
LOCAL = flags.DEFINE_string('local', None, 'Output directory of the Local run.')
WEIGHTING = flags.DEFINE_enum('weighting', 'uniform', gain.WEIGHTINGS, 'alpha_i of beta.')
ROUND = flags.DEFINE_integer('round', None, 'Evaluation round (default: the last of --run).')
ACCURACY = flags.DEFINE_string(
    'accuracy', 'sparse_categorical_accuracy', 'Accuracy column of eval_per_client.csv.'
)
PER_CLIENT_CSV = flags.DEFINE_string('per_client_csv', None, 'Also write per-client gains here.')


def main(argv):
  del argv
  try:
    if not RUN.value or not LOCAL.value:
      raise ValueError('--run and --local are required.')
    paths = [os.path.join(d, 'eval_per_client.csv') for d in (RUN.value, LOCAL.value)]
    for path in paths:
      if not os.path.exists(path):
        raise ValueError(f'{path} does not exist (not a finished run?).')
    federated = gain.read_round(paths[0], ACCURACY.value, ROUND.value)
    round_num = ROUND.value
    if round_num is None:
      with open(paths[0], newline='') as f:
        round_num = max(int(r['round']) for r in csv.DictReader(f))
    private = gain.read_round(paths[1], ACCURACY.value, round_num)
    gains = gain.client_gains(federated, private)
    value = gain.beta(gains, WEIGHTING.value)
  except ValueError as e:
    print(f'compare.py: error: {e}', file=sys.stderr)
    sys.exit(2)
  negative = sum(g.gain < 0 for g in gains)
  print(
      f'round {round_num}: beta ({WEIGHTING.value}) = {value:+.4f} over {len(gains)} clients;'
      f' {negative} ({negative / len(gains):.0%}) lose from federating'
      f' -> {"NFL" if value < 0 else "no NFL"}'
  )
  if PER_CLIENT_CSV.value:
    with open(PER_CLIENT_CSV.value, 'w', newline='') as f:
      writer = csv.writer(f)
      writer.writerow(['client_id', 'federated', 'private', 'gain', 'num_examples'])
      for g in gains:
        writer.writerow([g.client_id, g.federated, g.private, g.gain, g.num_examples])


if __name__ == '__main__':
  app.run(main)
