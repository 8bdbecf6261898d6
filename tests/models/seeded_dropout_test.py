"""Tests of SeededDropout: reproducible masks, scaling, identity at inference."""

import numpy as np
import pytest
import tensorflow as tf

from tff_personal.models import seeded_dropout


def _batch(seed=0, shape=(8, 50)):
  return tf.constant(np.random.default_rng(seed).uniform(0.5, 1.5, shape), tf.float32)


def test_identity_when_not_training():
  layer = seeded_dropout.SeededDropout(0.5, salt=1)
  x = _batch()
  np.testing.assert_array_equal(layer(x, training=False).numpy(), x.numpy())
  np.testing.assert_array_equal(layer(x).numpy(), x.numpy())


def test_kept_units_are_scaled_and_the_rest_zeroed():
  layer = seeded_dropout.SeededDropout(0.25, salt=1)
  x = _batch()
  y = layer(x, training=True).numpy()
  kept = y != 0
  np.testing.assert_allclose(y[kept], x.numpy()[kept] / 0.75, rtol=1e-6)
  # 400 units at rate 0.25: the dropped share is near 0.25 (binomial sd 0.022).
  assert 0.15 < 1 - kept.mean() < 0.35


def test_same_batch_same_mask_other_batch_other_mask():
  layer = seeded_dropout.SeededDropout(0.5, salt=1)
  x, other = _batch(0), _batch(1)
  mask = layer(x, training=True).numpy() != 0
  np.testing.assert_array_equal(layer(x, training=True).numpy() != 0, mask)
  assert (layer(other, training=True).numpy() != 0).tolist() != mask.tolist()
  # Another salt (another layer) draws another mask for the same batch.
  other_layer = seeded_dropout.SeededDropout(0.5, salt=2)
  assert (other_layer(x, training=True).numpy() != 0).tolist() != mask.tolist()


def test_mask_is_the_same_inside_a_tf_function():
  layer = seeded_dropout.SeededDropout(0.5, salt=3)
  x = _batch()
  eager = layer(x, training=True).numpy()
  traced = tf.function(lambda t: layer(t, training=True))(x).numpy()
  np.testing.assert_array_equal(traced, eager)


def test_gradient_flows_through_kept_units_only():
  layer = seeded_dropout.SeededDropout(0.5, salt=1)
  x = _batch()
  with tf.GradientTape() as tape:
    tape.watch(x)
    y = layer(x, training=True)
    total = tf.reduce_sum(y)
  gradient = tape.gradient(total, x).numpy()
  expected = np.where(y.numpy() != 0, 2.0, 0.0)
  np.testing.assert_allclose(gradient, expected)


def test_rate_zero_is_identity_and_bad_rate_raises():
  x = _batch()
  layer = seeded_dropout.SeededDropout(0.0, salt=1)
  np.testing.assert_array_equal(layer(x, training=True).numpy(), x.numpy())
  with pytest.raises(ValueError, match='rate'):
    seeded_dropout.SeededDropout(1.0, salt=1)


def _model_with_two_dropout_layers():
  inputs = tf.keras.Input((50,))
  h = seeded_dropout.SeededDropout(0.5, salt=1)(inputs)
  h = tf.keras.layers.Dense(50, kernel_initializer='ones', name='dense')(h)
  outputs = seeded_dropout.SeededDropout(0.5, salt=2)(h)
  return tf.keras.Model(inputs, outputs)


def test_mask_draws_give_other_masks_and_restore_the_salts():
  model = _model_with_two_dropout_layers()
  assert sorted(layer.salt for layer in seeded_dropout.dropout_layers(model)) == [1, 2]
  x = _batch()
  own = model(x, training=True).numpy()
  with seeded_dropout.mask_draw(model, 0):
    np.testing.assert_array_equal(model(x, training=True).numpy(), own)
  with seeded_dropout.mask_draw(model, 1):
    first = model(x, training=True).numpy()
    np.testing.assert_array_equal(model(x, training=True).numpy(), first)  # Still seeded.
  with seeded_dropout.mask_draw(model, 2):
    second = model(x, training=True).numpy()
  assert (first != 0).tolist() != (own != 0).tolist() != (second != 0).tolist()
  assert sorted(layer.salt for layer in seeded_dropout.dropout_layers(model)) == [1, 2]
  np.testing.assert_array_equal(model(x, training=True).numpy(), own)
  # Inference stays the identity of the dropout layers in every draw.
  with seeded_dropout.mask_draw(model, 3):
    np.testing.assert_array_equal(model(x, training=False).numpy(), model(x).numpy())


def test_mask_draw_restores_the_salts_on_error_and_checks_the_draw():
  model = _model_with_two_dropout_layers()
  with pytest.raises(RuntimeError):
    with seeded_dropout.mask_draw(model, 5):
      raise RuntimeError()
  assert sorted(layer.salt for layer in seeded_dropout.dropout_layers(model)) == [1, 2]
  with pytest.raises(ValueError, match=r'draw must be in \[0, 2000\], got -1'):
    with seeded_dropout.mask_draw(model, -1):
      pass
