"""Attack names, client roles and the choice of adversaries (no TensorFlow).

The threat model of Ditto (Li et al. 2021, Section 5): a fraction of the
population is malicious, chosen once per run.

* `label_poison` (A1): adversaries train on uniformly random labels: a data
  transform, their update is computed honestly from poisoned data.
* `random_update` (A2): adversaries send Gaussian noise with the standard
  deviation of their honest update.
* `model_replacement` (A3): adversaries scale their update by a boost
  (default: the clients per round; Bagdasaryan et al. 2020).

The last two transform the update a client sends; every client runs the same
TFF computation and its *role* (a client-placed input) selects the transform.
"""

from typing import Sequence

import numpy as np

ATTACK_NAMES = ('none', 'label_poison', 'random_update', 'model_replacement')
UPDATE_ATTACKS = ('random_update', 'model_replacement')

# Roles passed to the client computation.
HONEST = 0
RANDOM_UPDATE = 1
MODEL_REPLACEMENT = 2


def update_role(attack: str) -> int:
  """The role an adversary plays in the client computation for `attack`."""
  return {'random_update': RANDOM_UPDATE, 'model_replacement': MODEL_REPLACEMENT}.get(
      attack, HONEST
  )


def choose_adversaries(
    population: Sequence[str], fraction: float, *, seed: int
) -> frozenset[str]:
  """round(fraction * N) clients of the population, chosen once with `seed`."""
  if not 0.0 <= fraction < 1.0:
    raise ValueError(f'attack fraction must be in [0, 1), got {fraction}.')
  count = int(round(fraction * len(population)))
  rng = np.random.default_rng([seed, 0xA77AC])
  chosen = rng.choice(len(population), size=count, replace=False)
  return frozenset(population[i] for i in chosen)
