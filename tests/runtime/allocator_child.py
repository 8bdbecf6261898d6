"""A program for allocator_test.py: re-executes itself with the settings, then reports.

Usage: allocator_child.py [worker] [ARG ...]
Prints one JSON line: its pid, its arguments, the settings in its environment
and (with `worker`) those in the environment of the TFF worker it starts.
"""

import json
import os
import sys

from tff_personal.runtime import allocator

allocator.reexec_with_program_settings()


def settings_in(environ: dict) -> dict:
  return {name: environ.get(name) for name in allocator.PROGRAM_SETTINGS}


def environment_of(pid: int) -> dict:
  with open(f'/proc/{pid}/environ', 'rb') as f:
    entries = [e.decode() for e in f.read().split(b'\0') if b'=' in e]
  return dict(e.split('=', 1) for e in entries)


def main(args: list) -> None:
  report = {'pid': os.getpid(), 'args': args, 'env': settings_in(os.environ)}
  if args[:1] == ['worker']:
    os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
    from tff_personal.runtime import context  # pylint: disable=g-import-not-at-top

    worker = context.install_local_context()
    report['worker_env'] = settings_in(environment_of(worker.pid))
  print(json.dumps(report), flush=True)


if __name__ == '__main__':
  main(sys.argv[1:])
