"""Serves TFF computations for `bin/train.py --workers=...`: TFF's C++ worker.

  bin/worker.py --port=8000          # on each worker machine
  bin/train.py --workers=10.0.0.5:8000,10.0.0.6:8000 --flagfile=...

Starts the TFF worker binary that ships in the TFF wheel (the executor
service of TFF's C++ runtime; --worker_binary: another build of it, e.g. with
CUDA) on --port and stops it on SIGTERM, SIGINT or SIGHUP, or when this
process dies. Before serving it runs one trivial computation and prints the
devices the worker found; --device=gpu exits 2 if it found no GPU, --device=cpu
hides the GPUs from it (`tff_personal/runtime/devices.py`). Exits 0 after a
clean stop, 1 if the worker itself stops.

SECURITY: the executor protocol has no authentication or encryption, and the
TFF 0.87 worker binary has no bind-address option: it listens on every
interface of the machine ([::]:port). Anyone who can reach the port can run
arbitrary TensorFlow on this machine. Run it only on a private network, behind
a firewall that admits the training machine alone (or on localhost, the
default in our tests); never on a public address.
"""

import os
import socket
import sys

from tff_personal.runtime import log_levels  # pylint: disable=g-import-not-at-top

log_levels.quiet_native_logs(sys.argv)  # Before TensorFlow's import; --verbosity shows all.

from absl import app  # pylint: disable=g-import-not-at-top
from absl import flags  # pylint: disable=g-import-not-at-top
import device_flags  # pylint: disable=g-import-not-at-top  # bin/device_flags.py

from tff_personal.runtime import devices  # pylint: disable=g-import-not-at-top

PORT = flags.DEFINE_integer('port', None, 'Port to serve on (1-65535).', lower_bound=1, upper_bound=65535)
MAX_CONCURRENT_CALLS = flags.DEFINE_integer(
    'max_concurrent_computation_calls', -1,
    'Most parallel calls of one computation (clients trained at once); nonpositive: no limit.',
)

DEVICE, WORKER_BINARY = device_flags.define_device_flags()


def _port_free(port: int) -> bool:
  with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as probe:
    # As gRPC does: a port whose last connections linger in TIME_WAIT is free.
    probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
      probe.bind(('::', port))
    except OSError:
      return False
  return True


def main(argv):
  log_levels.quiet_python_logs(verbosity_set=flags.FLAGS['verbosity'].present > 0)
  if len(argv) > 1:
    sys.exit(f'worker.py: error: unexpected arguments: {" ".join(argv[1:])}')
  if PORT.value is None:
    print('worker.py: error: --port is required.', file=sys.stderr)
    sys.exit(2)
  if not _port_free(PORT.value):
    print(f'worker.py: error: --port={PORT.value}: the port is in use.', file=sys.stderr)
    sys.exit(2)
  from tff_personal.runtime import context  # pylint: disable=g-import-not-at-top
  try:
    worker = context.serve(
        PORT.value, MAX_CONCURRENT_CALLS.value, device=DEVICE.value, binary=WORKER_BINARY.value
    )
  except ValueError as e:  # The binary.
    print(f'worker.py: error: --worker_binary={WORKER_BINARY.value}: {e}.', file=sys.stderr)
    sys.exit(2)
  except devices.DeviceError as e:
    context.shutdown()
    print(f'worker.py: error: {e}', file=sys.stderr)
    sys.exit(2)
  print(
      f'TFF worker (pid {worker.pid}) serving on port {PORT.value} of every interface;'
      ' no authentication: keep the port on a private network. It trains on:'
      f' {devices.describe(worker.devices)}.',
      flush=True,
  )
  try:
    code = worker.wait()
  except (KeyboardInterrupt, SystemExit):
    context.shutdown()
    print('TFF worker stopped.', flush=True)
    return
  print(f'worker.py: error: the TFF worker exited with code {code}.', file=sys.stderr)
  sys.exit(1)


if __name__ == '__main__':
  app.run(main)
