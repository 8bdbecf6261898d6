"""FedProx (Li, Sahu, Zaheer, Sanjabi, Talwalkar, Smith, MLSys 2020).

"Federated Optimization in Heterogeneous Networks". Clients minimize
F_k(w) + (mu / 2) ||w - w^t||^2 by SGD from the received w^t,

  w <- w - eta * (grad F_k(w) + mu * (w - w^t)),

and the server averages the deltas w^t - w_k as FedAvg does. mu = 0 is
FedAvg. One of Ditto's baselines. No personal state:

  next: (<S@SERVER, {<data=D*,role,seed>}@CLIENTS, {<>}@CLIENTS>
         -> <S@SERVER, {<>}@CLIENTS, M@SERVER>)
  evaluate: every client evaluates the global model on its own data.

It equals TFF's `tff.learning.algorithms.build_weighted_fed_prox` at mu = 0;
for mu > 0 TFF 0.87's proximal term has the opposite sign of the paper's
(tests/algorithms/fedprox_test.py shows both).
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
  """FedProx's hyperparameters.

  Attributes:
    mu: the proximal strength mu >= 0.
  """

  mu: float = common.hparam(0.01, lower=0.0)


CAPABILITIES = common.Capabilities(personal_state=False)


def build_client_update(model_fn, learning_rate, mu):
  """Proximal SGD from the broadcast model over the round data (`tf.function`)."""
  model = model_fn()
  variables = ModelWeights.from_model(model)

  @tf.function
  def client_update(global_weights, personal_state, dataset):
    del personal_state  # Empty: FedProx keeps nothing on clients.
    tf.nest.map_structure(lambda v, w: v.assign(w), variables, global_weights)
    num_examples = client_training.proximal_sgd_pass(
        model, dataset, variables.trainable, global_weights.trainable, learning_rate, mu
    )
    update = tf.nest.map_structure(tf.subtract, global_weights.trainable, variables.trainable)
    nothing = collections.OrderedDict()
    return compose.client_result(update, num_examples, nothing, nothing, model)

  return client_update


def build(
    model: model_spec.ModelSpec, hparams: Hparams = Hparams(),
    options: common.Common = common.Common(),
) -> process_lib.PersonalizedProcess:
  """Builds FedProx; see the module docstring."""
  if hparams.mu < 0:
    raise ValueError(f'--fedprox_mu must be >= 0, got {hparams.mu}.')
  work = common.global_model_work(
      lambda: build_client_update(model.tff_model_fn, options.client_learning_rate, hparams.mu)
  )
  return common.build_process(model, model.initial_weights(options.seed), work, options)
