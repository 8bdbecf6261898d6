"""The two-layer CNN of FedAvg (McMahan et al. 2017), parameterized.

"Communication-Efficient Learning of Deep Networks from Decentralized Data":
two 5x5 convolutions (32 and 64 channels, each followed by 2x2 max pooling),
a fully connected layer of 512 units with ReLU, and a linear layer of class
logits. With 62 classes on 28x28x1 inputs it has 1,690,046 parameters.
Ditto's code (Li et al. 2021) trains a smaller one on FEMNIST: 16 and 32
channels, 128 dense units, dropout 0.25 and 0.5 (about 0.2M parameters).

FedPer blocks, bottom to top: [conv1, pool1], [conv2, pool2, flatten],
[dense], [logits]; the classifier (`logits`) is FedPer's block 1.
"""

from typing import Sequence

import tensorflow as tf

BLOCKS = (
    ('conv1', 'pool1'),
    ('conv2', 'pool2', 'flatten'),
    ('dense',),
    ('logits',),
)


def build_cnn(
    num_classes: int = 62,
    input_shape: Sequence[int] = (28, 28, 1),
    conv_filters: Sequence[int] = (32, 64),
    dense_units: int = 512,
) -> tf.keras.Model:
  """Returns the (built, uncompiled) CNN; its output is class logits."""
  if len(conv_filters) != 2:
    raise ValueError(f'conv_filters must have 2 entries, got {conv_filters}.')
  inputs = tf.keras.Input(shape=tuple(input_shape), name='x')
  h = tf.keras.layers.Conv2D(
      conv_filters[0], 5, padding='same', activation='relu', name='conv1'
  )(inputs)
  h = tf.keras.layers.MaxPool2D(2, name='pool1')(h)
  h = tf.keras.layers.Conv2D(
      conv_filters[1], 5, padding='same', activation='relu', name='conv2'
  )(h)
  h = tf.keras.layers.MaxPool2D(2, name='pool2')(h)
  h = tf.keras.layers.Flatten(name='flatten')(h)
  h = tf.keras.layers.Dense(dense_units, activation='relu', name='dense')(h)
  logits = tf.keras.layers.Dense(num_classes, name='logits')(h)
  return tf.keras.Model(inputs=inputs, outputs=logits, name='cnn')


def cnn_blocks() -> list[list[str]]:
  """Layer names of the CNN's blocks, bottom to top."""
  return [list(block) for block in BLOCKS]
