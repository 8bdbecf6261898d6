"""Trains a federated algorithm on a task and evaluates it per client.

  bin/train.py --task=femnist --algorithm=fedavg --total_rounds=50
  bin/train.py --flagfile=configs/fedavg_femnist.flags

Outputs go to <root_output_dir>/<experiment_name>/ (see
tff_personal/program/outputs.py). Rerunning the same command after an
interruption resumes from the last checkpoint. Bad input exits with code 2
and a one-line message naming the flag.
"""

import os
import sys

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

from absl import app  # pylint: disable=g-import-not-at-top
# TensorFlow must be imported before app.run: imported first inside app.run's
# main, tf.keras builds graph tensors instead of KerasTensors (TF 2.14) and
# models with Flatten fail to build.
import tensorflow  # pylint: disable=g-import-not-at-top,unused-import

from tff_personal.program import experiment_flags as ef  # pylint: disable=g-import-not-at-top


def main(argv):
  if len(argv) > 1:
    ef.exit_with_error(f'unexpected arguments: {" ".join(argv[1:])}')
  from tff_personal.algorithms import registry as algorithm_registry  # pylint: disable=g-import-not-at-top
  from tff_personal.personal import store  # pylint: disable=g-import-not-at-top
  from tff_personal.program import checkpoints  # pylint: disable=g-import-not-at-top
  from tff_personal.program import outputs  # pylint: disable=g-import-not-at-top
  from tff_personal.program import training_loop  # pylint: disable=g-import-not-at-top
  from tff_personal.runtime import context  # pylint: disable=g-import-not-at-top
  from tff_personal.tasks import base  # pylint: disable=g-import-not-at-top
  from tff_personal.tasks import registry as task_registry  # pylint: disable=g-import-not-at-top

  experiment = outputs.ExperimentDir(ef.ROOT_OUTPUT_DIR.value, ef.experiment_name())
  try:
    ef.check_output_dir_writable(experiment.path)
    task = task_registry.build_task(ef.TASK.value, ef.task_options())
    population = len(task.client_ids)
    if ef.POPULATION.value > population:
      raise ef.UsageError(
          f'--population={ef.POPULATION.value} exceeds the {population} clients'
          f' of task {task.name}; allowed: 0 (all) or 1..{population}.'
      )
    population = ef.POPULATION.value or population
    if ef.CLIENTS_PER_ROUND.value > population:
      raise ef.UsageError(
          f'--clients_per_round={ef.CLIENTS_PER_ROUND.value} exceeds the'
          f' {population} clients of the run; allowed: 1..{population}.'
      )
    context.install_local_context()
    process = algorithm_registry.build_algorithm(
        ef.ALGORITHM.value, task.model, ef.algorithm_options()
    )
    with open(experiment.flags_path, 'w') as f:
      f.write(ef.resolved_flagfile())
    summary = training_loop.run_training(
        task,
        process,
        ef.training_config(),
        experiment,
        run_config=ef.run_config(),
        progress_stream=sys.stdout,
    )
  except (
      ef.UsageError,
      base.DataUnavailableError,
      training_loop.ResumeError,
      checkpoints.CheckpointMismatchError,
      store.StoreMismatchError,
  ) as e:
    ef.exit_with_error(e)
  except training_loop.NonFiniteRoundError as e:
    ef.exit_with_error(e, code=1)
  except KeyboardInterrupt:
    print(
        f'Interrupted; rerun the same command to resume from the last'
        f' checkpoint in {experiment.path}.',
        file=sys.stderr,
    )
    sys.exit(130)
  final = summary['final_eval']
  print(
      f'{ef.ALGORITHM.value} on {task.name}: mean per-client test'
      f' {summary["accuracy_metric"]} {final.get("eval/accuracy_mean", float("nan")):.4f}'
      f' (std {final.get("eval/accuracy_std", float("nan")):.4f}, over'
      f' {final.get("eval/num_clients", 0)} clients) after'
      f' {summary["rounds_completed"]} rounds.'
  )
  print(f'Outputs: {experiment.path}')


if __name__ == '__main__':
  app.run(main, flags_parser=ef.parse_flags_or_exit)
