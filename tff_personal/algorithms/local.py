"""Local training: every client trains only its own model; nothing is shared.

The reference every personalized method is judged against (the "Local"
baseline of Ditto, Li et al. 2021, and the private model V_i^P of LINDT).
A client's model is its personal state; each time it is selected it runs
FedAvg's client SGD on it. The server holds only the initial model W0, which
a client starts from the first time it is seen, and aggregates training
metrics. A client whose update is not finite keeps its model and is counted
in the `non_finite_clients` metric.

The client still reports its update (its model's change) to the composed
round, which aggregates nothing with it; the NFL detector, when added,
measures the clients' divergence from it (`nfl.detection`).

  initialize: ( -> <global_model_weights=W0>@SERVER)
  next: (<S@SERVER, {<data=D*,role,seed>}@CLIENTS, {W}@CLIENTS>
         -> <S@SERVER, {W}@CLIENTS, M@SERVER>)
  evaluate: (<W0@SERVER, {D*}@CLIENTS, {W}@CLIENTS> -> {E}@CLIENTS)
    every client evaluates its own model.
"""

import dataclasses

import tensorflow as tf
import tensorflow_federated as tff

from tff_personal.algorithms import common
from tff_personal.models import model_spec
from tff_personal.personal import compose
from tff_personal.personal import process as process_lib
from tff_personal.training import client_training

ModelWeights = tff.learning.models.ModelWeights


@dataclasses.dataclass(frozen=True)
class Hparams:
  """Local has no hyperparameters of its own (`common.Common` has the rest)."""


CAPABILITIES = common.Capabilities(personal_state=True, shares_model=False)


def build_client_update(model_fn, learning_rate):
  """SGD on the client's own model over its round data, as a `tf.function`."""
  model = model_fn()
  variables = ModelWeights.from_model(model)

  @tf.function
  def client_update(initial_weights, personal_weights, dataset):
    del initial_weights  # The client's own model is all it trains.
    tf.nest.map_structure(lambda v, w: v.assign(w), variables, personal_weights)
    num_examples = client_training.sgd_pass(model, dataset, variables.trainable, learning_rate)
    trained = tf.nest.map_structure(tf.identity, variables)
    update = tf.nest.map_structure(tf.subtract, personal_weights.trainable, trained.trainable)
    return compose.client_result(update, num_examples, trained, personal_weights, model)

  return client_update


def build(
    model: model_spec.ModelSpec, hparams: Hparams = Hparams(),
    options: common.Common = common.Common(),
) -> process_lib.PersonalizedProcess:
  """Builds Local training; see the module docstring."""
  del hparams  # None of its own.
  initial_weights = model.initial_weights(options.seed)
  work = compose.ClientWork(
      build_update=lambda: build_client_update(model.tff_model_fn, options.client_learning_rate),
      personal_type=compose.weights_type(initial_weights),
      # A new client starts from the initial model W0 the server holds.
      initial_personal_state=lambda client_id, initial: initial,
      assemble=lambda initial, personal_state: personal_state,
  )
  return common.build_process(model, initial_weights, work, options, shares_model=False)
