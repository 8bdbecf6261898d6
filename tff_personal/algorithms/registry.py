"""Algorithm names and the options their builders take."""

import dataclasses
from typing import TYPE_CHECKING, Optional

if TYPE_CHECKING:  # The registry itself imports no TensorFlow (fast flag checks).
  from tff_personal.personal import process as process_lib
  from tff_personal.tasks import base

ALGORITHM_NAMES = ('fedavg', 'local', 'fedper')


@dataclasses.dataclass(frozen=True)
class AlgorithmOptions:
  """Hyperparameters of the algorithms.

  Attributes:
    client_learning_rate: learning rate of the clients' SGD.
    server_learning_rate: learning rate of the server's SGD on the averaged
      update (algorithms with a global model).
    seed: seeds the initial model weights (and FedPer's personal layers).
    fedper_personal_layers: FedPer's K_P, blocks kept personal counted from
      the top (the classifier is block 1); None: the task's default.
    fedper_finetune_epochs: FedPer's personal-only passes over the round data
      before each round's training.
    fedper_linear_base: FedPer's ablation, the base replaced by one linear
      layer.
  """

  client_learning_rate: float = 0.02
  server_learning_rate: float = 1.0
  seed: int = 0
  fedper_personal_layers: Optional[int] = None
  fedper_finetune_epochs: int = 0
  fedper_linear_base: bool = False


def build_algorithm(
    name: str, task: 'base.Task', options: AlgorithmOptions
) -> 'process_lib.PersonalizedProcess':
  """Builds the algorithm `name` for `task`'s model."""
  # Imported here so that importing the registry stays cheap.
  from tff_personal.algorithms import fedavg  # pylint: disable=g-import-not-at-top
  from tff_personal.algorithms import fedper  # pylint: disable=g-import-not-at-top
  from tff_personal.algorithms import local  # pylint: disable=g-import-not-at-top
  from tff_personal.models import split  # pylint: disable=g-import-not-at-top

  if name == 'fedavg':
    return fedavg.build_fedavg(
        task.model,
        client_learning_rate=options.client_learning_rate,
        server_learning_rate=options.server_learning_rate,
        seed=options.seed,
    )
  if name == 'local':
    return local.build_local(
        task.model, client_learning_rate=options.client_learning_rate, seed=options.seed
    )
  if name == 'fedper':
    personal_blocks = options.fedper_personal_layers
    if personal_blocks is None:
      personal_blocks = task.default_personal_blocks
    model = task.model
    if options.fedper_linear_base:
      model = split.with_linear_base(model, personal_blocks)
    return fedper.build_fedper(
        model,
        personal_blocks=personal_blocks,
        client_learning_rate=options.client_learning_rate,
        server_learning_rate=options.server_learning_rate,
        finetune_passes=options.fedper_finetune_epochs,
        seed=options.seed,
    )
  raise ValueError(
      f'Unknown algorithm {name!r}; allowed: {", ".join(ALGORITHM_NAMES)}.'
  )
