"""The library in one run: FedAvg against personalized FL on a non-IID split.

  bin/demo.py --flagfile=configs/demo_fmnist.flags        # what `make demo` runs

Trains each of --demo_algorithms (default FedAvg, FedPer, Ditto and Local)
with the same task, clients, seed and rounds (the experiment flags of
bin/train.py, --algorithm excepted), one after the other in this process.
Then it prints one table of the mean per-client test accuracy (each client
evaluates its own model on its own test split) with each algorithm's gain
over FedAvg, and writes one PNG: mean per-client accuracy per round, and the
final per-client accuracy distribution. A rerun resumes or reuses finished
runs.
"""

import os
import sys

from tff_personal.runtime import log_levels  # pylint: disable=g-import-not-at-top

log_levels.quiet_native_logs(sys.argv)  # Before TensorFlow's import; --verbosity shows all.
from tff_personal.runtime import allocator  # pylint: disable=g-import-not-at-top

if __name__ == '__main__':  # Not when tests load this file as a module.
  allocator.reexec_with_program_settings()  # Before TensorFlow's import (its docstring).

from absl import app  # pylint: disable=g-import-not-at-top
from absl import flags  # pylint: disable=g-import-not-at-top
# TensorFlow must be imported before app.run (see bin/train.py).
import tensorflow  # pylint: disable=g-import-not-at-top,unused-import

import experiment_flags as ef  # pylint: disable=g-import-not-at-top  # bin/experiment_flags.py

DEMO_ALGORITHMS = flags.DEFINE_list(
    'demo_algorithms', ['fedavg', 'fedper', 'ditto', 'local'],
    'Algorithms to train and compare; the first is the baseline of the gain column.',
)
DEMO_FIGURE = flags.DEFINE_string(
    'demo_figure', None, 'The PNG to write; default: <root_output_dir>/demo.png.'
)

_WHAT = {
    'fedavg': 'one global model for everyone',
    'fedper': 'shared base, personal classifier',
    'ditto': 'global model + personal model pulled toward it',
    'local': 'each client alone, no federation',
    'fedprox': 'one global model, proximal local training',
    'apfl': 'personal model mixed with the global one',
    'lindt': 'global and local model intertwined',
}


def _introduction(task, algorithms) -> str:
  population = ef.POPULATION.value or len(task.client_ids)
  split = ''
  if task.name in ('fmnist', 'mnist') and ef.PARTITION.value == 'k_classes':
    split = f' with {ef.CLASSES_PER_CLIENT.value} classes each'
  lines = [
      f'Task {task.name}: {population} clients{split}, {ef.CLIENTS_PER_ROUND.value} a round,'
      f' {ef.TOTAL_ROUNDS.value} rounds.',
      'Each client is scored on its own test split with the model it would use:',
  ] + [f'  {a:<8} {_WHAT.get(a, "")}' for a in algorithms]
  return '\n'.join(lines) + '\n'


def _table(summaries) -> str:
  baseline = next(iter(summaries))
  base_mean = summaries[baseline]['final_eval']['eval/accuracy_mean']
  lines = [
      f'{"algorithm":<10} {"mean":>6} {"std":>6} {"p10":>6} {"min":>6}'
      f' {f"vs {baseline}":>10}  outputs'
  ]
  for algorithm, summary in summaries.items():
    final = summary['final_eval']
    gain = 100 * (final['eval/accuracy_mean'] - base_mean)
    lines.append(
        f'{algorithm:<10} {final["eval/accuracy_mean"]:>6.3f} {final["eval/accuracy_std"]:>6.3f}'
        f' {final["eval/accuracy_p10"]:>6.3f} {final["eval/accuracy_min"]:>6.3f}'
        f' {"" if algorithm == baseline else f"{gain:+.1f} pts":>10}  {summary["experiment_dir"]}'
    )
  return '\n'.join(lines)


def main(argv):
  if len(argv) > 1:
    ef.exit_with_error(f'unexpected arguments: {" ".join(argv[1:])}')
  from tff_personal.algorithms import registry as algorithm_registry  # pylint: disable=g-import-not-at-top
  from tff_personal.runtime import context  # pylint: disable=g-import-not-at-top

  algorithms = list(dict.fromkeys(DEMO_ALGORITHMS.value))
  unknown = set(algorithms) - set(algorithm_registry.ALGORITHM_NAMES)
  if unknown or not algorithms:
    ef.exit_with_error(
        f'--demo_algorithms: unknown {", ".join(sorted(unknown)) or "(none given)"};'
        f' allowed: {", ".join(algorithm_registry.ALGORITHM_NAMES)}.'
    )
  figure = DEMO_FIGURE.value or os.path.join(ef.ROOT_OUTPUT_DIR.value, 'demo.png')
  summaries = {}
  with ef.exit_on_errors():
    ef.check_output_dir_writable(os.path.dirname(os.path.abspath(figure)), DEMO_FIGURE)
    task = ef.build_task()
    print(_introduction(task, algorithms), flush=True)
    context.install_local_context()
    for algorithm in algorithms:
      flags.FLAGS.algorithm = algorithm
      print(f'== {algorithm} ({ef.experiment_dir().path}) ==', flush=True)
      summaries[algorithm] = ef.train(task, ef.build_algorithm(task))

  print(
      f'\nMean per-client test accuracy after {ef.TOTAL_ROUNDS.value} rounds'
      f' ({summaries[algorithms[0]]["final_eval"]["eval/num_clients"]} clients;'
      ' std, 10th percentile and min over clients):'
  )
  print(_table(summaries))
  from tff_personal.reports import run_report  # pylint: disable=g-import-not-at-top

  runs = [run_report.load_run(s['experiment_dir'], label=a) for a, s in summaries.items()]
  run_report.comparison_figure(
      runs, figure,
      title=f'{task.name}: {ef.TOTAL_ROUNDS.value} rounds, mean per-client test accuracy',
  )
  print(f'\nFigure: {figure}')
  print(
      'Next: bin/report.py --run=DIR ... --output=DIR for a full report;'
      ' docs/README.md for the user guide.'
  )


if __name__ == '__main__':
  app.run(main, flags_parser=ef.parse_flags_or_exit)
