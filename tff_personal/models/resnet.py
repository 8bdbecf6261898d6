"""A small ResNet with GroupNorm for CIFAR-sized images.

A ResNet-8 in the style of He et al. 2016 ("Deep Residual Learning for Image
Recognition"): a 3x3 stem convolution, three stages of one basic block each
(two 3x3 convolutions and an identity or 1x1 projection shortcut), global
average pooling and a linear classifier. BatchNorm is replaced by GroupNorm,
which keeps no batch statistics and suits non-IID federated clients (Hsieh et
al. 2020, "The Non-IID Data Quagmire of Decentralized Machine Learning";
Reddi et al. 2021, "Adaptive Federated Optimization", use it for CIFAR-100).

FedPer blocks, bottom to top: [stem], [stage 1], [stage 2], [stage 3],
[pool, logits]; the classifier is FedPer's block 1.
"""

from typing import Sequence

import tensorflow as tf

_STEM = ('stem_conv', 'stem_norm', 'stem_relu')
_BLOCK_LAYERS = ('conv1', 'norm1', 'relu1', 'conv2', 'norm2', 'add', 'relu2')
_CLASSIFIER = ('pool', 'logits')


def _group_norm(channels: int, num_groups: int, name: str) -> tf.keras.layers.Layer:
  return tf.keras.layers.GroupNormalization(
      groups=min(num_groups, channels), name=name
  )


def _basic_block(h, filters: int, stride: int, num_groups: int, prefix: str):
  shortcut = h
  h = tf.keras.layers.Conv2D(
      filters, 3, strides=stride, padding='same', use_bias=False, name=f'{prefix}_conv1'
  )(h)
  h = _group_norm(filters, num_groups, f'{prefix}_norm1')(h)
  h = tf.keras.layers.ReLU(name=f'{prefix}_relu1')(h)
  h = tf.keras.layers.Conv2D(
      filters, 3, padding='same', use_bias=False, name=f'{prefix}_conv2'
  )(h)
  h = _group_norm(filters, num_groups, f'{prefix}_norm2')(h)
  if stride != 1 or shortcut.shape[-1] != filters:
    shortcut = tf.keras.layers.Conv2D(
        filters, 1, strides=stride, use_bias=False, name=f'{prefix}_proj'
    )(shortcut)
    shortcut = _group_norm(filters, num_groups, f'{prefix}_proj_norm')(shortcut)
  h = tf.keras.layers.Add(name=f'{prefix}_add')([h, shortcut])
  return tf.keras.layers.ReLU(name=f'{prefix}_relu2')(h)


def build_resnet(
    num_classes: int = 100,
    input_shape: Sequence[int] = (32, 32, 3),
    stage_filters: Sequence[int] = (16, 32, 64),
    num_groups: int = 2,
) -> tf.keras.Model:
  """Returns the (built, uncompiled) ResNet; its output is class logits.

  Stage i has one basic block with `stage_filters[i]` channels; stages after
  the first halve the resolution.
  """
  inputs = tf.keras.Input(shape=tuple(input_shape), name='x')
  h = tf.keras.layers.Conv2D(
      stage_filters[0], 3, padding='same', use_bias=False, name='stem_conv'
  )(inputs)
  h = _group_norm(stage_filters[0], num_groups, 'stem_norm')(h)
  h = tf.keras.layers.ReLU(name='stem_relu')(h)
  for i, filters in enumerate(stage_filters):
    h = _basic_block(h, filters, 1 if i == 0 else 2, num_groups, f'block{i + 1}')
  h = tf.keras.layers.GlobalAveragePooling2D(name='pool')(h)
  logits = tf.keras.layers.Dense(num_classes, name='logits')(h)
  return tf.keras.Model(inputs=inputs, outputs=logits, name='resnet')


def resnet_blocks(num_stages: int = 3) -> list[list[str]]:
  """Layer names of `build_resnet`'s blocks (with `num_stages` stages), bottom to top.

  Stages after the first change shape, so they also have a projection
  shortcut (`_proj`, `_proj_norm`).
  """
  blocks = [list(_STEM)]
  for i in range(1, num_stages + 1):
    layers = list(_BLOCK_LAYERS)
    if i > 1:
      layers[5:5] = ['proj', 'proj_norm']
    blocks.append([f'block{i}_{name}' for name in layers])
  blocks.append(list(_CLASSIFIER))
  return blocks
