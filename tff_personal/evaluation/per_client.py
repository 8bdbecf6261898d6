"""Each client's metrics of its own model on its own data, as a TFF computation.

  evaluate: (<model_weights=W@SERVER, client_data={D*}@CLIENTS,
              personal_states={P}@CLIENTS> -> {E}@CLIENTS)

The server broadcasts the shared weights W; each client assembles its model
from W and its personal state P (`assemble_fn`: FedAvg takes W, Local takes
P, FedPer merges them), runs one pass over its data and returns its finalized
metrics E (the task's Keras metrics, `loss`, `num_examples`, `num_batches`).
The results stay at CLIENTS: per-client numbers are the point (mean, spread
and worst clients), so they are not aggregated here.

The fine-tuning baseline (FT in Ditto, Li et al. 2021, Section 5; "FB" in
LINDT) evaluates each client's model after a few local SGD epochs on the
client's own training data:

  evaluate_finetuned: (<model_weights=W@SERVER,
                        client_data={<train=D*, test=D*>}@CLIENTS,
                        personal_states={P}@CLIENTS> -> {E'}@CLIENTS)

E' is E of the fine-tuned model plus `before_finetune=E` of the model as
assembled, so one evaluation reports an algorithm and its fine-tuned variant.
"""

import collections
from typing import Any, Callable, Optional

import tensorflow as tf
import tensorflow_federated as tff

from tff_personal.training import client_training

ModelWeights = tff.learning.models.ModelWeights
AssembleFn = Callable[[ModelWeights, Any], ModelWeights]


def evaluate_model_on_dataset(
    model: tff.learning.models.VariableModel, dataset: tf.data.Dataset
) -> collections.OrderedDict:
  """One pass of `model` over `dataset`; returns its finalized metrics.

  Call inside a `tf.function`. A loop over the batches, as the clients'
  training (`client_training.reduce_batches`): in a TFF worker that sees a
  GPU the loop's ops run there, a `dataset.reduce` function's on the CPU.
  """

  def accumulate(num_batches, batch):
    model.forward_pass(batch, training=False)
    return num_batches + 1

  client_training.reduce_batches(dataset, tf.constant(0, tf.int64), accumulate)
  unfinalized = model.report_local_unfinalized_metrics()
  return collections.OrderedDict(
      (name, finalizer(unfinalized[name]))
      for name, finalizer in model.metric_finalizers().items()
  )


def _types(model_fn, shared_weights_type: Optional[tff.Type]):
  """(W's type, D*'s type) of the model built by `model_fn`."""
  with tf.Graph().as_default():
    model = model_fn()
    weights_type = shared_weights_type or tff.learning.models.weights_type_from_model(model)
    data_type = tff.SequenceType(tff.types.tensorflow_to_type(model.input_spec))
  return weights_type, data_type


def _assign(model, weights: ModelWeights) -> None:
  tf.nest.map_structure(
      lambda variable, value: variable.assign(value), ModelWeights.from_model(model), weights
  )


def _federated_evaluation(client_fn, weights_type, client_data_type, personal_state_type):
  """`client_fn` mapped over the clients with the broadcast shared weights."""

  @tff.federated_computation(
      tff.FederatedType(weights_type, tff.SERVER),
      tff.FederatedType(client_data_type, tff.CLIENTS),
      tff.FederatedType(personal_state_type, tff.CLIENTS),
  )
  def evaluate(model_weights, client_data, personal_states):
    return tff.federated_map(
        client_fn, (tff.federated_broadcast(model_weights), personal_states, client_data)
    )

  return evaluate


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
  weights_type, data_type = _types(model_fn, shared_weights_type)

  @tff.tensorflow.computation(weights_type, personal_state_type, data_type)
  def client_evaluate(shared_weights, personal_state, dataset):
    model = model_fn()

    @tf.function  # Orders the assignments, the pass and the metric reads.
    def assign_and_evaluate():
      _assign(model, assemble_fn(shared_weights, personal_state))
      return evaluate_model_on_dataset(model, dataset)

    return assign_and_evaluate()

  return _federated_evaluation(client_evaluate, weights_type, data_type, personal_state_type)


def build_finetuned_evaluation(
    model_fn: Callable[[], tff.learning.models.VariableModel],
    personal_state_type: tff.Type,
    assemble_fn: AssembleFn,
    shared_weights_type: Optional[tff.Type] = None,
    *,
    learning_rate: float,
) -> tff.Computation:
  """Builds `evaluate_finetuned` (see the module docstring).

  Each client assembles its model, evaluates it on `test`, runs SGD with
  `learning_rate` on all its trainable variables over `train` (the program
  repeats `train` for the fine-tuning epochs), and evaluates it again. The
  fine-tuned weights are discarded: fine-tuning changes no state.

  Args: as `build_per_client_evaluation`, plus the fine-tuning SGD's rate.
  """
  if not learning_rate > 0:
    raise ValueError(f'The fine-tuning learning rate must be > 0, got {learning_rate}.')
  weights_type, data_type = _types(model_fn, shared_weights_type)
  client_data_type = tff.StructWithPythonType(
      [('train', data_type), ('test', data_type)], collections.OrderedDict
  )

  @tff.tensorflow.computation(weights_type, personal_state_type, client_data_type)
  def client_finetune_and_evaluate(shared_weights, personal_state, client_data):
    model = model_fn()

    @tf.function
    def finetune_and_evaluate():
      _assign(model, assemble_fn(shared_weights, personal_state))
      before = evaluate_model_on_dataset(model, client_data['test'])
      model.reset_metrics()
      client_training.sgd_pass(
          model, client_data['train'], model.trainable_variables, learning_rate
      )
      model.reset_metrics()
      after = evaluate_model_on_dataset(model, client_data['test'])
      after['before_finetune'] = before
      return after

    return finetune_and_evaluate()

  return _federated_evaluation(
      client_finetune_and_evaluate, weights_type, client_data_type, personal_state_type
  )


def _global_model(global_weights, personal_state):
  del personal_state  # P = <>.
  return global_weights


def build_global_model_evaluation(
    model_fn: Callable[[], tff.learning.models.VariableModel],
) -> tff.Computation:
  """`evaluate` of algorithms without personal state (P = `<>`).

  Every client evaluates the broadcast global model on its own data.
  """
  return build_per_client_evaluation(model_fn, tff.StructType([]), _global_model)


def build_global_model_finetuned_evaluation(
    model_fn: Callable[[], tff.learning.models.VariableModel], learning_rate: float
) -> tff.Computation:
  """`evaluate_finetuned` of algorithms without personal state (P = `<>`)."""
  return build_finetuned_evaluation(
      model_fn, tff.StructType([]), _global_model, learning_rate=learning_rate
  )
