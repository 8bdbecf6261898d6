"""Tests of the logistic regression of Stack Overflow tag prediction."""

import numpy as np
import tensorflow as tf

from tff_personal.models import linear
from tff_personal.models import model_spec


def test_output_is_sigmoid_of_affine_map():
  model = linear.build_logistic_regression(3, 2)
  kernel = np.array([[1.0, 0.0], [0.0, 2.0], [1.0, -1.0]], np.float32)
  model.get_layer('classifier').set_weights([kernel, np.array([0.0, 1.0], np.float32)])
  x = np.array([[0.5, 0.0, 0.5], [0.0, 1.0, 0.0]], np.float32)
  expected = 1.0 / (1.0 + np.exp(-np.array([[1.0, 0.5], [0.0, 3.0]])))
  np.testing.assert_allclose(model(x).numpy(), expected, rtol=1e-6)


def test_one_block_covers_the_only_layer():
  model = linear.build_logistic_regression(10, 4)
  assert {l.name for l in model.layers if l.weights} == {'classifier'}
  assert linear.LOGISTIC_REGRESSION_BLOCKS == (('classifier',),)
  assert model.output_shape == (None, 4)


def test_initial_weights_are_reproducible():
  spec = model_spec.ModelSpec(
      build=lambda: linear.build_logistic_regression(10, 4),
      blocks=linear.LOGISTIC_REGRESSION_BLOCKS,
      loss=tf.keras.losses.BinaryCrossentropy,
      metrics=lambda: [tf.keras.metrics.Recall(top_k=2)],
      input_spec=(tf.TensorSpec([None, 10]), tf.TensorSpec([None, 4])),
  )
  first = tf.nest.flatten(spec.initial_weights(5))
  again = tf.nest.flatten(spec.initial_weights(5))
  other = tf.nest.flatten(spec.initial_weights(6))
  assert [np.shape(w) for w in first] == [(10, 4), (4,)]
  for a, b in zip(first, again):
    np.testing.assert_array_equal(a, b)
  assert not np.array_equal(first[0], other[0])
