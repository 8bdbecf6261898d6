"""Algorithm names and the options their builders take."""

import dataclasses
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # The registry itself imports no TensorFlow (fast flag checks).
  from tff_personal.personal import process as process_lib
  from tff_personal.tasks import base

ALGORITHM_NAMES = ('fedavg', 'local')


@dataclasses.dataclass(frozen=True)
class AlgorithmOptions:
  """Hyperparameters shared by the algorithms.

  Attributes:
    client_learning_rate: learning rate of the clients' SGD.
    server_learning_rate: learning rate of the server's SGD on the averaged
      update (algorithms with a global model).
    seed: seeds the initial model weights.
  """

  client_learning_rate: float = 0.02
  server_learning_rate: float = 1.0
  seed: int = 0


def build_algorithm(
    name: str, model: 'base.ModelSpec', options: AlgorithmOptions
) -> 'process_lib.PersonalizedProcess':
  """Builds the algorithm `name` for `model`."""
  from tff_personal.algorithms import fedavg  # pylint: disable=g-import-not-at-top
  from tff_personal.algorithms import local  # pylint: disable=g-import-not-at-top

  if name == 'fedavg':
    return fedavg.build_fedavg(
        model,
        client_learning_rate=options.client_learning_rate,
        server_learning_rate=options.server_learning_rate,
        seed=options.seed,
    )
  if name == 'local':
    return local.build_local(
        model, client_learning_rate=options.client_learning_rate, seed=options.seed
    )
  raise ValueError(
      f'Unknown algorithm {name!r}; allowed: {", ".join(ALGORITHM_NAMES)}.'
  )
