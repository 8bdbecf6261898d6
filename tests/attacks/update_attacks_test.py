"""Update attacks: exact for honest and model replacement, noise with the update's std."""

import numpy as np
import tensorflow as tf

from tff_personal.attacks import roles
from tff_personal.attacks import update_attacks

UPDATE = [tf.constant([[1.0, -2.0], [3.0, 0.5]]), tf.constant([0.25, -0.75])]


def attacked(role, seed=3, boost=10.0, update=UPDATE):
  return [t.numpy() for t in update_attacks.attacked_update(update, role, seed, boost)]


def test_honest_clients_send_their_update():
  for a, b in zip(attacked(roles.HONEST), UPDATE):
    np.testing.assert_array_equal(a, b.numpy())


def test_model_replacement_boosts_the_update():
  for a, b in zip(attacked(roles.MODEL_REPLACEMENT, boost=10.0), UPDATE):
    np.testing.assert_allclose(a, 10.0 * b.numpy())


def test_random_update_is_seeded_noise_with_the_updates_std():
  big = [tf.random.stateless_normal([300, 100], seed=[1, 2]) * 3.0 + 1.0]
  noise = attacked(roles.RANDOM_UPDATE, seed=5, update=big)[0]
  expected_std = np.std(big[0].numpy())
  assert noise.shape == (300, 100)
  assert abs(np.std(noise) - expected_std) < 0.02 * expected_std  # 30,000 draws.
  assert abs(np.mean(noise)) < 0.03 * expected_std
  np.testing.assert_array_equal(noise, attacked(roles.RANDOM_UPDATE, seed=5, update=big)[0])
  assert not np.array_equal(noise, attacked(roles.RANDOM_UPDATE, seed=6, update=big)[0])
  assert np.corrcoef(noise.ravel(), big[0].numpy().ravel())[0, 1] < 0.05
