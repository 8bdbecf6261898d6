"""The README's demo: FedAvg and Local side by side, then a table.

  bin/demo.py --flagfile=configs/demo_shakespeare.flags

Trains each of --demo_algorithms with the same task, data, seed and rounds
(the experiment flags of bin/train.py, --algorithm excepted), one after the
other in this process, and prints their mean per-client test accuracy and
where the outputs are. A rerun resumes or reuses finished runs.
"""

import os
import sys

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
from tff_personal.runtime import allocator  # pylint: disable=g-import-not-at-top

if __name__ == '__main__':  # Not when tests load this file as a module.
  allocator.reexec_with_program_settings()  # Before TensorFlow's import (its docstring).

from absl import app  # pylint: disable=g-import-not-at-top
from absl import flags  # pylint: disable=g-import-not-at-top
# TensorFlow must be imported before app.run (see bin/train.py).
import tensorflow  # pylint: disable=g-import-not-at-top,unused-import

from tff_personal.program import experiment_flags as ef  # pylint: disable=g-import-not-at-top

DEMO_ALGORITHMS = flags.DEFINE_list(
    'demo_algorithms', ['fedavg', 'local'], 'Algorithms to train and compare.'
)


def main(argv):
  if len(argv) > 1:
    ef.exit_with_error(f'unexpected arguments: {" ".join(argv[1:])}')
  from tff_personal.algorithms import registry as algorithm_registry  # pylint: disable=g-import-not-at-top
  from tff_personal.runtime import context  # pylint: disable=g-import-not-at-top

  unknown = set(DEMO_ALGORITHMS.value) - set(algorithm_registry.ALGORITHM_NAMES)
  if unknown:
    ef.exit_with_error(
        f'--demo_algorithms: unknown {", ".join(sorted(unknown))}; allowed:'
        f' {", ".join(algorithm_registry.ALGORITHM_NAMES)}.'
    )
  summaries = {}
  with ef.exit_on_errors():
    task = ef.build_task()
    context.install_local_context()
    for algorithm in DEMO_ALGORITHMS.value:
      flags.FLAGS.algorithm = algorithm
      print(f'\n== {algorithm} on {task.name} ({ef.experiment_dir().path}) ==', flush=True)
      summaries[algorithm] = ef.train(task, ef.build_algorithm(task))

  print(f'\nMean per-client test accuracy on {task.name} after {ef.TOTAL_ROUNDS.value}'
        ' rounds (each client evaluates its own model on its own test split):')
  print(f'{"algorithm":<10} {"mean":>7} {"std":>7} {"p10":>7} {"min":>7} {"clients":>8}  outputs')
  for algorithm, summary in summaries.items():
    final = summary['final_eval']
    print(
        f'{algorithm:<10} {final["eval/accuracy_mean"]:>7.4f}'
        f' {final["eval/accuracy_std"]:>7.4f} {final["eval/accuracy_p10"]:>7.4f}'
        f' {final["eval/accuracy_min"]:>7.4f} {final["eval/num_clients"]:>8d} '
        f' {summary["experiment_dir"]}'
    )


if __name__ == '__main__':
  app.run(main, flags_parser=ef.parse_flags_or_exit)
