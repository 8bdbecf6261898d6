"""FedProx (Li, Sahu, Zaheer, Sanjabi, Talwalkar, Smith, MLSys 2020), TFF's own.

Clients minimize F_k(w) + (mu / 2) ||w - w^t||^2 by SGD from the received
w^t; the server averages the deltas as FedAvg does
(`tff.learning.algorithms.build_weighted_fed_prox`). One of Ditto's
baselines. No personal state:

  next: (<S@SERVER, {D*}@CLIENTS, {<>}@CLIENTS> -> <S@SERVER, {<>}@CLIENTS, M@SERVER>)
  evaluate: every client evaluates the global model on its own data.
"""

import functools
from typing import Optional

import tensorflow_federated as tff

from tff_personal.evaluation import per_client
from tff_personal.models import model_spec
from tff_personal.personal import process as process_lib


def build_fedprox(
    model: model_spec.ModelSpec,
    *,
    mu: float,
    client_learning_rate: float,
    server_learning_rate: float = 1.0,
    seed: int = 0,
    model_aggregator: Optional[tff.aggregators.WeightedAggregationFactory] = None,
) -> process_lib.PersonalizedProcess:
  """Builds FedProx with proximal strength `mu` (>= 0; 0 is FedAvg)."""
  learning_process = tff.learning.algorithms.build_weighted_fed_prox(
      model.tff_model_fn,
      proximal_strength=mu,
      client_optimizer_fn=tff.learning.optimizers.build_sgdm(client_learning_rate),
      server_optimizer_fn=tff.learning.optimizers.build_sgdm(server_learning_rate),
      model_aggregator=model_aggregator,
      # A loop over the batches, not `dataset.reduce`, as in our client work
      # (`client_training.reduce_batches` says why).
      loop_implementation=tff.learning.LoopImplementation.DATASET_ITERATOR,
  )
  return process_lib.from_learning_process(
      learning_process,
      model.initial_weights(seed),
      per_client.build_global_model_evaluation(model.tff_model_fn),
      functools.partial(per_client.build_global_model_finetuned_evaluation, model.tff_model_fn),
  )
