"""User-level differential privacy of the shared update (DP-FedAvg).

McMahan, Ramage, Talwar, Zhang, "Learning Differentially Private Recurrent
Language Models" (ICLR 2018): every client's update is clipped to L2 norm C,
the clipped updates are summed, Gaussian noise N(0, (z C)^2 I) is added to
the sum, and the sum is divided by the fixed number of clients per round K.
So one client moves the mean by at most C / K before noise, and the noise in
the mean has standard deviation z C / K per coordinate.

The mechanism is TFF's `tff.aggregators.DifferentiallyPrivateFactory` over
tensorflow-privacy's DP queries:
  * fixed clipping: `gaussian_fixed(z, K, C)`;
  * adaptive clipping (Andrew, Thakkar, McMahan, Ramaswamy, "Differentially
    Private Learning with Adaptive Clipping", NeurIPS 2021):
    `gaussian_adaptive(z, K, C0, target_quantile)`; C follows a private
    estimate of the target quantile of the update norms, and part of the
    budget z pays for that estimate (the value's own noise multiplier,
    `value_noise_multiplier`, is slightly above z).

DP-FedAvg is unweighted: each sampled client's clipped update counts once,
so the factory ignores the example weights (`as_weighted_aggregator`). It
applies to whatever an algorithm sends (FedAvg's model update, FedPer's base
update, Ditto's global update); personal variables never leave the client
and take no noise.

The noise is TFF's unseeded draw unless `noise_seed` is given: then
`privacy.seeded_query` draws it from that seed and the aggregator's state, so
a simulation repeats (and resumes) with the same noise; with adaptive
clipping the noise of the clip's quantile estimate too (the same query as
`gaussian_adaptive`'s, TFF's parameters). Only for simulations: whoever
knows the seed can remove the noise.

  aggregate: (<{U}@CLIENTS, {float32}@CLIENTS> -> mean of the clipped U + noise @SERVER)
"""

import dataclasses
import math
from typing import Optional

import tensorflow_federated as tff
from tensorflow_federated.python.aggregators import differential_privacy as tff_dp
import tensorflow_privacy as tfp

from tff_personal.privacy import seeded_query

# Seed streams of a round's seeded DP noise: the update, the NFL detector's
# squared norms, and adaptive clipping's count of unclipped updates.
UPDATE_NOISE_STREAM, DETECTOR_NOISE_STREAM, CLIPPED_COUNT_NOISE_STREAM = 0, 1, 2
# TFF's `gaussian_adaptive` default: the clip moves by at most a factor e^0.2 a round.
ADAPTIVE_CLIP_LEARNING_RATE = 0.2


@dataclasses.dataclass(frozen=True)
class DpSetting:
  """Fixed-clipping DP of an aggregate: z, C and K."""

  noise_multiplier: float
  clip_norm: float
  clients_per_round: int
  noise_seed: Optional[int] = None

  def expected_noise_squared_norm(self, num_parameters: int) -> float:
    return expected_noise_squared_norm(
        num_parameters, self.noise_multiplier, self.clip_norm, self.clients_per_round
    )


def value_noise_multiplier(
    noise_multiplier: float, clients_per_round: int, adaptive: bool
) -> float:
  """The noise multiplier of the update itself (above z with adaptive clipping)."""
  if not adaptive or noise_multiplier == 0:
    return float(noise_multiplier)
  value, _ = tff_dp.adaptive_clip_noise_params(
      noise_multiplier, float(clients_per_round), None
  )
  return float(value)


def build_dp_aggregator(
    *,
    noise_multiplier: float,
    clients_per_round: int,
    clip_norm: Optional[float] = None,
    adaptive: bool = False,
    initial_clip_norm: float = 0.1,
    target_quantile: float = 0.5,
    noise_seed: Optional[int] = None,
) -> tff.aggregators.WeightedAggregationFactory:
  """DP-FedAvg's aggregator (module docstring), weights ignored.

  Args:
    noise_multiplier: z >= 0 (0: clipping only).
    clients_per_round: K, the fixed denominator of the mean.
    clip_norm: C > 0 of fixed clipping.
    adaptive: clip adaptively to `target_quantile` starting at
      `initial_clip_norm` (then `clip_norm` must be None).
    initial_clip_norm: C0 of adaptive clipping.
    target_quantile: the quantile of update norms adaptive clipping tracks.
    noise_seed: draw the noise from this seed (module docstring); None:
      TFF's unseeded noise.

  Raises:
    ValueError: for a negative z, a non-positive C or K, or a missing or
      doubly given clipping choice.
  """
  if noise_multiplier < 0:
    raise ValueError(f'The noise multiplier must be >= 0, got {noise_multiplier}.')
  if clients_per_round < 1:
    raise ValueError(f'clients_per_round must be >= 1, got {clients_per_round}.')
  if adaptive:
    if clip_norm is not None:
      raise ValueError('Give a fixed clip norm or adaptive clipping, not both.')
    if not 0 < target_quantile < 1 or initial_clip_norm <= 0:
      raise ValueError(
          'Adaptive clipping needs 0 < target_quantile < 1 and initial_clip_norm > 0.'
      )
    factory = _gaussian_adaptive(
        noise_multiplier, clients_per_round, initial_clip_norm, target_quantile, noise_seed
    )
  else:
    if clip_norm is None or not clip_norm > 0:
      raise ValueError(f'The clip norm must be > 0, got {clip_norm}.')
    factory = _gaussian_fixed(
        noise_multiplier, clients_per_round, clip_norm, noise_seed, UPDATE_NOISE_STREAM
    )
  return tff.aggregators.as_weighted_aggregator(factory)


def _gaussian_fixed(
    noise_multiplier: float, clients_per_round: int, clip_norm: float,
    noise_seed: Optional[int], stream: int,
) -> tff.aggregators.UnweightedAggregationFactory:
  """TFF's `gaussian_fixed` DP mean; with `noise_seed`, its seeded twin."""
  if noise_seed is None:
    return tff.aggregators.DifferentiallyPrivateFactory.gaussian_fixed(
        noise_multiplier, float(clients_per_round), clip_norm
    )
  # The query `gaussian_fixed` builds, with the seeded sum inside.
  query = tfp.NormalizedQuery(
      seeded_query.SeededGaussianSumQuery(
          clip_norm, clip_norm * noise_multiplier, (noise_seed, stream)
      ),
      denominator=float(clients_per_round),
  )
  return tff.aggregators.DifferentiallyPrivateFactory(query)


def _gaussian_adaptive(
    noise_multiplier: float, clients_per_round: int, initial_clip_norm: float,
    target_quantile: float, noise_seed: Optional[int],
) -> tff.aggregators.UnweightedAggregationFactory:
  """TFF's `gaussian_adaptive` DP mean; with `noise_seed`, its seeded twin."""
  if noise_seed is None:
    return tff.aggregators.DifferentiallyPrivateFactory.gaussian_adaptive(
        noise_multiplier, float(clients_per_round), initial_l2_norm_clip=initial_clip_norm,
        target_unclipped_quantile=target_quantile, learning_rate=ADAPTIVE_CLIP_LEARNING_RATE,
    )
  # The query `gaussian_adaptive` builds, with both noises seeded.
  value_noise, clipped_count_stddev = tff_dp.adaptive_clip_noise_params(
      noise_multiplier, float(clients_per_round), None
  )
  query = tfp.NormalizedQuery(
      seeded_query.SeededQuantileAdaptiveClipSumQuery(
          initial_clip_norm, value_noise, target_quantile, ADAPTIVE_CLIP_LEARNING_RATE,
          clipped_count_stddev, float(clients_per_round),
          sum_seed=(noise_seed, UPDATE_NOISE_STREAM),
          count_seed=(noise_seed, CLIPPED_COUNT_NOISE_STREAM),
      ),
      denominator=float(clients_per_round),
  )
  return tff.aggregators.DifferentiallyPrivateFactory(query)


def build_squared_norm_aggregator(setting: DpSetting) -> tff.aggregators.UnweightedAggregationFactory:
  """The NFL detector's DP mean of the clients' squared update norms.

  TFF's Gaussian DP mean of one scalar per client, clipped to C^2, with
  noise multiplier k z (k = `accounting.DETECTOR_NOISE_FACTOR`), divided by
  K: the detector's statistic is released under DP like the update, and the
  accountant counts it (`privacy/accounting.py`).
  """
  from tff_personal.privacy import accounting  # pylint: disable=g-import-not-at-top

  return _gaussian_fixed(
      accounting.DETECTOR_NOISE_FACTOR * setting.noise_multiplier,
      setting.clients_per_round,
      setting.clip_norm**2,
      setting.noise_seed,
      DETECTOR_NOISE_STREAM,
  )


def noise_stddev_of_mean(
    noise_multiplier: float, clip_norm: float, clients_per_round: int
) -> float:
  """Per-coordinate standard deviation of the noise in the mean: z C / K."""
  return noise_multiplier * clip_norm / clients_per_round


def expected_noise_squared_norm(
    num_parameters: int, noise_multiplier: float, clip_norm: float, clients_per_round: int
) -> float:
  """E||noise||^2 in the aggregated mean: d (z C / K)^2.

  The NFL detector subtracts it from its divergence statistic. With adaptive
  clipping pass `value_noise_multiplier(...)` and the round's clip norm.
  """
  if num_parameters < 0:
    raise ValueError(f'num_parameters must be >= 0, got {num_parameters}.')
  return num_parameters * noise_stddev_of_mean(
      noise_multiplier, clip_norm, clients_per_round
  ) ** 2


def num_parameters(value_type: tff.Type) -> int:
  """The number of scalars in a (structure of) tensor type(s)."""
  if isinstance(value_type, tff.StructType):
    return sum(num_parameters(t) for t in tff.structure.flatten(value_type))
  return math.prod(value_type.shape)
