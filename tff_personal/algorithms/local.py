"""Local training: every client trains only its own model; nothing is shared.

The reference every personalized method is judged against (the "Local"
baseline of Ditto, Li et al. 2021, and the private model V_i^P of LINDT).
A client's model is its personal state; each time it is selected it runs
the same client SGD as FedAvg (TFF's model-delta client work) on it. The
server only holds the initial model W0, which a client starts from the first
time it is seen, and aggregates training metrics. A client whose update is
not finite keeps its model (TFF zeroes such updates) and is counted in the
`non_finite_clients` metric.

The client step is the function TFF's model-delta client work maps over
the clients (`model_delta_client_work.build_model_delta_update_with_tff_optimizer`,
TFF 0.87), composed here with the metrics' aggregation rather than called
through `client_work.next`, so that the round also splits into the clients'
work and the server's (`process.SplitRound`; on several workers TFF's
mergeable form would otherwise train every client twice).

  initialize: ( -> <model_weights=W0, client_work=C>@SERVER)
  next: (<S@SERVER, {D*}@CLIENTS, {W}@CLIENTS> -> <S@SERVER, {W}@CLIENTS, M@SERVER>)
  evaluate: (<W0@SERVER, {D*}@CLIENTS, {W}@CLIENTS> -> {E}@CLIENTS)
    every client evaluates its own model.
"""

import collections
import functools

import tensorflow as tf
import tensorflow_federated as tff
from tensorflow_federated.python.learning.templates import model_delta_client_work

from tff_personal.evaluation import per_client
from tff_personal.models import model_spec
from tff_personal.personal import process as process_lib

ModelWeights = tff.learning.models.ModelWeights


def build_local(
    model: model_spec.ModelSpec, *, client_learning_rate: float, seed: int = 0
) -> process_lib.PersonalizedProcess:
  """Builds Local training; see the module docstring.

  Args:
    model: the task's model.
    client_learning_rate: learning rate of the clients' SGD.
    seed: seeds the initial model weights W0 every client starts from.
  """
  # Nothing is averaged, so the update weight only flags non-finite updates:
  # with UNIFORM weighting TFF sets it to 0 exactly for those.
  weighting = tff.learning.ClientWeighting.UNIFORM
  # A loop over the batches, not `dataset.reduce` (`client_training.reduce_batches`).
  loop = tff.learning.LoopImplementation.DATASET_ITERATOR
  optimizer = tff.learning.optimizers.build_sgdm(client_learning_rate)
  client_work = tff.learning.templates.build_model_delta_client_work(
      model.tff_model_fn, optimizer, client_weighting=weighting, loop_implementation=loop
  )
  initial_weights_fn = process_lib.constant_computation(model.initial_weights(seed))
  weights_type = initial_weights_fn.type_signature.result
  data_type = client_work.next.type_signature.parameter[2]
  hparams_type = client_work.initialize.type_signature.result.member
  with tf.Graph().as_default():
    metrics_aggregation = tff.learning.metrics.sum_then_finalize(
        model.tff_model_fn().metric_finalizers()
    )

  @tff.federated_computation
  def initialize_fn():
    return tff.federated_zip(
        collections.OrderedDict(
            model_weights=tff.federated_eval(initial_weights_fn, tff.SERVER),
            client_work=client_work.initialize(),
        )
    )

  state_type = initialize_fn.type_signature.result

  @tff.tensorflow.computation(hparams_type, weights_type, data_type.member)
  def client_update(hparams, weights, dataset):
    """The client step of `client_work` (TFF's model-delta client update)."""
    train = model_delta_client_work.build_model_delta_update_with_tff_optimizer(
        model_fn=model.tff_model_fn, weighting=weighting, loop_implementation=loop
    )
    result, model_output = train(optimizer, weights, dataset, hparams)
    # TFF's update is initial - trained weights, zeroed when non-finite,
    # which leaves the personal model unchanged.
    trained = ModelWeights(
        trainable=tf.nest.map_structure(tf.subtract, weights.trainable, result.update),
        non_trainable=weights.non_trainable,
    )
    return collections.OrderedDict(
        personal_state=trained,
        model_output=model_output,
        non_finite=tf.cast(tf.equal(result.update_weight, 0.0), tf.int32),
    )

  def client_part(state, client_data, personal_states):
    return tff.federated_map(
        client_update,
        (tff.federated_broadcast(state.client_work), personal_states, client_data),
    )

  def server_part(state, client_outputs):
    metrics = collections.OrderedDict(
        client_work=tff.federated_zip(
            collections.OrderedDict(train=metrics_aggregation(client_outputs.model_output))
        ),
        non_finite_clients=tff.federated_sum(client_outputs.non_finite),
    )
    return state, tff.federated_zip(metrics)

  personal_states_type = tff.FederatedType(weights_type, tff.CLIENTS)

  next_fn, split_round = process_lib.build_round(
      state_type, data_type, personal_states_type, client_update.type_signature.result,
      client_part, server_part,
  )

  @tff.tensorflow.computation(state_type.member)
  def get_model_weights(state):
    return state['model_weights']

  evaluation_args = (
      model.tff_model_fn,
      weights_type,
      lambda initial_weights, personal_state: personal_state,
  )
  return process_lib.PersonalizedProcess(
      initialize_fn,
      next_fn,
      get_model_weights,
      per_client.build_per_client_evaluation(*evaluation_args),
      # A new client starts from the initial model W0 the server holds.
      initial_personal_state_fn=lambda client_id, initial_weights: initial_weights,
      finetuned_evaluation_fn=functools.partial(
          per_client.build_finetuned_evaluation, *evaluation_args
      ),
      sends_updates=False,
      split_round=split_round,
  )
