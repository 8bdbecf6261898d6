"""Per-client summaries with exact numbers."""

import pytest

from tff_personal.evaluation import summary


def test_summary_of_known_values():
  result = summary.summarize([0.5, 1.0, 0.0, 0.5], 'acc')
  assert result == {
      'acc_mean': 0.5,
      'acc_std': pytest.approx(0.3535533905932738),
      'acc_min': 0.0,
      'acc_p10': pytest.approx(0.15),
      'acc_median': 0.5,
      'acc_max': 1.0,
  }


def test_summary_of_nothing_is_empty():
  assert summary.summarize([], 'acc') == {}
