"""runtime/log_levels: INFO lines hidden by default, back with --verbosity."""

import logging

from absl import logging as absl_logging
from absl.testing import flagsaver
import pytest

from tff_personal.runtime import log_levels
import experiment_flags as ef  # bin/experiment_flags.py (pytest.ini puts bin/ on the path)


@pytest.fixture
def restored_log_levels():
  absl_verbosity = absl_logging.get_verbosity()
  tf_level = logging.getLogger('tensorflow').level
  yield
  absl_logging.set_verbosity(absl_verbosity)
  logging.getLogger('tensorflow').setLevel(tf_level)


@pytest.mark.parametrize(
    'argv, requested',
    [
        (['train.py'], False),
        (['train.py', '--verbosity=0'], True),
        (['train.py', '-v', '1'], True),
        (['train.py', '--v=1'], True),
        (['train.py', '--verbose_name=1', '--flagfile=x.flags'], False),
    ],
)
def test_verbosity_requested(argv, requested):
  assert log_levels.verbosity_requested(argv) == requested


def test_native_logs_hidden_below_fatal_unless_verbose(monkeypatch):
  monkeypatch.delenv('TF_CPP_MIN_LOG_LEVEL', raising=False)
  log_levels.quiet_native_logs(['train.py'])
  assert log_levels.os.environ['TF_CPP_MIN_LOG_LEVEL'] == '3'
  monkeypatch.delenv('TF_CPP_MIN_LOG_LEVEL')
  log_levels.quiet_native_logs(['train.py', '--verbosity=0'])
  assert log_levels.os.environ['TF_CPP_MIN_LOG_LEVEL'] == '2'
  monkeypatch.setenv('TF_CPP_MIN_LOG_LEVEL', '0')
  log_levels.quiet_native_logs(['train.py'])
  assert log_levels.os.environ['TF_CPP_MIN_LOG_LEVEL'] == '0'  # The user's own setting.


def test_parsed_flags_quiet_absl_and_tensorflow(restored_log_levels):
  with flagsaver.flagsaver():
    ef.parse_flags_or_exit(['train.py'])
    assert absl_logging.get_verbosity() == absl_logging.WARNING
    assert logging.getLogger('tensorflow').level == logging.ERROR


def test_verbosity_flag_keeps_info(restored_log_levels):
  logging.getLogger('tensorflow').setLevel(logging.INFO)
  with flagsaver.flagsaver():
    ef.parse_flags_or_exit(['train.py', '--verbosity=0'])
    assert absl_logging.get_verbosity() == absl_logging.INFO
    assert logging.getLogger('tensorflow').level == logging.INFO
