"""Label poisoning: uniform labels in range, inputs untouched, seeded."""

import numpy as np
import tensorflow as tf

from tff_personal.attacks import label_poison


def batches(n=4000, batch=100):
  x = np.arange(n, dtype=np.float32).reshape(n, 1)
  y = np.zeros(n, np.int32)
  return tf.data.Dataset.from_tensor_slices((x, y)).batch(batch)


def labels_of(dataset):
  return np.concatenate([y.numpy() for _, y in dataset])


def test_labels_are_uniform_and_inputs_untouched():
  poisoned = label_poison.poison_labels(batches(), num_classes=10, seed=7)
  xs = np.concatenate([x.numpy() for x, _ in poisoned])
  np.testing.assert_array_equal(xs[:, 0], np.arange(4000))
  labels = labels_of(poisoned)
  assert labels.dtype == np.int32 and labels.min() == 0 and labels.max() == 9
  counts = np.bincount(labels, minlength=10)
  assert np.all(np.abs(counts - 400) < 6 * np.sqrt(400 * 0.9))  # Binomial, 6 std.


def test_seeded():
  a = labels_of(label_poison.poison_labels(batches(), 10, seed=1))
  np.testing.assert_array_equal(a, labels_of(label_poison.poison_labels(batches(), 10, seed=1)))
  assert not np.array_equal(a, labels_of(label_poison.poison_labels(batches(), 10, seed=2)))
