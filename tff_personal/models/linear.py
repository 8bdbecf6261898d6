"""Logistic regression, TFF's Stack Overflow tag prediction model.

As `tff.simulation.baselines.stackoverflow.create_tag_prediction_task`: one
dense layer with a sigmoid per tag over a bag-of-words vector (multi-label).
A single block, `[classifier]`; it outputs probabilities, not logits.
"""

import tensorflow as tf


def build_logistic_regression(input_size: int, num_labels: int) -> tf.keras.Model:
  """`Dense(num_labels, sigmoid)` over float32 `[batch, input_size]` inputs."""
  if input_size < 1 or num_labels < 1:
    raise ValueError('Sizes must be positive integers.')
  inputs = tf.keras.Input(shape=(input_size,), dtype=tf.float32, name='bag_of_words')
  probabilities = tf.keras.layers.Dense(
      num_labels, activation='sigmoid', name='classifier'
  )(inputs)
  return tf.keras.Model(
      inputs=inputs, outputs=probabilities, name='logistic_regression'
  )


LOGISTIC_REGRESSION_BLOCKS = (('classifier',),)
