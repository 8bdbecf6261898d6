"""FedPer: federated base layers, personal top layers (Arivazhagan et al. 2019).

"Federated Learning with Personalization Layers" (arXiv 1912.00818). The
model is split (`tff_personal.models.split.PersonalSplit`) into base blocks,
trained by federated averaging, and the top K_P blocks (the classifier is
block 1), which never leave the client. Each round, every selected client

  1. assembles its model from the broadcast base B and its personal layers P;
  2. optionally fine-tunes P alone, B frozen, for `finetune_epochs` passes
     over its round data (the paper's appendix);
  3. runs SGD on B and P together over its round data (`client_epochs`
     epochs, batched by the task);
  4. keeps the new P and sends only the base delta B - B' with weight n_j.

The server averages the base deltas with weights n_j / sum n (any weighted
`tff.aggregators` factory) and applies them with its SGD (TFF's
apply-optimizer finalizer). With K_P = 0 this is exactly FedAvg.

  initialize: ( -> <global_model_weights=B, aggregator, finalizer>@SERVER)
  next: (<S@SERVER, {D*}@CLIENTS, {P}@CLIENTS> -> <S@SERVER, {P}@CLIENTS, M@SERVER>)
    P = <trainable=<personal layers' weights>, non_trainable=<...>>
  evaluate: (<B@SERVER, {D*}@CLIENTS, {P}@CLIENTS> -> {E}@CLIENTS)
    each client's personalized model (B and its own P) on its own data.

A client seen for the first time gets personal layers freshly initialized
with a seed derived from (seed, client id). A client whose base delta or
personal layers are not finite keeps its old P, sends a zero-weight update,
and is counted in the `non_finite_clients` metric.
"""

import dataclasses
import hashlib
from typing import Optional

import tensorflow as tf
import tensorflow_federated as tff

from tff_personal.algorithms import common
from tff_personal.models import model_spec
from tff_personal.models import split as split_lib
from tff_personal.personal import compose
from tff_personal.personal import process as process_lib
from tff_personal.training import client_training

ModelWeights = tff.learning.models.ModelWeights


@dataclasses.dataclass(frozen=True)
class Hparams:
  """FedPer's hyperparameters.

  Attributes:
    personal_layers: K_P, the top blocks kept personal (the classifier is
      block 1); None: the task's default.
    finetune_epochs: personal-only passes over the round data (each the
      round's epochs) before training, base frozen (the paper's appendix).
    linear_base: the paper's ablation, the base replaced by one linear layer.
  """

  personal_layers: Optional[int] = common.hparam(None, lower=0)
  finetune_epochs: int = common.hparam(0, lower=0)
  linear_base: bool = False


CAPABILITIES = common.Capabilities(personal_state=True)


def for_task(hparams: Hparams, task) -> Hparams:
  """The task's default K_P where none is given, checked against its model."""
  if hparams.personal_layers is None:
    hparams = dataclasses.replace(hparams, personal_layers=task.default_personal_blocks)
  _check(hparams, len(task.model.blocks), f'the {task.name} model')
  return hparams


def client_seed(seed: int, client_id: str) -> int:
  """A stable seed for one client's personal initialization."""
  digest = hashlib.sha256(f'{seed}/{client_id}'.encode()).digest()
  return int.from_bytes(digest[:4], 'little')


def build_client_update(model_fn, split: split_lib.PersonalSplit, learning_rate, finetune_passes):
  """The client's steps 1-4 (module docstring) as a `tf.function`."""
  model = model_fn()
  variables = ModelWeights.from_model(model)
  personal_variables = split.personal(variables).trainable

  @tf.function
  def client_update(base_weights, personal_weights, dataset):
    tf.nest.map_structure(
        lambda v, w: v.assign(w), variables, split.merge(base_weights, personal_weights)
    )
    if personal_variables:
      for _ in range(finetune_passes):
        client_training.sgd_pass(model, dataset, personal_variables, learning_rate)
      model.reset_metrics()  # Training metrics cover step 3 only.
    num_examples = client_training.sgd_pass(
        model, dataset, variables.trainable, learning_rate
    )
    new_personal = tf.nest.map_structure(tf.identity, split.personal(variables))
    update = tf.nest.map_structure(
        tf.subtract, base_weights.trainable, split.base(variables).trainable
    )
    return compose.client_result(
        update, num_examples, new_personal, personal_weights, model
    )

  return client_update


def _check(hparams: Hparams, num_blocks: int, model_name: str = 'the model') -> int:
  """K_P, checked against the model's blocks (messages name the flags)."""
  personal_blocks = hparams.personal_layers
  if personal_blocks is None or not 0 <= personal_blocks <= num_blocks:
    raise ValueError(
        f'--fedper_personal_layers={personal_blocks}: {model_name} has {num_blocks} blocks;'
        f' allowed: 0..{num_blocks}.'
    )
  if hparams.linear_base and not 1 <= personal_blocks < num_blocks:
    raise ValueError(
        f'--fedper_linear_base needs 1 <= --fedper_personal_layers < {num_blocks}'
        f' (a base to replace), got {personal_blocks}.'
    )
  if hparams.finetune_epochs < 0:
    raise ValueError(f'--fedper_finetune_epochs must be >= 0, got {hparams.finetune_epochs}.')
  return personal_blocks


def build(
    model: model_spec.ModelSpec, hparams: Hparams = Hparams(personal_layers=1),
    options: common.Common = common.Common(),
) -> process_lib.PersonalizedProcess:
  """Builds FedPer; see the module docstring.

  Raises:
    ValueError: for a K_P outside the model's blocks, or a linear base
      without a base to replace.
  """
  personal_blocks = _check(hparams, len(model.blocks))
  if hparams.linear_base:
    model = split_lib.with_linear_base(model, personal_blocks)
  split = split_lib.PersonalSplit.of(model, personal_blocks)
  initial_weights = model.initial_weights(options.seed)

  def initial_personal_state(client_id, base_weights):
    del base_weights  # Personal layers start fresh, not from the shared model.
    return split.personal(model.initial_weights(client_seed(options.seed, client_id)))

  work = compose.ClientWork(
      build_update=lambda: build_client_update(
          model.tff_model_fn, split, options.client_learning_rate, hparams.finetune_epochs
      ),
      personal_type=compose.weights_type(split.personal(initial_weights)),
      initial_personal_state=initial_personal_state,
      assemble=split.merge,
  )
  return common.build_process(model, split.base(initial_weights), work, options)
