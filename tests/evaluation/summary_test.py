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
      'acc_worst10_mean': 0.0,
      'acc_median': 0.5,
      'acc_max': 1.0,
  }


def test_summary_of_nothing_is_empty():
  assert summary.summarize([], 'acc') == {}


def test_worst_ten_percent_mean_takes_the_lowest_tenth():
  values = [0.9] * 18 + [0.1, 0.3]
  assert summary.summarize(values, 'a')['a_worst10_mean'] == pytest.approx(0.2)
  assert summary.summarize([0.5, 0.7, 0.9], 'a')['a_worst10_mean'] == 0.5  # ceil(0.3) = 1.


def test_worst_ten_percent_of_a_loss_takes_the_highest_tenth():
  values = [0.1] * 18 + [2.0, 3.0]
  result = summary.summarize(values, 'loss', higher_is_better=False)
  assert result['loss_worst10_mean'] == pytest.approx(2.5)
  assert result['loss_min'] == 0.1 and result['loss_max'] == 3.0
