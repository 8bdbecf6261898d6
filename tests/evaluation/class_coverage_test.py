"""class_coverage: the gap split by whether a client trained on the class, exactly."""

import numpy as np
import pytest

from tff_personal.evaluation import class_coverage


def predictions(client_id, train_classes, labels, global_correct, personal_correct):
  return class_coverage.ClientPredictions(
      client_id, frozenset(train_classes), np.array(labels),
      np.array(global_correct, bool), np.array(personal_correct, bool),
  )


CLIENTS = [
    # Trained on 0 and 1; tested on 0, 1 (seen) and 2, 2 (unseen).
    predictions('a', {0, 1}, [0, 1, 2, 2], [1, 1, 1, 0], [1, 1, 0, 0]),
    # Trained on 3; tested on 3 (seen) and 4 (unseen).
    predictions('b', {3}, [3, 4], [0, 1], [1, 0]),
    predictions('no test examples', {5}, [], [], []),
]


def test_the_gap_splits_exactly_into_seen_and_unseen_shares():
  result = class_coverage.coverage(CLIENTS)
  assert result.clients == 2
  assert result.global_accuracy_mean == pytest.approx((0.75 + 0.5) / 2)
  assert result.personal_accuracy_mean == pytest.approx((0.5 + 0.5) / 2)
  assert result.seen == class_coverage.Part(
      examples=3, global_accuracy=pytest.approx(2 / 3), personal_accuracy=1.0,
      per_client_gap=pytest.approx((0 / 4 + 1 / 2) / 2),
  )
  assert result.unseen == class_coverage.Part(
      examples=3, global_accuracy=pytest.approx(2 / 3), personal_accuracy=0.0,
      per_client_gap=pytest.approx((-1 / 4 - 1 / 2) / 2),
  )
  assert result.gap == pytest.approx(result.seen.per_client_gap + result.unseen.per_client_gap)
  assert result.gap == pytest.approx(-0.125)


def test_markdown_rows():
  table = class_coverage.markdown(class_coverage.coverage(CLIENTS))
  assert table.splitlines()[2:] == [
      "| class in the client's training split | 3 | 0.6667 | 1.0000 | +25.00 |",
      '| class not in it | 3 | 0.6667 | 0.0000 | -37.50 |',
      '| all (2 clients, mean per-client accuracy) | 6 | 0.6250 | 0.5000 | -12.50 |',
      '',
      'Over all 6 test examples pooled: global 0.6667, personal 0.5000.',
  ]


def test_shares_of_dropout_masks_split_as_counts_do():
  # Per example, the share of 4 masks under which each model is right.
  clients = [
      class_coverage.ClientPredictions(
          'a', frozenset({0}), np.array([0, 0, 1]),
          np.array([1.0, 0.75, 0.5]), np.array([1.0, 1.0, 0.25]),
      ),
      class_coverage.ClientPredictions(
          'b', frozenset({2}), np.array([3]), np.array([0.25]), np.array([0.0]),
      ),
  ]
  result = class_coverage.coverage(clients)
  assert result.global_accuracy_mean == pytest.approx((2.25 / 3 + 0.25) / 2)
  assert result.personal_accuracy_mean == pytest.approx((2.25 / 3 + 0.0) / 2)
  assert result.seen == class_coverage.Part(
      examples=2, global_accuracy=pytest.approx(0.875), personal_accuracy=1.0,
      per_client_gap=pytest.approx((0.25 / 3 + 0) / 2),
  )
  assert result.unseen == class_coverage.Part(
      examples=2, global_accuracy=pytest.approx(0.375), personal_accuracy=pytest.approx(0.125),
      per_client_gap=pytest.approx((-0.25 / 3 - 0.25) / 2),
  )
  assert result.gap == pytest.approx(result.seen.per_client_gap + result.unseen.per_client_gap)
  assert result.pooled_accuracies() == (pytest.approx(2.5 / 4), pytest.approx(2.25 / 4))


def test_bad_input():
  with pytest.raises(ValueError, match='client x: 2 labels but 1 global and 2 personal'):
    predictions('x', {0}, [0, 1], [1], [1, 0])
  with pytest.raises(ValueError, match='No client has a test example'):
    class_coverage.coverage(CLIENTS[2:])
