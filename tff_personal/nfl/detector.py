"""Server-side detection of Negative Federated Learning (NFL) from weight divergence.

LINDT (Lin, Shou, Chen, Chen, Wu, "LINDT: Tackling Negative Federated
Learning with Local Adaptation", arXiv 2011.11160) flags NFL when the
clients' models keep diverging from their aggregate. Our copy of the paper
lacks its equations; these are the ones implemented.

Divergence from aggregates only. With Delta_i the update client i sends,
alpha_i its aggregation weight (sum alpha_i = 1) and Delta_bar = sum alpha_i
Delta_i the aggregate:

  D = sum_i alpha_i ||Delta_i - Delta_bar||^2
    = sum_i alpha_i ||Delta_i||^2 - ||Delta_bar||^2          (identity)

so each client reports one scalar ||Delta_i||^2 next to its update and the
server never sees an individual update. Since w_i - w_bar = -(Delta_i -
Delta_bar), D is also the divergence of the clients' models w_i from their
average. Under DP the aggregate carries Gaussian noise n with E||n||^2 = N0
(`aggregators.dp.expected_noise_squared_norm`), E||Delta_bar + n||^2 =
||Delta_bar||^2 + N0, so N0 is added back: D = mean ||Delta_i||^2 -
(||aggregate||^2 - N0), floored at 0; with DP the clients report the norm of
their clipped update, and mean ||Delta_i||^2 is itself a Gaussian DP mean
(`aggregators.dp.build_squared_norm_aggregator`; its noise has mean 0, so
nothing is added back for it).

Cohort-size correction (`cohort_correction`, on by default; a change to the
plain cohort formula above). D is the spread of this round's cohort around its own
mean, and a small cohort's mean sits closer to its members: for cohort
members drawn from a population whose updates spread with s^2 = E||Delta -
E Delta||^2, E D = (1 - sum_i alpha_i^2) s^2, i.e. (K - 1)/K s^2 for K
equally weighted clients (half of s^2 at K = 2). The detector divides D by
1 - sum_i alpha_i^2, an unbiased estimate of s^2 whatever the cohort size,
so one threshold serves rounds of 2 clients and of 20. sum_i alpha_i^2 comes
from aggregates too: (sum_i n_i^2 / sum_i n_i) / sum_i n_i for example
weights n_i, 1/K under DP (DP-FedAvg's fixed denominator K); 1/sum_i
alpha_i^2 is reported as `effective_clients`. With a single client (sum 1)
D is 0 and stays 0.

  w_div = sqrt(D) / ||w||     (w: the shared weights the round started from)

is the round's statistic (LINDT's Delta; the metric `nfl/w_div`, its windowed mean
`nfl/windowed_w_div`).

How much DP noise the detector can see through (`noise_to_signal`): with K
clients a round, noise multiplier z and clip norm C, the aggregate's noise n
has d coordinates of standard deviation s = z C / K, so ||n||^2 - N0 has
standard deviation sqrt(2 d) s^2, the cross term 2 <Delta_bar, n> at most
2 C s, and the DP mean of the squared norms k z C^2 / K; while D can be at
most C^2 (every clipped ||Delta_i|| <= C), K/(K-1) C^2 corrected. At z = 1,
C = 1, K = 10 that noise is 3.4x (65,322 weights, Shakespeare's char RNN) to
6x (215,370, the fmnist CNN) the largest D a round: no threshold can tell
divergence from noise, and `nfl.detection` logs a warning when the ratio over
a window exceeds 1.

A blind detector flags (`flag_when_blind`, on by default; our addition):
when that ratio over the window exceeds 1, the detector flags NFL at the
first round it may (after the warm-up, once the window is full), whatever
w_div says. The server cannot certify that the federation helps its clients
when its own noise hides any divergence, and at that noise the global model
is itself mostly noise (in the NFL table's DP-noise-large cells, fmnist and
Shakespeare, FedAvg's beta was negative in every seed); flagging fails
closed, so LINDT's on_detection mode turns on local adaptation. The verdict
follows from z, C, K, d and the window alone, before any round runs.

Detector: after `warmup_rounds` rounds, once the last `window` values of
w_div are in, NFL is flagged at the first round whose windowed mean is not
below `threshold`; the flag then stays, with the round it was raised. Its
state (the window, the flag, the round flagged) is part of the server state,
so it is checkpointed and resumed with it.
"""

import collections
import dataclasses

import numpy as np
import tensorflow as tf


@dataclasses.dataclass(frozen=True)
class DetectorConfig:
  """The detector's settings (module docstring).

  Attributes:
    warmup_rounds: r', rounds before any flag.
    window: rounds in the moving mean of w_div.
    threshold: epsilon; NFL when the windowed w_div stays >= epsilon.
    noise_squared_norm: E||n||^2 of the aggregate's DP noise (0 without DP).
    cohort_correction: divide D by 1 - sum_i alpha_i^2 (module docstring).
    noise_to_signal: `noise_to_signal` over the window (0 without DP).
    flag_when_blind: flag at the first armed round when noise_to_signal > 1
      (module docstring).
  """

  warmup_rounds: int
  window: int
  threshold: float
  noise_squared_norm: float = 0.0
  cohort_correction: bool = True
  noise_to_signal: float = 0.0
  flag_when_blind: bool = True

  @property
  def blind(self) -> bool:
    """Flags at the first armed round: the DP noise hides any divergence."""
    return self.flag_when_blind and self.noise_to_signal > 1

  def __post_init__(self):
    if self.warmup_rounds < 0 or self.window < 1 or self.threshold < 0:
      raise ValueError(
          'The NFL detector needs warmup_rounds >= 0, window >= 1 and threshold'
          f' >= 0, got {self.warmup_rounds}, {self.window}, {self.threshold}.'
      )


def noise_to_signal(num_parameters: int, noise_multiplier: float, clip_norm: float,
                    clients_per_round: int, norm_noise_factor: float, window: int = 1) -> float:
  """Standard deviation of the DP noise in D (averaged over `window` rounds)
  over the largest D a round can have (module docstring); 0 without noise."""
  s = noise_multiplier * clip_norm / clients_per_round
  variance = (
      2 * num_parameters * s**4 + (2 * clip_norm * s) ** 2
      + (norm_noise_factor * noise_multiplier * clip_norm**2 / clients_per_round) ** 2
  )
  largest = clip_norm**2
  if clients_per_round > 1:
    largest *= clients_per_round / (clients_per_round - 1)
  return float(np.sqrt(variance / window) / largest)


def initial_state(config: DetectorConfig) -> collections.OrderedDict:
  """The detector's state before round 1 (NumPy)."""
  return collections.OrderedDict(
      window=np.zeros([config.window], np.float32),
      round_num=np.int32(0),
      flagged=np.int32(0),
      round_flagged=np.int32(-1),
  )


def squared_norm(structure) -> tf.Tensor:
  """sum of squares of every tensor in the structure (float32)."""
  return tf.add_n([tf.reduce_sum(tf.square(tf.cast(t, tf.float32))) for t in tf.nest.flatten(structure)])


def divergence(mean_squared_norm, aggregate_squared_norm, noise_squared_norm=0.0):
  """D of the module docstring, floored at 0 (rounding, noise)."""
  return tf.maximum(
      mean_squared_norm - (aggregate_squared_norm - noise_squared_norm), 0.0
  )


def weight_concentration(mean_weight_by_weight, total_weight):
  """sum_i alpha_i^2 = (sum_i n_i^2 / sum_i n_i) / sum_i n_i, from two aggregates."""
  return tf.math.divide_no_nan(mean_weight_by_weight, total_weight)


def update_state(state, mean_squared_norm, aggregate_squared_norm, weights_squared_norm,
                 config: DetectorConfig, concentration=0.0):
  """One round of the detector (TF); returns (new state, metrics).

  `concentration` is sum_i alpha_i^2 of the round's aggregation weights
  (`weight_concentration`); it only matters with `config.cohort_correction`.
  """
  concentration = tf.cast(concentration, tf.float32)
  spread = divergence(mean_squared_norm, aggregate_squared_norm, config.noise_squared_norm)
  if config.cohort_correction:
    spread = tf.math.divide_no_nan(spread, 1.0 - concentration)
  w_div = tf.math.divide_no_nan(tf.sqrt(spread), tf.sqrt(weights_squared_norm))
  round_num = state['round_num'] + 1
  window = tf.concat([state['window'][1:], tf.reshape(w_div, [1])], axis=0)
  filled = tf.minimum(round_num, config.window)
  windowed = tf.reduce_sum(window[config.window - filled:]) / tf.cast(filled, tf.float32)
  armed = tf.logical_and(
      round_num > config.warmup_rounds, round_num >= config.window
  )
  raise_flag = tf.logical_and(
      tf.equal(state['flagged'], 0),
      tf.logical_and(armed, tf.logical_or(windowed >= config.threshold, config.blind)),
  )
  new_state = collections.OrderedDict(
      window=window,
      round_num=round_num,
      flagged=tf.where(raise_flag, 1, state['flagged']),
      round_flagged=tf.where(raise_flag, round_num, state['round_flagged']),
  )
  metrics = collections.OrderedDict(
      w_div=w_div,
      windowed_w_div=windowed,
      effective_clients=tf.math.divide_no_nan(1.0, concentration),
      flagged=new_state['flagged'],
      round_flagged=new_state['round_flagged'],
  )
  return new_state, metrics
