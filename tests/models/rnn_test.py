"""Tests of the recurrent language models: shapes, blocks, seeded weights."""

import numpy as np
import pytest
import tensorflow as tf

from tff_personal.models import model_spec
from tff_personal.models import rnn


def _layers_with_weights(model):
  return {layer.name for layer in model.layers if layer.weights}


def _flat_block_names(blocks):
  names = [name for block in blocks for name in block]
  assert len(names) == len(set(names))
  return set(names)


def _spec(build, blocks):
  spec = tf.TensorSpec([None, None], tf.int64)
  return model_spec.ModelSpec(
      build=build,
      blocks=blocks,
      loss=lambda: tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
      metrics=lambda: [tf.keras.metrics.SparseCategoricalAccuracy()],
      input_spec=(spec, spec),
  )


def _flat_weights(spec, seed):
  return [np.asarray(w) for w in tf.nest.flatten(spec.initial_weights(seed))]


def test_char_rnn_default_shapes_and_blocks():
  model = rnn.build_char_rnn(90)
  logits = model(tf.constant([[88, 5, 6, 89, 0], [88, 1, 2, 3, 4]], tf.int64))
  assert logits.shape == (2, 5, 90)
  blocks = rnn.char_rnn_blocks()
  assert blocks == [['embedding'], ['rnn1'], ['logits']]
  assert _layers_with_weights(model) == _flat_block_names(blocks)
  assert model.get_layer('embedding').output_dim == 8
  assert isinstance(model.get_layer('rnn1'), tf.keras.layers.GRU)
  assert model.get_layer('rnn1').units == 128


def test_char_rnn_two_lstm_layers():
  model = rnn.build_char_rnn(12, rnn_units=4, num_rnn_layers=2, cell='lstm')
  blocks = rnn.char_rnn_blocks(2)
  assert blocks == [['embedding'], ['rnn1'], ['rnn2'], ['logits']]
  assert _layers_with_weights(model) == _flat_block_names(blocks)
  assert isinstance(model.get_layer('rnn2'), tf.keras.layers.LSTM)
  assert model(tf.ones([3, 7], tf.int64)).shape == (3, 7, 12)


def test_char_rnn_rejects_unknown_cell():
  with pytest.raises(ValueError, match='cell'):
    rnn.build_char_rnn(12, cell='transformer')


def test_char_rnn_masks_trailing_padding():
  # With pad 0 masked, the outputs of the real tokens do not depend on how
  # much padding follows them.
  tf.keras.utils.set_random_seed(0)
  model = rnn.build_char_rnn(12, rnn_units=4)
  short = model(tf.constant([[3, 4, 0]], tf.int64)).numpy()
  long = model(tf.constant([[3, 4, 0, 0, 0]], tf.int64)).numpy()
  np.testing.assert_allclose(short[0, :2], long[0, :2], rtol=1e-6)


def test_word_lstm_default_sizes():
  model = rnn.build_word_lstm(10004)
  assert model.get_layer('embedding').output_dim == 64
  assert model.get_layer('lstm').units == 128
  assert model.get_layer('logits').units == 10004


def test_word_lstm_shapes_and_blocks():
  model = rnn.build_word_lstm(30, embedding_dim=6, lstm_units=5)
  assert model(tf.ones([2, 20], tf.int64)).shape == (2, 20, 30)
  assert _layers_with_weights(model) == _flat_block_names(rnn.WORD_LSTM_BLOCKS)
  assert [b[0] for b in rnn.WORD_LSTM_BLOCKS] == ['embedding', 'lstm', 'dense', 'logits']
  assert model.get_layer('dense').units == 6


def test_initial_weights_are_reproducible():
  spec = _spec(lambda: rnn.build_char_rnn(12, rnn_units=4), rnn.char_rnn_blocks())
  first, again, other = (_flat_weights(spec, s) for s in (7, 7, 8))
  # Embedding, GRU kernel/recurrent kernel/bias, dense kernel/bias.
  assert [w.shape for w in first] == [(12, 8), (8, 12), (4, 12), (2, 12), (4, 12), (12,)]
  for a, b in zip(first, again):
    np.testing.assert_array_equal(a, b)
  assert not np.array_equal(first[0], other[0])


def test_word_lstm_initial_weights_are_reproducible():
  spec = _spec(
      lambda: rnn.build_word_lstm(30, embedding_dim=6, lstm_units=5),
      rnn.WORD_LSTM_BLOCKS,
  )
  for a, b in zip(_flat_weights(spec, 3), _flat_weights(spec, 3)):
    np.testing.assert_array_equal(a, b)
