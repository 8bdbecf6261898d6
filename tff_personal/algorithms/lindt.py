"""LINDT's dual model: a global and a local model intertwined layer by layer.

"LINDT: Tackling Negative Federated Learning with Local Adaptation" (Lin,
Shou, Chen, Chen, Wu, arXiv 2011.11160). Our copy of the paper lacks its
equations; these are the ones implemented.

Each client holds a local model L (personal, parameters v) of the global
model G's architecture (shared, parameters w). The models' blocks
(`ModelSpec.blocks`) are applied one after the other; after every block m
but the classifier, an attaching module feeds local block m+1 with

  h^m = L^m + sigmoid(score) * G^m,   score = <G^m, L^m> / (||L^m|| sqrt(d_m)),

computed per example over the flattened activations of size d_m (||L^m||
floored at 1e-6): the scaled
scalar projection of the global representation on the local one (a large
angle gives a small score and a loose intertwinement). G's own forward pass
does not see L. Client loss: CE(G's logits) + CE(L's logits); one SGD step
per batch updates w and v on it (L's loss reaches w through the attaching
modules); only w's update leaves the client, as in FedAvg. The client
predicts with L's logits.

A new client's L starts from the current global model. This module
implements `--lindt_mode=always` (dual training every round); the mode that
switches on at NFL detection is not implemented yet.

  next: (<S@SERVER, {<data=D*,role,seed>}@CLIENTS, {v}@CLIENTS>
         -> <S@SERVER, {v}@CLIENTS, M@SERVER>)
  evaluate: each client's L logits with G = the current global model.
"""

from typing import Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_personal.aggregators import dp
from tff_personal.algorithms import shared_model
from tff_personal.nfl import detector as detector_lib
from tff_personal.personal import process as process_lib
from tff_personal.tasks import base

ModelWeights = tff.learning.models.ModelWeights


class AttachingModule(tf.keras.layers.Layer):
  """h = L + sigmoid(<G, L> / (||L|| sqrt(d))) * G, per example (no weights)."""

  def call(self, inputs):
    global_activation, local_activation = inputs
    flat_global = tf.reshape(global_activation, [tf.shape(global_activation)[0], -1])
    flat_local = tf.reshape(local_activation, [tf.shape(local_activation)[0], -1])
    size = tf.cast(tf.shape(flat_local)[1], flat_local.dtype)
    # ||L|| floored at 1e-6 keeps the score (and its gradient) finite when
    # a ReLU zeroes L; the numerator is then 0 too.
    local_norm = tf.sqrt(tf.maximum(tf.reduce_sum(tf.square(flat_local), axis=1), 1e-12))
    score = tf.reduce_sum(flat_global * flat_local, axis=1) / (local_norm * tf.sqrt(size))
    gate = tf.sigmoid(score)
    gate = tf.reshape(gate, [-1] + [1] * (len(local_activation.shape) - 1))
    return local_activation + gate * global_activation


def _apply_blocks(model: tf.keras.Model, blocks, inputs):
  outputs = []
  h = inputs
  for block in blocks:
    for name in block:
      h = model.get_layer(name)(h)
    outputs.append(h)
  return outputs


def check_chain(model_spec: base.ModelSpec) -> None:
  """Raises ValueError unless the blocks, applied in order, are the model.

  The attaching modules sit between blocks, so every block must take the
  previous block's output alone (no skip connection across blocks), and
  there must be at least two blocks.
  """
  if len(model_spec.blocks) < 2:
    raise ValueError('LINDT needs a model with at least two blocks to attach.')
  model = model_spec.build()
  names = [layer.name for layer in model.layers if not isinstance(layer, tf.keras.layers.InputLayer)]
  if names != [name for block in model_spec.blocks for name in block]:
    raise ValueError(
        'LINDT needs a model whose layers are its blocks in order, with no'
        ' other layer; this model has no place for attaching modules.'
    )
  x = tf.random.stateless_uniform(
      [2] + list(model.input_shape[1:]), seed=[1, 2], maxval=3,
      dtype=tf.float32 if model.input.dtype.is_floating else tf.int32,
  )
  chained = _apply_blocks(model, model_spec.blocks, x)[-1]
  if not np.allclose(chained.numpy(), model(x).numpy(), atol=1e-5):
    raise ValueError(
        'LINDT needs a model whose blocks apply one after the other; this one'
        ' has connections across blocks, with no place for attaching modules.'
    )


class DualModel:
  """G, L and the Keras dual model over their layers."""

  def __init__(self, model_spec: base.ModelSpec):
    self.global_model = model_spec.build()
    self.local_model = model_spec.build()
    local_layers = {layer.name: layer for layer in self.local_model.layers}
    for name, layer in local_layers.items():
      layer._name = f'local_{name}'  # pylint: disable=protected-access  # Unique in the dual model.
    inputs = tf.keras.Input(
        shape=self.global_model.input_shape[1:], dtype=self.global_model.input.dtype
    )
    global_h, local_h = inputs, inputs
    last = len(model_spec.blocks) - 1
    for index, block in enumerate(model_spec.blocks):
      for name in block:
        global_h = self.global_model.get_layer(name)(global_h)
        local_h = local_layers[name](local_h)
      if index < last:
        local_h = AttachingModule(name=f'attach_{index + 1}')([global_h, local_h])
    self.dual = tf.keras.Model(inputs, [global_h, local_h])
    self.predictor = tf.keras.Model(inputs, local_h)

  def predictor_arrangement(self) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """Where each predictor weight comes from: (0: G, 1: L, index), trainable and not."""

    def arrange(predictor_vars, global_vars, local_vars):
      position = {v.ref(): (0, i) for i, v in enumerate(global_vars)}
      position.update({v.ref(): (1, i) for i, v in enumerate(local_vars)})
      return [position[v.ref()] for v in predictor_vars]

    return (
        arrange(self.predictor.trainable_weights, self.global_model.trainable_weights,
                self.local_model.trainable_weights),
        arrange(self.predictor.non_trainable_weights, self.global_model.non_trainable_weights,
                self.local_model.non_trainable_weights),
    )


def build_client_update(model_spec: base.ModelSpec, learning_rate: float):
  """Dual training (module docstring) as a `tf.function`."""
  models = DualModel(model_spec)
  loss_fn = model_spec.loss()
  # G's training metrics, as FedAvg reports them, over G's own layers.
  metrics_model = tff.learning.models.from_keras_model(
      models.global_model, loss=model_spec.loss(), input_spec=model_spec.input_spec,
      metrics=model_spec.metrics(),
  )
  global_vars = ModelWeights.from_model(metrics_model)
  local_vars = ModelWeights(
      trainable=models.local_model.trainable_weights,
      non_trainable=models.local_model.non_trainable_weights,
  )
  trainable = list(global_vars.trainable) + list(local_vars.trainable)

  def assign(variables, values):
    tf.nest.map_structure(lambda v, w: v.assign(w), variables, values)

  @tf.function
  def client_update(global_weights, personal_weights, dataset):
    assign(global_vars, global_weights)
    assign(local_vars, personal_weights)

    def step(num_examples, batch):
      x, y = batch
      with tf.GradientTape() as tape:
        global_logits, local_logits = models.dual(x, training=True)
        loss = loss_fn(y, global_logits) + loss_fn(y, local_logits)
      gradients = tape.gradient(loss, trainable)
      gradients = [tf.convert_to_tensor(g) if isinstance(g, tf.IndexedSlices) else g
                   for g in gradients]
      metrics_model.forward_pass(batch, training=False)  # Metrics of G, before the step.
      for variable, gradient in zip(trainable, gradients):
        variable.assign(variable - learning_rate * gradient)
      return num_examples + tf.cast(tf.shape(y)[0], tf.int64)

    num_examples = dataset.reduce(tf.constant(0, tf.int64), step)
    update = tf.nest.map_structure(
        tf.subtract, list(global_weights.trainable), list(global_vars.trainable)
    )
    new_personal = tf.nest.map_structure(tf.identity, local_vars)
    return shared_model.client_result(
        update, num_examples, new_personal, personal_weights, metrics_model
    )

  return client_update


def predictor_spec(model_spec: base.ModelSpec) -> base.ModelSpec:
  """A ModelSpec whose model is the dual model's L output (for evaluation)."""
  return base.ModelSpec(
      build=lambda: DualModel(model_spec).predictor,
      blocks=model_spec.blocks,
      loss=model_spec.loss,
      metrics=model_spec.metrics,
      input_spec=model_spec.input_spec,
  )


def build_lindt(
    model: base.ModelSpec,
    *,
    client_learning_rate: float,
    server_learning_rate: float = 1.0,
    seed: int = 0,
    model_aggregator: Optional[tff.aggregators.WeightedAggregationFactory] = None,
    attack_boost: float = 1.0,
    nfl_detector: Optional[detector_lib.DetectorConfig] = None,
    dp_setting: Optional[dp.DpSetting] = None,
) -> process_lib.PersonalizedProcess:
  """Builds LINDT's dual model, always on; see the module docstring.

  Args:
    model: the task's model (its blocks must apply one after the other).
    client_learning_rate: the SGD rate of w and v.
    server_learning_rate: the server SGD's learning rate (1.0: averaging).
    seed: seeds the initial global model.
    model_aggregator: weighted aggregation of the global updates.
    attack_boost: the model-replacement attackers' factor.
    nfl_detector: adds the NFL detector (`nfl.detector`) to the server.
    dp_setting: the fixed-clipping DP of `model_aggregator`.

  Raises:
    ValueError: if the model has no place for attaching modules.
  """
  check_chain(model)
  initial_weights = model.initial_weights(seed)
  with tf.Graph().as_default():
    trainable_order, non_trainable_order = DualModel(model).predictor_arrangement()

  def assemble(global_weights, local_weights):
    """(W, v) in the predictor's weight order."""
    sources = (global_weights, local_weights)
    return ModelWeights(
        trainable=[list(sources[s].trainable)[i] for s, i in trainable_order],
        non_trainable=[list(sources[s].non_trainable)[i] for s, i in non_trainable_order],
    )

  return shared_model.build_process(
      model,
      initial_shared_weights=initial_weights,
      personal_type=shared_model.weights_type(initial_weights),
      client_update_fn=lambda: build_client_update(model, client_learning_rate),
      assemble_fn=assemble,
      initial_personal_state_fn=lambda client_id, global_weights: global_weights,
      server_learning_rate=server_learning_rate,
      model_aggregator=model_aggregator,
      attack_boost=attack_boost,
      nfl_detector=nfl_detector,
      dp_setting=dp_setting,
      evaluation_model=predictor_spec(model),
  )
