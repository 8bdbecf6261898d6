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
    seeds = tf.random.experimental.stateless_split(global_state.seed, num=len(records) + 1)
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
