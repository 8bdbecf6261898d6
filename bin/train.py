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

from tff_personal.runtime import log_levels  # pylint: disable=g-import-not-at-top

log_levels.quiet_native_logs(sys.argv)  # Before TensorFlow's import; --verbosity shows all.
from tff_personal.runtime import allocator  # pylint: disable=g-import-not-at-top

if __name__ == '__main__':  # Not when tests load this file as a module.
  allocator.reexec_with_program_settings()  # Before TensorFlow's import (its docstring).

from absl import app  # pylint: disable=g-import-not-at-top
# TensorFlow must be imported before app.run: imported first inside app.run's
# main, tf.keras builds graph tensors instead of KerasTensors (TF 2.14) and
# models with Flatten fail to build.
import tensorflow  # pylint: disable=g-import-not-at-top,unused-import

import experiment_flags as ef  # pylint: disable=g-import-not-at-top  # bin/experiment_flags.py


def main(argv):
  if len(argv) > 1:
    ef.exit_with_error(f'unexpected arguments: {" ".join(argv[1:])}')
  from tff_personal.runtime import context  # pylint: disable=g-import-not-at-top

  experiment = ef.experiment_dir()
  try:
    with ef.exit_on_errors():
      ef.check_output_dir_writable(experiment.path)
      task = ef.build_task()
      worker_devices = ef.install_context(task)
      if worker_devices:
        print(f'TFF worker trains on: {worker_devices}', flush=True)
      summary = ef.train(task, ef.build_algorithm(task))
  except KeyboardInterrupt:
    print(
        f'Interrupted; rerun the same command to resume from the last'
        f' checkpoint in {experiment.path}.',
        file=sys.stderr,
    )
    sys.exit(130)
  except context.WorkerUnavailableError as e:
    ef.exit_with_error(
        f'{e} The checkpoints in {experiment.path} are intact: rerun the same command'
        ' when the worker is back, or without --workers to resume on this machine.',
        code=1,
    )
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
