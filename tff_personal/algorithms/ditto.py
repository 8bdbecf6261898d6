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

Per-client lambda (the paper's Section 3.3 heuristic, `lambda_grid`): a
client picks its lambda once, at its first participation, from a candidate
grid. For each candidate it trains a copy of v (= w^t) with step 1 on 4/5
of the round's batches and measures the mean loss on the other fifth (every
fifth batch); the candidate with the lowest validation loss (the first on
ties, e.g. a client with fewer than 5 batches) is kept in its personal state
and used from then on. P is then <model=v, ditto_lambda=float32>, -1 until
chosen; without a grid, P = v.
"""

import collections
from typing import Optional, Sequence

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_personal.algorithms import shared_model
from tff_personal.models import model_spec
from tff_personal.personal import process as process_lib
from tff_personal.training import client_training

ModelWeights = tff.learning.models.ModelWeights
UNSELECTED_LAMBDA = -1.0  # A new client's lambda before it chose from the grid.


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

  return client_training.reduce_batches(dataset, tf.constant(0, tf.int64), step)


VALIDATION_EVERY = 5  # Every fifth batch validates a lambda candidate.


def mean_loss(model, dataset):
  """The example-weighted mean loss of `model` over `dataset` (0 if empty)."""

  def accumulate(totals, batch):
    output = model.forward_pass(batch, training=False)
    n = tf.cast(output.num_examples, tf.float32)
    return totals[0] + output.loss * n, totals[1] + n

  zero = tf.constant(0.0)
  total, count = client_training.reduce_batches(dataset, (zero, zero), accumulate)
  return tf.math.divide_no_nan(total, count)


def build_client_update(
    model_fn, *, ditto_lambda, learning_rate, personal_learning_rate,
    personal_steps, personal_passes, lambda_grid=(),
):
  """The client's steps 1-2 (module docstring) as a `tf.function`."""
  model = model_fn()
  variables = ModelWeights.from_model(model)

  def assign(weights):
    tf.nest.map_structure(lambda v, w: v.assign(w), variables, weights)

  def personal_update(personal_weights, global_weights, dataset, lambda_value):
    assign(personal_weights)
    if personal_steps > 0:
      personal_data = [dataset.repeat().take(personal_steps)]
    else:
      personal_data = [dataset] * personal_passes
    for data in personal_data:
      proximal_sgd(
          model, data, variables.trainable, global_weights.trainable,
          personal_learning_rate, lambda_value,
      )

  def select_lambda(personal_weights, global_weights, dataset):
    """The grid's candidate with the lowest validation loss (module docstring)."""
    # tf.equal, not ==: TFF traces in graph mode, where == compares identity.
    is_validation = lambda i, _: tf.equal(i % VALIDATION_EVERY, VALIDATION_EVERY - 1)
    indexed = dataset.enumerate()
    train = indexed.filter(lambda i, batch: tf.logical_not(is_validation(i, batch)))
    validation = indexed.filter(is_validation)
    train, validation = (d.map(lambda _, batch: batch) for d in (train, validation))
    losses = []
    for candidate in lambda_grid:
      personal_update(personal_weights, global_weights, train, tf.constant(candidate))
      losses.append(mean_loss(model, validation))
    return tf.gather(tf.constant(lambda_grid, tf.float32), tf.argmin(tf.stack(losses)))

  @tf.function
  def client_update(global_weights, personal_state, dataset):
    if lambda_grid:
      personal_weights = personal_state['model']
      lambda_value = personal_state['ditto_lambda']
      if lambda_value < 0:  # First participation: choose from the grid.
        lambda_value = select_lambda(personal_weights, global_weights, dataset)
    else:
      personal_weights, lambda_value = personal_state, tf.constant(ditto_lambda)
    personal_update(personal_weights, global_weights, dataset, lambda_value)
    new_personal = tf.nest.map_structure(tf.identity, variables)
    if lambda_grid:
      new_personal = collections.OrderedDict(model=new_personal, ditto_lambda=lambda_value)
    model.reset_metrics()  # Training metrics are the global model's, as FedAvg's.

    assign(global_weights)
    num_examples = client_training.sgd_pass(
        model, dataset, variables.trainable, learning_rate
    )
    update = tf.nest.map_structure(
        tf.subtract, global_weights.trainable, variables.trainable
    )
    return shared_model.client_result(
        update, num_examples, new_personal, personal_state, model
    )

  return client_update


def build_ditto(
    model: model_spec.ModelSpec,
    *,
    ditto_lambda: float,
    client_learning_rate: float,
    personal_learning_rate: Optional[float] = None,
    personal_steps: int = 0,
    personal_passes: int = 1,
    server: shared_model.ServerOptions = shared_model.ServerOptions(),
    lambda_grid: Sequence[float] = (),
) -> process_lib.PersonalizedProcess:
  """Builds Ditto; see the module docstring.

  Args:
    model: the task's model.
    ditto_lambda: lambda >= 0, the pull of the personal model to the global.
    client_learning_rate: learning rate of the global model's client SGD.
    personal_learning_rate: eta_p; default: `client_learning_rate`.
    personal_steps: personal SGD steps per round (0: use `personal_passes`).
    personal_passes: passes over the round data when `personal_steps` is 0.
    server: the server side (`shared_model.ServerOptions`).
    lambda_grid: candidates of the per-client lambda (empty: `ditto_lambda`
      for every client).
  """
  if ditto_lambda < 0:
    raise ValueError(f'ditto_lambda must be >= 0, got {ditto_lambda}.')
  lambda_grid = tuple(float(c) for c in lambda_grid)
  if any(c < 0 for c in lambda_grid):
    raise ValueError(f'The lambda grid must hold values >= 0, got {list(lambda_grid)}.')
  if personal_steps < 0 or (personal_steps == 0 and personal_passes < 1):
    raise ValueError('Ditto needs personal_steps > 0 or personal_passes >= 1.')
  initial_weights = model.initial_weights(server.seed)
  if lambda_grid:
    new_client_state = lambda client_id, global_weights: collections.OrderedDict(
        model=global_weights, ditto_lambda=np.float32(UNSELECTED_LAMBDA)
    )
    personal_model = lambda personal_state: personal_state['model']
  else:
    new_client_state = lambda client_id, global_weights: global_weights
    personal_model = lambda personal_state: personal_state
  return shared_model.build_process(
      model,
      initial_shared_weights=initial_weights,
      personal_type=shared_model.weights_type(new_client_state('', initial_weights)),
      client_update_fn=lambda: build_client_update(
          model.tff_model_fn,
          ditto_lambda=ditto_lambda,
          learning_rate=client_learning_rate,
          personal_learning_rate=(
              client_learning_rate if personal_learning_rate is None else personal_learning_rate
          ),
          personal_steps=personal_steps,
          personal_passes=personal_passes,
          lambda_grid=lambda_grid,
      ),
      assemble_fn=lambda global_weights, personal_state: personal_model(personal_state),
      # A new client's personal model starts from the current global model.
      initial_personal_state_fn=new_client_state,
      server=server,
  )
