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
does not see L.

Options (each measured in docs/results_nfl.md, "LINDT's options"):

  * `attach_logits` (on; our change): one more attaching module after the
    classifier block, L's logits = L^M + sigmoid(score) G^M with the same
    score. Without it L's classifier learns from the client's data alone
    and trailed FedAvg's global model on Shakespeare. `False` is the paper's
    arrangement.
  * `learn_gates` (off): gate sigmoid(score + b_m), b_m a personal scalar
    per module trained with v, so that a client can shut G out (the paper's
    gate is at least 1/2 for an orthogonal G after a ReLU). The offsets
    hardly moved at the clients' learning rate.
  * `own_global` (off): each client keeps the global model its last dual
    round left and predicts with L intertwined with that copy, the G that L
    was fitted to, instead of the current one (a second model copy in the
    personal state). It helped where G swings, cost beta where G improves.
  * `match_scale` (off): the attached G^m rescaled to L^m's norm,
    L^m + sigmoid(score) (||L^m|| / ||G^m||) G^m, so that G's features make
    at most half of L's next input. It did not stop divergence under heavy
    DP noise.
  * `detach_global` (off): G^m enters the modules as a constant, so L's loss
    no longer reaches w (w takes FedAvg's step on G's loss alone). It stops
    divergence under heavy DP noise but lowers beta elsewhere: L's loss
    makes a better G.
  * `detach_when_blind` (on): G is detached as above, whatever
    `detach_global` says, when the server's DP noise would blind the NFL
    detector (`nfl.detector.noise_to_signal` > 1 over the detector's window,
    or over one round without the detector; known from z, C, K and the
    model size before round 1). The global model is then mostly noise, and
    dual training with L's loss reaching w diverged there.

Client loss: CE(G's logits) + CE(L's logits); one SGD step
per batch updates w and v on it (L's loss reaches w through the attaching
modules); only w's update leaves the client, as in FedAvg. The client
predicts with L's logits.

Modes:
  * `always`: dual training every round; a new client's L starts from the
    current global model; P = v.
  * `on_detection`: FedAvg (G alone) until the NFL detector (`nfl.detector`,
    in the server state) has raised its flag, then dual training; the flag
    is broadcast with the weights. P = <model=v, dual_rounds>; until a
    client's first dual round its L follows the global model it receives,
    so L starts from the current G. Stopping: `persist` (dual training
    every round once activated) or `after_one_round` (each client trains
    dual once, so dual training stops once every client has had its
    round). A client that never trained dual is evaluated with G.

  next: (<S@SERVER, {<data=D*,role,seed>}@CLIENTS, {P}@CLIENTS>
         -> <S@SERVER, {P}@CLIENTS, M@SERVER>)
    (P with `own_global`: <model=v, [dual_rounds,] global_model=w_i>)
  evaluate: each client's L logits (or G's, see above) with G = the current
    global model (with `own_global`: the client's w_i once it trained dual).
"""

import collections
import dataclasses

from absl import logging
import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_personal.algorithms import shared_model
from tff_personal.models import model_spec
from tff_personal.personal import process as process_lib
from tff_personal.training import client_training

ModelWeights = tff.learning.models.ModelWeights
MODES = ('always', 'on_detection')
STOPS = ('persist', 'after_one_round')


@dataclasses.dataclass(frozen=True)
class Intertwining:
  """How the dual model attaches G to L (module docstring: our changes)."""

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


def build_client_update(spec: model_spec.ModelSpec, learning_rate: float, mode: str,
                        stop: str, intertwining: Intertwining, own_global: bool = False):
  """The client's round (module docstring) as a `tf.function`."""
  models = DualModel(spec, intertwining)
  loss_fn = spec.loss()
  # G's training metrics, as FedAvg reports them, over G's own layers.
  metrics_model = tff.learning.models.from_keras_model(
      models.global_model, loss=spec.loss(), input_spec=spec.input_spec,
      metrics=spec.metrics(),
  )
  global_vars = ModelWeights.from_model(metrics_model)
  local_vars = models.personal_weights
  num_offsets = len(local_vars.trainable) - len(models.local_model.trainable_weights)
  trainable = list(global_vars.trainable) + list(local_vars.trainable)

  def assign(variables, values):
    tf.nest.map_structure(lambda v, w: v.assign(w), variables, values)

  def dual_step(num_examples, batch):
    x, y = batch
    with tf.GradientTape() as tape:
      global_logits, local_logits = models.dual(x, training=True)
      loss = loss_fn(y, global_logits) + loss_fn(y, local_logits)
    gradients = client_training.dense_gradients(tape.gradient(loss, trainable))
    metrics_model.forward_pass(batch, training=False)  # Metrics of G, before the step.
    for variable, gradient in zip(trainable, gradients):
      variable.assign(variable - learning_rate * gradient)
    return num_examples + tf.cast(tf.shape(y)[0], tf.int64)

  def dual_training(dataset):
    return client_training.reduce_batches(dataset, tf.constant(0, tf.int64), dual_step)

  def global_training(dataset):  # FedAvg's client step, G alone.
    return client_training.sgd_pass(metrics_model, dataset, global_vars.trainable, learning_rate)

  def result(global_weights, num_examples, new_personal, personal_state):
    update = tf.nest.map_structure(
        tf.subtract, list(global_weights.trainable), list(global_vars.trainable)
    )
    return shared_model.client_result(
        update, num_examples, new_personal, personal_state, metrics_model
    )

  def trained_global():
    """w as this round's training left it (the G that L last trained with)."""
    return tf.nest.map_structure(tf.identity, global_vars)

  if mode == 'always':

    @tf.function
    def client_update(global_weights, personal_state, dataset):
      assign(global_vars, global_weights)
      assign(local_vars, personal_state['model'] if own_global else personal_state)
      num_examples = dual_training(dataset)
      new_personal = tf.nest.map_structure(tf.identity, local_vars)
      if own_global:
        new_personal = collections.OrderedDict(model=new_personal, global_model=trained_global())
      return result(global_weights, num_examples, new_personal, personal_state)

    return client_update

  @tf.function
  def client_update_on_detection(global_weights, personal_state, dataset, nfl_flag):
    assign(global_vars, global_weights)
    dual_rounds = personal_state['dual_rounds']
    before_dual = tf.equal(dual_rounds, 0)
    # Until its first dual round, a client's L follows the global model
    # (and its gate offsets stay 0).
    assign(local_vars, tf.nest.map_structure(
        lambda local, global_: tf.where(before_dual, global_, local),
        personal_state['model'], with_zero_offsets(global_weights, num_offsets),
    ))
    train_dual = tf.logical_and(
        tf.greater(nfl_flag, 0), tf.logical_or(stop == 'persist', before_dual)
    )
    if train_dual:
      num_examples = dual_training(dataset)
    else:
      num_examples = global_training(dataset)
    new_personal = collections.OrderedDict(
        model=tf.nest.map_structure(tf.identity, local_vars),
        dual_rounds=dual_rounds + tf.cast(train_dual, tf.int32),
    )
    if own_global:
      # The G of the client's last dual round; before its first, the G it received.
      new_personal['global_model'] = tf.nest.map_structure(
          lambda trained, received, kept: tf.where(
              train_dual, trained, tf.where(before_dual, received, kept)
          ),
          trained_global(), global_weights, personal_state['global_model'],
      )
    return result(global_weights, num_examples, new_personal, personal_state)

  return client_update_on_detection


def with_zero_offsets(weights: ModelWeights, num_offsets: int) -> ModelWeights:
  """v of a client whose L is `weights` and whose gate offsets are 0."""
  return ModelWeights(
      trainable=list(weights.trainable) + [np.float32(0.0)] * num_offsets,
      non_trainable=list(weights.non_trainable),
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


def resolve_intertwining(intertwining: Intertwining, server: shared_model.ServerOptions,
                         num_parameters: int, detach_when_blind: bool) -> Intertwining:
  """`intertwining`, with G detached when the server's DP noise would blind
  the NFL detector (module docstring) if `detach_when_blind`."""
  blind = shared_model.dp_noise_to_signal(server, num_parameters) > 1
  if detach_when_blind and blind and not intertwining.detach_global:
    logging.info(
        "LINDT: the DP noise exceeds any divergence a round can show (noise_to_signal"
        " > 1); G is detached from L's loss."
    )
    return dataclasses.replace(intertwining, detach_global=True)
  return intertwining


def build_lindt(
    model: model_spec.ModelSpec,
    *,
    client_learning_rate: float,
    server: shared_model.ServerOptions = shared_model.ServerOptions(),
    mode: str = 'always',
    stop: str = 'persist',
    attach_logits: bool = True,
    learn_gates: bool = False,
    own_global: bool = False,
    match_scale: bool = False,
    detach_global: bool = False,
    detach_when_blind: bool = True,
) -> process_lib.PersonalizedProcess:
  """Builds LINDT's dual model; see the module docstring.

  Args:
    model: the task's model (its blocks must apply one after the other).
    client_learning_rate: the SGD rate of w and v.
    server: the server side (`shared_model.ServerOptions`).
    mode: 'always' or 'on_detection' (needs `server.nfl_detector`).
    stop: on detection, 'persist' or 'after_one_round'.
    attach_logits: an attaching module on the logits too (module docstring).
    learn_gates: each attaching module's gate gets a learned personal offset
      (module docstring).
    own_global: each client keeps the G its last dual round left and predicts
      with L intertwined with it (module docstring).
    match_scale: the attached G^m is rescaled to L^m's norm (module docstring).
    detach_global: L's loss does not reach w (module docstring).
    detach_when_blind: detach_global when the server's DP noise would blind
      the NFL detector (module docstring).

  Raises:
    ValueError: if the model has no place for attaching modules, or for an
      unknown mode or stop, or on_detection without a detector.
  """
  if mode not in MODES or stop not in STOPS:
    raise ValueError(f'mode must be in {MODES} and stop in {STOPS}, got {mode!r}, {stop!r}.')
  if mode == 'on_detection' and server.nfl_detector is None:
    raise ValueError("LINDT's on_detection mode needs the NFL detector.")
  check_chain(model)
  initial_weights = model.initial_weights(server.seed)
  intertwining = resolve_intertwining(
      Intertwining(attach_logits, learn_gates, match_scale, detach_global), server,
      sum(np.size(w) for w in initial_weights.trainable), detach_when_blind,
  )
  with tf.Graph().as_default():
    dual_model = DualModel(model, intertwining)
    trainable_order, non_trainable_order = dual_model.predictor_arrangement()
    num_offsets = len(dual_model.personal_weights.trainable) - len(
        dual_model.local_model.trainable_weights
    )

  def assemble(global_weights, personal_state):
    """(W, v, use_local) in the predictor's weight order."""
    if mode == 'always' and not own_global:
      local_weights, use_local = personal_state, tf.constant(1.0)
    elif mode == 'always':
      local_weights, use_local = personal_state['model'], tf.constant(1.0)
    else:
      local_weights = personal_state['model']
      use_local = tf.cast(personal_state['dual_rounds'] > 0, tf.float32)
    if own_global:  # Never-dual clients (use_local 0) keep the current G.
      global_weights = tf.nest.map_structure(
          lambda own, current: tf.where(use_local > 0, own, current),
          personal_state['global_model'], global_weights,
      )
    sources = (
        (list(global_weights.trainable), list(local_weights.trainable), []),
        (list(global_weights.non_trainable), list(local_weights.non_trainable), [use_local]),
    )
    return ModelWeights(
        trainable=[sources[0][s][i] for s, i in trainable_order],
        non_trainable=[sources[1][s][i] for s, i in non_trainable_order],
    )

  def new_client_state(client_id, global_weights):
    del client_id  # Every new client starts alike.
    local_weights = with_zero_offsets(global_weights, num_offsets)
    if mode == 'always' and not own_global:
      return local_weights
    state = collections.OrderedDict(model=local_weights)
    if mode == 'on_detection':
      state['dual_rounds'] = np.int32(0)
    if own_global:
      state['global_model'] = global_weights
    return state

  return shared_model.build_process(
      model,
      initial_shared_weights=initial_weights,
      personal_type=shared_model.weights_type(new_client_state('', initial_weights)),
      client_update_fn=lambda: build_client_update(
          model, client_learning_rate, mode, stop, intertwining, own_global
      ),
      assemble_fn=assemble,
      initial_personal_state_fn=new_client_state,
      server=server,
      # Detaching changes no forward pass; the predictor (and so fine-tuning
      # before evaluation) keeps G's gradient through the modules.
      evaluation_model=predictor_spec(
          model, dataclasses.replace(intertwining, detach_global=False)
      ),
      client_takes_nfl_flag=mode == 'on_detection',
  )
