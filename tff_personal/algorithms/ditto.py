"""Ditto: a global model and a proximal personal model (Li, Hu, Beirami, Smith, ICML 2021).

"Ditto: Fair and Robust Federated Learning Through Personalization". The
global model w is trained as in FedAvg (or with a robust aggregator); each
selected client k also updates its personal model v_k on

  h_k(v; w^t) = F_k(v) + (lambda / 2) ||v - w^t||^2,

where w^t is the global model it received this round, with SGD steps

  v <- v - eta_p * (grad F_k(v) + lambda * (v - w^t)).

Only the global update w^t - w_k leaves the client; v_k stays. lambda = 0 is
Local training of v; as lambda grows, v is held at w^t. A client seen for the
first time starts from v = the current global model, or with
`personal_start='initial'` from the initial global model w^0, as Ditto's code
starts every device's v.

Client k, each round (both updates start from the received w^t):
  1. personal: `personal_steps` SGD steps on h_k over its round data
     (repeated as needed), or, with personal_steps = 0, `personal_epochs`
     passes over the round data (`client_epochs` epochs each);
  2. global: SGD on F_k from w^t over its round data, as FedAvg's client.

  next: (<S@SERVER, {D*}@CLIENTS, {v}@CLIENTS> -> <S@SERVER, {v}@CLIENTS, M@SERVER>)
  evaluate: (<w@SERVER, {D*}@CLIENTS, {v}@CLIENTS> -> {E}@CLIENTS)
    each client's personal model v on its own data.
The server part is the composed round (`personal.compose`: weighted mean of
the global updates with weights n_k, or any robust aggregator, then the
server's SGD).

Per-client lambda (the paper's Section 3.3 heuristic, `lambda_grid`): a
client picks its lambda from a candidate grid on a validation set of its own,
a fixed tenth of its examples (`client_training.heldout_mask`) that its
personal model never trains on, as Ditto's code holds out 10% of a device's
training data. For each candidate the client trains a copy of its v on the
other examples (step 1) and measures the mean loss on the held-out ones of
all its round data, also with `client_steps` (the process then takes the
client's whole round data and trains on its first `client_steps` batches:
Ditto's code validates on the device's whole validation split, where the
held-out examples of 2 batches of 16 are about 3); the
candidate with the lowest loss (the first on ties, e.g. a client with no
held-out example) gives the round's lambda and v. With `few_heldout_lambda`,
a client with fewer than `min_heldout` held-out examples does not choose: it
trains with that lambda (the paper's Appendix: under 4 validation examples,
lambda = 1, or 0.1 under strong attacks). With
`lambda_selection='every'` a client chooses at every participation; with
'first', once, at its first participation, and keeps it; with 'step', at
every personal SGD step, as Ditto's code does with `dynamic_lam`: from the
step's gradient g at v, each candidate's step v - eta_p * (g + lambda *
(v - w^t)) is scored by its held-out loss and the lowest is kept, so the
lambda can change from one step to the next (P's lambda is the last step's).
Choosing once locks in the choice made against an early, poor global model:
on the 105 FEMNIST writers 60 of them kept lambda = 0.1 and their v stayed
near a local model (docs/results_ditto.md).
P is then <model=v, ditto_lambda=float32>, the last chosen lambda (-1 before
the first); without a grid, P = v and v trains on all the client's data.
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
UNSELECTED_LAMBDA = -1.0  # A new client's lambda before it chose from the grid.
HELDOUT_BUCKETS = 10  # With a lambda grid, a tenth of a client's examples validates.
LAMBDA_SELECTIONS = ('every', 'first', 'step')
PERSONAL_STARTS = ('global', 'initial')


def _lower_loss(best, candidate):
  """Of two (loss, lambda, weights), the one with the lower loss (`best` on ties)."""
  if best is None:
    return candidate
  better = candidate[0] < best[0]
  return tf.nest.map_structure(lambda new, old: tf.where(better, new, old), candidate, best)


def _few_heldout_or_chosen(too_few, few_heldout, chosen):
  """`few_heldout`'s (lambda, weights) where the client has too few held-out examples."""
  return tf.nest.map_structure(lambda few, own: tf.where(too_few, few, own), few_heldout, chosen)


@dataclasses.dataclass(frozen=True)
class Hparams:
  """Ditto's hyperparameters.

  Attributes:
    lambda_: lambda >= 0, the pull of the personal models to the global one.
    lambda_grid: per-client lambda, chosen from these candidates by the
      loss on a held-out tenth of the client's examples (overrides lambda_); e.g. 0.05,0.1,0.2 under strong attacks, 0.1,1,2
      otherwise (Li et al. 2021).
    lambda_selection: with lambda_grid, when a client chooses its lambda:
      at every participation ('every'), at its first only ('first'), or at
      every personal SGD step ('step', Ditto's code).
    few_heldout_lambda: with lambda_grid, the lambda of a client with fewer
      than min_heldout held-out examples, which then does not choose (the
      paper: 1, or 0.1 under strong attacks); None: it chooses too.
    min_heldout: the held-out examples a client needs to choose its lambda.
    personal_learning_rate: the personal SGD rate; None: the client's.
    personal_steps: personal SGD steps a round; 0: personal_epochs passes.
    personal_epochs: personal passes over the round data (each the round's
      epochs).
    personal_start: a new client's v: the global model it receives first
      ('global') or the initial global model ('initial', Ditto's code).
  """

  lambda_: float = common.hparam(0.1, lower=0.0)
  lambda_grid: tuple[float, ...] = common.hparam((), lower=0.0)
  lambda_selection: str = common.hparam('every', choices=LAMBDA_SELECTIONS)
  few_heldout_lambda: Optional[float] = common.hparam(None, lower=0.0)
  min_heldout: int = common.hparam(4, lower=1)
  personal_learning_rate: Optional[float] = common.hparam(None, lower=0.0)
  personal_steps: int = common.hparam(0, lower=0)
  personal_epochs: int = common.hparam(1, lower=1)
  personal_start: str = common.hparam('global', choices=PERSONAL_STARTS)


CAPABILITIES = common.Capabilities(personal_state=True)


def build_client_update(
    model_fn, hparams: Hparams, learning_rate: float, client_steps: int = 0
):
  """The client's steps 1-2 (module docstring) as a `tf.function`.

  With a lambda grid and `client_steps` > 0 its dataset is the client's whole
  round data: both models train on its first `client_steps` batches, and the
  held-out examples of all of it validate the choice.
  """
  model = model_fn()
  variables = ModelWeights.from_model(model)
  lambda_grid = hparams.lambda_grid
  choose_every_round = hparams.lambda_selection == 'every'
  every_step = hparams.lambda_selection == 'step'
  personal_learning_rate = hparams.personal_learning_rate
  if personal_learning_rate is None:
    personal_learning_rate = learning_rate

  def assign(weights):
    tf.nest.map_structure(lambda v, w: v.assign(w), variables, weights)

  def personal_passes(dataset):
    if hparams.personal_steps > 0:
      return [dataset.repeat().take(hparams.personal_steps)]
    return [dataset] * hparams.personal_epochs

  def personal_update(personal_weights, global_weights, dataset, lambda_value):
    assign(personal_weights)
    for data in personal_passes(dataset):
      client_training.proximal_sgd_pass(
          model, data, variables.trainable, global_weights.trainable,
          personal_learning_rate, lambda_value,
      )

  def select_lambda_every_step(personal_weights, global_weights, train, validation):
    """(last step's lambda, v) with each step's lambda chosen on the held-out loss."""
    assign(personal_weights)
    trainable = variables.trainable
    anchor = global_weights.trainable
    few_lambda = hparams.few_heldout_lambda
    candidates = list(lambda_grid)
    if few_lambda is not None:
      _, num_heldout = client_training.mean_loss_and_count(model, validation)
      too_few = num_heldout < hparams.min_heldout
      if few_lambda not in candidates:
        candidates.append(few_lambda)

    def step(chosen_lambda, batch):
      del chosen_lambda  # Each step chooses afresh.
      with tf.GradientTape() as tape:
        output = model.forward_pass(batch, training=True)
      gradients = client_training.dense_gradients(tape.gradient(output.loss, trainable))
      start = [tf.identity(v) for v in trainable]
      best = None
      stepped = {}
      for value in candidates:
        candidate = tf.constant(value, tf.float32)
        for variable, origin, gradient, center in zip(trainable, start, gradients, anchor):
          variable.assign(
              origin - personal_learning_rate * (gradient + candidate * (origin - center))
          )
        weights = [tf.identity(v) for v in trainable]
        stepped[value] = (candidate, weights)
        if value not in lambda_grid:
          continue  # The few-held-out lambda, outside the grid: never chosen by loss.
        loss, _ = client_training.mean_loss_and_count(model, validation)
        best = _lower_loss(best, (loss, candidate, weights))
      chosen_lambda, chosen = best[1:]
      if few_lambda is not None:
        chosen_lambda, chosen = _few_heldout_or_chosen(
            too_few, stepped[few_lambda], (chosen_lambda, chosen)
        )
      for variable, value in zip(trainable, chosen):
        variable.assign(value)
      return chosen_lambda

    lambda_value = tf.constant(UNSELECTED_LAMBDA, tf.float32)
    for data in personal_passes(train):
      lambda_value = client_training.reduce_batches(data, lambda_value, step)
    return lambda_value, tf.nest.map_structure(tf.identity, variables)

  def select_lambda(personal_weights, global_weights, train, validation):
    """(lambda, v) of the grid's candidate with the lowest held-out loss."""
    best = None
    trained = {}  # v of each candidate, for a few_heldout_lambda in the grid.
    for value in lambda_grid:
      candidate = tf.constant(value, tf.float32)
      personal_update(personal_weights, global_weights, train, candidate)
      loss, num_heldout = client_training.mean_loss_and_count(model, validation)
      weights = tf.nest.map_structure(tf.identity, variables)
      trained[value] = (candidate, weights)
      best = _lower_loss(best, (loss, candidate, weights))
    if hparams.few_heldout_lambda is None:
      return best[1], best[2]
    fallback = trained.get(hparams.few_heldout_lambda) or keep_lambda(
        personal_weights, global_weights, train,
        tf.constant(hparams.few_heldout_lambda, tf.float32),
    )
    too_few = num_heldout < hparams.min_heldout
    return _few_heldout_or_chosen(too_few, fallback, best[1:])

  def keep_lambda(personal_weights, global_weights, train, lambda_value):
    personal_update(personal_weights, global_weights, train, lambda_value)
    return lambda_value, tf.nest.map_structure(tf.identity, variables)

  @tf.function
  def client_update(global_weights, personal_state, dataset):
    if lambda_grid:
      whole_data = dataset
      if client_steps:
        dataset = dataset.take(client_steps)
      train, _ = client_training.split_heldout(dataset, HELDOUT_BUCKETS)
      _, validation = client_training.split_heldout(whole_data, HELDOUT_BUCKETS)
      personal_weights = personal_state['model']
      lambda_value = personal_state['ditto_lambda']
      if every_step:
        lambda_value, new_personal = select_lambda_every_step(
            personal_weights, global_weights, train, validation)
      elif choose_every_round or lambda_value < 0:
        lambda_value, new_personal = select_lambda(
            personal_weights, global_weights, train, validation)
      else:
        lambda_value, new_personal = keep_lambda(
            personal_weights, global_weights, train, lambda_value)
      new_personal = collections.OrderedDict(model=new_personal, ditto_lambda=lambda_value)
    else:
      personal_update(personal_state, global_weights, dataset, tf.constant(hparams.lambda_))
      new_personal = tf.nest.map_structure(tf.identity, variables)
    model.reset_metrics()  # Training metrics are the global model's, as FedAvg's.

    assign(global_weights)
    num_examples = client_training.sgd_pass(
        model, dataset, variables.trainable, learning_rate
    )
    update = tf.nest.map_structure(
        tf.subtract, global_weights.trainable, variables.trainable
    )
    return compose.client_result(
        update, num_examples, new_personal, personal_state, model
    )

  return client_update


def _check(hparams: Hparams) -> Hparams:
  """`hparams` with the grid as floats; ValueError naming the flag if invalid."""
  if hparams.lambda_ < 0:
    raise ValueError(f'--ditto_lambda must be >= 0, got {hparams.lambda_}.')
  lambda_grid = tuple(float(c) for c in hparams.lambda_grid)
  if any(c < 0 for c in lambda_grid):
    raise ValueError(f'--ditto_lambda_grid must hold values >= 0, got {list(lambda_grid)}.')
  if hparams.lambda_selection not in LAMBDA_SELECTIONS:
    raise ValueError(
        f'--ditto_lambda_selection must be one of {list(LAMBDA_SELECTIONS)}, '
        f'got {hparams.lambda_selection!r}.'
    )
  if hparams.personal_start not in PERSONAL_STARTS:
    raise ValueError(
        f'--ditto_personal_start must be one of {list(PERSONAL_STARTS)}, '
        f'got {hparams.personal_start!r}.'
    )
  if hparams.few_heldout_lambda is not None:
    if not lambda_grid:
      raise ValueError('--ditto_few_heldout_lambda applies with --ditto_lambda_grid.')
    if hparams.few_heldout_lambda < 0:
      raise ValueError(
          f'--ditto_few_heldout_lambda must be >= 0, got {hparams.few_heldout_lambda}.'
      )
  if hparams.min_heldout < 1:
    raise ValueError(f'--ditto_min_heldout must be >= 1, got {hparams.min_heldout}.')
  if hparams.personal_steps < 0 or (hparams.personal_steps == 0 and hparams.personal_epochs < 1):
    raise ValueError('Ditto needs --ditto_personal_steps > 0 or --ditto_personal_epochs >= 1.')
  return dataclasses.replace(hparams, lambda_grid=lambda_grid)


def build(
    model: model_spec.ModelSpec, hparams: Hparams = Hparams(),
    options: common.Common = common.Common(),
) -> process_lib.PersonalizedProcess:
  """Builds Ditto; see the module docstring."""
  hparams = _check(hparams)
  initial_weights = model.initial_weights(options.seed)
  if hparams.personal_start == 'initial':
    start = lambda global_weights: tf.nest.map_structure(np.copy, initial_weights)
  else:
    start = lambda global_weights: global_weights
  if hparams.lambda_grid:
    new_client_state = lambda client_id, global_weights: collections.OrderedDict(
        model=start(global_weights), ditto_lambda=np.float32(UNSELECTED_LAMBDA)
    )
    personal_model = lambda personal_state: personal_state['model']
  else:
    new_client_state = lambda client_id, global_weights: start(global_weights)
    personal_model = lambda personal_state: personal_state
  work = compose.ClientWork(
      build_update=lambda: build_client_update(
          model.tff_model_fn, hparams, options.client_learning_rate, options.client_steps
      ),
      personal_type=compose.weights_type(new_client_state('', initial_weights)),
      # A new client's personal model starts from the current or the initial global model.
      initial_personal_state=new_client_state,
      assemble=lambda global_weights, personal_state: personal_model(personal_state),
      takes_whole_client_data=bool(hparams.lambda_grid) and options.client_steps > 0,
  )
  return common.build_process(model, initial_weights, work, options)
