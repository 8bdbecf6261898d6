"""Which devices TFF's worker trains on (`--device`), and how we know.

TFF 0.87's runtime is its C++ worker (`worker_binary`: our child process,
or `bin/worker.py`'s on another machine). When it creates its first
TensorFlow session it lists the machine's physical devices and logs them
("Found devices: [...]", TFF's `session_provider.cc`). With a GPU among
them it places every top-level op of a computation's graph that has a GPU
kernel on a GPU (sessions round-robin over the GPUs), iterators excepted;
ops in a function that a tf.data op calls stay on the CPU, which is why our
clients loop over their batches (`training.client_training.reduce_batches`).

The `worker_binary` in TFF 0.87's pip wheel is built without CUDA: it holds
none of TensorFlow's GPU device code (no `GPUDeviceFactory`, no CUDA stream
executor, while the TensorFlow wheel beside it has both), so on any machine
it finds only the CPU and trains there. The TFF-native path to a GPU is the
same worker built from TFF's source with its CUDA configuration
(`bazel build --config=cuda //tensorflow_federated/cc/simulation:worker_binary`
at tag v0.87.0; README, "GPU"), given to the binaries as `--worker_binary`.

`--device` says what a run requires of its worker:
  auto: whatever the worker finds (the run prints it; with a warning when
        TensorFlow here sees a GPU that the worker does not);
  cpu: the CPU: every GPU is hidden from the worker (CUDA_VISIBLE_DEVICES=-1);
  gpu: a GPU: start-up fails before the first round unless the worker
       reports one.
The worker reports its devices only at its first computation, so the
context runs a trivial one at start-up (`context.probe_devices`).
"""

import re
from typing import Mapping, Optional, Sequence

DEVICES = ('auto', 'cpu', 'gpu')

_REPORT = re.compile(r'Found devices: \[([^\]]*)\]')
_HIDE_GPUS = {'CUDA_VISIBLE_DEVICES': '-1'}
# The worker logs its devices at INFO, which TF_CPP_MIN_LOG_LEVEL >= 1 hides.
_LOG_INFO = {'TF_CPP_MIN_LOG_LEVEL': '0'}

CUDA_BUILD_HINT = (
    "TFF 0.87's pip worker_binary is built without CUDA; build TFF's worker with"
    ' `bazel build --config=cuda //tensorflow_federated/cc/simulation:worker_binary`'
    ' at tag v0.87.0 and pass it as --worker_binary (README, "GPU").'
)


class DeviceError(RuntimeError):
  """The worker cannot train on the device a run requires."""


def check_device_name(device: str) -> None:
  if device not in DEVICES:
    raise ValueError(f'unknown device {device!r}; allowed: {", ".join(DEVICES)}')


def worker_environment(env: Mapping[str, str], device: str) -> dict:
  """`env` for a worker that must train on `device` and log its devices."""
  check_device_name(device)
  worker_env = dict(env, **_LOG_INFO)
  if device == 'cpu':
    worker_env.update(_HIDE_GPUS)
  return worker_env


def parse_device_report(log_text: str) -> Optional[tuple[str, ...]]:
  """The physical devices of the worker's last report in `log_text`, or None.

  E.g. ('/physical_device:CPU:0', '/physical_device:GPU:0').
  """
  reports = _REPORT.findall(log_text)
  if not reports:
    return None
  return tuple(d.strip() for d in reports[-1].split(',') if d.strip())


def gpus(found: Sequence[str]) -> tuple[str, ...]:
  """The GPUs among the reported physical devices."""
  return tuple(d for d in found if d.split(':')[-2:-1] == ['GPU'])


def describe(found: Sequence[str]) -> str:
  """E.g. 'GPU:0, GPU:1 (and the CPU)' or 'CPU only'."""
  found_gpus = gpus(found)
  if not found_gpus:
    return 'CPU only'
  return ', '.join(d.split(':', 1)[-1] for d in found_gpus) + ' (and the CPU)'


def unused_gpus_warning(found: Sequence[str], tensorflow_gpus: Sequence[str], binary: str) -> Optional[str]:
  """A warning when TensorFlow here sees GPUs that the worker did not find, else None."""
  if gpus(found) or not tensorflow_gpus:
    return None
  return (
      f'TensorFlow sees {len(tensorflow_gpus)} GPU(s) but the TFF worker ({binary}) found'
      f' none: client training runs on the CPU. {CUDA_BUILD_HINT}'
  )


def check(device: str, found: Sequence[str], binary: str) -> None:
  """Raises `DeviceError` unless a worker that found `found` can train on `device`."""
  check_device_name(device)
  if device == 'gpu' and not gpus(found):
    raise DeviceError(
        f'--device=gpu: the TFF worker ({binary}) found no GPU, only'
        f' [{", ".join(found)}]. {CUDA_BUILD_HINT}'
    )
  if device == 'cpu' and gpus(found):  # CUDA_VISIBLE_DEVICES was not honoured.
    raise DeviceError(f'--device=cpu: the TFF worker ({binary}) still found {describe(found)}.')
