"""LINDT: a global and a local model intertwined layer by layer (Lin et al. 2020).

"LINDT: Tackling Negative Federated Learning with Local Adaptation" (Lin,
Shou, Chen, Chen, Wu, arXiv 2011.11160). Each client holds a local model L
(personal, parameters v) of the global model G's architecture (shared,
parameters w); attaching modules feed each of L's blocks with L's previous
activation plus G's, gated by their agreement (`models.dual` gives the
formula).

Its options are `Hparams`' fields, each measured in docs/results_nfl.md
("LINDT's options").

Client loss: CE(G's logits) + CE(L's logits); one SGD step
per batch updates w and v on it (L's loss reaches w through the attaching
modules); only w's update leaves the client, as in FedAvg. The client
predicts with L's logits.

Modes:
  * `always`: dual training every round; a new client's L starts from the
    current global model; P = v.
  * `on_detection`: FedAvg (G alone) until the NFL detector
    (`nfl.detection`, in the server state) has raised its flag, then dual
    training; the flag is broadcast with the weights. P = <model=v,
    dual_rounds>; until a client's first dual round its L follows the
    global model it receives, so L starts from the current G. Stopping: `persist` (dual training
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

from tff_personal.algorithms import common
from tff_personal.models import dual
from tff_personal.models import model_spec
from tff_personal.nfl import detection
from tff_personal.personal import compose
from tff_personal.personal import process as process_lib

ModelWeights = tff.learning.models.ModelWeights
MODES = ('always', 'on_detection')
STOPS = ('persist', 'after_one_round')


@dataclasses.dataclass(frozen=True)
class Hparams:
  """LINDT's hyperparameters.

  Attributes:
    mode: dual training every round (always), or FedAvg until the NFL
      detector flags NFL (on_detection; needs the detector).
    stop: on_detection: keep dual training once activated (persist), or give
      each client one dual round (after_one_round).
    attach_logits: attach G's logits to L's too, a module after the
      classifier with the same score (our change: without it L's classifier
      learns from the client's data alone); off: the paper's arrangement.
    learn_gates: each gate gets a personal offset b, sigmoid(score + b), so
      that a client can shut G out (the paper's gate is at least 1/2).
    own_global: each client predicts with L intertwined with the G its last
      dual round left, not the current one (a second model in its state).
    match_scale: rescale the attached G^m to L^m's norm.
    detach_global: L's loss does not reach w (w takes FedAvg's step on G's
      loss alone).
    detach_when_blind: detach G as detach_global does when the server's DP
      noise would blind the NFL detector (noise_to_signal > 1, known before
      round 1), where dual training on a noise-dominated G diverged.
  """

  mode: str = common.hparam('always', choices=MODES)
  stop: str = common.hparam('persist', choices=STOPS)
  attach_logits: bool = True
  learn_gates: bool = False
  own_global: bool = False
  match_scale: bool = False
  detach_global: bool = False
  detach_when_blind: bool = True


CAPABILITIES = common.Capabilities(personal_state=True)


def _result(steps: dual.DualTraining, global_weights, num_examples, new_personal,
            personal_state):
  """The client's result: w's update leaves the client, v stays."""
  update = tf.nest.map_structure(
      tf.subtract, list(global_weights.trainable), list(steps.global_vars.trainable)
  )
  return compose.client_result(
      update, num_examples, new_personal, personal_state, steps.metrics_model
  )


def _always_update(steps: dual.DualTraining, own_global: bool):
  """The client's round in `always` mode (module docstring)."""

  @tf.function
  def client_update(global_weights, personal_state, dataset):
    steps.assign(steps.global_vars, global_weights)
    steps.assign(steps.local_vars, personal_state['model'] if own_global else personal_state)
    num_examples = steps.dual_training(dataset)
    new_personal = tf.nest.map_structure(tf.identity, steps.local_vars)
    if own_global:
      new_personal = collections.OrderedDict(
          model=new_personal, global_model=steps.trained_global()
      )
    return _result(steps, global_weights, num_examples, new_personal, personal_state)

  return client_update


def _on_detection_update(steps: dual.DualTraining, stop: str, own_global: bool):
  """The client's round in `on_detection` mode (module docstring)."""

  @tf.function
  def client_update(global_weights, personal_state, dataset, nfl_flag):
    steps.assign(steps.global_vars, global_weights)
    dual_rounds = personal_state['dual_rounds']
    before_dual = tf.equal(dual_rounds, 0)
    # Until its first dual round, a client's L follows the global model
    # (and its gate offsets stay 0).
    steps.assign(steps.local_vars, tf.nest.map_structure(
        lambda local, global_: tf.where(before_dual, global_, local),
        personal_state['model'], dual.with_zero_offsets(global_weights, steps.num_offsets),
    ))
    train_dual = tf.logical_and(
        tf.greater(nfl_flag, 0), tf.logical_or(stop == 'persist', before_dual)
    )
    if train_dual:
      num_examples = steps.dual_training(dataset)
    else:
      num_examples = steps.global_training(dataset)
    new_personal = collections.OrderedDict(
        model=tf.nest.map_structure(tf.identity, steps.local_vars),
        dual_rounds=dual_rounds + tf.cast(train_dual, tf.int32),
    )
    if own_global:
      # The G of the client's last dual round; before its first, the G it received.
      new_personal['global_model'] = tf.nest.map_structure(
          lambda trained, received, kept: tf.where(
              train_dual, trained, tf.where(before_dual, received, kept)
          ),
          steps.trained_global(), global_weights, personal_state['global_model'],
      )
    return _result(steps, global_weights, num_examples, new_personal, personal_state)

  return client_update


def build_client_update(spec: model_spec.ModelSpec, learning_rate: float, hparams: Hparams,
                        intertwining: dual.Intertwining):
  """The client's round (module docstring) as a `tf.function`."""
  steps = dual.DualTraining(spec, learning_rate, intertwining)
  if hparams.mode == 'always':
    return _always_update(steps, hparams.own_global)
  return _on_detection_update(steps, hparams.stop, hparams.own_global)


def resolve_intertwining(hparams: Hparams, options: common.Common,
                         num_parameters: int) -> dual.Intertwining:
  """The dual model's arrangement, with G detached when the server's DP noise
  would blind the NFL detector (module docstring) if `detach_when_blind`."""
  intertwining = dual.Intertwining(
      hparams.attach_logits, hparams.learn_gates, hparams.match_scale, hparams.detach_global
  )
  blind = options.noise_to_signal(num_parameters) > 1
  if hparams.detach_when_blind and blind and not intertwining.detach_global:
    logging.info(
        "LINDT: the DP noise exceeds any divergence a round can show (noise_to_signal"
        " > 1); G is detached from L's loss."
    )
    return dataclasses.replace(intertwining, detach_global=True)
  return intertwining


def _assemble_fn(hparams: Hparams, trainable_order, non_trainable_order):
  """(W, P) -> the predictor's weights (W, v, use_local) in its order."""

  def assemble(global_weights, personal_state):
    if hparams.mode == 'always' and not hparams.own_global:
      local_weights, use_local = personal_state, tf.constant(1.0)
    elif hparams.mode == 'always':
      local_weights, use_local = personal_state['model'], tf.constant(1.0)
    else:
      local_weights = personal_state['model']
      use_local = tf.cast(personal_state['dual_rounds'] > 0, tf.float32)
    if hparams.own_global:  # Never-dual clients (use_local 0) keep the current G.
      global_weights = tf.nest.map_structure(
          lambda own, current: tf.where(use_local > 0, own, current),
          personal_state['global_model'], global_weights,
      )
    return dual.predictor_weights(
        global_weights, local_weights, use_local, trainable_order, non_trainable_order
    )

  return assemble


def _new_client_state_fn(hparams: Hparams, num_offsets: int):
  """(client id, W) -> the personal state of a new client."""

  def new_client_state(client_id, global_weights):
    del client_id  # Every new client starts alike.
    local_weights = dual.with_zero_offsets(global_weights, num_offsets)
    if hparams.mode == 'always' and not hparams.own_global:
      return local_weights
    state = collections.OrderedDict(model=local_weights)
    if hparams.mode == 'on_detection':
      state['dual_rounds'] = np.int32(0)
    if hparams.own_global:
      state['global_model'] = global_weights
    return state

  return new_client_state


def build(
    model: model_spec.ModelSpec, hparams: Hparams = Hparams(),
    options: common.Common = common.Common(),
) -> process_lib.PersonalizedProcess:
  """Builds LINDT's dual model; see the module docstring.

  Raises:
    ValueError: if the model has no place for attaching modules, or for an
      unknown mode or stop, or on_detection without a detector.
  """
  if hparams.mode not in MODES or hparams.stop not in STOPS:
    raise ValueError(
        f'--lindt_mode must be in {MODES} and --lindt_stop in {STOPS}, got'
        f' {hparams.mode!r}, {hparams.stop!r}.'
    )
  if hparams.mode == 'on_detection' and options.nfl_detector is None:
    raise ValueError('--lindt_mode=on_detection needs the NFL detector: add --nfl_detection.')
  dual.check_chain(model)
  initial_weights = model.initial_weights(options.seed)
  intertwining = resolve_intertwining(
      hparams, options, sum(np.size(w) for w in initial_weights.trainable)
  )
  with tf.Graph().as_default():
    dual_model = dual.DualModel(model, intertwining)
    trainable_order, non_trainable_order = dual_model.predictor_arrangement()
    num_offsets = len(dual_model.personal_weights.trainable) - len(
        dual_model.local_model.trainable_weights
    )
  new_client_state = _new_client_state_fn(hparams, num_offsets)
  work = compose.ClientWork(
      build_update=lambda: build_client_update(
          model, options.client_learning_rate, hparams, intertwining
      ),
      personal_type=compose.weights_type(new_client_state('', initial_weights)),
      initial_personal_state=new_client_state,
      assemble=_assemble_fn(hparams, trainable_order, non_trainable_order),
      # Detaching changes no forward pass; the predictor (and so fine-tuning
      # before evaluation) keeps G's gradient through the modules.
      evaluation_model=dual.predictor_spec(
          model, dataclasses.replace(intertwining, detach_global=False)
      ),
      input_from=detection.NAME if hparams.mode == 'on_detection' else None,
  )
  return common.build_process(model, initial_weights, work, options)
