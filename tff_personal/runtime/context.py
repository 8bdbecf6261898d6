"""The one owner of the TFF execution context and its worker process.

TFF 0.87 executes computations in a C++ `worker_binary` child process that it
starts lazily and stops only from a `__del__` method, which often does not run
at interpreter shutdown. The orphan then keeps running and holds the parent's
stdout open, so a pipeline or a CI step never ends. This module starts that
worker itself and guarantees it dies with the Python process:

* normal exit and uncaught exceptions: an `atexit` hook stops it;
* SIGINT: Python raises `KeyboardInterrupt`, then the `atexit` hook runs;
* SIGTERM (and SIGHUP): a handler turns the signal into `SystemExit` so that
  `atexit` runs;
* SIGKILL or a crash of the interpreter: the worker was started with the
  Linux parent-death signal (`PR_SET_PDEATHSIG`), so the kernel kills it.

The worker never inherits our stdout/stderr: its log goes to a file (a
temporary one, unlinked as soon as it is open, unless
`TFF_PERSONAL_WORKER_LOG` names one), so even in the worst case it cannot
hold a pipe of ours open. That log is also where the worker reports the
devices it found (`devices`: `--device`, and `--worker_binary` for a CUDA
build of TFF's worker).

Usage: call `install_local_context()` once, from the main thread, before any
TFF computation is invoked. Every binary and test fixture does.

`install_remote_context(["host:port", ...])` instead runs computations on
TFF workers started elsewhere (`bin/worker.py`): one worker through TFF's
`RemoteExecutor`, several through TFF's mergeable computation context, which
splits each round's clients into one sub-round per worker, runs the client
work up to the aggregation on each, merges the partial aggregates and runs the
rest (`tff.backends.native.create_mergeable_comp_execution_context`).
`call_on_local_worker` runs a computation on this machine's worker whatever
the default context: the server's half of a split round (`process.SplitRound`).

Both contexts talk to their workers through `remote_executor.RemoteExecutor`:
TFF's, with arguments serialized in place (its docstring says why).
"""

import atexit
import ctypes
import os
import signal
import subprocess
import tempfile
import threading
import time
from typing import Optional

from absl import logging
import grpc
import numpy as np
import portpicker
import tensorflow as tf
import tensorflow_federated as tff
from tensorflow_federated.python.core.impl.executors import executors_errors

from tff_personal.runtime import allocator
from tff_personal.runtime import devices
from tff_personal.runtime import remote_executor

_RETRYABLE_ERROR = executors_errors.RetryableGRPCError

_GRPC_MAX_MESSAGE_BYTES = 2 * 1000 * 1000 * 1000
_GRPC_OPTIONS = [
    ('grpc.max_message_length', _GRPC_MAX_MESSAGE_BYTES),
    ('grpc.max_receive_message_length', _GRPC_MAX_MESSAGE_BYTES),
    ('grpc.max_send_message_length', _GRPC_MAX_MESSAGE_BYTES),
]
_READY_TIMEOUT_SECONDS = 60.0
_DEVICE_REPORT_TIMEOUT_SECONDS = 10.0
_STOP_TIMEOUT_SECONDS = 5.0
_PR_SET_PDEATHSIG = 1
_LIBC = ctypes.CDLL(None, use_errno=True)


def worker_binary_path(path: Optional[str] = None) -> str:
  """`path` (default: the C++ worker binary shipped in the TFF wheel), checked.

  Raises ValueError if it is not an executable file.
  """
  if path is None:
    path = os.path.join(os.path.dirname(tff.__file__), 'data', 'worker_binary')
  if not os.path.isfile(path):
    raise ValueError(f'no TFF worker binary at {path}')
  if not os.access(path, os.X_OK):
    raise ValueError(f'{path} is not executable')
  return path


def _prepare_child() -> None:
  """Runs in the worker between fork and exec (async-signal-safe calls only).

  The kernel kills the worker when its parent dies, and SIGINT/SIGTERM get
  their default action even when our shell started us with them ignored
  (as it does for background jobs), so that `stop` is prompt.
  """
  _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
  _LIBC.signal(signal.SIGINT, 0)  # 0 is SIG_DFL.
  _LIBC.signal(signal.SIGTERM, 0)


class WorkerProcess:
  """A TFF C++ worker serving the executor protocol on a localhost port."""

  def __init__(
      self,
      max_concurrent_computation_calls: int = -1,
      port: Optional[int] = None,
      *,
      binary: Optional[str] = None,
      device: str = 'auto',
  ):
    """A worker on `port` (default: a free port picked at each start).

    Args:
      max_concurrent_computation_calls: passed to the worker; nonpositive
        means no limit.
      port: the port it serves on.
      binary: the worker binary (default: the TFF wheel's).
      device: what it may train on (`devices.DEVICES`; `cpu` hides GPUs).
    """
    devices.check_device_name(device)
    self.binary = worker_binary_path(binary)
    self.device = device
    self._max_calls = max_concurrent_computation_calls
    self._port = port
    self._process: Optional[subprocess.Popen] = None
    self._stub = None
    self._lock = threading.Lock()
    self._log_reader = None  # The worker's log, opened for reading.
    self._log_start = 0  # Where this start's output begins in it.
    self.devices: Optional[tuple[str, ...]] = None  # Set by `probe_devices`.

  @property
  def pid(self) -> Optional[int]:
    return None if self._process is None else self._process.pid

  def wait(self) -> int:
    """Blocks until the worker exits; returns its exit code."""
    return self._process.wait()

  def start(self) -> None:
    """Starts the worker (no-op when it is running) and waits until ready."""
    with self._lock:
      if self._process is not None and self._process.poll() is None:
        return
      port = self._port or portpicker.pick_unused_port()
      log = self._open_log()
      try:
        self._process = subprocess.Popen(
            [
                self.binary,
                f'--port={port}',
                f'--max_concurrent_computation_calls={self._max_calls}',
            ],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            preexec_fn=_prepare_child,
            close_fds=True,
            env=devices.worker_environment(allocator.child_environment(), self.device),
        )
      finally:
        log.close()
      channel = grpc.insecure_channel(f'localhost:{port}', _GRPC_OPTIONS)
      self._stub = tff.framework.RemoteExecutorGrpcStub(channel)
      deadline = time.monotonic() + _READY_TIMEOUT_SECONDS
      while not self._stub.is_ready:
        if self._process.poll() is not None:
          raise RuntimeError(
              'The TFF worker binary exited at start-up with code '
              f'{self._process.returncode}; set TFF_PERSONAL_WORKER_LOG=<file> '
              'to see its log.'
          )
        if time.monotonic() > deadline:
          self.stop()
          raise RuntimeError('The TFF worker binary did not become ready.')
        time.sleep(0.05)
      logging.debug('TFF worker pid %d serving on port %d', self.pid, port)

  def _open_log(self):
    """The worker's log, opened for appending (for the worker) and reading.

    `TFF_PERSONAL_WORKER_LOG` names a file to append to; otherwise a
    temporary file, removed from the file system at once (the two open
    descriptors keep it), so that nothing is left behind even when this
    process is killed.
    """
    if self._log_reader is not None:
      self._log_reader.close()
    path = os.environ.get('TFF_PERSONAL_WORKER_LOG')
    temporary = path is None
    if temporary:
      fd, path = tempfile.mkstemp(prefix='tff_worker_', suffix='.log')
      os.close(fd)
    try:
      log = open(path, 'ab')
      self._log_reader = open(path, 'rb')
    finally:
      if temporary:
        os.remove(path)
    self._log_start = log.tell()
    return log

  def log_text(self) -> str:
    """What the worker has logged since it last started."""
    if self._log_reader is None:
      return ''
    self._log_reader.seek(self._log_start)
    return self._log_reader.read().decode('utf-8', errors='replace')

  def stub(self):
    """Returns a ready gRPC stub, restarting the worker if it has died."""
    if self._stub is None or not self._stub.is_ready:
      self.stop()
      self.start()
    return self._stub

  def stop(self) -> None:
    """Stops the worker: SIGTERM, then SIGKILL if it has not exited in time."""
    with self._lock:
      process, self._process, self._stub = self._process, None, None
    if process is not None and process.poll() is None:
      try:
        process.terminate()
        process.wait(timeout=_STOP_TIMEOUT_SECONDS)
      except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
      except ProcessLookupError:
        pass
    if self._log_reader is not None:
      self._log_reader.close()
      self._log_reader = None


_worker: Optional[WorkerProcess] = None
_local_context = None  # `_worker`'s execution context (`_local_execution_context`).
_remote_stubs: list = []  # The workers of the context `install_remote_context` installed.
_handlers_installed = False


_termination_signal: Optional[int] = None


def _termination_error(signum: int) -> BaseException:
  if signum == signal.SIGINT:
    return KeyboardInterrupt()
  return SystemExit(128 + signum)


def _raise_on_signal(signum, frame):
  global _termination_signal
  del frame  # Unused.
  _termination_signal = signum
  raise _termination_error(signum)


def raise_if_terminated() -> None:
  """Raises again the exit of a SIGTERM, SIGHUP or SIGINT that arrived before.

  Python runs a signal handler in whatever the main thread is doing; when
  that is an object's `__del__` (TensorFlow's functions have them), the
  handler's SystemExit (KeyboardInterrupt for SIGINT) is printed as
  "Exception ignored" and the program goes on. Long loops call this between
  steps so that the signal still ends them (seen: a SIGTERM'd training run
  that kept training).
  """
  if _termination_signal is not None:
    raise _termination_error(_termination_signal)


def _install_exit_handlers() -> None:
  global _handlers_installed
  if _handlers_installed:
    return
  atexit.register(shutdown)
  if threading.current_thread() is threading.main_thread():
    for signum in (signal.SIGTERM, signal.SIGHUP):
      if signal.getsignal(signum) in (signal.SIG_DFL, None):
        signal.signal(signum, _raise_on_signal)
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
      signal.signal(signal.SIGINT, _raise_on_signal)  # Still KeyboardInterrupt.
  _handlers_installed = True


def install_local_context(
    max_concurrent_computation_calls: int = -1,
    *,
    device: Optional[str] = None,
    binary: Optional[str] = None,
):
  """Starts a local TFF worker and makes it the default execution context.

  Idempotent. Returns the `WorkerProcess`, whose `pid` tests can watch.

  Args:
    max_concurrent_computation_calls: passed to the worker; nonpositive means
      no limit.
    device: `devices.DEVICES`; when given, the worker's devices are probed
      and checked before this returns (`devices.DeviceError`). Default:
      `auto`, not probed.
    binary: the worker binary (default: the TFF wheel's).
  """
  worker = _start_local_worker(max_concurrent_computation_calls, device, binary)
  tff.framework.set_default_context(_local_execution_context())
  return worker


def call_on_local_worker(computation: tff.Computation, *args):
  """`computation(*args)` on this machine's TFF worker, whatever the default
  context (the worker starts on first use, as `install_local_context` starts
  it). With several `--workers`, the server's half of a split round runs here
  (`process.SplitRound`): the clients' updates reach it over loopback instead
  of crossing the network to a worker again.
  """
  if _worker is None:
    _start_local_worker(-1, None, None)
  with tff.framework.get_context_stack().install(_local_execution_context()):
    return computation(*args)


def _start_local_worker(max_concurrent_computation_calls, device, binary) -> 'WorkerProcess':
  global _worker
  if _worker is not None:
    binary = worker_binary_path(binary)
    # Only `cpu` starts the worker differently (GPUs hidden); `gpu` is a check.
    hides_gpus = None if device is None else device == 'cpu'
    if binary != _worker.binary or hides_gpus not in (None, _worker.device == 'cpu'):
      raise RuntimeError(
          f'A local TFF worker ({_worker.binary}, device {_worker.device}) is'
          f' already installed; cannot switch to {binary}, device {device}.'
      )
    _worker.start()
    if device is not None:
      if _worker.devices is None:
        probe_devices(_worker)
      devices.check(device, _worker.devices, binary)
    return _worker
  _install_exit_handlers()
  worker = WorkerProcess(max_concurrent_computation_calls, binary=binary, device=device or 'auto')
  worker.start()
  if device is not None:
    try:
      probe_devices(worker)
    except BaseException:
      worker.stop()
      raise
  _worker = worker
  return worker


def _local_execution_context() -> tff.framework.SyncExecutionContext:
  """The execution context of the worker `_start_local_worker` started."""
  global _local_context
  if _local_context is None:
    worker = _worker

    def executor_fn(cardinalities):
      cardinalities.setdefault(tff.CLIENTS, 0)  # As TFF's own local factory.
      executor = remote_executor.RemoteExecutor(worker.stub())
      executor.set_cardinalities(cardinalities)
      return executor

    _local_context = tff.framework.SyncExecutionContext(
        executor_fn=tff.framework.ResourceManagingExecutorFactory(executor_fn),
        **_context_kwargs(),
    )
  return _local_context


def serve(
    port: int,
    max_concurrent_computation_calls: int = -1,
    *,
    device: str = 'auto',
    binary: Optional[str] = None,
) -> WorkerProcess:
  """Starts a worker serving on `port` for remote callers (`bin/worker.py`).

  Its devices are probed and checked against `device` before it is handed
  out (`devices.DeviceError`). It is stopped by `shutdown`, which runs at
  exit and on SIGTERM/SIGHUP.
  """
  global _worker
  _install_exit_handlers()
  _drop_import_time_context()
  _worker = WorkerProcess(max_concurrent_computation_calls, port=port, binary=binary, device=device)
  _worker.start()
  probe_devices(_worker)
  return _worker


def probe_devices(worker: WorkerProcess) -> tuple[str, ...]:
  """Runs a trivial computation on `worker`; returns and checks its devices.

  TFF's worker reports the physical devices it found in its log when it
  creates its first TensorFlow session (`devices`). Sets `worker.devices`.
  Raises `devices.DeviceError` if they do not satisfy `worker.device`, or if
  no report comes.
  """
  probe = tff.tensorflow.computation(lambda: tf.constant(0, tf.int32))
  tff.framework.SyncExecutionContext(
      executor_fn=_executor_factory(worker.stub()), **_context_kwargs()
  ).invoke(probe, None)
  deadline = time.monotonic() + _DEVICE_REPORT_TIMEOUT_SECONDS
  while (found := devices.parse_device_report(worker.log_text())) is None:
    if time.monotonic() > deadline:
      raise devices.DeviceError(
          f'The TFF worker ({worker.binary}) did not report its devices within'
          f' {_DEVICE_REPORT_TIMEOUT_SECONDS:g} s of its first computation.'
      )
    time.sleep(0.05)
  devices.check(worker.device, found, worker.binary)
  worker.devices = found
  if worker.device == 'auto':
    tensorflow_gpus = [d.name for d in tf.config.list_physical_devices('GPU')]
    warning = devices.unused_gpus_warning(found, tensorflow_gpus, worker.binary)
    if warning:
      logging.warning(warning)
  logging.debug('TFF worker %s trains on: %s', worker.binary, devices.describe(found))
  return found


def _drop_import_time_context() -> None:
  """Replaces the context TFF installs at import by one that runs nothing.

  That context's clean-up fails at interpreter exit ("'NoneType' object has
  no attribute 'Popen'") unless it is dropped while Python is still whole.
  """
  from tensorflow_federated.python.core.impl.context_stack import set_default_context  # pylint: disable=g-import-not-at-top

  set_default_context.set_no_default_context()


# A program that exits before it installs a context (bad input) would
# otherwise meet that failure at exit; registered at import, this hook runs
# after `shutdown`'s.
atexit.register(_drop_import_time_context)


class WorkerUnavailableError(RuntimeError):
  """A remote TFF worker cannot be reached (at start-up or during a round)."""


class WorkerDataError(RuntimeError):
  """A remote TFF worker cannot read a client's dataset."""


_WORKER_LOST_AFTER_SECONDS = 10.0


class _FailFastStub(tff.framework.RemoteExecutorGrpcStub):
  """TFF's gRPC stub, but a worker unreachable for a while is an error.

  TFF's execution contexts retry a call that failed with UNAVAILABLE forever,
  so a dead worker would hang the run. Here calls are still retried (a
  restarted worker or a network blip costs nothing), until the worker has
  failed every call for `_WORKER_LOST_AFTER_SECONDS`; then the call raises
  `WorkerUnavailableError`, which no context retries.
  """

  def __init__(self, channel, address: str):
    super().__init__(channel)
    self.address = address
    self._failing_since = None

  def _call(self, method, request):
    try:
      response = method(request)
    except _RETRYABLE_ERROR as e:
      now = time.monotonic()
      self._failing_since = self._failing_since or now
      if now - self._failing_since > _WORKER_LOST_AFTER_SECONDS:
        raise WorkerUnavailableError(
            f'Lost the TFF worker at {self.address}: {e.code().name}'
            f' ({e.details()}) for {_WORKER_LOST_AFTER_SECONDS:g} s.'
        ) from None
      time.sleep(0.2)
      raise
    self._failing_since = None
    return response


def _fail_fast(name):
  method = getattr(tff.framework.RemoteExecutorGrpcStub, name)
  return lambda self, request: self._call(lambda r: method(self, r), request)  # pylint: disable=protected-access


for _name in (
    'get_executor', 'create_value', 'create_struct', 'create_call', 'create_selection',
    'compute', 'dispose', 'dispose_executor',
):
  setattr(_FailFastStub, _name, _fail_fast(_name))


def _remote_stub(address: str, timeout_seconds: float):
  channel = grpc.insecure_channel(address, _GRPC_OPTIONS)
  try:
    grpc.channel_ready_future(channel).result(timeout=timeout_seconds)
  except grpc.FutureTimeoutError:
    channel.close()
    raise WorkerUnavailableError(
        f'No TFF worker answers at {address} within {timeout_seconds:g} s; start one'
        f' there with bin/worker.py --port={address.rsplit(":", 1)[-1]}.'
    ) from None
  return _FailFastStub(channel, address)


def _executor_factory(stub):
  def executor_fn(cardinalities):
    cardinalities.setdefault(tff.CLIENTS, 0)  # As TFF's own local factory.
    executor = remote_executor.RemoteExecutor(stub)
    executor.set_cardinalities(cardinalities)
    return executor

  return tff.framework.ResourceManagingExecutorFactory(executor_fn)


def _context_kwargs():
  return dict(
      compiler_fn=tff.backends.native.desugar_and_transform_to_native,
      transform_args=tff.tensorflow.transform_args,
      transform_result=tff.tensorflow.transform_result,
  )


def parse_worker_addresses(text: str) -> list[str]:
  """`host1:port,host2:port` as a list; ValueError naming what is wrong."""
  addresses = [a.strip() for a in text.split(',') if a.strip()]
  if not addresses:
    raise ValueError('no worker address given (host:port,...)')
  for address in addresses:
    host, _, port = address.rpartition(':')
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
      raise ValueError(f'{address!r} is not host:port')
  if len(set(addresses)) != len(addresses):
    raise ValueError('a worker address is given twice')
  return addresses


def install_remote_context(addresses, ready_timeout_seconds: float = 30.0) -> None:
  """Makes TFF workers at `addresses` ("host:port") the default context.

  Raises `WorkerUnavailableError` if one does not answer in time. With one
  address, every computation runs on that worker; with several, TFF's
  mergeable computation context spreads each round's clients over them
  (client-placed results then come back in the order the workers finish:
  `runtime.client_keys` matches them to their clients), and this machine's
  worker starts too, for `call_on_local_worker`.
  """
  global _remote_stubs
  _drop_import_time_context()
  if len(addresses) > 1:
    # For `call_on_local_worker`: started before any gRPC channel exists, as
    # forking a process while gRPC's threads run is unsafe.
    _start_local_worker(-1, None, None)
  stubs = [_remote_stub(a, ready_timeout_seconds) for a in addresses]
  _remote_stubs = stubs
  if len(stubs) == 1:
    context = tff.framework.SyncExecutionContext(
        executor_fn=_executor_factory(stubs[0]), **_context_kwargs()
    )
  else:
    context = tff.backends.native.create_mergeable_comp_execution_context([
        tff.framework.AsyncExecutionContext(
            executor_fn=_executor_factory(stub), **_context_kwargs()
        )
        for stub in stubs
    ])
  tff.framework.set_default_context(context)


def runs_on_several_workers() -> bool:
  """Whether `install_remote_context` installed TFF's mergeable context."""
  return len(_remote_stubs) > 1


def _first_element_count(element_spec) -> tff.Computation:
  """(D* -> int64): how many of a dataset's first element it reads (0 or 1)."""

  @tff.tensorflow.computation(tff.SequenceType(tff.types.tensorflow_to_type(element_spec)))
  def first_elements(data):
    return data.take(1).reduce(np.int64(0), lambda count, _: count + 1)

  return first_elements


def check_workers_read(datasets) -> None:
  """Reads the first element of each `tf.data.Dataset` on every worker that
  `install_remote_context` connected to, one worker at a time.

  A client's dataset reaches a worker as a graph, which can name files of
  this machine (the SQLite databases of TFF's loaders); a worker without
  them would fail in the first round, with TensorFlow's error deep in a
  gRPC traceback. Raises `WorkerDataError` naming the worker and that error;
  TFF 0.87's worker dies (SIGSEGV) where TensorFlow's SQLite reader cannot
  open a database file, which is then the error.
  """
  reads = [(_first_element_count(dataset.element_spec), dataset) for dataset in datasets]
  for stub in _remote_stubs:
    worker_context = tff.framework.SyncExecutionContext(
        executor_fn=_executor_factory(stub), **_context_kwargs()
    )
    for read, dataset in reads:
      try:
        with tff.framework.get_context_stack().install(worker_context):
          read(dataset)
      except grpc.RpcError as e:
        detail = (e.details() or str(e.code())).splitlines()[0]
        raise WorkerDataError(
            f'the TFF worker at {stub.address} cannot read the task\'s data: {detail}.'
        ) from None
      except WorkerUnavailableError:
        raise WorkerDataError(
            f'the TFF worker at {stub.address} stopped while reading the task\'s data'
            ' (it does where a database file is missing).'
        ) from None


def shutdown() -> None:
  """Stops the worker started by `install_local_context` (safe to repeat)."""
  if _worker is not None:
    _worker.stop()
