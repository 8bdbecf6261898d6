"""TERM: tilted empirical risk minimization at the client level (Li, Beirami,
Sanjabi, Smith, "Tilted Empirical Risk Minimization", ICLR 2021).

TERM minimizes the tilted risk over the clients' losses F_k,

  J(t; w) = (1 / t) log( sum_k p_k exp(t F_k(w)) ),   p_k = n_k / n,

whose gradient is the mean of the clients' gradients under the tilted
weights p_k exp(t F_k(w)) / sum_j p_j exp(t F_j(w)). t < 0 down-weights the
clients of high loss (robustness to corrupted clients, the baseline of Ditto's
attack table); t > 0 up-weights them (fairness); t = 0 is FedAvg. Each round:

  client k, from the received w^t: F_k = its mean loss at w^t on its round
    data; w_k = FedAvg's client SGD from w^t; it sends w^t - w_k with the
    weight n_k exp(t F_k);
  server: the weighted mean of the updates, then the server's SGD.

The exponent t F_k is clipped to [-60, 60] so that the float32 weights stay
finite and non-zero (the tilt is relative: only the clients' differences in
t F_k matter while they stay in that range). Ditto's code weighs clients by
exp(t F_k) alone; with equal-sized clients the two agree. No personal state:

  next: (<S@SERVER, {<data=D*,role,seed>}@CLIENTS, {<>}@CLIENTS>
         -> <S@SERVER, {<>}@CLIENTS, M@SERVER>)
  evaluate: every client evaluates the global model on its own data.
"""

import collections
import dataclasses

import tensorflow as tf
import tensorflow_federated as tff

from tff_personal.algorithms import common
from tff_personal.models import model_spec
from tff_personal.personal import compose
from tff_personal.personal import process as process_lib
from tff_personal.training import client_training

ModelWeights = tff.learning.models.ModelWeights
MAX_TILT_EXPONENT = 60.0  # exp(60) * examples * clients stays below float32's max.


@dataclasses.dataclass(frozen=True)
class Hparams:
  """TERM's hyperparameters.

  Attributes:
    t: the tilt (< 0: clients of high loss count less, robust; > 0: they
      count more, fair; 0: FedAvg).
  """

  t: float = common.hparam(-1.0)


CAPABILITIES = common.Capabilities(personal_state=False, sets_update_weights=True)


def build_client_update(model_fn, learning_rate: float, t: float):
  """The client's part of TERM (module docstring) as a `tf.function`."""
  model = model_fn()
  variables = ModelWeights.from_model(model)

  @tf.function
  def client_update(global_weights, personal_state, dataset):
    del personal_state  # Empty: TERM keeps nothing on clients.
    tf.nest.map_structure(lambda v, w: v.assign(w), variables, global_weights)
    loss = client_training.mean_loss(model, dataset)
    model.reset_metrics()  # The training metrics are those of the SGD pass.
    num_examples = client_training.sgd_pass(model, dataset, variables.trainable, learning_rate)
    update = tf.nest.map_structure(tf.subtract, global_weights.trainable, variables.trainable)
    nothing = collections.OrderedDict()
    result = compose.client_result(update, num_examples, nothing, nothing, model)
    exponent = tf.clip_by_value(t * loss, -MAX_TILT_EXPONENT, MAX_TILT_EXPONENT)
    tilted_weight = tf.cast(num_examples, tf.float32) * tf.exp(exponent)  # n_k exp(t F_k)
    return compose.with_update_weight(result, tilted_weight)

  return client_update


def build(
    model: model_spec.ModelSpec, hparams: Hparams = Hparams(),
    options: common.Common = common.Common(),
) -> process_lib.PersonalizedProcess:
  """Builds TERM; see the module docstring."""
  work = common.global_model_work(
      lambda: build_client_update(model.tff_model_fn, options.client_learning_rate, hparams.t)
  )
  return common.build_process(model, model.initial_weights(options.seed), work, options)
