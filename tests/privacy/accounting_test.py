"""Privacy accounting: our epsilon, a published reference value, calibration."""

import math

import dp_accounting
import numpy as np
import pytest

from tff_personal.privacy import accounting


def direct_epsilon(z, population, k, rounds, delta):
  """The same event, composed round by round with dp_accounting's own API."""
  accountant = dp_accounting.rdp.RdpAccountant(
      neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE
  )
  event = dp_accounting.SampledWithoutReplacementDpEvent(
      population, k, dp_accounting.GaussianDpEvent(z / 2)
  )
  for _ in range(rounds):
    accountant.compose(event)
  return accountant.get_epsilon(delta)


@pytest.mark.parametrize('z, population, k, rounds', [(1.0, 105, 10, 30), (2.5, 1000, 50, 7)])
def test_epsilon_equals_a_direct_dp_accounting_computation(z, population, k, rounds):
  delta = accounting.default_delta(population)
  assert accounting.epsilon(z, population, k, rounds, delta) == pytest.approx(
      direct_epsilon(z, population, k, rounds, delta), rel=1e-9
  )


@pytest.mark.parametrize(
    'noise_multiplier, epochs, published_epsilon',
    [(1.1, 60, 3.01), (0.7, 45, 7.10), (1.3, 15, 1.19)],
)
def test_rdp_composition_reproduces_tf_privacys_published_values(
    noise_multiplier, epochs, published_epsilon
):
  """TensorFlow Privacy's MNIST DP-SGD table (tutorials/README.md: N = 60,000,
  batch 256, delta = 1e-5; e.g. z = 1.1 for 60 epochs gives eps = 3.01).

  Those values were converted from RDP with eps = min_a RDP(a) + log(1/delta)
  / (a - 1) (Mironov 2017, Proposition 3) over TF Privacy's original orders;
  the same conversion of dp_accounting's composed RDP curve reproduces them,
  and the tighter conversion our accountant reports is at most that.
  """
  orders = [1 + x / 10.0 for x in range(1, 100)] + list(range(12, 64))
  steps = int(math.ceil(epochs * 60_000 / 256))
  event = dp_accounting.SelfComposedDpEvent(
      dp_accounting.PoissonSampledDpEvent(
          256 / 60_000, dp_accounting.GaussianDpEvent(noise_multiplier)
      ),
      steps,
  )
  accountant = dp_accounting.rdp.RdpAccountant(orders)
  accountant.compose(event)
  rdp = np.asarray(accountant._rdp)  # pylint: disable=protected-access
  classic = float(np.min(rdp - math.log(1e-5) / (np.asarray(orders) - 1)))
  assert round(classic, 2) == published_epsilon
  assert accountant.get_epsilon(1e-5) <= classic


def test_no_noise_is_infinite_epsilon_and_no_round_is_zero():
  assert accounting.epsilon(0.0, 100, 10, 5, 1e-3) == math.inf
  assert accounting.epsilon(1.0, 100, 10, 0, 1e-3) == 0.0


def test_epsilon_grows_with_rounds_and_falls_with_noise():
  values = [accounting.epsilon(1.0, 100, 10, r, 1e-3) for r in (1, 5, 20)]
  assert values == sorted(values) and values[0] < values[-1]
  assert accounting.epsilon(2.0, 100, 10, 20, 1e-3) < values[-1]


def test_calibration_gives_the_smallest_noise_for_the_target():
  z = accounting.calibrate_noise_multiplier(4.0, 100, 10, 20, 1e-3, tolerance=1e-3)
  assert accounting.epsilon(z, 100, 10, 20, 1e-3) <= 4.0
  assert accounting.epsilon(z - 2e-3, 100, 10, 20, 1e-3) > 4.0


def test_unreachable_target_is_an_error():
  with pytest.raises(accounting.UnreachableEpsilonError, match='unreachable in 20 rounds'):
    accounting.calibrate_noise_multiplier(1e-5, 100, 10, 20, 1e-3)


def test_default_delta_is_below_one_over_n():
  assert accounting.default_delta(105) == pytest.approx(105**-1.1)
  assert accounting.default_delta(105) < 1 / 105
  with pytest.raises(ValueError):
    accounting.default_delta(0)


def test_the_detectors_release_is_a_second_gaussian_in_the_same_round():
  """Two Gaussians on the same sampled clients = one of z / sqrt(1 + 1/k^2)."""
  population, k, rounds = 105, 10, 30
  delta = accounting.default_delta(population)
  factor = accounting.DETECTOR_NOISE_FACTOR
  with_detector = accounting.epsilon(1.0, population, k, rounds, delta, with_detector=True)
  equivalent = accounting.epsilon(
      1.0 / math.sqrt(1 + 1 / factor**2), population, k, rounds, delta
  )
  assert with_detector == pytest.approx(equivalent, rel=1e-6)
  assert with_detector > accounting.epsilon(1.0, population, k, rounds, delta)
  calibrated = accounting.calibrate_noise_multiplier(
      4.0, population, k, rounds, delta, with_detector=True
  )
  assert accounting.epsilon(calibrated, population, k, rounds, delta, with_detector=True) <= 4.0
  assert calibrated > accounting.calibrate_noise_multiplier(4.0, population, k, rounds, delta)
