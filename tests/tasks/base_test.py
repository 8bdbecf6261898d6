"""Seeded epochs: the order every result in docs/ was trained with."""

import dataclasses

import numpy as np
import pytest
import tensorflow as tf

from tff_personal.tasks import base


def flat_map_epochs(dataset, epochs, seed, shuffle_buffer=1000):
  """An earlier formulation of `base.shuffled_epochs` (a `flat_map`)."""
  seed = tf.cast(seed, tf.int64)

  def epoch(e):
    return dataset.shuffle(
        shuffle_buffer, seed=seed * 1_000_003 + e, reshuffle_each_iteration=False
    )

  return tf.data.Dataset.range(epochs).flat_map(epoch)


EXAMPLES = tf.data.Dataset.from_tensor_slices(np.arange(2500))


@pytest.mark.parametrize('seed', [0, 7, 123_456, 2**40 + 3])
@pytest.mark.parametrize('epochs', [1, 2, 3])
def test_same_order_as_the_flat_map(seed, epochs):
  expected = list(flat_map_epochs(EXAMPLES, epochs, seed).as_numpy_iterator())
  actual = list(base.shuffled_epochs(EXAMPLES, epochs, seed).as_numpy_iterator())
  assert actual == expected
  assert sorted(actual) == sorted(list(range(2500)) * epochs)


def test_same_order_with_a_seed_tensor_in_a_graph():
  """As in `Task.train_dataset_computation`, where the seed is a tensor."""

  @tf.function
  def both(seed):
    return (
        flat_map_epochs(EXAMPLES, 2, seed).batch(5000).get_single_element(),
        base.shuffled_epochs(EXAMPLES, 2, seed).batch(5000).get_single_element(),
    )

  expected, actual = both(tf.constant(42, tf.int64))
  np.testing.assert_array_equal(actual, expected)


def test_epochs_differ_and_repeat():
  first, second = (
      list(base.shuffled_epochs(EXAMPLES, 2, seed=5).as_numpy_iterator()) for _ in range(2)
  )
  assert first == second  # Iterating again gives the same order.
  assert first[:2500] != first[2500:]  # Each epoch its own order.


def test_zero_epochs_is_empty_and_negative_is_an_error():
  assert list(base.shuffled_epochs(EXAMPLES, 0, seed=1).as_numpy_iterator()) == []
  with pytest.raises(ValueError, match='epochs must be >= 0, got -1'):
    base.shuffled_epochs(EXAMPLES, -1, seed=1)


def _batches(dataset):
  return [tuple(part.tolist() for part in batch) for batch in dataset.as_numpy_iterator()]


@pytest.mark.parametrize('examples_in_memory', [False, True])
def test_task_datasets_are_the_pipeline_built_in_python(examples_in_memory):
  """`Task.train_dataset`/`test_dataset` call a traced builder: same batches
  as the task's preprocessing applied to `create_tf_dataset_for_client`."""
  from tests import test_utils  # pylint: disable=g-import-not-at-top

  task = dataclasses.replace(test_utils.tiny_task(num_clients=4),
                             examples_in_memory=examples_in_memory)
  for i, client in enumerate(task.client_ids):
    for epochs, seed in [(1, i), (3, 2**40 + i), (0, i)]:
      raw = task.train_data.create_tf_dataset_for_client(client)
      expected = _batches(task.preprocess_train(raw, epochs, 3, seed))
      assert _batches(task.train_dataset(client, epochs=epochs, batch_size=3, seed=seed)) == expected
    raw = task.test_data.create_tf_dataset_for_client(client)
    assert _batches(task.test_dataset(client, batch_size=3)) == _batches(task.preprocess_eval(raw, 3))
  assert _batches(task.train_dataset(task.client_ids[0], epochs=2, batch_size=3, seed=1)) != _batches(
      task.train_dataset(task.client_ids[0], epochs=2, batch_size=3, seed=2))
  # One trace per (split, epochs, batch size), whatever the clients and seeds.
  assert {key: f.experimental_get_tracing_count() for key, f in task._builders.items()} == {  # pylint: disable=protected-access
      ('train', 1, 3): 1, ('train', 3, 3): 1, ('train', 0, 3): 1, ('train', 2, 3): 1, ('test', 3): 1
  }
  # A changed task traces its own builders.
  other = dataclasses.replace(task, name='other')
  assert other._builders == {}  # pylint: disable=protected-access



@pytest.mark.parametrize('examples_in_memory', [False, True])
@pytest.mark.parametrize('epochs, steps', [(1, 2), (2, 0)])
def test_a_clients_rounds_in_one_dataset_are_its_rounds_batches_in_sequence(
    examples_in_memory, epochs, steps
):
  """`train_dataset_of_rounds` = each round's `train_dataset`, cut to `steps`
  batches and transformed with that round's seed, one after the other."""
  from tests import test_utils  # pylint: disable=g-import-not-at-top
  from tff_personal.attacks import label_poison  # pylint: disable=g-import-not-at-top

  task = dataclasses.replace(test_utils.tiny_task(num_clients=3),
                             examples_in_memory=examples_in_memory)
  client, seeds = task.client_ids[1], [5, 2**40 + 1, 17]
  poison = lambda data, seed: label_poison.poison_labels(data, 4, seed)
  for transform in (lambda data, _: data, poison):
    expected = []
    for seed in seeds:
      batches = task.train_dataset(client, epochs=epochs, batch_size=3, seed=seed)
      expected += _batches(transform(batches.take(steps) if steps else batches, seed))
    together = task.train_dataset_of_rounds(
        client, epochs=epochs, batch_size=3, seeds=seeds, steps=steps, transform=transform
    )
    assert _batches(together) == expected
  assert len(expected) == (3 * 2 if steps else len(expected))
  unpoisoned = _batches(task.train_dataset_of_rounds(client, epochs=epochs, batch_size=3, seeds=seeds, steps=steps))
  assert [b[0] for b in unpoisoned] == [b[0] for b in expected]  # Same inputs,
  assert [b[1] for b in unpoisoned] != [b[1] for b in expected]  # other labels.
