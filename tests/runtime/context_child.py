"""A run for context_test.py: starts the TFF context, computes, then ends as told.

Usage: context_child.py exit|raise|wait|swallow|here
Prints `READY <worker pid>` once a computation has run on the worker, then
(modes exit and raise) waits for its stdin to close, so that the test can look
at the worker before the run ends. swallow: a loop that spends its time in
`__del__`, where a signal handler's SystemExit is ignored, and calls
`context.raise_if_terminated` between iterations, as the training loop does.
here: as exit, with no default context, the computation run through
`context.call_on_local_worker`.
"""

import os
import sys
import time

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

import numpy as np  # pylint: disable=g-import-not-at-top
import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top

from tensorflow_federated.python.core.impl.context_stack import set_default_context  # pylint: disable=g-import-not-at-top

from tff_personal.runtime import context  # pylint: disable=g-import-not-at-top


class _SlowToDelete:

  def __del__(self):
    time.sleep(1.0)  # A signal now lands here, and its SystemExit is ignored.


def main(mode: str) -> None:
  @tff.federated_computation(tff.FederatedType(np.int32, tff.CLIENTS))
  def total(values):
    return tff.federated_sum(values)

  if mode == 'here':
    # No default context (as with --workers, where it is TFF's mergeable
    # one): `call_on_local_worker` starts the worker on demand.
    set_default_context.set_no_default_context()
    assert context.call_on_local_worker(total, [1, 2, 3]) == 6
    worker = context._worker  # pylint: disable=protected-access
  else:
    worker = context.install_local_context()
    assert total([1, 2, 3]) == 6
  print(f'READY {worker.pid}', flush=True)
  if mode in ('exit', 'raise', 'here'):
    sys.stdin.read()
  if mode == 'raise':
    raise RuntimeError('the run failed')
  if mode == 'wait':
    time.sleep(600)
  if mode == 'swallow':
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
      _SlowToDelete()  # Deleted at once.
      context.raise_if_terminated()


if __name__ == '__main__':
  main(sys.argv[1])
