"""glibc malloc settings for the program's process, not for TensorFlow's.

Every round of Ditto, LINDT or APFL moves the cohort's personal states into
TFF's runtime and back (68 MB each way for 10 FEMNIST CNNs). On the Python
side that is protobuf work in TFF's and gRPC's threads: upb builds the
request, copies it and serializes it into buffers of tens of MB. glibc serves
blocks that large with a fresh `mmap` and returns them with `munmap` when
freed (and each thread gets its own arena, which it trims), so every round
touches new pages; in a VM whose freed memory goes back to the host (this
project's machines) a fresh page costs about 10 us, i.e. about 0.17 s per
68 MB copy. Keeping freed memory in one arena for reuse halves the transport
(0.88 s -> 0.4 s a round for 10 FEMNIST CNNs here; docs/results_scale.md).

The same settings slow multithreaded TensorFlow (a compute-floor round took
1.57 s with one arena against 0.87-1.16 s without), so they apply to the
program's own process only: `child_environment` strips them for TFF's worker
and any other TensorFlow process the program starts.

glibc reads these settings when a process starts and fixes its arena limit
once a second thread allocates, so `mallopt` after TensorFlow's import is too
late: the binaries call `reexec_with_program_settings` before importing
TensorFlow, which re-executes the same command line once with them set. Set
TFF_PERSONAL_SYSTEM_MALLOC=1 to keep glibc's defaults (freed memory then goes
back to the system; with these settings the process keeps its peak, and its
first rounds pay for touching the heap's pages as it grows).
"""

import os
import sys
from typing import Mapping, Optional

PROGRAM_SETTINGS = {
    'MALLOC_ARENA_MAX': '1',  # One arena: every thread reuses the same freed blocks.
    'MALLOC_MMAP_MAX_': '0',  # Large blocks from the heap, not a fresh mmap each.
    'MALLOC_TRIM_THRESHOLD_': '2147483647',  # Never hand freed heap back to the system.
}
OPT_OUT = 'TFF_PERSONAL_SYSTEM_MALLOC'
_ADDED = 'TFF_PERSONAL_MALLOC_ADDED'  # The names the re-execution added, comma-separated.


def reexec_with_program_settings() -> None:
  """Re-executes this program once with `PROGRAM_SETTINGS` (module docstring).

  Call at the top of a binary, before TensorFlow is imported. Returns at
  once when this process is the re-execution or when `OPT_OUT` is set to 1.
  A setting already in the environment (the user's) is kept as it is.
  """
  if os.environ.get(OPT_OUT) == '1' or _ADDED in os.environ:
    return
  added = [name for name in PROGRAM_SETTINGS if name not in os.environ]
  env = dict(os.environ, **{name: PROGRAM_SETTINGS[name] for name in added})
  env[_ADDED] = ','.join(added)
  sys.stdout.flush()
  sys.stderr.flush()
  os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], env)


def child_environment(env: Optional[Mapping[str, str]] = None) -> dict:
  """`env` (default: this process's) without the settings the re-execution added.

  For TFF's worker and the other TensorFlow processes the program starts.
  """
  env = dict(os.environ if env is None else env)
  for name in filter(None, env.pop(_ADDED, '').split(',')):
    env.pop(name, None)
  return env
