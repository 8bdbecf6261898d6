"""Exports an algorithm's TFF computations (serialized) and their type signatures.

  bin/export.py --algorithm=local --task=femnist --export_dir=output/export

Writes initialize/next/evaluate/get_model_weights as serialized TFF
computations plus manifest.json (see tff_personal/reports/export.py); a
production TFF runtime, or `tff_personal.reports.export.load_exported`, runs
them. Takes the same task and algorithm flags as bin/train.py.
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
from absl import flags  # pylint: disable=g-import-not-at-top

import experiment_flags as ef  # pylint: disable=g-import-not-at-top  # bin/experiment_flags.py

EXPORT_DIR = flags.DEFINE_string(
    'export_dir', None, 'Output folder; default <root_output_dir>/export/<task>_<algorithm>.'
)


def main(argv):
  if len(argv) > 1:
    ef.exit_with_error(f'unexpected arguments: {" ".join(argv[1:])}')
  from tff_personal.reports import export  # pylint: disable=g-import-not-at-top
  from tff_personal.runtime import context  # pylint: disable=g-import-not-at-top

  directory = EXPORT_DIR.value or os.path.join(
      ef.ROOT_OUTPUT_DIR.value, 'export', f'{ef.TASK.value}_{ef.ALGORITHM.value}'
  )
  with ef.exit_on_errors():
    ef.check_output_dir_writable(
        directory, EXPORT_DIR if EXPORT_DIR.value else ef.ROOT_OUTPUT_DIR
    )
    task = ef.build_task(check_sampling=False)
    context.install_local_context()
    algorithm = ef.build_algorithm(task)
    manifest = export.export_process(
        algorithm.process,
        directory,
        description={
            'algorithm': ef.ALGORITHM.value, 'task': ef.TASK.value,
            **ef.run_config(algorithm.dp),
        },
    )
  for name, entry in manifest['computations'].items():
    print(f'{name}: {entry["type_signature"]}')
  print(f'Exported to {directory}')


if __name__ == '__main__':
  app.run(main, flags_parser=ef.parse_flags_or_exit)
