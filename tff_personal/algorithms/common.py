"""What every algorithm module shares: its common options, capabilities, and
the one path from a client work to a `PersonalizedProcess`.

An algorithm module (fedavg.py, ditto.py, ...) exports
  * `Hparams`: a frozen dataclass of its own hyperparameters (the binaries
    make a flag `--<algorithm>_<field>` of each field, help from its
    `Attributes:` docstring);
  * `CAPABILITIES`: a `Capabilities`;
  * `build(model, hparams, common) -> PersonalizedProcess`, which builds its
    `compose.ClientWork` and calls `build_process`;
  * optionally `for_task(hparams, task) -> Hparams`, the task's defaults.
`algorithms.registry` maps names to modules and checks what combines.
"""

import collections
import dataclasses
from typing import Any, Optional, Sequence

import tensorflow_federated as tff

from tff_personal.aggregators import dp
from tff_personal.models import model_spec
from tff_personal.nfl import detection
from tff_personal.nfl import detector as detector_lib
from tff_personal.personal import compose
from tff_personal.personal import process as process_lib

ModelWeights = tff.learning.models.ModelWeights


def hparam(default: Any, *, lower: Optional[float] = None, upper: Optional[float] = None,
           choices: Optional[Sequence[str]] = None):
  """A field of an `Hparams` with the bounds its flag checks at parsing.

  `lower`/`upper` bound a number (every element of a tuple); `choices` lists
  the values of a string.
  """
  metadata = {'lower': lower, 'upper': upper, 'choices': tuple(choices) if choices else None}
  return dataclasses.field(default=default, metadata=metadata)


@dataclasses.dataclass(frozen=True)
class Capabilities:
  """What an algorithm can be combined with.

  Attributes:
    personal_state: its clients keep state between rounds.
    shares_model: its clients' updates move a shared model: robust
      aggregation, DP and update attacks act on them (not so for Local).
    nfl_detection: it can run the NFL detector.
    sets_update_weights: its aggregation weights are part of its update rule
      (q-FFL's h_k, TERM's tilt), so it aggregates with the weighted mean
      only: robust and DP aggregators ignore or replace the weights.
  """

  personal_state: bool
  shares_model: bool = True
  nfl_detection: bool = True
  sets_update_weights: bool = False


@dataclasses.dataclass(frozen=True)
class Common:
  """The options every algorithm takes besides its own hyperparameters.

  Attributes:
    client_learning_rate: the clients' SGD learning rate.
    server_learning_rate: the server SGD's learning rate on the aggregated
      update (1.0: plain averaging).
    seed: seeds the initial shared weights (and, with a client's id, any
      personal weights a client starts from).
    model_aggregator: weighted aggregation of the updates (None: the mean;
      a robust or DP factory from `aggregators`).
    attack_boost: the model-replacement attackers' factor (`attacks`).
    nfl_detector: adds the NFL detector (`nfl.detection`) to the process.
    dp_setting: the fixed-clipping DP of `model_aggregator`, which the NFL
      detector (and LINDT's `detach_when_blind`) must know.
    client_steps: the clients' local steps a round (0: all their round data);
      the program truncates their data, except for a process that
      `takes_whole_client_data`, which takes this many steps itself.
  """

  client_learning_rate: float = 0.02
  server_learning_rate: float = 1.0
  seed: int = 0
  model_aggregator: Optional[tff.aggregators.WeightedAggregationFactory] = None
  attack_boost: float = 1.0
  nfl_detector: Optional[detector_lib.DetectorConfig] = None
  dp_setting: Optional[dp.DpSetting] = None
  client_steps: int = 0

  def noise_to_signal(self, num_parameters: int) -> float:
    """How far the DP noise hides the detector's statistic (`nfl.detection`)."""
    return detection.noise_to_signal(self.dp_setting, self.nfl_detector, num_parameters)


def global_model_work(build_update) -> compose.ClientWork:
  """The client work of an algorithm without personal state (P = <>), whose
  clients are evaluated with the global model (FedAvg, FedProx, q-FFL)."""
  return compose.ClientWork(
      build_update=build_update,
      personal_type=tff.StructType([]),
      initial_personal_state=lambda client_id, weights: collections.OrderedDict(),
      assemble=lambda global_weights, personal_state: global_weights,
  )


def build_process(
    model: model_spec.ModelSpec,
    initial_shared_weights: ModelWeights,
    client_work: compose.ClientWork,
    common: Common,
    *,
    shares_model: bool = True,
) -> process_lib.PersonalizedProcess:
  """The composed process of a client work under `common`.

  `shares_model=False` (Local): no aggregation and no server update.
  """
  aggregator = None
  if shares_model:
    aggregator = common.model_aggregator or tff.aggregators.MeanFactory()
  composition = compose.Composition(
      model=model,
      initial_shared_weights=initial_shared_weights,
      client_work=client_work,
      aggregator=aggregator,
      server_learning_rate=common.server_learning_rate,
      attack_boost=common.attack_boost,
      sends_updates=shares_model,
  )
  if common.nfl_detector is not None:
    composition = detection.with_detector(composition, common.nfl_detector, common.dp_setting)
  return compose.compose_personalized_process(composition)
