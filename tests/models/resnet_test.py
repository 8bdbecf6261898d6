"""Tests of the GroupNorm ResNet builder and its blocks."""

import numpy as np
import pytest
import tensorflow as tf

from tff_personal.models import resnet


@pytest.fixture(scope='module')
def model():
  return resnet.build_resnet()


def test_output_shape(model):
  assert model(tf.zeros([2, 32, 32, 3])).shape == (2, 100)
  assert model.layers[-1].name == 'logits'


def test_parameter_count(model):
  # Small enough for 2 CPU cores; pins the architecture.
  assert model.count_params() == 83_892


def test_blocks_cover_every_layer_once(model):
  blocks = resnet.resnet_blocks()
  assert len(blocks) == 5
  assert blocks[0] == ['stem_conv', 'stem_norm', 'stem_relu']
  assert blocks[-1] == ['pool', 'logits']
  assert all(n.startswith(f'block{i}_') for i in (1, 2, 3) for n in blocks[i])
  names = [n for block in blocks for n in block]
  assert len(names) == len(set(names))
  assert set(names) == {l.name for l in model.layers[1:]}


def test_group_norm_not_batch_norm(model):
  kinds = {type(l).__name__ for l in model.layers}
  assert 'GroupNormalization' in kinds
  assert not kinds & {'BatchNormalization', 'Dropout'}
  assert not model.non_trainable_weights


def test_downsampling_stages(model):
  assert model.get_layer('block1_relu2').output.shape[1:] == (32, 32, 16)
  assert model.get_layer('block2_relu2').output.shape[1:] == (16, 16, 32)
  assert model.get_layer('block3_relu2').output.shape[1:] == (8, 8, 64)


def test_seeded_initialization_is_reproducible():
  tf.keras.utils.set_random_seed(5)
  a = resnet.build_resnet(num_classes=10, stage_filters=(4, 8, 8)).get_weights()
  tf.keras.utils.set_random_seed(5)
  b = resnet.build_resnet(num_classes=10, stage_filters=(4, 8, 8)).get_weights()
  for x, y in zip(a, b):
    np.testing.assert_array_equal(x, y)
