"""Tests of the FedAvg CNN builder and its blocks."""

import numpy as np
import pytest
import tensorflow as tf

from tff_personal.models import cnn


@pytest.fixture(scope='module')
def emnist_cnn():
  return cnn.build_cnn()


def test_fedavg_cnn_parameter_count(emnist_cnn):
  # conv1 5*5*1*32+32, conv2 5*5*32*64+64, dense 7*7*64*512+512, logits 512*62+62.
  expected = 832 + 51_264 + 1_606_144 + 31_806
  assert expected == 1_690_046
  assert emnist_cnn.count_params() == expected
  assert [l.name for l in emnist_cnn.layers] == [
      'x', 'conv1', 'pool1', 'conv2', 'pool2', 'flatten', 'dense', 'logits'
  ]


def test_output_shape_and_logits(emnist_cnn):
  out = emnist_cnn(tf.zeros([3, 28, 28, 1]))
  assert out.shape == (3, 62)
  assert emnist_cnn.layers[-1].activation is tf.keras.activations.linear


def test_small_variant_for_fmnist():
  model = cnn.build_cnn(num_classes=10, conv_filters=(16, 32), dense_units=128)
  assert model(tf.zeros([2, 28, 28, 1])).shape == (2, 10)
  # conv1 416, conv2 12,832, dense 1568*128+128, logits 1,290.
  assert model.count_params() == 416 + 12_832 + 200_832 + 1_290


def test_other_input_shape():
  model = cnn.build_cnn(num_classes=100, input_shape=(32, 32, 3))
  assert model(tf.zeros([1, 32, 32, 3])).shape == (1, 100)


def test_blocks_cover_every_layer_once(emnist_cnn):
  blocks = cnn.cnn_blocks()
  assert len(blocks) == 4 and blocks[-1] == ['logits']
  names = [n for block in blocks for n in block]
  assert len(names) == len(set(names))
  assert set(names) == {l.name for l in emnist_cnn.layers[1:]}
  with_weights = {l.name for l in emnist_cnn.layers if l.weights}
  assert with_weights <= set(names)


def test_no_stochastic_or_batch_statistics_layers(emnist_cnn):
  kinds = {type(l).__name__ for l in emnist_cnn.layers}
  assert not kinds & {'Dropout', 'BatchNormalization'}
  assert not emnist_cnn.non_trainable_weights


def test_ditto_femnist_cnn():
  model = cnn.build_cnn(62, (28, 28, 1), *cnn.DITTO_FEMNIST)
  # conv1 416, conv2 12,832, dense 1568*128+128, logits 128*62+62.
  assert model.count_params() == 416 + 12_832 + 200_832 + 7_998 == 222_078
  assert [l.name for l in model.layers] == [
      'x', 'conv1', 'pool1', 'conv2', 'pool2', 'dropout_conv', 'flatten', 'dense',
      'dropout_dense', 'logits',
  ]
  assert [l.rate for l in model.layers if 'dropout' in l.name] == [0.25, 0.5]
  blocks = cnn.cnn_blocks(with_dropout=True)
  assert [n for block in blocks for n in block] == [l.name for l in model.layers[1:]]
  x = tf.random.stateless_uniform([4, 28, 28, 1], seed=[0, 1])
  np.testing.assert_array_equal(model(x, training=False), model(x))
  assert not np.allclose(model(x, training=True), model(x))
  np.testing.assert_array_equal(model(x, training=True), model(x, training=True))


def test_bad_filters():
  with pytest.raises(ValueError, match='conv_filters'):
    cnn.build_cnn(conv_filters=(8,))


def test_seeded_initialization_is_reproducible():
  tf.keras.utils.set_random_seed(3)
  a = cnn.build_cnn(num_classes=10, conv_filters=(4, 8), dense_units=16).get_weights()
  tf.keras.utils.set_random_seed(3)
  b = cnn.build_cnn(num_classes=10, conv_filters=(4, 8), dense_units=16).get_weights()
  for x, y in zip(a, b):
    np.testing.assert_array_equal(x, y)
