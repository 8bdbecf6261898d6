"""Seeded sampling: fixed size, without replacement, reproducible."""

import numpy as np
import pytest

from tff_personal.program import sampling

POPULATION = [f'c{i:02d}' for i in range(20)]


def test_sample_is_distinct_sorted_and_reproducible():
  first = sampling.sample_clients(POPULATION, 5, seed=3, round_num=7)
  assert len(set(first)) == 5 and first == sorted(first)
  assert first == sampling.sample_clients(POPULATION, 5, seed=3, round_num=7)
  assert first != sampling.sample_clients(POPULATION, 5, seed=3, round_num=8)
  assert first != sampling.sample_clients(POPULATION, 5, seed=4, round_num=7)


def test_sampling_is_uniform():
  counts = dict.fromkeys(POPULATION, 0)
  for round_num in range(2000):
    for client in sampling.sample_clients(POPULATION, 5, seed=0, round_num=round_num):
      counts[client] += 1
  # Each client is expected 500 times (binomial std ~ 19.4); 6 std bounds.
  assert all(383 < c < 617 for c in counts.values()), counts


@pytest.mark.parametrize('k', [0, 21])
def test_sample_size_out_of_range(k):
  with pytest.raises(ValueError, match='clients_per_round'):
    sampling.sample_clients(POPULATION, k, seed=0, round_num=1)


def test_weighted_sampling_never_draws_a_zero_weight_client():
  weights = [0.0] * 17 + [1.0, 2.0, 3.0]
  for round_num in range(50):
    assert sampling.sample_clients(
        POPULATION, 3, seed=0, round_num=round_num, weights=weights
    ) == ['c17', 'c18', 'c19']


def test_weighted_sampling_follows_the_weights():
  """One client a round: each is drawn in proportion to its weight."""
  weights = np.arange(1, 21, dtype=float)
  counts = dict.fromkeys(POPULATION, 0)
  for round_num in range(21000):
    (client,) = sampling.sample_clients(
        POPULATION, 1, seed=0, round_num=round_num, weights=weights
    )
    counts[client] += 1
  # Client i is expected 100 * (i + 1) times; 6 binomial std bounds.
  for i, client in enumerate(POPULATION):
    expected = 100.0 * (i + 1)
    assert abs(counts[client] - expected) < 6 * np.sqrt(expected), (client, counts[client])


def test_weighted_sampling_is_reproducible():
  weights = np.arange(1, 21, dtype=float)
  first = sampling.sample_clients(POPULATION, 5, seed=3, round_num=7, weights=weights)
  assert len(set(first)) == 5 and first == sorted(first)
  assert first == sampling.sample_clients(POPULATION, 5, seed=3, round_num=7, weights=weights)


@pytest.mark.parametrize(
    'weights, match',
    [([1.0] * 19, 'weights must be 20 values'), ([-1.0] + [1.0] * 19, 'weights must be 20'),
     ([0.0] * 18 + [1.0, 1.0], '2 clients have a weight above 0')],
)
def test_bad_weights_are_refused(weights, match):
  with pytest.raises(ValueError, match=match):
    sampling.sample_clients(POPULATION, 3, seed=0, round_num=1, weights=weights)


def test_data_seeds_differ_by_round_and_client():
  seeds = {sampling.data_seed(0, r, c) for r in range(10) for c in range(10)}
  assert len(seeds) == 100
  assert sampling.data_seed(1, 2, 3) == sampling.data_seed(1, 2, 3)


def test_fixed_subset():
  assert sampling.fixed_subset(POPULATION, 0, seed=1) == POPULATION
  subset = sampling.fixed_subset(POPULATION, 4, seed=1)
  assert len(subset) == 4 and subset == sampling.fixed_subset(POPULATION, 4, seed=1)
