"""The NFL detector in the server state of any composed process.

`with_detector(composition, config, dp_setting)` adds LINDT's detector of
Negative Federated Learning (`nfl.detector` states the statistic and the
state machine) to a `personal.compose.Composition`, whatever its algorithm:

  * each client also sends ||update||^2 (`update_squared_norm`; under DP
    the norm of the update DP clips, at most C^2);
  * the server averages those scalars (weights n_j; under DP by TFF's
    Gaussian DP mean, state `nfl_norm_aggregator`, so the statistic is
    released privately too) and runs `detector.update_state` on them, the
    aggregated update and the round's shared weights: state `nfl`, metrics
    `nfl/w_div`, `nfl/windowed_w_div`, `nfl/flagged`, ...

In a process without an aggregator (Local) the detector averages the
clients' updates itself, weighted as FedAvg would, and w is the initial
model every client started from. A client work can take the flag raised so
far (`Composition.client_work.input_from = 'nfl'`; LINDT's on-detection mode).
"""

import collections
import dataclasses
from typing import Optional

from absl import logging
import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_personal.aggregators import dp
from tff_personal.nfl import detector as detector_lib
from tff_personal.personal import compose
from tff_personal.personal import process as process_lib
from tff_personal.privacy import accounting

NAME = 'nfl'


def noise_to_signal(dp_setting: Optional[dp.DpSetting],
                    config: Optional[detector_lib.DetectorConfig], num_parameters: int) -> float:
  """`detector.noise_to_signal` under fixed-clipping DP for a shared model of
  `num_parameters` weights: over the detector's window, or over one round
  without the detector (0 without DP)."""
  if dp_setting is None:
    return 0.0
  return detector_lib.noise_to_signal(
      num_parameters, dp_setting.noise_multiplier, dp_setting.clip_norm,
      dp_setting.clients_per_round, accounting.DETECTOR_NOISE_FACTOR,
      config.window if config else 1,
  )


class Detection(compose.Extension):
  """The detector as a `compose.Extension` (module docstring)."""

  name = NAME
  client_input_type = tff.TensorType(np.int32)  # The flag raised so far.

  def __init__(self, config: detector_lib.DetectorConfig, dp_setting: Optional[dp.DpSetting],
               shared_type: tff.Type):
    self._dp_setting = dp_setting
    if dp_setting is not None:
      num_parameters = dp.num_parameters(shared_type.trainable)
      ratio = noise_to_signal(dp_setting, config, num_parameters)
      config = dataclasses.replace(
          config, noise_squared_norm=dp_setting.expected_noise_squared_norm(num_parameters),
          noise_to_signal=ratio,
      )
      if ratio > 1:
        logging.warning(
            'NFL detector: under this DP noise its windowed statistic has a noise standard'
            ' deviation %.1fx its largest possible value; it cannot tell divergence from'
            ' noise (nfl/detector.py, noise_to_signal). %s', ratio,
            'It flags NFL at its first armed round.' if config.blind
            else 'It will not flag on this noise (--nonfl_flag_when_blind).',
        )
    self.config = config
    self._initial_state_fn = process_lib.constant_computation(detector_lib.initial_state(config))
    self._norm_aggregation = None
    if dp_setting is not None:
      self._norm_aggregation = dp.build_squared_norm_aggregator(dp_setting).create(
          tff.TensorType(np.float32)
      )
    state_type = self._initial_state_fn.type_signature.result

    @tff.tensorflow.computation(
        state_type, np.float32, shared_type.trainable, shared_type, np.float32
    )
    def update(detector_state, mean_squared_norm, aggregate, weights, concentration):
      return detector_lib.update_state(
          detector_state, mean_squared_norm, detector_lib.squared_norm(aggregate),
          detector_lib.squared_norm(weights.trainable), self.config, concentration,
      )

    @tff.tensorflow.computation(np.float32, np.float32)
    def weight_concentration(mean_weight_by_weight, total_weight):
      return detector_lib.weight_concentration(mean_weight_by_weight, total_weight)

    self._update, self._weight_concentration = update, weight_concentration

  def client_outputs(self, update, update_weight) -> dict:
    norm = detector_lib.squared_norm(update)
    if self._dp_setting is not None:  # The norm of the update DP clips (its mean clips it too).
      norm = tf.minimum(norm, self._dp_setting.clip_norm**2)
    return {'update_squared_norm': norm, 'statistic_weight': update_weight}

  def initialize(self) -> dict:
    state = {NAME: tff.federated_eval(self._initial_state_fn, tff.SERVER)}
    if self._norm_aggregation is not None:
      state['nfl_norm_aggregator'] = self._norm_aggregation.initialize()
    return state

  def client_input(self, state):
    return getattr(state, NAME).flagged

  def next(self, state, client_outputs, aggregate, shared_type) -> tuple[dict, dict]:
    del shared_type  # Bound at construction.
    new_state = {}
    weights = client_outputs.statistic_weight
    if aggregate is None:  # No aggregator (Local): the clients' mean update.
      aggregate = tff.federated_mean(client_outputs.update, weight=weights)
    if self._norm_aggregation is None:
      mean_squared_norm = tff.federated_mean(client_outputs.update_squared_norm, weight=weights)
      concentration = tff.federated_map(self._weight_concentration, (
          tff.federated_mean(weights, weight=weights), tff.federated_sum(weights)
      ))
    else:
      norm_aggregated = self._norm_aggregation.next(
          state.nfl_norm_aggregator, client_outputs.update_squared_norm
      )
      mean_squared_norm = norm_aggregated.result
      new_state['nfl_norm_aggregator'] = norm_aggregated.state
      # DP-FedAvg's mean is unweighted over the fixed K: sum alpha^2 = 1/K.
      concentration = tff.federated_value(
          np.float32(1.0 / self._dp_setting.clients_per_round), tff.SERVER
      )
    detected = tff.federated_map(self._update, (
        getattr(state, NAME), mean_squared_norm, aggregate, state.global_model_weights,
        concentration,
    ))
    new_state = collections.OrderedDict([(NAME, detected[0])] + list(new_state.items()))
    return new_state, {NAME: detected[1]}


def with_detector(composition: compose.Composition, config: detector_lib.DetectorConfig,
                  dp_setting: Optional[dp.DpSetting] = None) -> compose.Composition:
  """`composition` with the NFL detector in its server state (module docstring)."""
  if composition.extension(NAME) is not None:
    raise ValueError('The composition has an NFL detector already.')
  detection = Detection(
      config, dp_setting, compose.weights_type(composition.initial_shared_weights)
  )
  return dataclasses.replace(
      composition, extensions=tuple(composition.extensions) + (detection,)
  )
