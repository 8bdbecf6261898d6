"""Test set-up: one TFF worker per test process, owned by tff_personal.

`install_local_context` starts the C++ worker and guarantees it is stopped
when the test process ends, however it ends.
"""

import os

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

import pytest  # pylint: disable=g-import-not-at-top


@pytest.fixture(scope='session', autouse=True)
def tff_context():
  from tff_personal.runtime import context  # pylint: disable=g-import-not-at-top

  worker = context.install_local_context()
  yield worker
  context.shutdown()


@pytest.fixture(scope='session')
def cache_dir(tmp_path_factory):
  """A TFF dataset cache shared by a test process (femnist is written once)."""
  return str(tmp_path_factory.mktemp('tff_cache'))
