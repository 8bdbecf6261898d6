"""Seeded client sampling and per-client data seeds.

Sampling is fixed-size sampling without replacement, drawn independently
each round from the whole population: uniform, or with each draw's
probability proportional to a client's weight (its training examples, as
Ditto's and FedProx's code sample devices). The functions are pure
functions of (seed, round, ...), so a resumed run draws exactly what an
uninterrupted one does, with no sampler state to checkpoint.
"""

from typing import Optional, Sequence

import numpy as np

# How a run draws its clients (`TrainingConfig.client_sampling`): uniformly, or
# with `sample_clients`' weights set to the clients' training examples.
CLIENT_SAMPLINGS = ('uniform', 'examples')


def sample_clients(
    population: Sequence[str],
    clients_per_round: int,
    *,
    seed: int,
    round_num: int,
    weights: Optional[Sequence[float]] = None,
) -> list[str]:
  """`clients_per_round` distinct clients, in population order.

  Uniformly at random; with `weights` (one per client, >= 0), each draw picks
  a client not yet drawn with probability proportional to its weight
  (`numpy.random.Generator.choice` with `p`, as Ditto's code draws devices).
  """
  if not 0 < clients_per_round <= len(population):
    raise ValueError(
        f'clients_per_round must be in [1, {len(population)}], got'
        f' {clients_per_round}.'
    )
  probabilities = None
  if weights is not None:
    weights = np.asarray(weights, np.float64)
    if weights.shape != (len(population),) or not np.all(weights >= 0):
      raise ValueError(f'weights must be {len(population)} values >= 0, got {weights}.')
    if np.count_nonzero(weights) < clients_per_round:
      raise ValueError(
          f'{np.count_nonzero(weights)} clients have a weight above 0, fewer than the'
          f' clients_per_round={clients_per_round} to draw.'
      )
    probabilities = weights / weights.sum()
  rng = np.random.default_rng([seed, round_num])
  chosen = rng.choice(len(population), size=clients_per_round, replace=False, p=probabilities)
  return [population[i] for i in sorted(chosen)]


def data_seed(seed: int, round_num: int, client_index: int, stream: int = 0) -> int:
  """The shuffle seed of one client's data in one round.

  `stream` separates independent uses (0: training, 1: fine-tuning).
  """
  entropy = [seed, round_num, client_index] + ([stream] if stream else [])
  sequence = np.random.SeedSequence(entropy)
  return int(sequence.generate_state(1)[0])


def fixed_subset(
    population: Sequence[str], size: int, *, seed: int
) -> list[str]:
  """A seeded subset of `size` clients (all of them when size is 0 or more)."""
  if size <= 0 or size >= len(population):
    return list(population)
  rng = np.random.default_rng([seed, 0x5EED])
  return [population[i] for i in sorted(rng.choice(len(population), size, replace=False))]
