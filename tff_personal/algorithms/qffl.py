"""q-FFL: fair resource allocation by q-FedAvg (Li, Sanjabi, Beirami, Smith, ICLR 2020).

"Fair Resource Allocation in Federated Learning" minimizes
sum_k p_k F_k^{q+1}(w) / (q + 1): the larger q, the more weight the clients
with a high loss get. q-FedAvg (the paper's Algorithm 3), each round:

  client k, from the received w^t: F_k = its loss at w^t on its round data;
    w_k = FedAvg's client SGD from w^t; Delta w_k = L (w^t - w_k), with the
    Lipschitz estimate L = 1 / (client learning rate);
    Delta_k = F_k^q Delta w_k,
    h_k = q F_k^{q-1} ||Delta w_k||^2 + L F_k^q;
  server: w^{t+1} = w^t - sum_k Delta_k / sum_k h_k.

The composed round's weighted mean computes that quotient when each client
sends the update Delta_k / h_k with weight h_k (and the server's SGD rate is
1). q = 0 is FedAvg with every client weighted alike. No personal state:

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


@dataclasses.dataclass(frozen=True)
class Hparams:
  """q-FFL's hyperparameters.

  Attributes:
    q: the fairness exponent q >= 0 (0: FedAvg with clients weighted alike).
  """

  q: float = common.hparam(1.0, lower=0.0)


CAPABILITIES = common.Capabilities(personal_state=False, sets_update_weights=True)


def build_client_update(model_fn, learning_rate: float, q: float):
  """The client's part of q-FedAvg (module docstring) as a `tf.function`."""
  model = model_fn()
  variables = ModelWeights.from_model(model)
  lipschitz = 1.0 / learning_rate

  @tf.function
  def client_update(global_weights, personal_state, dataset):
    del personal_state  # Empty: q-FFL keeps nothing on clients.
    tf.nest.map_structure(lambda v, w: v.assign(w), variables, global_weights)
    loss = client_training.mean_loss(model, dataset)
    model.reset_metrics()  # The training metrics are those of the SGD pass.
    num_examples = client_training.sgd_pass(model, dataset, variables.trainable, learning_rate)
    delta = [lipschitz * (w - v) for w, v in zip(global_weights.trainable, variables.trainable)]
    squared_norm = tf.add_n([tf.reduce_sum(tf.square(d)) for d in delta])
    loss_q = tf.pow(loss, q)
    h = q * tf.pow(loss, q - 1.0) * squared_norm + lipschitz * loss_q if q else lipschitz
    update = [loss_q * d / h for d in delta]
    nothing = collections.OrderedDict()
    result = compose.client_result(update, num_examples, nothing, nothing, model)
    return compose.with_update_weight(result, h)  # The aggregation weight is h_k.

  return client_update


def build(
    model: model_spec.ModelSpec, hparams: Hparams = Hparams(),
    options: common.Common = common.Common(),
) -> process_lib.PersonalizedProcess:
  """Builds q-FFL (q-FedAvg); see the module docstring."""
  if hparams.q < 0:
    raise ValueError(f'--qffl_q must be >= 0, got {hparams.q}.')
  work = common.global_model_work(
      lambda: build_client_update(model.tff_model_fn, options.client_learning_rate, hparams.q)
  )
  return common.build_process(model, model.initial_weights(options.seed), work, options)
