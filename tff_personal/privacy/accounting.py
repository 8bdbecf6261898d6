"""Privacy accounting of DP-FedAvg rounds with `dp_accounting` (RDP).

What one round does (`aggregators/dp.py`, `program/sampling.py`): the program
samples K of the N clients uniformly without replacement, and the Gaussian
mechanism adds N(0, (z C)^2) noise to the sum of the K clipped updates.

User-level neighbouring populations here differ in one client's data
replaced (N is public), the relation under which sampling without
replacement is analysed (Wang, Balle, Kasiviswanathan, "Subsampled Renyi
Differential Privacy and Analytical Moments Accountant", AISTATS 2019,
Theorem 27). Replacing one client moves the clipped sum by up to 2C, so the
Gaussian mechanism's noise multiplier relative to that sensitivity is z / 2:

  round event = SampledWithoutReplacement(N, K, Gaussian(z / 2))
  run event   = SelfComposed(round event, rounds)

and epsilon at delta comes from an RDP accountant (`REPLACE_ONE`).

With the NFL detector, a DP round releases a second Gaussian mechanism: the
sum of the clients' squared update norms, each clipped to C^2, with noise
N(0, (k z C^2)^2), k = DETECTOR_NOISE_FACTOR (`aggregators/dp.py`). It is
accounted in the same round, on the same sampled clients:

  round event = SampledWithoutReplacement(N, K, Composed[Gaussian(z / 2),
                                                         Gaussian(k z / 2)])

(the same as one Gaussian of multiplier z / 2 / sqrt(1 + 1 / k^2): with
k = 10, epsilon is that of a 0.5% smaller z). Every
quantity is a deterministic function of (z, N, K, rounds, delta), so a
resumed run reports exactly the epsilon of an uninterrupted one.
"""

import math

import dp_accounting

# Noise multipliers above this drown any update: a target epsilon that needs
# more is called unreachable.
MAX_NOISE_MULTIPLIER = 100.0
# The NFL detector's squared-norm sum takes k times the update's noise
# multiplier: little privacy spent on one scalar (module docstring).
DETECTOR_NOISE_FACTOR = 10.0


class UnreachableEpsilonError(ValueError):
  """No noise multiplier up to MAX_NOISE_MULTIPLIER meets the target epsilon."""


def default_delta(population: int) -> float:
  """delta = 1 / N^1.1, below 1/N as user-level DP requires."""
  if population < 1:
    raise ValueError(f'population must be >= 1, got {population}.')
  return 1.0 / population**1.1


def run_event(
    noise_multiplier: float, population: int, clients_per_round: int, rounds: int,
    with_detector: bool = False,
) -> dp_accounting.DpEvent:
  """The `dp_accounting` event of `rounds` rounds (module docstring).

  `with_detector`: each round also releases the NFL detector's noised sum.
  """
  if not 1 <= clients_per_round <= population:
    raise ValueError(
        f'Need 1 <= clients_per_round <= population, got {clients_per_round}'
        f' and {population}.'
    )
  mechanism = dp_accounting.GaussianDpEvent(noise_multiplier / 2)
  if with_detector:
    mechanism = dp_accounting.ComposedDpEvent([
        mechanism, dp_accounting.GaussianDpEvent(DETECTOR_NOISE_FACTOR * noise_multiplier / 2)
    ])
  round_event = dp_accounting.SampledWithoutReplacementDpEvent(
      population, clients_per_round, mechanism
  )
  return dp_accounting.SelfComposedDpEvent(round_event, rounds)


def epsilon(
    noise_multiplier: float, population: int, clients_per_round: int, rounds: int, delta: float,
    with_detector: bool = False,
) -> float:
  """Epsilon at `delta` after `rounds` rounds; inf without noise, 0 before any round."""
  if not 0 < delta < 1:
    raise ValueError(f'delta must be in (0, 1), got {delta}.')
  if rounds == 0:
    return 0.0
  if noise_multiplier == 0:
    return math.inf
  accountant = dp_accounting.rdp.RdpAccountant(
      neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE
  )
  accountant.compose(
      run_event(noise_multiplier, population, clients_per_round, rounds, with_detector)
  )
  return float(accountant.get_epsilon(delta))


def calibrate_noise_multiplier(
    target_epsilon: float,
    population: int,
    clients_per_round: int,
    rounds: int,
    delta: float,
    tolerance: float = 1e-3,
    with_detector: bool = False,
) -> float:
  """The smallest noise multiplier (to `tolerance`) with epsilon <= target.

  Raises:
    UnreachableEpsilonError: if even MAX_NOISE_MULTIPLIER exceeds the target.
  """
  if not target_epsilon > 0:
    raise ValueError(f'The target epsilon must be > 0, got {target_epsilon}.')
  spent = lambda z: epsilon(z, population, clients_per_round, rounds, delta, with_detector)
  if spent(MAX_NOISE_MULTIPLIER) > target_epsilon:
    raise UnreachableEpsilonError(
        f'epsilon={target_epsilon} is unreachable in {rounds} rounds of'
        f' {clients_per_round} of {population} clients at delta={delta:.3g}: even'
        f' noise multiplier {MAX_NOISE_MULTIPLIER:g} gives'
        f' {spent(MAX_NOISE_MULTIPLIER):.3g}.'
    )
  low, high = 0.0, MAX_NOISE_MULTIPLIER
  while high - low > tolerance:
    middle = (low + high) / 2
    if middle > 0 and spent(middle) <= target_epsilon:
      high = middle
    else:
      low = middle
  return high
