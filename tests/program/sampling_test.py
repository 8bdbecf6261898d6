"""Seeded sampling: fixed size, without replacement, reproducible."""

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


def test_data_seeds_differ_by_round_and_client():
  seeds = {sampling.data_seed(0, r, c) for r in range(10) for c in range(10)}
  assert len(seeds) == 100
  assert sampling.data_seed(1, 2, 3) == sampling.data_seed(1, 2, 3)


def test_fixed_subset():
  assert sampling.fixed_subset(POPULATION, 0, seed=1) == POPULATION
  subset = sampling.fixed_subset(POPULATION, 4, seed=1)
  assert len(subset) == 4 and subset == sampling.fixed_subset(POPULATION, 4, seed=1)
