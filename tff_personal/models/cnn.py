"""The two-layer CNN of FedAvg (McMahan et al. 2017), parameterized.

"Communication-Efficient Learning of Deep Networks from Decentralized Data":
two 5x5 convolutions (32 and 64 channels, each followed by 2x2 max pooling),
a fully connected layer of 512 units with ReLU, and a linear layer of class
logits. With 62 classes on 28x28x1 inputs it has 1,690,046 parameters.
Ditto's code (Li et al. 2021, litian96/ditto `flearn/models/femnist/cnn.py`)
trains a smaller one on FEMNIST: 16 and 32 channels, 128 dense units, and
dropout of 0.25 after the second pooling and 0.5 after the dense layer
(`DITTO_FEMNIST`; 222,078 parameters with 62 classes). Dropout here is
`SeededDropout`, reproducible inside TFF; Ditto's code also drops units when
it evaluates, ours only while training.

FedPer blocks, bottom to top: [conv1, pool1], [conv2, pool2, flatten],
[dense], [logits], with the dropout layers, when present, after pool2 and
after dense in their blocks; the classifier (`logits`) is FedPer's block 1.
"""

from typing import NamedTuple, Sequence

import tensorflow as tf

from tff_personal.models import seeded_dropout


class CnnShape(NamedTuple):
  """The sizes of a CNN of this module."""

  conv_filters: tuple[int, int]
  dense_units: int
  dropout_rates: tuple[float, float] = (0.0, 0.0)


FEDAVG = CnnShape((32, 64), 512)
DITTO_FEMNIST = CnnShape((16, 32), 128, (0.25, 0.5))


def build_cnn(
    num_classes: int = 62,
    input_shape: Sequence[int] = (28, 28, 1),
    conv_filters: Sequence[int] = FEDAVG.conv_filters,
    dense_units: int = FEDAVG.dense_units,
    dropout_rates: Sequence[float] = FEDAVG.dropout_rates,
) -> tf.keras.Model:
  """Returns the (built, uncompiled) CNN; its output is class logits.

  `dropout_rates` are those after the second pooling and after the dense
  layer; with both 0 (the default) the model has no dropout layers.
  """
  if len(conv_filters) != 2:
    raise ValueError(f'conv_filters must have 2 entries, got {conv_filters}.')
  if len(dropout_rates) != 2:
    raise ValueError(f'dropout_rates must have 2 entries, got {dropout_rates}.')
  with_dropout = any(dropout_rates)
  inputs = tf.keras.Input(shape=tuple(input_shape), name='x')
  h = tf.keras.layers.Conv2D(
      conv_filters[0], 5, padding='same', activation='relu', name='conv1'
  )(inputs)
  h = tf.keras.layers.MaxPool2D(2, name='pool1')(h)
  h = tf.keras.layers.Conv2D(
      conv_filters[1], 5, padding='same', activation='relu', name='conv2'
  )(h)
  h = tf.keras.layers.MaxPool2D(2, name='pool2')(h)
  if with_dropout:
    h = seeded_dropout.SeededDropout(dropout_rates[0], salt=1, name='dropout_conv')(h)
  h = tf.keras.layers.Flatten(name='flatten')(h)
  h = tf.keras.layers.Dense(dense_units, activation='relu', name='dense')(h)
  if with_dropout:
    h = seeded_dropout.SeededDropout(dropout_rates[1], salt=2, name='dropout_dense')(h)
  logits = tf.keras.layers.Dense(num_classes, name='logits')(h)
  return tf.keras.Model(inputs=inputs, outputs=logits, name='cnn')


def cnn_blocks(with_dropout: bool = False) -> list[list[str]]:
  """Layer names of the CNN's blocks, bottom to top."""
  if not with_dropout:
    return [['conv1', 'pool1'], ['conv2', 'pool2', 'flatten'], ['dense'], ['logits']]
  return [
      ['conv1', 'pool1'],
      ['conv2', 'pool2', 'dropout_conv', 'flatten'],
      ['dense', 'dropout_dense'],
      ['logits'],
  ]
