"""Composes a `PersonalizedProcess` from its parts.

In the spirit of `tff.learning.templates.compose_learning_process`: every
algorithm of tff_personal is the same round over different parts
(`Composition`), FedAvg's round (McMahan et al. 2017) with personal state:

  1. broadcast the shared weights W (and what an extension sends clients);
  2. each client, given <data=D*, role, seed>, runs its `ClientWork`:
     `(W, P, D) -> <update = W - W' (its shared delta), update_weight (n_j,
     0 if non-finite), personal_state = P', model_output (unfinalized
     metrics), non_finite>` (`client_result`); its role then selects the
     update it sends (`attacks.update_attacks`: honest, random noise, or
     boosted), so honest and malicious clients run one computation;
  3. aggregate the updates with a weighted `tff.aggregators` factory (mean
     by default, or a robust or DP one);
  4. apply the aggregate with the server's SGD (TFF's apply-optimizer
     finalizer, which also rejects a non-finite aggregate);
  5. each `Extension` (the NFL detector, `nfl.detection`) updates its part
     of the server state from the clients' outputs and the aggregate.

A process whose server keeps no moving model (Local) has no aggregator:
steps 3-4 are skipped and W stays the initial model.

  initialize: ( -> <global_model_weights=W, aggregator, finalizer, ...>@SERVER)
  next: (<S@SERVER, {<data=D*,role=int32,seed=int64>}@CLIENTS, {P}@CLIENTS>
         -> <S@SERVER, {P}@CLIENTS, M@SERVER>)
  M = <client_work=<train=...>, aggregator, finalizer, non_finite_clients, ...>
  evaluate: (<W@SERVER, {D*}@CLIENTS, {P}@CLIENTS> -> {E}@CLIENTS), each
    client's model `ClientWork.assemble(W, P)` on its own data.

Only `update` (and what extensions add, e.g. a scalar norm) and the metrics
leave the clients; `personal_state` stays at CLIENTS. The round is also
offered as two calls (`process.SplitRound`) for TFF's mergeable context.
"""

import collections
import dataclasses
import functools
from typing import Any, Callable, Optional, Sequence

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_personal.attacks import update_attacks
from tff_personal.evaluation import per_client
from tff_personal.models import model_spec
from tff_personal.personal import process as process_lib
from tff_personal.training import client_training

ModelWeights = tff.learning.models.ModelWeights


def weights_type(weights: Any) -> tff.Type:
  """The TFF type of a NumPy structure (e.g. `ModelWeights`)."""
  return process_lib.constant_computation(weights).type_signature.result


def client_result(update, num_examples, new_personal, old_personal, model):
  """A client's round result; a non-finite client sends nothing and keeps P.

  Call inside the client's `tf.function`.
  """
  finite = tf.logical_and(
      client_training.all_finite(update), client_training.all_finite(new_personal)
  )
  if not finite:
    model.reset_metrics()
  return collections.OrderedDict(
      update=tf.nest.map_structure(lambda u: tf.where(finite, u, tf.zeros_like(u)), update),
      update_weight=tf.where(finite, tf.cast(num_examples, tf.float32), 0.0),
      personal_state=tf.nest.map_structure(
          lambda new, old: tf.where(finite, new, old), new_personal, old_personal
      ),
      model_output=model.report_local_unfinalized_metrics(),
      non_finite=tf.cast(tf.logical_not(finite), tf.int32),
  )


def with_update_weight(result, weight):
  """`client_result`'s `result` aggregated with `weight` instead of n_k.

  For algorithms whose weight is part of the update rule (q-FFL, TERM). A
  client already refused as non-finite keeps weight 0; one whose `weight`
  is not finite is refused the same way (zero update, weight 0). Only for
  algorithms without personal state. Call inside the client's `tf.function`.
  """
  accepted = tf.logical_and(result['update_weight'] > 0, tf.math.is_finite(weight))
  result = collections.OrderedDict(result)
  result['update'] = tf.nest.map_structure(
      lambda u: tf.where(accepted, u, tf.zeros_like(u)), result['update']
  )
  result['update_weight'] = tf.where(accepted, weight, 0.0)
  result['non_finite'] = tf.where(
      tf.logical_or(accepted, result['non_finite'] > 0), result['non_finite'], 1
  )
  return result


@dataclasses.dataclass(frozen=True)
class ClientWork:
  """What a client does in a round, and what its personal state is.

  Attributes:
    build_update: builds, inside a TF computation, the client's
      `(W, P, dataset[, input]) -> client_result(...)` `tf.function`; the
      fourth argument is the value of the extension `input_from` names.
    personal_type: the type P of one client's personal state.
    initial_personal_state: `(client_id, W) -> P` (NumPy) of a new client.
    assemble: `(W, P) -> ModelWeights` of the model a client is evaluated
      with (`evaluation.per_client`).
    evaluation_model: that model's spec; None: the composition's model.
    input_from: the name of an `Extension` whose `client_input` the update
      takes (LINDT's on-detection mode takes the NFL flag); None: none.
    takes_whole_client_data: the update takes a client's whole round data and
      truncates its training itself (`PersonalizedProcess`).
  """

  build_update: Callable[[], Callable[..., Any]]
  personal_type: tff.Type
  initial_personal_state: process_lib.InitialPersonalStateFn
  assemble: per_client.AssembleFn
  evaluation_model: Optional[model_spec.ModelSpec] = None
  input_from: Optional[str] = None
  takes_whole_client_data: bool = False


class Extension:
  """A part of the server state updated every round (e.g. the NFL detector).

  Its state entries and metrics sit under `name` (more entries are allowed,
  each under its own key).
  """

  name: str
  # The type of `client_input`'s value, for a client work that takes it.
  client_input_type: Optional[tff.Type] = None

  def client_outputs(self, update, update_weight) -> dict:
    """Extra client outputs (TF, in the client's computation), e.g. a norm."""
    del update, update_weight
    return {}

  def initialize(self) -> dict:
    """{key: value@SERVER} of its initial state (in a federated computation)."""
    raise NotImplementedError

  def client_input(self, state) -> Any:
    """A value@SERVER broadcast to a client work that asks for it."""
    raise NotImplementedError(f'{self.name} sends clients nothing.')

  def next(self, state, client_outputs, aggregate, shared_type) -> tuple[dict, dict]:
    """({key: new state@SERVER}, {key: metrics@SERVER}) after a round.

    `aggregate` is the aggregated update@SERVER, or None in a process
    without an aggregator.
    """
    raise NotImplementedError


@dataclasses.dataclass(frozen=True)
class Composition:
  """The parts of a personalized process (module docstring).

  Attributes:
    model: the task's model (its data type and metrics).
    initial_shared_weights: W at round 0 (NumPy `ModelWeights`).
    client_work: what each client does.
    aggregator: weighted aggregation of the updates; None: no aggregation
      and no server update (Local: W stays the initial model).
    server_learning_rate: the server SGD's learning rate on the aggregate.
    attack_boost: the model-replacement attackers' factor (`attacks`).
    extensions: parts of the server state updated from the round.
    sends_updates: whether clients send the server an update that moves a
      model (not so for Local; update attacks then have no effect).
  """

  model: model_spec.ModelSpec
  initial_shared_weights: ModelWeights
  client_work: ClientWork
  aggregator: Optional[tff.aggregators.WeightedAggregationFactory] = dataclasses.field(
      default_factory=tff.aggregators.MeanFactory
  )
  server_learning_rate: float = 1.0
  attack_boost: float = 1.0
  extensions: Sequence[Extension] = ()
  sends_updates: bool = True

  def extension(self, name: str) -> Optional[Extension]:
    return next((e for e in self.extensions if e.name == name), None)


def _client_input_type(keras_model_fn) -> tff.Type:
  with tf.Graph().as_default():
    data_type = tff.SequenceType(tff.types.tensorflow_to_type(keras_model_fn().input_spec))
  return tff.StructWithPythonType(
      [('data', data_type), ('role', np.int32), ('seed', np.int64)], collections.OrderedDict
  )


def _client_update(composition: Composition, shared_type: tff.Type, input_type: tff.Type,
                   extra_type: Optional[tff.Type]) -> tff.Computation:
  """The client's steps 2 (module docstring) as a TF computation."""
  work = composition.client_work

  def body(shared_weights, personal_state, client_input, *extra):
    result = work.build_update()(shared_weights, personal_state, client_input['data'], *extra)
    result['update'] = update_attacks.attacked_update(
        result['update'], client_input['role'], client_input['seed'], composition.attack_boost
    )
    for extension in composition.extensions:
      result.update(extension.client_outputs(result['update'], result['update_weight']))
    return result

  types = (shared_type, work.personal_type, input_type)
  if extra_type is None:
    return tff.tensorflow.computation(lambda w, p, c: body(w, p, c), *types)
  return tff.tensorflow.computation(lambda w, p, c, e: body(w, p, c, e), *types, extra_type)


def _initialize_fn(composition: Composition, aggregation, finalizer) -> tff.Computation:
  """`( -> S@SERVER)`: W0, the aggregator's and finalizer's states, the extensions'."""
  initial_weights_fn = process_lib.constant_computation(composition.initial_shared_weights)

  @tff.federated_computation
  def initialize_fn():
    state = collections.OrderedDict(
        global_model_weights=tff.federated_eval(initial_weights_fn, tff.SERVER)
    )
    if aggregation is not None:
      state['aggregator'] = aggregation.initialize()
      state['finalizer'] = finalizer.initialize()
    for extension in composition.extensions:
      state.update(extension.initialize())
    return tff.federated_zip(state)

  return initialize_fn


def _server_part_fn(composition: Composition, aggregation, finalizer, shared_type):
  """Steps 3-5 (module docstring): `(state, client results) -> (S, M)`, both
  @SERVER; the clients' personal states are not read."""
  with tf.Graph().as_default():
    metrics_aggregation = tff.learning.metrics.sum_then_finalize(
        composition.model.tff_model_fn().metric_finalizers()
    )

  def server_part(state, client_outputs):
    new_state = collections.OrderedDict(global_model_weights=state.global_model_weights)
    metrics = collections.OrderedDict(
        client_work=tff.federated_zip(
            collections.OrderedDict(train=metrics_aggregation(client_outputs.model_output))
        )
    )
    aggregate = None
    if aggregation is not None:
      aggregated = aggregation.next(
          state.aggregator, client_outputs.update, client_outputs.update_weight
      )
      finalized = finalizer.next(state.finalizer, state.global_model_weights, aggregated.result)
      aggregate = aggregated.result
      new_state.update(
          global_model_weights=finalized.result, aggregator=aggregated.state,
          finalizer=finalized.state,
      )
      metrics.update(aggregator=aggregated.measurements, finalizer=finalized.measurements)
    metrics['non_finite_clients'] = tff.federated_sum(client_outputs.non_finite)
    for extension in composition.extensions:
      extension_state, extension_metrics = extension.next(
          state, client_outputs, aggregate, shared_type
      )
      new_state.update(extension_state)
      metrics.update(extension_metrics)
    return tff.federated_zip(new_state), tff.federated_zip(metrics)

  return server_part


def _client_input(dataset, role, seed):
  return collections.OrderedDict(data=dataset, role=np.int32(role), seed=np.int64(seed))


def compose_personalized_process(composition: Composition) -> process_lib.PersonalizedProcess:
  """The `PersonalizedProcess` of `composition` (module docstring)."""
  model, work = composition.model, composition.client_work
  shared_type = weights_type(composition.initial_shared_weights)
  input_type = _client_input_type(model.tff_model_fn)
  source = None
  if work.input_from is not None:
    source = composition.extension(work.input_from)
    if source is None:
      raise ValueError(f'The client work takes the input of {work.input_from!r}, which is absent.')
  aggregation = finalizer = None
  if composition.aggregator is not None:
    aggregation = composition.aggregator.create(shared_type.trainable, tff.TensorType(np.float32))
    finalizer = tff.learning.templates.build_apply_optimizer_finalizer(
        tff.learning.optimizers.build_sgdm(composition.server_learning_rate), shared_type
    )
  initialize_fn = _initialize_fn(composition, aggregation, finalizer)
  state_type = initialize_fn.type_signature.result
  client_update = _client_update(
      composition, shared_type, input_type, None if source is None else source.client_input_type
  )

  def client_part(state, client_data, personal_states):
    """{client_update's result}@CLIENTS (steps 1-2)."""
    args = (tff.federated_broadcast(state.global_model_weights), personal_states, client_data)
    if source is not None:
      args += (tff.federated_broadcast(source.client_input(state)),)
    return tff.federated_map(client_update, args)

  next_fn, split_round = process_lib.build_round(
      state_type, tff.FederatedType(input_type, tff.CLIENTS),
      tff.FederatedType(work.personal_type, tff.CLIENTS), client_update.type_signature.result,
      client_part, _server_part_fn(composition, aggregation, finalizer, shared_type),
  )

  @tff.tensorflow.computation(state_type.member)
  def get_model_weights(state):
    return state['global_model_weights']

  evaluation_args = (
      (work.evaluation_model or model).tff_model_fn, work.personal_type, work.assemble,
      shared_type,
  )
  return process_lib.PersonalizedProcess(
      initialize_fn,
      next_fn,
      get_model_weights,
      per_client.build_per_client_evaluation(*evaluation_args),
      work.initial_personal_state,
      client_input_fn=_client_input,
      finetuned_evaluation_fn=functools.partial(
          per_client.build_finetuned_evaluation, *evaluation_args
      ),
      sends_updates=composition.sends_updates,
      split_round=split_round,
      takes_whole_client_data=work.takes_whole_client_data,
      # No aggregation and no extension: the server state never changes.
      clients_train_independently=(
          composition.aggregator is None and not composition.extensions
          and work.input_from is None
      ),
  )
