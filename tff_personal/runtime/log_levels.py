"""Quiet screens for the binaries: TensorFlow's and TFF's INFO lines only on request.

A run's screen should show its progress lines and real problems. Left alone,
absl logs at INFO (TFF's "Adding default num_examples metric", TensorFlow's
"Assets written" on every checkpoint) and TensorFlow's C++ start-up prints
cuDNN/cuFFT/cuBLAS factory-registration errors that mean nothing on a CPU
machine. The binaries therefore call `quiet_native_logs` before importing
TensorFlow and `quiet_python_logs` once the flags are parsed; absl's own
`--verbosity` (e.g. `--verbosity=0` for INFO) brings every line back.
"""

import logging
import os
from typing import Sequence

from absl import logging as absl_logging

VERBOSITY_FLAGS = ('--verbosity', '-verbosity', '--v', '-v')


def verbosity_requested(argv: Sequence[str]) -> bool:
  """Whether the command line sets absl's `--verbosity` (or `-v`)."""
  return any(
      arg.split('=', 1)[0] in VERBOSITY_FLAGS for arg in argv
  )


def quiet_native_logs(argv: Sequence[str]) -> None:
  """Hides TensorFlow's C++ log lines below FATAL unless `argv` asks for verbosity.

  Call before TensorFlow is imported (the C++ side reads the variable once).
  A `TF_CPP_MIN_LOG_LEVEL` already in the environment is kept.
  """
  os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2' if verbosity_requested(argv) else '3')


def quiet_python_logs(verbosity_set: bool) -> None:
  """absl at WARNING and TensorFlow's Python logger at ERROR, unless `verbosity_set`."""
  if verbosity_set:
    return
  absl_logging.set_verbosity(absl_logging.WARNING)
  logging.getLogger('tensorflow').setLevel(logging.ERROR)
