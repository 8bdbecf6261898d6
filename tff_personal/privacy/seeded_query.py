"""A Gaussian sum query whose noise is reproducible from a seed.

TFF's `DifferentiallyPrivateFactory.gaussian_fixed` wraps tensorflow-privacy's
`GaussianSumQuery`, which draws its noise from an unseeded
`tf.random_normal_initializer`: two runs with the same `--seed` add different
noise, and a resumed run does not repeat the noise an uninterrupted one adds.
`SeededGaussianSumQuery` is the same mechanism (clip every record to L2 norm
C, add N(0, sigma^2 I) to the sum) with the noise drawn by
`tf.random.stateless_normal` from a seed kept in the query's global state.
Each call splits that seed into one seed per tensor and the next state's
seed, so every round draws fresh noise, and since the aggregator's state is
part of the server state, a checkpointed run resumes with the noise it would
have drawn.

Whoever knows the seed can subtract the noise: a seeded query is for
simulations that must repeat, never for a deployment. The program uses it
only when asked (`--dp_noise_seed`); the default stays TFF's unseeded query.

  initial_global_state: <l2_norm_clip=float32, stddev=float32, seed=int64[2]>
  get_noised_result: (sum, state) -> (sum + noise, state with the next seed, event)

Adaptive clipping (Andrew, Thakkar, McMahan, Ramaswamy, NeurIPS 2021) draws
noise twice a round: into the clipped sum and into the count of unclipped
updates that moves the clip. `SeededQuantileAdaptiveClipSumQuery` is
tensorflow-privacy's `QuantileAdaptiveClipSumQuery` with both drawn this way,
from two seeds of their own. tensorflow-privacy rebuilds the sum's state for
each round's new clip from scratch, so the sum's next seed is carried over
into it.
"""

import collections

import dp_accounting
import tensorflow as tf
import tensorflow_privacy as tfp


class SeededGaussianSumQuery(tfp.GaussianSumQuery):
  """`tfp.GaussianSumQuery` with stateless noise keyed by `seed` (module docstring)."""

  _GlobalState = collections.namedtuple('_GlobalState', ['l2_norm_clip', 'stddev', 'seed'])

  def __init__(self, l2_norm_clip: float, stddev: float, seed: tuple[int, int]):
    """`seed`: two integers; the noise of round r follows from them alone."""
    super().__init__(l2_norm_clip, stddev)
    self._seed = seed

  def make_global_state(self, l2_norm_clip, stddev, seed=None):
    return self._GlobalState(
        tf.cast(l2_norm_clip, tf.float32),
        tf.cast(stddev, tf.float32),
        tf.cast(self._seed if seed is None else seed, tf.int64),
    )

  def get_noised_result(self, sample_state, global_state):
    """The sum plus N(0, stddev^2) noise per coordinate, and the next seed."""
    records = tf.nest.flatten(sample_state)
    seeds = _split(global_state.seed, len(records))
    noised = [
        record + tf.cast(
            tf.random.stateless_normal(tf.shape(record), seed=seeds[i], stddev=global_state.stddev),
            record.dtype,
        )
        for i, record in enumerate(records)
    ]
    noise_multiplier = global_state.stddev / global_state.l2_norm_clip
    return (
        tf.nest.pack_sequence_as(sample_state, noised),
        global_state._replace(seed=seeds[-1]),
        dp_accounting.GaussianDpEvent(noise_multiplier),
    )


def _split(seed, num_records: int):
  """One seed per record, then the next round's seed (the last)."""
  return tf.random.experimental.stateless_split(seed, num=num_records + 1)


class _SeededQuantileEstimatorQuery(tfp.QuantileEstimatorQuery):
  """`tfp.QuantileEstimatorQuery` whose noisy count of the records below the
  estimate is a `SeededGaussianSumQuery`."""

  def __init__(self, *args, seed: tuple[int, int], **kwargs):
    self._seed = seed  # Read by `_construct_below_estimate_query`, from super().__init__.
    super().__init__(*args, **kwargs)

  def _construct_below_estimate_query(self, below_estimate_stddev, expected_num_records):
    # Each record is 0.5 or -0.5 (below the estimate or not, shifted by -0.5,
    # as tensorflow-privacy's query), so a clip of 0.5 never clips.
    return tfp.NormalizedQuery(
        SeededGaussianSumQuery(0.5, below_estimate_stddev, self._seed),
        denominator=expected_num_records,
    )


class SeededQuantileAdaptiveClipSumQuery(tfp.QuantileAdaptiveClipSumQuery):
  """`tfp.QuantileAdaptiveClipSumQuery` with seeded noise (module docstring).

  initial_global_state: <noise_multiplier, sum_state=<l2_norm_clip, stddev,
    seed=int64[2]>, quantile_estimator_state=<..., below_estimate_state=
    <numerator_state=<l2_norm_clip, stddev, seed=int64[2]>, denominator>>>
  """

  def __init__(self, initial_l2_norm_clip: float, noise_multiplier: float,
               target_unclipped_quantile: float, learning_rate: float,
               clipped_count_stddev: float, expected_num_records: float,
               sum_seed: tuple[int, int], count_seed: tuple[int, int],
               geometric_update: bool = True):
    """tensorflow-privacy's arguments, and the seeds of the sum's noise and
    of the clipped count's."""
    super().__init__(initial_l2_norm_clip, noise_multiplier, target_unclipped_quantile,
                     learning_rate, clipped_count_stddev, expected_num_records,
                     geometric_update)
    self._sum_query = SeededGaussianSumQuery(
        initial_l2_norm_clip, noise_multiplier * initial_l2_norm_clip, sum_seed
    )
    self._quantile_estimator_query = _SeededQuantileEstimatorQuery(
        initial_l2_norm_clip, target_unclipped_quantile, learning_rate, clipped_count_stddev,
        expected_num_records, geometric_update, seed=count_seed,
    )

  def get_noised_result(self, sample_state, global_state):
    """tensorflow-privacy's round, the sum's state keeping its next seed."""
    result, new_state, event = super().get_noised_result(sample_state, global_state)
    next_seed = _split(
        global_state.sum_state.seed, len(tf.nest.flatten(sample_state.sum_state))
    )[-1]
    return result, new_state._replace(sum_state=new_state.sum_state._replace(seed=next_seed)), event
