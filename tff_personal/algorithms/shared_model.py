"""The orchestration shared by algorithms with a global model and personal state.

FedPer and Ditto (and LINDT, APFL later) differ only in what a client does;
the rest is FedAvg's composition (McMahan et al. 2017), written once here:

  1. broadcast the shared weights W to the round's clients;
  2. each client, given <data=D*, role, seed>, runs `client_update(W, P, D)`
     and returns <update = W - W' (its shared delta), update_weight (n_j, 0
     if non-finite), personal_state = P', model_output (unfinalized
     metrics), non_finite>; its role then selects the update it sends
     (`attacks.update_attacks`: honest, random noise, or boosted), so honest
     and malicious clients run this one computation;
  3. aggregate the updates with a weighted `tff.aggregators` factory (mean
     by default, or a robust one);
  4. apply the aggregate with the server's SGD (TFF's apply-optimizer
     finalizer, which also rejects a non-finite aggregate).

  initialize: ( -> <global_model_weights=W, aggregator, finalizer>@SERVER)
  next: (<S@SERVER, {<data=D*,role=int32,seed=int64>}@CLIENTS, {P}@CLIENTS>
         -> <S@SERVER, {P}@CLIENTS, M@SERVER>)
  M = <client_work=<train=...>, aggregator, finalizer, non_finite_clients>

With an NFL detector (`nfl.detector`), each client also sends the scalar
||update||^2, the server state gains the detector's state (`nfl`) and M its
metrics (`nfl/w_div`, `nfl/flagged`, ...). Under DP the scalars are averaged
by TFF's Gaussian DP mean (`aggregators.dp.build_squared_norm_aggregator`,
state `nfl_norm_aggregator`), so everything the round releases is private.

Only `update` (and that scalar) and the metrics leave the clients;
`personal_state` stays at CLIENTS.

The process also offers the round as two calls (`process.SplitRound`), for
TFF's mergeable context on several workers, which would train every client
twice in `next`:
  client_phase: (<S@SERVER, {C}@CLIENTS, {P}@CLIENTS> -> {R}@CLIENTS)   steps 1-2
  server_phase: (<S@SERVER, {R without personal_state}@CLIENTS>
                 -> <S@SERVER, M@SERVER>)                              steps 3-4
R is step 2's result; the updates stay client-placed until the server
phase aggregates them.
"""

import collections
import dataclasses
import functools
from typing import Any, Callable, Optional

from absl import logging
import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_personal.aggregators import dp
from tff_personal.attacks import update_attacks
from tff_personal.evaluation import per_client
from tff_personal.models import model_spec
from tff_personal.nfl import detector as detector_lib
from tff_personal.personal import process as process_lib
from tff_personal.training import client_training

ModelWeights = tff.learning.models.ModelWeights


def weights_type(weights: ModelWeights) -> tff.Type:
  """The TFF type of a NumPy `ModelWeights`."""
  return process_lib.constant_computation(weights).type_signature.result


def client_result(update, num_examples, new_personal, old_personal, model):
  """The `client_update` result; a non-finite client sends nothing, keeps P.

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


@dataclasses.dataclass(frozen=True)
class ServerOptions:
  """The server side every algorithm on this orchestration shares.

  Attributes:
    learning_rate: the server SGD's learning rate on the aggregated update
      (1.0: plain averaging).
    seed: seeds the initial shared weights (and, with a client's id, any
      personal weights a client starts from).
    model_aggregator: weighted aggregation of the updates (default: mean;
      a robust or DP factory from `aggregators`).
    attack_boost: the model-replacement attackers' factor (`attacks`).
    nfl_detector: adds the NFL detector (`nfl.detector`) to the server state
      update.
    dp_setting: the fixed-clipping DP of `model_aggregator`: the NFL
      statistic then uses the clipped norms, is itself a DP mean, and adds
      back the noise's expected squared norm (`dp_noise_to_signal` reads it
      with or without the detector).
  """

  learning_rate: float = 1.0
  seed: int = 0
  model_aggregator: Optional[tff.aggregators.WeightedAggregationFactory] = None
  attack_boost: float = 1.0
  nfl_detector: Optional[detector_lib.DetectorConfig] = None
  dp_setting: Optional[dp.DpSetting] = None


def dp_noise_to_signal(server: ServerOptions, num_parameters: int) -> float:
  """`nfl.detector.noise_to_signal` under the server's fixed-clipping DP, for a
  shared model of `num_parameters` weights: over the detector's window, or
  over one round without the detector (0 without DP)."""
  if server.dp_setting is None:
    return 0.0
  from tff_personal.privacy import accounting  # pylint: disable=g-import-not-at-top

  setting = server.dp_setting
  return detector_lib.noise_to_signal(
      num_parameters, setting.noise_multiplier, setting.clip_norm, setting.clients_per_round,
      accounting.DETECTOR_NOISE_FACTOR, server.nfl_detector.window if server.nfl_detector else 1,
  )


def build_process(
    model: model_spec.ModelSpec,
    *,
    initial_shared_weights: ModelWeights,
    personal_type: tff.Type,
    client_update_fn: Callable[[], Callable[..., Any]],
    assemble_fn: per_client.AssembleFn,
    initial_personal_state_fn: process_lib.InitialPersonalStateFn,
    server: ServerOptions,
    evaluation_model: Optional[model_spec.ModelSpec] = None,
    client_takes_nfl_flag: bool = False,
) -> process_lib.PersonalizedProcess:
  """The `PersonalizedProcess` of the module docstring.

  Args:
    model: the task's model (its data type and metrics).
    initial_shared_weights: W at round 0 (NumPy `ModelWeights`).
    personal_type: the type P of one client's personal state.
    client_update_fn: builds, inside a TF computation, the client's
      `(W, P, dataset) -> client_result(...)` function (a `tf.function`).
    assemble_fn: `(W, P) -> ModelWeights` of a client's evaluated model.
    initial_personal_state_fn: P of a client seen for the first time.
    server: the server side (`ServerOptions`; its seed is the caller's, for
      `initial_shared_weights`).
    evaluation_model: the model a client is evaluated with, whose weights
      `assemble_fn` returns (default: `model`).
    client_takes_nfl_flag: the client update also takes the detector's flag
      (int32, broadcast from the server state; LINDT's on-detection mode).
  """
  model_aggregator, attack_boost = server.model_aggregator, server.attack_boost
  nfl_detector, dp_setting = server.nfl_detector, server.dp_setting
  shared_type = weights_type(initial_shared_weights)
  with tf.Graph().as_default():
    keras_model = model.tff_model_fn()
    data_type = tff.SequenceType(tff.types.tensorflow_to_type(keras_model.input_spec))
    metrics_aggregation = tff.learning.metrics.sum_then_finalize(
        keras_model.metric_finalizers()
    )

  input_type = tff.StructWithPythonType(
      [('data', data_type), ('role', np.int32), ('seed', np.int64)],
      collections.OrderedDict,
  )

  if client_takes_nfl_flag and nfl_detector is None:
    raise ValueError('A client update that takes the NFL flag needs the NFL detector.')

  def client_update_body(shared_weights, personal_state, client_input, extra):
    """`extra`: () or (the NFL flag,) for a client update that takes it."""
    result = client_update_fn()(shared_weights, personal_state, client_input['data'], *extra)
    result['update'] = update_attacks.attacked_update(
        result['update'], client_input['role'], client_input['seed'], attack_boost
    )
    if nfl_detector is not None:
      norm = detector_lib.squared_norm(result['update'])
      if dp_setting is not None:  # The norm of the update DP clips (the DP mean clips it too).
        norm = tf.minimum(norm, dp_setting.clip_norm**2)
      result['update_squared_norm'] = norm
      result['statistic_weight'] = result['update_weight']  # Unused under DP.
    return result

  if client_takes_nfl_flag:
    client_update = tff.tensorflow.computation(
        lambda shared_weights, personal_state, client_input, nfl_flag: client_update_body(
            shared_weights, personal_state, client_input, (nfl_flag,)
        ),
        shared_type, personal_type, input_type, np.int32,
    )
  else:
    client_update = tff.tensorflow.computation(
        lambda shared_weights, personal_state, client_input: client_update_body(
            shared_weights, personal_state, client_input, ()
        ),
        shared_type, personal_type, input_type,
    )

  aggregation = (model_aggregator or tff.aggregators.MeanFactory()).create(
      shared_type.trainable, tff.TensorType(np.float32)
  )
  finalizer = tff.learning.templates.build_apply_optimizer_finalizer(
      tff.learning.optimizers.build_sgdm(server.learning_rate), shared_type
  )
  initial_weights_fn = process_lib.constant_computation(initial_shared_weights)

  initial_detector_fn = None
  if nfl_detector is not None and dp_setting is not None:
    num_parameters = dp.num_parameters(shared_type.trainable)
    ratio = dp_noise_to_signal(server, num_parameters)
    nfl_detector = dataclasses.replace(
        nfl_detector, noise_squared_norm=dp_setting.expected_noise_squared_norm(num_parameters),
        noise_to_signal=ratio,
    )
    if ratio > 1:
      logging.warning(
          'NFL detector: under this DP noise its windowed statistic has a noise standard'
          ' deviation %.1fx its largest possible value; it cannot tell divergence from'
          ' noise (nfl/detector.py, noise_to_signal). %s', ratio,
          'It flags NFL at its first armed round.' if nfl_detector.blind
          else 'It will not flag on this noise (--nonfl_flag_when_blind).',
      )
  norm_aggregation = None
  if nfl_detector is not None:
    initial_detector_fn = process_lib.constant_computation(
        detector_lib.initial_state(nfl_detector)
    )
    if dp_setting is not None:  # The statistic is released under DP too.
      norm_aggregation = dp.build_squared_norm_aggregator(dp_setting).create(
          tff.TensorType(np.float32)
      )

  @tff.federated_computation
  def initialize_fn():
    state = collections.OrderedDict(
        global_model_weights=tff.federated_eval(initial_weights_fn, tff.SERVER),
        aggregator=aggregation.initialize(),
        finalizer=finalizer.initialize(),
    )
    if initial_detector_fn is not None:
      state['nfl'] = tff.federated_eval(initial_detector_fn, tff.SERVER)
    if norm_aggregation is not None:
      state['nfl_norm_aggregator'] = norm_aggregation.initialize()
    return tff.federated_zip(state)

  state_type = initialize_fn.type_signature.result

  if nfl_detector is not None:

    @tff.tensorflow.computation(
        state_type.member['nfl'], np.float32, shared_type.trainable, shared_type, np.float32
    )
    def detector_update(detector_state, mean_squared_norm, aggregate, weights, concentration):
      return detector_lib.update_state(
          detector_state,
          mean_squared_norm,
          detector_lib.squared_norm(aggregate),
          detector_lib.squared_norm(weights.trainable),
          nfl_detector,
          concentration,
      )

    @tff.tensorflow.computation(np.float32, np.float32)
    def weight_concentration(mean_weight_by_weight, total_weight):
      return detector_lib.weight_concentration(mean_weight_by_weight, total_weight)

  def client_part(state, client_data, personal_states):
    """{client_update's result}@CLIENTS."""
    client_args = (tff.federated_broadcast(state.global_model_weights), personal_states, client_data)
    if client_takes_nfl_flag:  # The flag the detector raised up to the last round.
      client_args += (tff.federated_broadcast(state.nfl.flagged),)
    return tff.federated_map(client_update, client_args)

  def server_part(state, client_outputs):
    """<new state, metrics>, both @SERVER, from the clients' results (their
    personal states unused)."""
    aggregated = aggregation.next(
        state.aggregator, client_outputs.update, client_outputs.update_weight
    )
    finalized = finalizer.next(state.finalizer, state.global_model_weights, aggregated.result)
    new_state = collections.OrderedDict(
        global_model_weights=finalized.result,
        aggregator=aggregated.state,
        finalizer=finalized.state,
    )
    metrics = collections.OrderedDict(
        client_work=tff.federated_zip(
            collections.OrderedDict(train=metrics_aggregation(client_outputs.model_output))
        ),
        aggregator=aggregated.measurements,
        finalizer=finalized.measurements,
        non_finite_clients=tff.federated_sum(client_outputs.non_finite),
    )
    if nfl_detector is not None:
      if norm_aggregation is None:
        weights = client_outputs.statistic_weight
        mean_squared_norm = tff.federated_mean(client_outputs.update_squared_norm, weight=weights)
        concentration = tff.federated_map(weight_concentration, (
            tff.federated_mean(weights, weight=weights), tff.federated_sum(weights)
        ))
      else:
        norm_aggregated = norm_aggregation.next(
            state.nfl_norm_aggregator, client_outputs.update_squared_norm
        )
        mean_squared_norm = norm_aggregated.result
        # DP-FedAvg's mean is unweighted over the fixed K: sum alpha^2 = 1/K.
        concentration = tff.federated_value(
            np.float32(1.0 / dp_setting.clients_per_round), tff.SERVER
        )
      detected = tff.federated_map(detector_update, (
          state.nfl, mean_squared_norm, aggregated.result, state.global_model_weights,
          concentration,
      ))
      new_state['nfl'], metrics['nfl'] = detected[0], detected[1]
      if norm_aggregation is not None:
        new_state['nfl_norm_aggregator'] = norm_aggregated.state
    return tff.federated_zip(new_state), tff.federated_zip(metrics)

  client_data_type = tff.FederatedType(input_type, tff.CLIENTS)
  personal_states_type = tff.FederatedType(personal_type, tff.CLIENTS)

  next_fn, split_round = process_lib.build_round(
      state_type, client_data_type, personal_states_type, client_update.type_signature.result,
      client_part, server_part,
  )

  @tff.tensorflow.computation(state_type.member)
  def get_model_weights(state):
    return state['global_model_weights']

  evaluation_args = (
      (evaluation_model or model).tff_model_fn, personal_type, assemble_fn, shared_type
  )
  evaluate = per_client.build_per_client_evaluation(*evaluation_args)

  def client_input(dataset, role, seed):
    return collections.OrderedDict(data=dataset, role=np.int32(role), seed=np.int64(seed))

  return process_lib.PersonalizedProcess(
      initialize_fn,
      next_fn,
      get_model_weights,
      evaluate,
      initial_personal_state_fn,
      client_input_fn=client_input,
      finetuned_evaluation_fn=functools.partial(
          per_client.build_finetuned_evaluation, *evaluation_args
      ),
      split_round=split_round,
  )
