"""APFL: adaptive personalized federated learning (Deng, Kamani, Mahdavi 2020).

"Adaptive Personalized Federated Learning", arXiv 2003.13461, Algorithm 1.
Client i keeps a personal model v_i and a mixing weight alpha_i in [0, 1];
its personalized model is the parameter mixture

  v_bar = alpha v + (1 - alpha) w.

Each local SGD step on a batch, from the same (w, v, alpha):

  w     <- w - eta grad f(w)                        (FedAvg's client step)
  v     <- v - eta alpha grad f(v_bar)              (d f(v_bar) / d v)
  alpha <- clip(alpha - eta_alpha <v - w, grad f(v_bar)>, 0, 1)   (adaptive alpha)

Only w's update leaves the client; (v, alpha) is the personal state. A new
client starts from v = the current global model and alpha = `alpha`. The
client is evaluated on v_bar built with the current global model.

  next: (<S@SERVER, {<data=D*,role,seed>}@CLIENTS, {<model=v, alpha>}@CLIENTS>
         -> <S@SERVER, {<model=v, alpha>}@CLIENTS, M@SERVER>)
The server part is the composed round (`personal.compose`).
"""

import collections
import dataclasses
from typing import Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_personal.algorithms import common
from tff_personal.models import model_spec
from tff_personal.personal import compose
from tff_personal.personal import process as process_lib
from tff_personal.training import client_training

ModelWeights = tff.learning.models.ModelWeights


@dataclasses.dataclass(frozen=True)
class Hparams:
  """APFL's hyperparameters.

  Attributes:
    alpha: a new client's mixing weight of its personal model, in [0, 1].
    adaptive_alpha: learn each client's alpha by SGD.
    alpha_learning_rate: alpha's SGD rate; None: the client's learning rate.
  """

  alpha: float = common.hparam(0.5, lower=0.0, upper=1.0)
  adaptive_alpha: bool = True
  alpha_learning_rate: Optional[float] = common.hparam(None, lower=0.0)


CAPABILITIES = common.Capabilities(personal_state=True)


def mix(alpha, personal, global_):
  """alpha * personal + (1 - alpha) * global, leaf by leaf."""
  return tf.nest.map_structure(lambda v, w: alpha * v + (1.0 - alpha) * w, personal, global_)


def build_client_update(spec: model_spec.ModelSpec, *, learning_rate, alpha_learning_rate,
                        adaptive_alpha):
  """The client's steps (module docstring) as a `tf.function`."""
  model = spec.tff_model_fn()
  loss_fn = spec.loss()
  variables = ModelWeights.from_model(model)
  trainable = list(variables.trainable)

  def assign(values):
    for variable, value in zip(trainable, values):
      variable.assign(value)

  def gradient(values, batch, mixed):
    """grad of the batch loss at `values`; the global pass feeds the metrics."""
    assign(values)
    with tf.GradientTape() as tape:
      if mixed:
        loss = loss_fn(batch[1], model.predict_on_batch(batch[0], training=True))
        num_examples = tf.constant(0, tf.int64)
      else:
        output = model.forward_pass(batch, training=True)
        loss, num_examples = output.loss, tf.cast(output.num_examples, tf.int64)
    return client_training.dense_gradients(tape.gradient(loss, trainable)), num_examples

  @tf.function
  def client_update(global_weights, personal_state, dataset):
    tf.nest.map_structure(lambda v, w: v.assign(w), variables, global_weights)

    def step(carry, batch):
      w, v, alpha, count = carry
      g_w, n = gradient(w, batch, mixed=False)
      g_mixed, _ = gradient(mix(alpha, v, w), batch, mixed=True)
      # Tuples: tf.data would stack a list of tensors into one.
      new_w = tuple(p - learning_rate * g for p, g in zip(w, g_w))
      new_v = tuple(p - learning_rate * alpha * g for p, g in zip(v, g_mixed))
      if adaptive_alpha:
        inner = tf.add_n([tf.reduce_sum((p - q) * g) for p, q, g in zip(v, w, g_mixed)])
        alpha = tf.clip_by_value(alpha - alpha_learning_rate * inner, 0.0, 1.0)
      return new_w, new_v, alpha, count + n

    start = (
        tuple(global_weights.trainable),
        tuple(personal_state['model'].trainable),
        personal_state['alpha'],
        tf.constant(0, tf.int64),
    )
    w, v, alpha, num_examples = client_training.reduce_batches(dataset, start, step)
    update = tf.nest.map_structure(tf.subtract, list(global_weights.trainable), list(w))
    new_personal = collections.OrderedDict(
        model=ModelWeights(trainable=list(v), non_trainable=list(global_weights.non_trainable)),
        alpha=alpha,
    )
    return compose.client_result(update, num_examples, new_personal, personal_state, model)

  return client_update


def build(
    model: model_spec.ModelSpec, hparams: Hparams = Hparams(),
    options: common.Common = common.Common(),
) -> process_lib.PersonalizedProcess:
  """Builds APFL; see the module docstring."""
  if not 0 <= hparams.alpha <= 1:
    raise ValueError(f'--apfl_alpha must be in [0, 1], got {hparams.alpha}.')
  initial_weights = model.initial_weights(options.seed)
  alpha_learning_rate = hparams.alpha_learning_rate
  if alpha_learning_rate is None:
    alpha_learning_rate = options.client_learning_rate

  def new_client_state(client_id, global_weights):
    del client_id
    return collections.OrderedDict(model=global_weights, alpha=np.float32(hparams.alpha))

  def personalized_model(global_weights, personal_state):
    return ModelWeights(
        trainable=mix(
            personal_state['alpha'], list(personal_state['model'].trainable),
            list(global_weights.trainable),
        ),
        non_trainable=list(global_weights.non_trainable),
    )

  work = compose.ClientWork(
      build_update=lambda: build_client_update(
          model,
          learning_rate=options.client_learning_rate,
          alpha_learning_rate=alpha_learning_rate,
          adaptive_alpha=hparams.adaptive_alpha,
      ),
      personal_type=compose.weights_type(new_client_state('', initial_weights)),
      initial_personal_state=new_client_state,
      assemble=personalized_model,
  )
  return common.build_process(model, initial_weights, work, options)
