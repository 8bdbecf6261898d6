"""Ditto: a global model and a proximal personal model (Li, Hu, Beirami, Smith, ICML 2021).

"Ditto: Fair and Robust Federated Learning Through Personalization". The
global model w is trained as in FedAvg (or with a robust aggregator); each
selected client k also updates its personal model v_k on

  h_k(v; w^t) = F_k(v) + (lambda / 2) ||v - w^t||^2,

where w^t is the global model it received this round, with SGD steps

  v <- v - eta_p * (grad F_k(v) + lambda * (v - w^t)).

Only the global update w^t - w_k leaves the client; v_k stays. lambda = 0 is
Local training of v; as lambda grows, v is held at w^t. A client seen for the
first time starts from v = the current global model.

Client k, each round (both updates start from the received w^t):
  1. personal: `personal_steps` SGD steps on h_k over its round data
     (repeated as needed), or, with personal_steps = 0, `personal_passes`
     passes over the round data (`client_epochs` epochs each);
  2. global: SGD on F_k from w^t over its round data, as FedAvg's client.

  next: (<S@SERVER, {D*}@CLIENTS, {v}@CLIENTS> -> <S@SERVER, {v}@CLIENTS, M@SERVER>)
  evaluate: (<w@SERVER, {D*}@CLIENTS, {v}@CLIENTS> -> {E}@CLIENTS)
    each client's personal model v on its own data.
The server part is `shared_model.build_process` (weighted mean of the global
updates with weights n_k, or any robust aggregator, then the server's SGD).
"""

from typing import Optional

import tensorflow as tf
import tensorflow_federated as tff

from tff_personal.algorithms import client_training
from tff_personal.algorithms import shared_model
from tff_personal.personal import process as process_lib
from tff_personal.tasks import base

ModelWeights = tff.learning.models.ModelWeights


def proximal_sgd(model, dataset, variables, anchor, learning_rate, ditto_lambda):
  """SGD on F(v) + lambda/2 ||v - anchor||^2 over `dataset` (inside a tf.function)."""
  variables = list(variables)

  def step(num_examples, batch):
    with tf.GradientTape() as tape:
      output = model.forward_pass(batch, training=True)
    gradients = client_training.dense_gradients(tape.gradient(output.loss, variables))
    for variable, gradient, center in zip(variables, gradients, anchor):
      variable.assign(
          variable - learning_rate * (gradient + ditto_lambda * (variable - center))
      )
    return num_examples + tf.cast(output.num_examples, tf.int64)

  return dataset.reduce(tf.constant(0, tf.int64), step)


def build_client_update(
    model_fn, *, ditto_lambda, learning_rate, personal_learning_rate,
    personal_steps, personal_passes,
):
  """The client's steps 1-2 (module docstring) as a `tf.function`."""
  model = model_fn()
  variables = ModelWeights.from_model(model)

  def assign(weights):
    tf.nest.map_structure(lambda v, w: v.assign(w), variables, weights)

  @tf.function
  def client_update(global_weights, personal_weights, dataset):
    assign(personal_weights)
    if personal_steps > 0:
      personal_data = [dataset.repeat().take(personal_steps)]
    else:
      personal_data = [dataset] * personal_passes
    for data in personal_data:
      proximal_sgd(
          model, data, variables.trainable, global_weights.trainable,
          personal_learning_rate, ditto_lambda,
      )
    new_personal = tf.nest.map_structure(tf.identity, variables)
    model.reset_metrics()  # Training metrics are the global model's, as FedAvg's.

    assign(global_weights)
    num_examples = client_training.sgd_pass(
        model, dataset, variables.trainable, learning_rate
    )
    update = tf.nest.map_structure(
        tf.subtract, global_weights.trainable, variables.trainable
    )
    return shared_model.client_result(
        update, num_examples, new_personal, personal_weights, model
    )

  return client_update


def build_ditto(
    model: base.ModelSpec,
    *,
    ditto_lambda: float,
    client_learning_rate: float,
    personal_learning_rate: Optional[float] = None,
    personal_steps: int = 0,
    personal_passes: int = 1,
    server_learning_rate: float = 1.0,
    seed: int = 0,
    model_aggregator: Optional[tff.aggregators.WeightedAggregationFactory] = None,
    attack_boost: float = 1.0,
) -> process_lib.PersonalizedProcess:
  """Builds Ditto; see the module docstring.

  Args:
    model: the task's model.
    ditto_lambda: lambda >= 0, the pull of the personal model to the global.
    client_learning_rate: learning rate of the global model's client SGD.
    personal_learning_rate: eta_p; default: `client_learning_rate`.
    personal_steps: personal SGD steps per round (0: use `personal_passes`).
    personal_passes: passes over the round data when `personal_steps` is 0.
    server_learning_rate: the server SGD's learning rate (1.0: averaging).
    seed: seeds the initial global model.
    model_aggregator: weighted aggregation of the global updates (default:
      mean; pass a robust factory for "Ditto + robust aggregation").
    attack_boost: the model-replacement attackers' factor.
  """
  if ditto_lambda < 0:
    raise ValueError(f'ditto_lambda must be >= 0, got {ditto_lambda}.')
  if personal_steps < 0 or (personal_steps == 0 and personal_passes < 1):
    raise ValueError('Ditto needs personal_steps > 0 or personal_passes >= 1.')
  initial_weights = model.initial_weights(seed)
  return shared_model.build_process(
      model,
      initial_shared_weights=initial_weights,
      personal_type=shared_model.weights_type(initial_weights),
      client_update_fn=lambda: build_client_update(
          model.tff_model_fn,
          ditto_lambda=ditto_lambda,
          learning_rate=client_learning_rate,
          personal_learning_rate=(
              client_learning_rate if personal_learning_rate is None else personal_learning_rate
          ),
          personal_steps=personal_steps,
          personal_passes=personal_passes,
      ),
      assemble_fn=lambda global_weights, personal_weights: personal_weights,
      # A new client's personal model starts from the current global model.
      initial_personal_state_fn=lambda client_id, global_weights: global_weights,
      server_learning_rate=server_learning_rate,
      model_aggregator=model_aggregator,
      attack_boost=attack_boost,
  )
