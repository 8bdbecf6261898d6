"""Label poisoning (A1): an adversary's training labels made uniformly random.

A data transform applied by the program to adversaries' training datasets;
the client computation is the same as an honest client's. Labels are drawn
uniformly from [0, num_classes) with a stateless RNG seeded per (client,
round), so reruns and resumed runs see the same poisoned data.
"""

import tensorflow as tf


def poison_labels(dataset: tf.data.Dataset, num_classes: int, seed: int) -> tf.data.Dataset:
  """`(x, y)` batches -> `(x, y')`, y' uniform in [0, num_classes), y's shape and dtype."""

  def poison(index, batch):
    x, y = batch
    if not y.dtype.is_integer:
      raise ValueError('Label poisoning needs integer class labels.')
    random_labels = tf.random.stateless_uniform(
        tf.shape(y), seed=tf.stack([tf.cast(seed, tf.int64), index]),
        maxval=num_classes, dtype=tf.int64,
    )
    return x, tf.cast(random_labels, y.dtype)

  return dataset.enumerate().map(poison)
