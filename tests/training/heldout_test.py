"""The held-out split: fixed examples whatever the batching, about the asked fraction."""

import numpy as np
import tensorflow as tf

from tff_personal.training import client_training


def examples(n, seed=0):
  rng = np.random.default_rng(seed)
  return rng.normal(size=(n, 3)).astype(np.float32), rng.integers(0, 5, n).astype(np.int32)


def heldout_rows(dataset):
  train, heldout = client_training.split_heldout(dataset, 10)
  rows = lambda d: {tuple(row) for x, _ in d.as_numpy_iterator() for row in x.tolist()}
  return rows(train), rows(heldout)


def test_the_same_examples_are_held_out_whatever_the_order_and_batching():
  x, y = examples(1000)
  by_20 = tf.data.Dataset.from_tensor_slices((x, y)).batch(20)
  order = np.random.default_rng(1).permutation(1000)
  shuffled_by_7 = tf.data.Dataset.from_tensor_slices((x[order], y[order])).batch(7)
  train, heldout = heldout_rows(by_20)
  assert (train, heldout) == heldout_rows(shuffled_by_7)
  assert not train & heldout
  assert len(train) + len(heldout) == 1000
  assert 70 <= len(heldout) <= 130  # A tenth, by hash.


def test_the_label_is_part_of_the_example():
  x, y = examples(1000)
  mask = client_training.heldout_mask((x, y), 10).numpy()
  other_labels = client_training.heldout_mask((x, (y + 1) % 5), 10).numpy()
  assert (mask != other_labels).any()


def test_dict_batches_and_empty_batches():
  x, y = examples(4, seed=3)
  batches = tf.data.Dataset.from_tensor_slices({'x': x, 'y': y}).batch(1)
  train, heldout = client_training.split_heldout(batches, 10**6)  # Nothing held out.
  assert [b['x'].shape[0] for b in train.as_numpy_iterator()] == [1, 1, 1, 1]
  assert list(heldout.as_numpy_iterator()) == []
