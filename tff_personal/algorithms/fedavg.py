"""Federated Averaging (McMahan et al., AISTATS 2017), TFF's own implementation.

The process is `tff.learning.algorithms.build_weighted_fed_avg` (clients run
SGD for the local epochs of their dataset, the server averages the model
deltas weighted by the clients' example counts n_j / sum n and applies them
with its optimizer), seen as a `PersonalizedProcess` with no personal state:

  initialize: ( -> S@SERVER)
  next: (<S@SERVER, {D*}@CLIENTS, {<>}@CLIENTS> -> <S@SERVER, {<>}@CLIENTS, M@SERVER>)
  evaluate: (<W@SERVER, {D*}@CLIENTS, {<>}@CLIENTS> -> {E}@CLIENTS)
    every client evaluates the global model W on its own data.

Non-finite updates: TFF gives a client whose update is not finite a zero
weight, and its finalizer rejects a non-finite aggregate
(`finalizer/update_non_finite`); the training program stops with an error in
that case, before writing anything of the round.
"""

from typing import Optional

import tensorflow_federated as tff

from tff_personal.evaluation import per_client
from tff_personal.personal import process as process_lib
from tff_personal.tasks import base


def build_fedavg(
    model: base.ModelSpec,
    *,
    client_learning_rate: float,
    server_learning_rate: float = 1.0,
    seed: int = 0,
    model_aggregator: Optional[tff.aggregators.WeightedAggregationFactory] = None,
) -> process_lib.PersonalizedProcess:
  """Builds FedAvg with client and server SGD; see the module docstring.

  Args:
    model: the task's model.
    client_learning_rate: learning rate of the clients' SGD.
    server_learning_rate: learning rate of the server's SGD on the averaged
      delta (1.0 is plain averaging).
    seed: seeds the initial model weights.
    model_aggregator: aggregation of the model deltas (default: weighted mean).
  """
  learning_process = tff.learning.algorithms.build_weighted_fed_avg(
      model.tff_model_fn,
      client_optimizer_fn=tff.learning.optimizers.build_sgdm(client_learning_rate),
      server_optimizer_fn=tff.learning.optimizers.build_sgdm(server_learning_rate),
      model_aggregator=model_aggregator,
  )
  return process_lib.from_learning_process(
      learning_process,
      model.initial_weights(seed),
      per_client.build_global_model_evaluation(model.tff_model_fn),
  )
