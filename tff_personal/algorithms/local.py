"""Local training: every client trains only its own model; nothing is shared.

The reference every personalized method is judged against (the "Local"
baseline of Ditto, Li et al. 2021, and the private model V_i^P of LINDT).
A client's model is its personal state; each time it is selected it runs
the same client SGD as FedAvg (TFF's model-delta client work) on it. The
server only holds the initial model W0, which a client starts from the first
time it is seen, and aggregates training metrics. A client whose update is
not finite keeps its model (TFF zeroes such updates) and is counted in the
`non_finite_clients` metric.

  initialize: ( -> <model_weights=W0, client_work=C>@SERVER)
  next: (<S@SERVER, {D*}@CLIENTS, {W}@CLIENTS> -> <S@SERVER, {W}@CLIENTS, M@SERVER>)
  evaluate: (<W0@SERVER, {D*}@CLIENTS, {W}@CLIENTS> -> {E}@CLIENTS)
    every client evaluates its own model.
"""

import collections
import functools

import tensorflow as tf
import tensorflow_federated as tff

from tff_personal.evaluation import per_client
from tff_personal.personal import process as process_lib
from tff_personal.tasks import base

ModelWeights = tff.learning.models.ModelWeights


def build_local(
    model: base.ModelSpec, *, client_learning_rate: float, seed: int = 0
) -> process_lib.PersonalizedProcess:
  """Builds Local training; see the module docstring.

  Args:
    model: the task's model.
    client_learning_rate: learning rate of the clients' SGD.
    seed: seeds the initial model weights W0 every client starts from.
  """
  # Nothing is averaged, so the update weight only flags non-finite updates:
  # with UNIFORM weighting TFF sets it to 0 exactly for those.
  client_work = tff.learning.templates.build_model_delta_client_work(
      model.tff_model_fn,
      tff.learning.optimizers.build_sgdm(client_learning_rate),
      client_weighting=tff.learning.ClientWeighting.UNIFORM,
      # A loop over the batches, not `dataset.reduce` (`client_training.reduce_batches`).
      loop_implementation=tff.learning.LoopImplementation.DATASET_ITERATOR,
  )
  initial_weights_fn = process_lib.constant_computation(model.initial_weights(seed))
  weights_type = initial_weights_fn.type_signature.result
  data_type = client_work.next.type_signature.parameter[2]

  @tff.federated_computation
  def initialize_fn():
    return tff.federated_zip(
        collections.OrderedDict(
            model_weights=tff.federated_eval(initial_weights_fn, tff.SERVER),
            client_work=client_work.initialize(),
        )
    )

  state_type = initialize_fn.type_signature.result
  result_type = client_work.next.type_signature.result.result.member

  @tff.tensorflow.computation(weights_type, result_type)
  def apply_client_update(weights, client_result):
    # TFF's client work reports update = initial - trained weights (zeroed
    # when non-finite, which leaves the personal model unchanged).
    return ModelWeights(
        trainable=tf.nest.map_structure(
            tf.subtract, weights.trainable, client_result.update
        ),
        non_trainable=weights.non_trainable,
    )

  @tff.tensorflow.computation(result_type)
  def is_non_finite(client_result):
    return tf.cast(tf.equal(client_result.update_weight, 0.0), tf.int32)

  @tff.federated_computation(
      state_type,
      data_type,
      tff.FederatedType(weights_type, tff.CLIENTS),
  )
  def next_fn(state, client_data, personal_states):
    output = client_work.next(state.client_work, personal_states, client_data)
    new_personal_states = tff.federated_map(
        apply_client_update, (personal_states, output.result)
    )
    new_state = tff.federated_zip(
        collections.OrderedDict(
            model_weights=state.model_weights, client_work=output.state
        )
    )
    metrics = tff.federated_zip(
        collections.OrderedDict(
            client_work=output.measurements,
            non_finite_clients=tff.federated_sum(
                tff.federated_map(is_non_finite, output.result)
            ),
        )
    )
    return process_lib.PersonalizedProcessOutput(
        new_state, new_personal_states, metrics
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
  )
