"""DP-FedAvg's aggregator: clipping bound, noise scale, the noise-norm helper."""

import numpy as np
import pytest
import tensorflow_federated as tff

from tests.aggregators.robust_test import build_round
from tff_personal.aggregators import dp

K = 4
DIM = 20_000  # Coordinates per draw: many independent noise samples at once.
VECTOR = tff.TensorType(np.float32, [DIM])


@pytest.fixture(scope='module')
def clip_only():
  return build_round(
      dp.build_dp_aggregator(noise_multiplier=0.0, clients_per_round=K, clip_norm=1.0),
      tff.TensorType(np.float32, [3]),
  )


@pytest.fixture(scope='module')
def noisy():
  """z = 1.5, C = 2, K = 4: noise std in the mean 0.75 per coordinate."""
  return build_round(
      dp.build_dp_aggregator(noise_multiplier=1.5, clients_per_round=K, clip_norm=2.0), VECTOR
  )


def test_one_huge_update_moves_the_mean_by_at_most_clip_over_k(clip_only):
  honest = [np.array([0.1, -0.2, 0.05], np.float32)] * 3
  huge = np.array([3e6, -4e6, 0.0], np.float32)
  without, _ = clip_only(honest + [np.zeros(3, np.float32)], [1.0] * 4)
  with_huge, _ = clip_only(honest + [huge], [1.0] * 4)
  # The huge update is clipped to norm C = 1 along its direction (0.6, -0.8).
  np.testing.assert_allclose(with_huge - without, [0.6 / K, -0.8 / K, 0.0], atol=1e-6)
  assert np.linalg.norm(with_huge - without) <= 1.0 / K + 1e-6
  # Small updates pass unclipped; the mean divides by K, weights are ignored.
  np.testing.assert_allclose(without, 3 * honest[0] / K, rtol=1e-6)
  reweighted, _ = clip_only(honest + [np.zeros(3, np.float32)], [1.0, 50.0, 2.0, 7.0])
  np.testing.assert_array_equal(reweighted, without)


def test_noise_has_the_stated_standard_deviation(noisy):
  zeros = [np.zeros(DIM, np.float32)] * K
  draws = np.concatenate([noisy(zeros, [1.0] * K)[0] for _ in range(5)])
  expected = dp.noise_stddev_of_mean(1.5, 2.0, K)
  assert expected == 0.75
  # 100,000 draws: the sample std's standard error is 0.75 / sqrt(2e5) ~ 0.0017,
  # so a 2% band (about 9 standard errors) fails a wrong scale, not chance.
  assert abs(np.std(draws) / expected - 1) < 0.02
  assert abs(np.mean(draws)) < 5 * expected / np.sqrt(draws.size)


def test_expected_noise_squared_norm_matches_the_empirical_mean(noisy):
  zeros = [np.zeros(DIM, np.float32)] * K
  squared_norms = [float(np.sum(noisy(zeros, [1.0] * K)[0] ** 2)) for _ in range(5)]
  expected = dp.expected_noise_squared_norm(DIM, 1.5, 2.0, K)
  assert expected == pytest.approx(DIM * 0.75**2)
  # Relative standard error of the mean of 5 chi-square(20,000) draws: ~0.45%.
  assert abs(np.mean(squared_norms) / expected - 1) < 0.03


def seeded_process(noise_seed):
  """`noisy`'s aggregator (std 0.75 in the mean) with its noise drawn from `noise_seed`."""
  factory = dp.build_dp_aggregator(
      noise_multiplier=1.5, clients_per_round=K, clip_norm=2.0, noise_seed=noise_seed
  )
  return factory.create(VECTOR, tff.TensorType(np.float32))


def test_seeded_noise_repeats_from_the_seed_and_the_state_and_is_fresh_each_round():
  process = seeded_process(7)
  zeros, weights = [np.zeros(DIM, np.float32)] * K, [1.0] * K
  first = process.next(process.initialize(), zeros, weights)
  np.testing.assert_array_equal(
      first.result, process.next(process.initialize(), zeros, weights).result
  )
  # Round 2 from round 1's state (as after a resume) draws the same noise again ...
  second = process.next(first.state, zeros, weights)
  np.testing.assert_array_equal(second.result, process.next(first.state, zeros, weights).result)
  # ... and noise independent of round 1's, at the unseeded query's scale.
  assert abs(np.corrcoef(first.result, second.result)[0, 1]) < 0.05
  draws = np.concatenate([first.result, second.result])
  # 40,000 draws: standard error of the sample std ~0.35%; a 3% band.
  assert abs(np.std(draws) / dp.noise_stddev_of_mean(1.5, 2.0, K) - 1) < 0.03
  other = seeded_process(8)
  assert abs(np.corrcoef(first.result, other.next(other.initialize(), zeros, weights).result)[0, 1]) < 0.05
  # The seed lives in the aggregator's state (checkpointed with the server state).
  assert 'seed=int64[2]' in str(process.initialize.type_signature)


def test_adaptive_clipping_reports_its_clip_and_spends_part_of_the_budget():
  assert dp.value_noise_multiplier(1.0, 100, adaptive=True) > 1.0
  assert dp.value_noise_multiplier(1.0, 100, adaptive=False) == 1.0
  one_round = build_round(
      dp.build_dp_aggregator(
          noise_multiplier=0.0, clients_per_round=K, adaptive=True, initial_clip_norm=0.5
      ),
      tff.TensorType(np.float32, [3]),
  )
  values = [np.array([1.0, 0.0, 0.0], np.float32), np.array([0.1, 0.0, 0.0], np.float32)]
  result, _ = one_round(values, [1.0, 1.0])
  # Initial clip 0.5: the first update is clipped to 0.5, the second passes.
  np.testing.assert_allclose(result, [0.6 / K, 0.0, 0.0], rtol=1e-6)


def test_num_parameters():
  value_type = tff.StructType(
      [tff.TensorType(np.float32, [2, 3]), tff.StructType([tff.TensorType(np.float32, [4])])]
  )
  assert dp.num_parameters(value_type) == 10


@pytest.mark.parametrize(
    'kwargs, message',
    [
        (dict(noise_multiplier=-1.0, clip_norm=1.0), 'noise multiplier must be >= 0'),
        (dict(noise_multiplier=1.0, clip_norm=0.0), 'clip norm must be > 0'),
        (dict(noise_multiplier=1.0), 'clip norm must be > 0'),
        (dict(noise_multiplier=1.0, clip_norm=1.0, adaptive=True), 'not both'),
    ],
)
def test_bad_arguments(kwargs, message):
  with pytest.raises(ValueError, match=message):
    dp.build_dp_aggregator(clients_per_round=K, **kwargs)


def build_scalar_round(setting):
  process = dp.build_squared_norm_aggregator(setting).create(tff.TensorType(np.float32))

  @tff.federated_computation(tff.FederatedType(np.float32, tff.CLIENTS))
  def one_round(values):
    return process.next(process.initialize(), values).result

  return one_round


def test_detector_squared_norms_are_clipped_to_c_squared_and_averaged_over_k():
  one_round = build_scalar_round(dp.DpSetting(noise_multiplier=0.0, clip_norm=0.5,
                                              clients_per_round=K))
  # C^2 = 0.25: 0.9 counts as 0.25; the sum divides by K = 4, not by the 3 present.
  assert one_round([0.9, 0.1, 0.05]) == pytest.approx((0.25 + 0.1 + 0.05) / K)


def test_detector_squared_norms_take_k_times_the_updates_noise_multiplier():
  from tff_personal.privacy import accounting  # pylint: disable=g-import-not-at-top

  one_round = build_scalar_round(dp.DpSetting(noise_multiplier=0.3, clip_norm=0.5,
                                              clients_per_round=K))
  draws = np.array([one_round([0.0] * K) for _ in range(400)])
  expected = accounting.DETECTOR_NOISE_FACTOR * 0.3 * 0.5**2 / K  # 0.1875
  # 400 draws: the sample std's standard error is ~3.5%; a 15% band.
  assert abs(np.std(draws) / expected - 1) < 0.15


def adaptive_process(noise_seed, noise_multiplier):
  """Adaptive clipping from C0 = 0.5, K = 100 expected clients (the value's
  noise in the sum about z C, the count's std 5)."""
  factory = dp.build_dp_aggregator(
      noise_multiplier=noise_multiplier, clients_per_round=100, adaptive=True,
      initial_clip_norm=0.5, noise_seed=noise_seed,
  )
  return factory.create(VECTOR, tff.TensorType(np.float32))


def adaptive_rounds(process, rounds, state=None):
  """(results, clips) of `rounds` rounds of 4 updates of norms 0.2, 1, 2 and 4."""
  updates = [np.full(DIM, norm / np.sqrt(DIM), np.float32) for norm in (0.2, 1.0, 2.0, 4.0)]
  state = process.initialize() if state is None else state
  results, clips = [], []
  for _ in range(rounds):
    output = process.next(state, updates, [1.0] * 4)
    state = output.state
    results.append(output.result)
    clips.append(float(output.measurements['dp_query_metrics']['clip']))
  return results, clips, state


def test_seeded_adaptive_clipping_without_noise_is_tffs():
  seeded_results, seeded_clips, _ = adaptive_rounds(adaptive_process(7, 0.0), 3)
  tff_results, tff_clips, _ = adaptive_rounds(adaptive_process(None, 0.0), 3)
  np.testing.assert_array_equal(np.array(seeded_results), np.array(tff_results))
  assert seeded_clips == tff_clips
  # The clip after each round: 1 of the 4 updates below it, counted over the
  # K = 100 expected clients, (1 - 4 / 2) / 100 + 1/2 = 0.49 below against the
  # target 0.5, so C <- C exp(0.2 x 0.01).
  np.testing.assert_allclose(seeded_clips, 0.5 * np.exp(0.002 * np.arange(1, 4)), rtol=1e-6)


def test_seeded_adaptive_clipping_repeats_both_noises_from_the_seed_and_the_state():
  process = adaptive_process(7, 1.0)
  results, clips, _ = adaptive_rounds(process, 2)
  again, clips_again, _ = adaptive_rounds(process, 2)
  np.testing.assert_array_equal(np.array(results), np.array(again))
  # The clip after round 1 follows the count's noise: seeded too.
  assert clips == clips_again
  # Round 2 from round 1's state (as after a resume) repeats round 2.
  _, _, after_one = adaptive_rounds(process, 1)
  resumed, resumed_clips, _ = adaptive_rounds(process, 1, after_one)
  np.testing.assert_array_equal(resumed[0], results[1])
  assert resumed_clips == clips[1:]
  # Fresh noise each round and for another seed.
  noise = [r - np.mean(r) for r in results]
  assert abs(np.corrcoef(noise[0], noise[1])[0, 1]) < 0.05
  other, other_clips, _ = adaptive_rounds(adaptive_process(8, 1.0), 2)
  assert abs(np.corrcoef(noise[0], other[0] - np.mean(other[0]))[0, 1]) < 0.05
  assert other_clips[1] != clips[1]
  # Both seeds live in the aggregator's state (checkpointed with the server state).
  assert str(process.initialize.type_signature).count('seed=int64[2]') == 2
