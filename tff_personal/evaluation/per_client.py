"""Each client's metrics of its own model on its own data, as a TFF computation.

  evaluate: (<model_weights=W@SERVER, client_data={D*}@CLIENTS,
              personal_states={P}@CLIENTS> -> {E}@CLIENTS)

The server broadcasts the shared weights W; each client assembles its model
from W and its personal state P (`assemble_fn`: FedAvg takes W, Local takes
P, FedPer merges them), runs one pass over its data and returns its finalized
metrics E (the task's Keras metrics, `loss`, `num_examples`, `num_batches`).
The results stay at CLIENTS: per-client numbers are the point (mean, spread
and worst clients), so they are not aggregated here.
"""

import collections
from typing import Any, Callable, Optional

import tensorflow as tf
import tensorflow_federated as tff

ModelWeights = tff.learning.models.ModelWeights
AssembleFn = Callable[[ModelWeights, Any], ModelWeights]


def evaluate_model_on_dataset(
    model: tff.learning.models.VariableModel, dataset: tf.data.Dataset
) -> collections.OrderedDict:
  """One pass of `model` over `dataset`; returns its finalized metrics."""

  def accumulate(num_batches, batch):
    model.forward_pass(batch, training=False)
    return num_batches + 1

  dataset.reduce(tf.constant(0, tf.int64), accumulate)
  unfinalized = model.report_local_unfinalized_metrics()
  return collections.OrderedDict(
      (name, finalizer(unfinalized[name]))
      for name, finalizer in model.metric_finalizers().items()
  )


def build_per_client_evaluation(
    model_fn: Callable[[], tff.learning.models.VariableModel],
    personal_state_type: tff.Type,
    assemble_fn: AssembleFn,
    shared_weights_type: Optional[tff.Type] = None,
) -> tff.Computation:
  """Builds `evaluate` (see the module docstring).

  Args:
    model_fn: returns a new `tff.learning.models.VariableModel`.
    personal_state_type: the type P of one client's personal state.
    assemble_fn: `(W, P) -> ModelWeights` of the client's model, in TF.
    shared_weights_type: the type of W; default: the whole model's weights.
  """
  with tf.Graph().as_default():
    model = model_fn()
    weights_type = shared_weights_type or tff.learning.models.weights_type_from_model(model)
    data_type = tff.SequenceType(tff.types.tensorflow_to_type(model.input_spec))

  @tff.tensorflow.computation(weights_type, personal_state_type, data_type)
  def client_evaluate(shared_weights, personal_state, dataset):
    model = model_fn()

    @tf.function  # Orders the assignments, the pass and the metric reads.
    def assign_and_evaluate():
      client_weights = assemble_fn(shared_weights, personal_state)
      tf.nest.map_structure(
          lambda variable, value: variable.assign(value),
          ModelWeights.from_model(model),
          client_weights,
      )
      return evaluate_model_on_dataset(model, dataset)

    return assign_and_evaluate()

  @tff.federated_computation(
      tff.FederatedType(weights_type, tff.SERVER),
      tff.FederatedType(data_type, tff.CLIENTS),
      tff.FederatedType(personal_state_type, tff.CLIENTS),
  )
  def evaluate(model_weights, client_data, personal_states):
    return tff.federated_map(
        client_evaluate,
        (tff.federated_broadcast(model_weights), personal_states, client_data),
    )

  return evaluate


def build_global_model_evaluation(
    model_fn: Callable[[], tff.learning.models.VariableModel],
) -> tff.Computation:
  """`evaluate` of algorithms without personal state (P = `<>`).

  Every client evaluates the broadcast global model on its own data.
  """
  return build_per_client_evaluation(
      model_fn,
      personal_state_type=tff.StructType([]),
      assemble_fn=lambda global_weights, personal_state: global_weights,
  )
