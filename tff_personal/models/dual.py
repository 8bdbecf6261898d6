"""LINDT's dual model: a global and a local model intertwined block by block.

"LINDT: Tackling Negative Federated Learning with Local Adaptation" (Lin,
Shou, Chen, Chen, Wu, arXiv 2011.11160). Our copy of the paper lacks its
equations; these are the ones implemented.

G (the global model) and L (the local model) share one architecture, a
stack of blocks (`ModelSpec.blocks`). After every block m but the
classifier, an attaching module feeds L's block m+1 with

  h^m = L^m + sigmoid(score) * G^m,   score = <G^m, L^m> / (||L^m|| sqrt(d_m)),

computed per example over the flattened activations of size d_m (||L^m||
floored at 1e-6): the scaled scalar projection of the global representation
on the local one (a large angle gives a small score and a loose
intertwinement). G's own forward pass does not see L. `Intertwining` holds
the variants `algorithms.lindt` offers (attach the logits too, learned gate
offsets, G rescaled to L's norm, G detached from L's loss).
"""

import dataclasses

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_personal.models import model_spec
from tff_personal.training import client_training

ModelWeights = tff.learning.models.ModelWeights


@dataclasses.dataclass(frozen=True)
class Intertwining:
  """How the dual model attaches G to L (`algorithms.lindt` describes each option)."""

  attach_logits: bool = True
  learn_gates: bool = False
  match_scale: bool = False
  detach_global: bool = False


class AttachingModule(tf.keras.layers.Layer):
  """h = L + sigmoid(<G, L> / (||L|| sqrt(d)) + b) * G, per example.

  b is 0 and no weight unless `learn_offset`: then a trainable scalar
  (initialized to 0), one of the client's personal weights. With
  `match_scale` the attached G is rescaled to L's norm first:
  h = L + sigmoid(score + b) * (||L|| / ||G||) * G (the score unchanged).
  With `detach_global` G enters as a constant: no gradient reaches G's
  weights through the module.
  """

  def __init__(self, learn_offset: bool = False, match_scale: bool = False,
               detach_global: bool = False, **kwargs):
    super().__init__(**kwargs)
    self.learn_offset = learn_offset
    self.match_scale = match_scale
    self.detach_global = detach_global

  def build(self, input_shape):
    if self.learn_offset:
      self.offset = self.add_weight(name='offset', shape=[], initializer='zeros')

  def gate(self, global_activation, local_activation):
    """sigmoid(score (+ b)), one per example."""
    flat_global, flat_local = _flat(global_activation), _flat(local_activation)
    size = tf.cast(tf.shape(flat_local)[1], flat_local.dtype)
    score = tf.reduce_sum(flat_global * flat_local, axis=1) / (_norm(flat_local) * tf.sqrt(size))
    if self.learn_offset:
      score += self.offset
    return tf.sigmoid(score)

  def call(self, inputs):
    global_activation, local_activation = inputs
    if self.detach_global:
      global_activation = tf.stop_gradient(global_activation)
    gate = self.gate(global_activation, local_activation)
    if self.match_scale:
      gate *= _norm(_flat(local_activation)) / _norm(_flat(global_activation))
    gate = tf.reshape(gate, [-1] + [1] * (len(local_activation.shape) - 1))
    return local_activation + gate * global_activation


def _flat(activation):
  return tf.reshape(activation, [tf.shape(activation)[0], -1])


def _norm(flat_activation):
  """Per-example norm, floored at 1e-6: it keeps the score and the scale (and
  their gradients) finite when a ReLU zeroes an activation, whose products
  are then 0 too."""
  return tf.sqrt(tf.maximum(tf.reduce_sum(tf.square(flat_activation), axis=1), 1e-12))


class LogitsSelector(tf.keras.layers.Layer):
  """use_local * L's logits + (1 - use_local) * G's; use_local is a 0/1 weight."""

  def build(self, input_shape):
    self.use_local = self.add_weight(
        name='use_local', shape=[], initializer='ones', trainable=False
    )

  def call(self, inputs):
    global_logits, local_logits = inputs
    return self.use_local * local_logits + (1.0 - self.use_local) * global_logits


def _apply_blocks(model: tf.keras.Model, blocks, inputs):
  outputs = []
  h = inputs
  for block in blocks:
    for name in block:
      h = model.get_layer(name)(h)
    outputs.append(h)
  return outputs


def check_chain(spec: model_spec.ModelSpec) -> None:
  """Raises ValueError unless the blocks, applied in order, are the model.

  The attaching modules sit between blocks, so every block must take the
  previous block's output alone (no skip connection across blocks), and
  there must be at least two blocks.
  """
  if len(spec.blocks) < 2:
    raise ValueError('LINDT needs a model with at least two blocks to attach.')
  model = spec.build()
  names = [layer.name for layer in model.layers if not isinstance(layer, tf.keras.layers.InputLayer)]
  if names != [name for block in spec.blocks for name in block]:
    raise ValueError(
        'LINDT needs a model whose layers are its blocks in order, with no'
        ' other layer; this model has no place for attaching modules.'
    )
  # Unknown dimensions (a sequence model's time) take 5 steps.
  shape = [2] + [5 if d is None else d for d in model.input_shape[1:]]
  x = tf.random.stateless_uniform(
      shape, seed=[1, 2], maxval=3,
      dtype=tf.float32 if model.input.dtype.is_floating else tf.int32,
  )
  chained = _apply_blocks(model, spec.blocks, x)[-1]
  if not np.allclose(chained.numpy(), model(x).numpy(), atol=1e-5):
    raise ValueError(
        'LINDT needs a model whose blocks apply one after the other; this one'
        ' has connections across blocks, with no place for attaching modules.'
    )


class DualModel:
  """G, L and the Keras dual model over their layers."""

  def __init__(self, spec: model_spec.ModelSpec, intertwining: Intertwining = Intertwining()):
    self.global_model = spec.build()
    self.local_model = spec.build()
    local_layers = {layer.name: layer for layer in self.local_model.layers}
    for name, layer in local_layers.items():
      layer._name = f'local_{name}'  # pylint: disable=protected-access  # Unique in the dual model.
    inputs = tf.keras.Input(
        shape=self.global_model.input_shape[1:], dtype=self.global_model.input.dtype
    )
    global_h, local_h = inputs, inputs
    last = len(spec.blocks) - 1
    self.attaching_modules, attached = [], []
    for index, block in enumerate(spec.blocks):
      for name in block:
        global_h = self.global_model.get_layer(name)(global_h)
        local_h = local_layers[name](local_h)
      if index < last or intertwining.attach_logits:
        self.attaching_modules.append(AttachingModule(
            intertwining.learn_gates, intertwining.match_scale, intertwining.detach_global,
            name=f'attach_{index + 1}',
        ))
        attached.append((global_h, local_h))
        local_h = self.attaching_modules[-1]([global_h, local_h])
    self.dual = tf.keras.Model(inputs, [global_h, local_h])
    # (G^m, L^m) at each attaching module, for `intertwinement`.
    self.attached = tf.keras.Model(inputs, attached)
    self.selector = LogitsSelector(name='select_logits')
    self.predictor = tf.keras.Model(inputs, self.selector([global_h, local_h]))
    # v: L's weights, then the learned gate offsets (if any).
    self.personal_weights = ModelWeights(
        trainable=list(self.local_model.trainable_weights)
        + [module.offset for module in self.attaching_modules if module.learn_offset],
        non_trainable=list(self.local_model.non_trainable_weights),
    )

  def intertwinement(self, x) -> list[tuple[float, float]]:
    """Per attaching module over the examples x: the mean gate, and the mean
    ||G^m|| over the mean ||L^m|| (how much of G enters L, and how large)."""
    result = []
    for module, (global_h, local_h) in zip(self.attaching_modules, self.attached(x)):
      norm = lambda h: tf.reduce_mean(tf.norm(tf.reshape(h, [tf.shape(h)[0], -1]), axis=1))
      result.append((float(tf.reduce_mean(module.gate(global_h, local_h))),
                     float(norm(global_h) / norm(local_h))))
    return result

  def predictor_arrangement(self) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """Where each predictor weight comes from, trainable and not:
    (0: G, 1: L, 2: the selector's use_local; index)."""

    def arrange(predictor_vars, global_vars, local_vars, selector_vars):
      position = {v.ref(): (0, i) for i, v in enumerate(global_vars)}
      position.update({v.ref(): (1, i) for i, v in enumerate(local_vars)})
      position.update({v.ref(): (2, i) for i, v in enumerate(selector_vars)})
      return [position[v.ref()] for v in predictor_vars]

    return (
        arrange(self.predictor.trainable_weights, self.global_model.trainable_weights,
                self.personal_weights.trainable, []),
        arrange(self.predictor.non_trainable_weights, self.global_model.non_trainable_weights,
                self.personal_weights.non_trainable, [self.selector.use_local]),
    )


def with_zero_offsets(weights: ModelWeights, num_offsets: int) -> ModelWeights:
  """v of a client whose L is `weights` and whose gate offsets are 0."""
  return ModelWeights(
      trainable=list(weights.trainable) + [np.float32(0.0)] * num_offsets,
      non_trainable=list(weights.non_trainable),
  )


def predictor_weights(global_weights, local_weights, use_local, trainable_order,
                      non_trainable_order) -> ModelWeights:
  """The predictor's weights from G's, L's (v) and the selector's `use_local`,
  in the order `DualModel.predictor_arrangement` gives."""
  sources = (
      (list(global_weights.trainable), list(local_weights.trainable), []),
      (list(global_weights.non_trainable), list(local_weights.non_trainable), [use_local]),
  )
  return ModelWeights(
      trainable=[sources[0][s][i] for s, i in trainable_order],
      non_trainable=[sources[1][s][i] for s, i in non_trainable_order],
  )


def predictor_spec(spec: model_spec.ModelSpec,
                   intertwining: Intertwining = Intertwining()) -> model_spec.ModelSpec:
  """A ModelSpec whose model is the dual model's L output (for evaluation)."""
  return model_spec.ModelSpec(
      build=lambda: DualModel(spec, intertwining).predictor,
      blocks=spec.blocks,
      loss=spec.loss,
      metrics=spec.metrics,
      input_spec=spec.input_spec,
  )


class DualTraining:
  """A client's training steps over one dual model (inside a TF computation).

  `dual_training` takes one SGD step per batch on CE(G) + CE(L) for w and v
  together (L's loss reaches w through the attaching modules);
  `global_training` is FedAvg's client step on G alone. `metrics_model`
  reports G's training metrics, as FedAvg does.
  """

  def __init__(self, spec: model_spec.ModelSpec, learning_rate: float,
               intertwining: Intertwining):
    self.models = DualModel(spec, intertwining)
    self.loss_fn = spec.loss()
    # G's training metrics, as FedAvg reports them, over G's own layers.
    self.metrics_model = tff.learning.models.from_keras_model(
        self.models.global_model, loss=spec.loss(), input_spec=spec.input_spec,
        metrics=spec.metrics(),
    )
    self.global_vars = ModelWeights.from_model(self.metrics_model)
    self.local_vars = self.models.personal_weights
    self.num_offsets = len(self.local_vars.trainable) - len(
        self.models.local_model.trainable_weights
    )
    self.trainable = list(self.global_vars.trainable) + list(self.local_vars.trainable)
    self.learning_rate = learning_rate

  @staticmethod
  def assign(variables, values):
    tf.nest.map_structure(lambda v, w: v.assign(w), variables, values)

  def _dual_step(self, num_examples, batch):
    x, y = batch
    with tf.GradientTape() as tape:
      global_logits, local_logits = self.models.dual(x, training=True)
      loss = self.loss_fn(y, global_logits) + self.loss_fn(y, local_logits)
    gradients = client_training.dense_gradients(tape.gradient(loss, self.trainable))
    self.metrics_model.forward_pass(batch, training=False)  # Metrics of G, before the step.
    for variable, gradient in zip(self.trainable, gradients):
      variable.assign(variable - self.learning_rate * gradient)
    return num_examples + tf.cast(tf.shape(y)[0], tf.int64)

  def dual_training(self, dataset):
    return client_training.reduce_batches(dataset, tf.constant(0, tf.int64), self._dual_step)

  def global_training(self, dataset):  # FedAvg's client step, G alone.
    return client_training.sgd_pass(
        self.metrics_model, dataset, self.global_vars.trainable, self.learning_rate
    )

  def trained_global(self):
    """w as this round's training left it (the G that L last trained with)."""
    return tf.nest.map_structure(tf.identity, self.global_vars)
