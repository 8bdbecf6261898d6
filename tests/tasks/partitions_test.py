"""Tests of the synthetic partitions (pure NumPy)."""

import numpy as np
import pytest

from tff_personal.tasks import partitions

# 10 classes of 700 examples each, shuffled: a small Fashion-MNIST stand-in.
LABELS = np.random.default_rng(0).permutation(np.repeat(np.arange(10), 700))


def _assert_disjoint(parts, total=None):
  flat = np.concatenate(parts)
  assert len(np.unique(flat)) == len(flat)
  if total is not None:
    assert len(flat) == total


def _classes(part):
  return set(np.unique(LABELS[part]).tolist())


@pytest.mark.parametrize('num_clients,k', [(10, 2), (7, 3), (20, 1), (100, 2)])
def test_k_classes_exact_classes_and_equal_sizes(num_clients, k):
  parts = partitions.k_classes(LABELS, num_clients, k, seed=1)
  assert len(parts) == num_clients
  assert all(len(_classes(p)) == k for p in parts)
  assert len({len(p) for p in parts}) == 1
  for p in parts:  # Equal shares of each of the client's classes.
    assert len(set(np.bincount(LABELS[p])[sorted(_classes(p))])) == 1
  _assert_disjoint(parts)


def test_k_classes_fedper_default_uses_all_data():
  parts = partitions.k_classes(LABELS, 10, 2, seed=0)
  assert [len(p) for p in parts] == [700] * 10
  _assert_disjoint(parts, total=7000)


def test_k_classes_all_classes_is_iid():
  parts = partitions.k_classes(LABELS, 10, 10, seed=0)
  for p in parts:
    np.testing.assert_array_equal(np.bincount(LABELS[p], minlength=10), [70] * 10)
  _assert_disjoint(parts, total=7000)


def test_k_classes_deterministic_and_seed_dependent():
  a = partitions.k_classes(LABELS, 10, 2, seed=4)
  b = partitions.k_classes(LABELS, 10, 2, seed=4)
  c = partitions.k_classes(LABELS, 10, 2, seed=5)
  assert all(np.array_equal(x, y) for x, y in zip(a, b))
  assert not all(np.array_equal(x, y) for x, y in zip(a, c))
  assert all(np.all(np.diff(p) > 0) for p in a)  # Sorted.


@pytest.mark.parametrize(
    'kwargs,match',
    [
        (dict(num_clients=10, classes_per_client=11), 'classes_per_client'),
        (dict(num_clients=10, classes_per_client=0), 'classes_per_client'),
        (dict(num_clients=0, classes_per_client=2), 'num_clients'),
        (dict(num_clients=8000, classes_per_client=1), 'Not enough examples'),
    ],
)
def test_k_classes_impossible(kwargs, match):
  with pytest.raises(ValueError, match=match):
    partitions.k_classes(LABELS, seed=0, **kwargs)


def test_k_classes_num_classes_counts_absent_classes():
  with pytest.raises(ValueError, match=r'\[1, 12\]'):
    partitions.k_classes(LABELS, 4, 13, seed=0, num_classes=12)


def test_ditto_classes_and_lognormal_sizes():
  parts = partitions.ditto(LABELS, 100, 2, seed=0)
  assert len(parts) == 100
  assert all(len(_classes(p)) == 2 for p in parts)
  _assert_disjoint(parts)
  sizes = np.array([len(p) for p in parts])
  assert sizes.min() >= 2 * 5
  # Heavy-tailed, not balanced; the excess over the minimum is log-normal:
  # log(excess) has sigma close to 1 (sample of 100, generous bounds).
  assert sizes.max() > 5 * np.median(sizes)
  log_excess = np.log(sizes - 10 + 1e-9)[sizes > 20]
  assert 0.7 < np.std(log_excess) < 1.3
  # The most demanded class is used up (but for rounding).
  used = np.bincount(LABELS[np.concatenate(parts)], minlength=10)
  assert 700 - 20 <= used.max() <= 700  # Up to one floor() per holder lost.


def test_ditto_class_assignment_round_robin():
  parts = partitions.ditto(LABELS, 20, 3, seed=2)
  holders = np.zeros(10, int)
  for p in parts:
    holders[sorted(_classes(p))] += 1
  assert set(holders.tolist()) == {6}  # 20 * 3 / 10.


def test_ditto_deterministic_and_minimum():
  a = partitions.ditto(LABELS, 30, 2, seed=7, min_per_class=3)
  b = partitions.ditto(LABELS, 30, 2, seed=7, min_per_class=3)
  assert all(np.array_equal(x, y) for x, y in zip(a, b))
  for p in a:
    assert np.bincount(LABELS[p])[sorted(_classes(p))].min() >= 3


def test_ditto_impossible():
  with pytest.raises(ValueError, match='min_per_class'):
    partitions.ditto(LABELS, 1000, 1, seed=0, min_per_class=10)


def test_ditto_code_builds_the_devices_of_dittos_data_script():
  train_labels, test_labels = np.repeat(np.arange(10), 50), np.repeat(np.arange(10), 10)
  train, test = partitions.ditto_code(train_labels, test_labels, num_clients=50)
  assert len(train) == len(test) == 50
  # The script's draws, restated: sizes, then each device's class shares.
  rng = np.random.RandomState(233)
  sizes = rng.lognormal(3, 1, 50) + 10
  sizes = 500 * sizes / sizes.sum()
  for device in range(50):
    shares = rng.lognormal(1, 1, 5)
    shares = shares / shares.sum()
    window = [(device + j) % 10 for j in range(5)]  # Overlapping windows of classes.
    train_counts = np.bincount(train_labels[train[device]], minlength=10)
    test_counts = np.bincount(test_labels[test[device]], minlength=10)
    assert train_counts[window].tolist() == [int(p * sizes[device]) + 1 for p in shares]
    assert test_counts[window].tolist() == [int(p * sizes[device] / 6) + 1 for p in shares]
    assert train_counts.sum() == train_counts[window].sum()
  assert [len(t) for t in train[:5]] == [14, 9, 7, 8, 8]
  # A class's examples are handed out in the dataset's order: device 0 gets
  # the first ones of class 0; class 0 (indices 0-49) runs out and starts over,
  # so some examples sit on several devices.
  first = train[0][train_labels[train[0]] == 0]
  assert first.tolist() == list(range(len(first)))
  everything = np.concatenate(train)
  assert len(np.unique(everything)) < len(everything)


def test_ditto_code_is_one_partition_and_refuses_too_small_classes():
  labels = np.repeat(np.arange(10), 50), np.repeat(np.arange(10), 10)
  a = partitions.ditto_code(*labels, num_clients=50)
  b = partitions.ditto_code(*labels, num_clients=50)
  assert all(np.array_equal(x, y) for x, y in zip(a[0] + a[1], b[0] + b[1]))
  with pytest.raises(ValueError, match='Class 4 has 50 examples; a device needs 119 of it'):
    partitions.ditto_code(*labels, num_clients=5)


def test_dirichlet_uses_everything_with_min_size():
  parts = partitions.dirichlet(LABELS, 20, 0.5, seed=0, min_size=50)
  assert min(len(p) for p in parts) >= 50
  _assert_disjoint(parts, total=7000)


def test_dirichlet_alpha_controls_skew():
  def mean_classes(alpha):
    parts = partitions.dirichlet(LABELS, 10, alpha, seed=0, min_size=1)
    return np.mean([(np.bincount(LABELS[p], minlength=10) > 0.05 * len(p)).sum() for p in parts])
  assert mean_classes(0.05) < 4 < 9 < mean_classes(100.0)


def test_dirichlet_deterministic():
  a = partitions.dirichlet(LABELS, 10, 0.3, seed=9)
  b = partitions.dirichlet(LABELS, 10, 0.3, seed=9)
  assert all(np.array_equal(x, y) for x, y in zip(a, b))


def test_dirichlet_impossible():
  with pytest.raises(ValueError, match='min_size'):
    partitions.dirichlet(LABELS, 1000, 0.5, seed=0, min_size=10)
  with pytest.raises(ValueError, match='attempts'):
    partitions.dirichlet(LABELS, 600, 0.01, seed=0, min_size=10, max_attempts=3)
  with pytest.raises(ValueError, match='alpha'):
    partitions.dirichlet(LABELS, 10, 0.0, seed=0)


def test_train_test_split_stratified():
  client = np.concatenate([np.nonzero(LABELS == 3)[0][:50], np.nonzero(LABELS == 8)[0][:30]])
  train, test = partitions.train_test_split(client, LABELS, 0.2, seed=0)
  assert len(test) == 16 and len(train) == 64
  np.testing.assert_array_equal(np.bincount(LABELS[test], minlength=10)[[3, 8]], [10, 6])
  np.testing.assert_array_equal(np.union1d(train, test), np.sort(client))
  assert not np.intersect1d(train, test).size
  again = partitions.train_test_split(client, LABELS, 0.2, seed=0)
  np.testing.assert_array_equal(again[1], test)


def test_train_test_split_small_clients():
  train, test = partitions.train_test_split(np.array([5, 9]), LABELS, 0.2, seed=0)
  assert len(train) == 1 and len(test) == 1
  train, test = partitions.train_test_split(np.array([5]), LABELS, 0.2, seed=0)
  assert len(train) == 1 and len(test) == 0
  with pytest.raises(ValueError, match='test_fraction'):
    partitions.train_test_split(np.array([5]), LABELS, 1.0, seed=0)
