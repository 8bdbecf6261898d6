"""Federated Averaging (McMahan et al., AISTATS 2017).

Clients run SGD from the broadcast model w over their round data (the task's
`client_epochs` epochs); the server averages the deltas w - w_k with weights
n_k / sum n (or a robust aggregator) and applies them with its SGD. No
personal state:

  initialize: ( -> <global_model_weights=W, aggregator, finalizer>@SERVER)
  next: (<S@SERVER, {<data=D*,role,seed>}@CLIENTS, {<>}@CLIENTS>
         -> <S@SERVER, {<>}@CLIENTS, M@SERVER>)
  evaluate: (<W@SERVER, {D*}@CLIENTS, {<>}@CLIENTS> -> {E}@CLIENTS)
    every client evaluates the global model W on its own data.

Numerically it is TFF's `tff.learning.algorithms.build_weighted_fed_avg`
with SGD: a test checks the two bit for bit over three rounds.
"""

import collections
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
  """FedAvg has no hyperparameters of its own (`common.Common` has the rest)."""


CAPABILITIES = common.Capabilities(personal_state=False)


def build_client_update(model_fn, learning_rate):
  """SGD from the broadcast model over the round data, as a `tf.function`."""
  model = model_fn()
  variables = ModelWeights.from_model(model)

  @tf.function
  def client_update(global_weights, personal_state, dataset):
    del personal_state  # Empty: FedAvg keeps nothing on clients.
    tf.nest.map_structure(lambda v, w: v.assign(w), variables, global_weights)
    num_examples = client_training.sgd_pass(
        model, dataset, variables.trainable, learning_rate
    )
    update = tf.nest.map_structure(
        tf.subtract, global_weights.trainable, variables.trainable
    )
    nothing = collections.OrderedDict()
    return compose.client_result(update, num_examples, nothing, nothing, model)

  return client_update


def build(
    model: model_spec.ModelSpec, hparams: Hparams = Hparams(),
    options: common.Common = common.Common(),
) -> process_lib.PersonalizedProcess:
  """Builds FedAvg; see the module docstring."""
  del hparams  # None of its own.
  work = common.global_model_work(
      lambda: build_client_update(model.tff_model_fn, options.client_learning_rate)
  )
  return common.build_process(model, model.initial_weights(options.seed), work, options)
