"""The `--device` and `--worker_binary` flags, for the binaries that start a TFF worker."""

from absl import flags

from tff_personal.runtime import devices


def define_device_flags(where: str = '') -> tuple[flags.FlagHolder, flags.FlagHolder]:
  """Defines `--device` and `--worker_binary`; `where` ends their help."""
  device = flags.DEFINE_enum(
      'device', 'auto', devices.DEVICES,
      'What the TFF worker trains on: auto (what it finds), cpu (GPUs hidden), gpu'
      ' (exit 2 at start-up unless it finds a GPU; needs a CUDA build of the worker,'
      f' --worker_binary).{where}',
  )
  binary = flags.DEFINE_string(
      'worker_binary', None,
      f"TFF's C++ worker binary (e.g. a CUDA build); default: the TFF wheel's.{where}",
  )
  return device, binary
