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

It is built on `shared_model.build_process` (the orchestration FedPer and
Ditto share), whose client computation takes an attack role and reports
non-finite clients; numerically it is TFF's
`tff.learning.algorithms.build_weighted_fed_avg` with SGD: a test checks the
two bit for bit over three rounds.
"""

import collections

import tensorflow as tf
import tensorflow_federated as tff

from tff_personal.algorithms import shared_model
from tff_personal.models import model_spec
from tff_personal.personal import process as process_lib
from tff_personal.training import client_training

ModelWeights = tff.learning.models.ModelWeights


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
    return shared_model.client_result(update, num_examples, nothing, nothing, model)

  return client_update


def build_fedavg(
    model: model_spec.ModelSpec,
    *,
    client_learning_rate: float,
    server: shared_model.ServerOptions = shared_model.ServerOptions(),
) -> process_lib.PersonalizedProcess:
  """Builds FedAvg with client and server SGD; see the module docstring.

  Args:
    model: the task's model.
    client_learning_rate: learning rate of the clients' SGD.
    server: the server side (`shared_model.ServerOptions`).
  """
  return shared_model.build_process(
      model,
      initial_shared_weights=model.initial_weights(server.seed),
      personal_type=tff.StructType([]),
      client_update_fn=lambda: build_client_update(model.tff_model_fn, client_learning_rate),
      assemble_fn=lambda global_weights, personal_state: global_weights,
      initial_personal_state_fn=lambda client_id, weights: collections.OrderedDict(),
      server=server,
  )
