"""Tiny models and data for fast tests with exact numbers."""

import collections

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_personal.models import model_spec
from tff_personal.tasks import base


def tiny_model_spec(input_dim: int = 2, hidden: int = 0, num_classes: int = 2):
  """A linear (or one-hidden-layer) classifier; blocks: [hidden], [logits]."""

  def build():
    inputs = tf.keras.Input(shape=(input_dim,), name='x')
    x = inputs
    blocks = []
    if hidden:
      x = tf.keras.layers.Dense(hidden, activation='relu', name='hidden')(x)
      blocks.append(('hidden',))
    outputs = tf.keras.layers.Dense(num_classes, name='logits')(x)
    return tf.keras.Model(inputs, outputs)

  blocks = ((('hidden',),) if hidden else ()) + (('logits',),)
  return model_spec.ModelSpec(
      build=build,
      blocks=blocks,
      loss=lambda: tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
      metrics=lambda: [tf.keras.metrics.SparseCategoricalAccuracy()],
      input_spec=(
          tf.TensorSpec([None, input_dim], tf.float32),
          tf.TensorSpec([None], tf.int32),
      ),
  )


def tiny_client_data(num_clients: int = 4, examples: int = 8, input_dim: int = 2, seed: int = 0):
  """Linearly separable-ish client data as `(x, y)` examples, train and test."""
  rng = np.random.default_rng(seed)
  train, test = {}, {}
  for i in range(num_clients):
    for split in (train, test):
      x = rng.normal(size=(examples, input_dim)).astype(np.float32)
      y = (x[:, 0] + 0.1 * i > 0).astype(np.int32)
      split[f'client_{i}'] = collections.OrderedDict(x=x, y=y)
  return (
      tff.simulation.datasets.TestClientData(train),
      tff.simulation.datasets.TestClientData(test),
  )


def tiny_task(num_clients: int = 4, hidden: int = 0) -> base.Task:
  train, test = tiny_client_data(num_clients)

  preprocess_train, preprocess_eval = base.example_preprocessing(
      lambda e: (e['x'], e['y'])
  )
  return base.Task(
      name='tiny',
      train_data=train,
      test_data=test,
      model=tiny_model_spec(hidden=hidden),
      preprocess_train=preprocess_train,
      preprocess_eval=preprocess_eval,
  )


def tiny_datasets(num_clients: int = 3, hidden: int = 3, seed: int = 1):
  """Deterministic train/test datasets of the tiny task's clients, as lists."""
  task = tiny_task(num_clients=num_clients, hidden=hidden)
  train = [
      task.train_dataset(c, epochs=2, batch_size=3, seed=seed + i)
      for i, c in enumerate(task.client_ids)
  ]
  test = [task.test_dataset(c, batch_size=4) for c in task.client_ids]
  return train, test


def graph_defs(computation: tff.Computation) -> list:
  """Every TensorFlow GraphDef inside a TFF computation."""

  def walk(message):
    for field, value in message.ListFields():
      if field.message_type is None:
        continue
      for item in value if field.label == field.LABEL_REPEATED else [value]:
        if field.name == 'tensorflow':
          graph = tf.compat.v1.GraphDef()
          item.graph_def.Unpack(graph)
          yield graph
        else:
          yield from walk(item)

  return list(walk(computation.to_building_block().proto))
