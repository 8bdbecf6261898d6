"""FedPer: federated base layers, personal top layers (Arivazhagan et al. 2019).

"Federated Learning with Personalization Layers" (arXiv 1912.00818). The
model is split (`tff_personal.models.split.PersonalSplit`) into base blocks,
trained by federated averaging, and the top K_P blocks (the classifier is
block 1), which never leave the client. Each round, every selected client

  1. assembles its model from the broadcast base B and its personal layers P;
  2. optionally fine-tunes P alone, B frozen, for `finetune_passes` passes
     over its round data (the paper's appendix);
  3. runs SGD on B and P together over its round data (`client_epochs`
     epochs, batched by the task);
  4. keeps the new P and sends only the base delta B - B' with weight n_j.

The server averages the base deltas with weights n_j / sum n (any weighted
`tff.aggregators` factory) and applies them with its SGD (TFF's
apply-optimizer finalizer). With K_P = 0 this is exactly FedAvg.

  initialize: ( -> <global_model_weights=B, aggregator, finalizer>@SERVER)
  next: (<S@SERVER, {D*}@CLIENTS, {P}@CLIENTS> -> <S@SERVER, {P}@CLIENTS, M@SERVER>)
    P = <trainable=<personal layers' weights>, non_trainable=<...>>
  evaluate: (<B@SERVER, {D*}@CLIENTS, {P}@CLIENTS> -> {E}@CLIENTS)
    each client's personalized model (B and its own P) on its own data.

A client seen for the first time gets personal layers freshly initialized
with a seed derived from (seed, client id). A client whose base delta or
personal layers are not finite keeps its old P, sends a zero-weight update,
and is counted in the `non_finite_clients` metric.
"""

import hashlib

import tensorflow as tf
import tensorflow_federated as tff

from tff_personal.algorithms import shared_model
from tff_personal.models import model_spec
from tff_personal.models import split as split_lib
from tff_personal.personal import process as process_lib
from tff_personal.training import client_training

ModelWeights = tff.learning.models.ModelWeights


def client_seed(seed: int, client_id: str) -> int:
  """A stable seed for one client's personal initialization."""
  digest = hashlib.sha256(f'{seed}/{client_id}'.encode()).digest()
  return int.from_bytes(digest[:4], 'little')


def build_client_update(model_fn, split: split_lib.PersonalSplit, learning_rate, finetune_passes):
  """The client's steps 1-4 (module docstring) as a `tf.function`."""
  model = model_fn()
  variables = ModelWeights.from_model(model)
  personal_variables = split.personal(variables).trainable

  @tf.function
  def client_update(base_weights, personal_weights, dataset):
    tf.nest.map_structure(
        lambda v, w: v.assign(w), variables, split.merge(base_weights, personal_weights)
    )
    if personal_variables:
      for _ in range(finetune_passes):
        client_training.sgd_pass(model, dataset, personal_variables, learning_rate)
      model.reset_metrics()  # Training metrics cover step 3 only.
    num_examples = client_training.sgd_pass(
        model, dataset, variables.trainable, learning_rate
    )
    new_personal = tf.nest.map_structure(tf.identity, split.personal(variables))
    update = tf.nest.map_structure(
        tf.subtract, base_weights.trainable, split.base(variables).trainable
    )
    return shared_model.client_result(
        update, num_examples, new_personal, personal_weights, model
    )

  return client_update


def build_fedper(
    model: model_spec.ModelSpec,
    *,
    personal_blocks: int,
    client_learning_rate: float,
    finetune_passes: int = 0,
    server: shared_model.ServerOptions = shared_model.ServerOptions(),
) -> process_lib.PersonalizedProcess:
  """Builds FedPer; see the module docstring.

  Args:
    model: the task's model (use `split.with_linear_base` for the ablation).
    personal_blocks: K_P, the number of top blocks kept by the clients.
    client_learning_rate: learning rate of the clients' SGD.
    finetune_passes: personal-only passes over the round data before training.
    server: the server side (`shared_model.ServerOptions`).
  """
  split = split_lib.PersonalSplit.of(model, personal_blocks)
  initial_weights = model.initial_weights(server.seed)

  def initial_personal_state(client_id, base_weights):
    del base_weights  # Personal layers start fresh, not from the shared model.
    return split.personal(model.initial_weights(client_seed(server.seed, client_id)))

  return shared_model.build_process(
      model,
      initial_shared_weights=split.base(initial_weights),
      personal_type=shared_model.weights_type(split.personal(initial_weights)),
      client_update_fn=lambda: build_client_update(
          model.tff_model_fn, split, client_learning_rate, finetune_passes
      ),
      assemble_fn=split.merge,
      initial_personal_state_fn=initial_personal_state,
      server=server,
  )
