"""NFL detector: the divergence identity, the state machine, FedAvg's metrics."""

import dataclasses

import numpy as np
import pytest
import tensorflow as tf

from tests import test_utils
from tests.algorithms import numpy_reference
from tests.algorithms.fedavg_test import batches_dataset, client_batches, run_next
from tff_personal.aggregators import dp
from tff_personal.algorithms import common
from tff_personal.algorithms import fedavg
from tff_personal.algorithms import local
from tff_personal.nfl import detector
from tff_personal.personal import process as process_lib


def test_divergence_identity_matches_a_direct_computation():
  rng = np.random.default_rng(0)
  deltas = rng.normal(size=(5, 7))
  alpha = rng.uniform(size=5)
  alpha /= alpha.sum()
  mean = alpha @ deltas
  direct = float(np.sum(alpha * np.sum((deltas - mean) ** 2, axis=1)))
  from_aggregates = detector.divergence(
      float(alpha @ np.sum(deltas**2, axis=1)), float(np.sum(mean**2))
  )
  assert float(from_aggregates) == pytest.approx(direct, rel=1e-6)
  # DP: the noise's expected squared norm is added back.
  assert float(detector.divergence(3.0, 2.5, noise_squared_norm=0.5)) == pytest.approx(1.0)
  assert float(detector.divergence(1.0, 4.0)) == 0.0  # Floored.


def test_cohort_correction_makes_the_divergence_unbiased_for_any_cohort_size():
  # A population of update vectors; cohorts of K drawn without their own
  # mean: the plain statistic averages (1 - sum alpha^2) s^2, the corrected
  # one s^2, for K = 2 and K = 10 alike (equal and unequal weights).
  rng = np.random.default_rng(1)
  population = rng.normal(size=(2000, 4)) * [1.0, 2.0, 0.5, 1.5]
  spread = float(np.sum(population.var(axis=0)))
  for k, weighted in [(2, False), (10, False), (4, True)]:
    plain, corrected = [], []
    for _ in range(4000):
      cohort = population[rng.choice(len(population), size=k, replace=False)]
      n = rng.integers(1, 50, size=k).astype(float) if weighted else np.ones(k)
      alpha = n / n.sum()
      mean = alpha @ cohort
      mean_weight_by_weight = float(np.sum(n * n) / n.sum())
      concentration = detector.weight_concentration(mean_weight_by_weight, float(n.sum()))
      assert float(concentration) == pytest.approx(np.sum(alpha**2), rel=1e-5)
      d = detector.divergence(float(alpha @ np.sum(cohort**2, axis=1)), float(np.sum(mean**2)))
      plain.append(float(d))
      corrected.append(float(d) / (1 - float(concentration)))
    assert np.mean(corrected) == pytest.approx(spread, rel=0.05), k
    if not weighted:
      assert np.mean(plain) == pytest.approx((k - 1) / k * spread, rel=0.05), k


def test_cohort_correction_in_the_state_update():
  plain = detector.DetectorConfig(warmup_rounds=0, window=1, threshold=1.0, cohort_correction=False)
  corrected = dataclasses.replace(plain, cohort_correction=True)
  args = (tf.constant(1.25), tf.constant(0.25), tf.constant(4.0))  # D = 1, ||w|| = 2.
  for config, concentration, w_div in [(plain, 0.5, 0.5), (corrected, 0.5, np.sqrt(2) / 2),
                                       (corrected, 0.1, np.sqrt(1 / 0.9) / 2), (corrected, 1.0, 0.0)]:
    state = tf.nest.map_structure(tf.constant, detector.initial_state(config))
    _, metrics = detector.update_state(state, *args, config, tf.constant(concentration))
    assert float(metrics['w_div']) == pytest.approx(w_div, rel=1e-6)
    assert float(metrics['effective_clients']) == pytest.approx(1 / concentration, rel=1e-6)


def run_detector(config, w_divs):
  """Feeds rounds whose statistic is exactly each w_div (||w|| = 1)."""
  state = tf.nest.map_structure(tf.constant, detector.initial_state(config))
  metrics = []
  for w_div in w_divs:
    state, m = detector.update_state(
        state, tf.constant(w_div**2 + 0.25), tf.constant(0.25), tf.constant(1.0), config
    )
    metrics.append({k: v.numpy() for k, v in m.items()})
  return state, metrics


def test_state_machine_warmup_window_and_flag():
  config = detector.DetectorConfig(warmup_rounds=3, window=2, threshold=0.5)
  state, metrics = run_detector(config, [2.0, 1.0, 0.3, 0.2, 0.6, 0.7, 0.0])
  np.testing.assert_allclose([m['w_div'] for m in metrics], [2.0, 1.0, 0.3, 0.2, 0.6, 0.7, 0.0],
                             rtol=1e-6)
  np.testing.assert_allclose(
      [m['windowed_w_div'] for m in metrics], [2.0, 1.5, 0.65, 0.25, 0.4, 0.65, 0.35], rtol=1e-6
  )
  # Rounds 1-3 are warm-up (round 3's 0.65 is not a flag); round 6 is.
  assert [int(m['flagged']) for m in metrics] == [0, 0, 0, 0, 0, 1, 1]
  assert [int(m['round_flagged']) for m in metrics] == [-1] * 5 + [6, 6]
  assert int(state['round_num']) == 7


def test_a_converging_run_is_never_flagged():
  config = detector.DetectorConfig(warmup_rounds=1, window=3, threshold=0.5)
  _, metrics = run_detector(config, [0.6, 0.5, 0.3, 0.2, 0.1, 0.1])  # Windows < 0.5.
  assert [int(m['flagged']) for m in metrics] == [0] * 6


def test_a_blind_detector_flags_at_its_first_armed_round():
  blind = detector.DetectorConfig(warmup_rounds=2, window=2, threshold=0.5, noise_to_signal=1.5)
  assert blind.blind
  _, metrics = run_detector(blind, [0.0] * 5)  # w_div says nothing.
  assert [int(m['flagged']) for m in metrics] == [0, 0, 1, 1, 1]
  assert int(metrics[-1]['round_flagged']) == 3
  for config in (dataclasses.replace(blind, flag_when_blind=False),
                 dataclasses.replace(blind, noise_to_signal=1.0)):
    assert not config.blind
    _, metrics = run_detector(config, [0.0] * 5)
    assert [int(m['flagged']) for m in metrics] == [0] * 5


def test_bad_config():
  with pytest.raises(ValueError, match='window >= 1'):
    detector.DetectorConfig(warmup_rounds=0, window=0, threshold=0.1)


@pytest.fixture(scope='module')
def process():
  return fedavg.build(
      test_utils.tiny_model_spec(), fedavg.Hparams(),
      common.Common(
          client_learning_rate=0.1,
          seed=11,
          nfl_detector=detector.DetectorConfig(warmup_rounds=0, window=1, threshold=0.0),
      ),
  )


def test_fedavg_reports_the_divergence_of_its_clients(process):
  assert 'nfl' in str(process.initialize.type_signature.result)
  state = process.initialize()
  kernel, bias = process.get_model_weights(state).trainable
  clients = [client_batches(1, [3, 2]), client_batches(2, [4]), client_batches(3, [2, 2, 2])]
  output = run_next(process, state, [batches_dataset(b) for b in clients],
                    process_lib.empty_personal_states(3))
  deltas, sizes = [], [5, 4, 6]
  for batches in clients:
    trained = numpy_reference.sgd(kernel, bias, batches, 0.1)
    deltas.append(np.concatenate([(kernel - trained[0]).ravel(), bias - trained[1]]))
  alpha = np.array(sizes) / sum(sizes)
  mean = alpha @ np.array(deltas)
  divergence = sum(a * np.sum((d - mean) ** 2) for a, d in zip(alpha, deltas))
  divergence /= 1 - np.sum(alpha**2)  # The cohort-size correction (default).
  weights_norm = np.sqrt(np.sum(kernel**2) + np.sum(bias**2))
  nfl = output.metrics['nfl']
  assert nfl['w_div'] == pytest.approx(np.sqrt(divergence) / weights_norm, rel=1e-4)
  assert nfl['effective_clients'] == pytest.approx(1 / np.sum(alpha**2), rel=1e-5)
  assert nfl['flagged'] == 1 and nfl['round_flagged'] == 1  # Threshold 0.
  assert output.state['nfl']['round_num'] == 1


def dp_fedavg_with_detector(noise_multiplier, clip_norm, threshold=1.0):
  """FedAvg of the tiny model under DP (2 clients a round) with the detector."""
  return fedavg.build(
      test_utils.tiny_model_spec(), fedavg.Hparams(),
      common.Common(
          client_learning_rate=0.1, seed=11,
          model_aggregator=dp.build_dp_aggregator(
              noise_multiplier=noise_multiplier, clients_per_round=2, clip_norm=clip_norm
          ),
          nfl_detector=detector.DetectorConfig(warmup_rounds=0, window=1, threshold=threshold),
          dp_setting=dp.DpSetting(noise_multiplier, clip_norm, clients_per_round=2),
      ),
  )


def test_dp_statistic_adds_back_the_expected_noise():
  process = dp_fedavg_with_detector(noise_multiplier=0.0, clip_norm=0.01)
  state = process.initialize()
  kernel, bias = process.get_model_weights(state).trainable
  clients = [client_batches(1, [3, 2]), client_batches(2, [4])]
  output = run_next(process, state, [batches_dataset(b) for b in clients],
                    process_lib.empty_personal_states(2))
  clipped = []
  for batches in clients:
    trained = numpy_reference.sgd(kernel, bias, batches, 0.1)
    delta = np.concatenate([(kernel - trained[0]).ravel(), bias - trained[1]])
    clipped.append(delta * min(1.0, 0.01 / np.linalg.norm(delta)))
  mean = np.mean(clipped, axis=0)
  divergence = np.mean([np.sum((c - mean) ** 2) for c in clipped])
  divergence *= 2 / (2 - 1)  # Cohort correction: K/(K-1), DP-FedAvg's fixed K = 2.
  weights_norm = np.sqrt(np.sum(kernel**2) + np.sum(bias**2))
  assert output.metrics['nfl']['w_div'] == pytest.approx(
      np.sqrt(divergence) / weights_norm, rel=1e-3
  )
  assert output.metrics['nfl']['effective_clients'] == pytest.approx(2.0)


def test_noise_to_signal_of_the_dp_statistic():
  # fmnist CNN (215,370 weights), z = 1, C = 1, K = 10, DP mean of the norms
  # with 10 z: sqrt(2 d 0.1^4 + (2 x 0.1)^2 + 1^2) / (10/9) per round.
  expected = np.sqrt(2 * 215370 * 1e-4 + 0.04 + 1.0) / (10 / 9)
  assert detector.noise_to_signal(215370, 1.0, 1.0, 10, 10.0) == pytest.approx(expected)
  assert expected == pytest.approx(5.98, abs=0.01)
  assert detector.noise_to_signal(215370, 1.0, 1.0, 10, 10.0, window=3) == pytest.approx(
      expected / np.sqrt(3)
  )
  assert detector.noise_to_signal(215370, 0.1, 1.0, 10, 10.0) < 0.2  # Moderate noise.
  assert detector.noise_to_signal(100, 0.0, 1.0, 10, 10.0) == 0.0


def test_a_blind_detector_is_logged(caplog):
  with caplog.at_level('WARNING'):
    blind = dp_fedavg_with_detector(noise_multiplier=50.0, clip_norm=1.0, threshold=1e9)
  assert 'it cannot tell divergence from noise' in caplog.text
  assert 'It flags NFL at its first armed round.' in caplog.text
  # No w_div reaches the threshold: the flag comes from the noise level alone.
  clients = [client_batches(1, [3, 2]), client_batches(2, [4])]
  output = run_next(blind, blind.initialize(), [batches_dataset(b) for b in clients],
                    process_lib.empty_personal_states(2))
  assert output.metrics['nfl']['flagged'] == 1 and output.metrics['nfl']['round_flagged'] == 1
  caplog.clear()
  with caplog.at_level('WARNING'):
    dp_fedavg_with_detector(noise_multiplier=0.0, clip_norm=0.01)
  assert 'it cannot tell divergence from noise' not in caplog.text


def test_local_with_the_detector_measures_its_clients_own_updates():
  """Local aggregates nothing; the detector averages the clients' updates of
  their own models itself, and w is the initial model they started from."""
  process = local.build(
      test_utils.tiny_model_spec(), local.Hparams(),
      common.Common(
          client_learning_rate=0.1, seed=11,
          nfl_detector=detector.DetectorConfig(warmup_rounds=0, window=1, threshold=1e9),
      ),
  )
  state = process.initialize()
  initial = process.get_model_weights(state)
  rng = np.random.default_rng(4)
  starts = [
      type(initial)(
          trainable=[rng.normal(size=w.shape).astype(np.float32) for w in initial.trainable],
          non_trainable=[],
      )
      for _ in range(2)
  ]
  clients = [client_batches(1, [3, 2]), client_batches(2, [4])]
  output = run_next(process, state, [batches_dataset(b) for b in clients], starts)
  deltas = []
  for start, batches in zip(starts, clients):
    trained = numpy_reference.sgd(*start.trainable, batches, 0.1)
    deltas.append(np.concatenate([(s - t).ravel() for s, t in zip(start.trainable, trained)]))
  alpha = np.array([5, 4]) / 9
  mean = alpha @ np.array(deltas)
  divergence = sum(a * np.sum((d - mean) ** 2) for a, d in zip(alpha, deltas))
  divergence /= 1 - np.sum(alpha**2)
  initial_norm = np.sqrt(sum(np.sum(w**2) for w in initial.trainable))
  assert output.metrics['nfl']['w_div'] == pytest.approx(
      np.sqrt(divergence) / initial_norm, rel=1e-4
  )
  assert output.metrics['nfl']['flagged'] == 0
