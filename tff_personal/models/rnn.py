"""Recurrent language models with named blocks, after TFF's baseline models.

* `build_char_rnn`: next-character model, a small version of TFF's
  `tff.simulation.baselines.shakespeare` model (McMahan et al. 2017,
  https://arxiv.org/abs/1602.05629: embedding 8 -> LSTM 256 -> LSTM 256 ->
  logits). Ours by default: embedding 8 -> GRU 128 -> logits (65k weights;
  one local epoch of 10 typical Shakespeare clients, 765 sequences of 80
  characters, takes about 2.3 s on 2 CPU cores). Blocks bottom to top:
  `[embedding]`, `[rnn1]`, ..., `[logits]`.
* `build_word_lstm`: next-word model, a small version of TFF's
  `tff.simulation.baselines.stackoverflow` model (Reddi et al. 2021,
  https://arxiv.org/abs/2003.00295: embedding 96 -> LSTM 670 -> dense 96 ->
  logits). Ours by default: embedding 64 -> LSTM 128 -> dense 64 -> logits
  (1.4M weights for 10,004 tokens, mostly embedding and logits; about 80 ms
  per batch of 16 x 20 words on 2 CPU cores, against 230 ms for TFF's sizes).
  Blocks: `[embedding]`, `[lstm]`, `[dense]`, `[logits]`.

Both output logits for every position (`[batch, time, vocab]`) and mask the
pad token 0 as TFF's models do, so pad inputs do not count in the loss. No
dropout or batch statistics: runs must be reproducible.
"""

import tensorflow as tf


def build_char_rnn(
    vocab_size: int,
    *,
    embedding_dim: int = 8,
    rnn_units: int = 128,
    num_rnn_layers: int = 1,
    cell: str = 'gru',
) -> tf.keras.Model:
  """Embedding -> `num_rnn_layers` GRU/LSTM (all steps) -> dense logits.

  Args:
    vocab_size: number of token ids, special tokens (pad 0) included.
    embedding_dim: size of the character embedding (TFF: 8).
    rnn_units: units of each recurrent layer (TFF: 256).
    num_rnn_layers: recurrent layers, named `rnn1`, `rnn2`, ... (TFF: 2).
    cell: `gru` or `lstm` (TFF: `lstm`).

  Returns:
    A built, uncompiled model mapping int64 `[batch, time]` to logits
    `[batch, time, vocab_size]`.
  """
  if vocab_size < 1 or embedding_dim < 1 or rnn_units < 1 or num_rnn_layers < 1:
    raise ValueError('Sizes must be positive integers.')
  layer_classes = {'gru': tf.keras.layers.GRU, 'lstm': tf.keras.layers.LSTM}
  if cell not in layer_classes:
    raise ValueError(f'cell must be one of {sorted(layer_classes)}, got {cell!r}.')
  inputs = tf.keras.Input(shape=(None,), dtype=tf.int64, name='tokens')
  x = tf.keras.layers.Embedding(
      vocab_size, embedding_dim, mask_zero=True, name='embedding'
  )(inputs)
  for i in range(num_rnn_layers):
    x = layer_classes[cell](rnn_units, return_sequences=True, name=f'rnn{i + 1}')(x)
  logits = tf.keras.layers.Dense(vocab_size, name='logits')(x)
  return tf.keras.Model(inputs=inputs, outputs=logits, name='char_rnn')


def char_rnn_blocks(num_rnn_layers: int = 1) -> list[list[str]]:
  """Blocks of `build_char_rnn`, bottom to top."""
  return (
      [['embedding']]
      + [[f'rnn{i + 1}'] for i in range(num_rnn_layers)]
      + [['logits']]
  )


def build_word_lstm(
    vocab_size: int,
    *,
    embedding_dim: int = 64,
    lstm_units: int = 128,
) -> tf.keras.Model:
  """Embedding -> LSTM (all steps) -> dense projection -> dense logits.

  Args:
    vocab_size: number of token ids, special tokens (pad 0) included.
    embedding_dim: size of the word embedding and of the projection after the
      LSTM (TFF: 96).
    lstm_units: LSTM units (TFF: 670).

  Returns:
    A built, uncompiled model mapping int64 `[batch, time]` to logits
    `[batch, time, vocab_size]`.
  """
  if vocab_size < 1 or embedding_dim < 1 or lstm_units < 1:
    raise ValueError('Sizes must be positive integers.')
  inputs = tf.keras.Input(shape=(None,), dtype=tf.int64, name='tokens')
  x = tf.keras.layers.Embedding(
      vocab_size, embedding_dim, mask_zero=True, name='embedding'
  )(inputs)
  x = tf.keras.layers.LSTM(lstm_units, return_sequences=True, name='lstm')(x)
  x = tf.keras.layers.Dense(embedding_dim, name='dense')(x)
  logits = tf.keras.layers.Dense(vocab_size, name='logits')(x)
  return tf.keras.Model(inputs=inputs, outputs=logits, name='word_lstm')


WORD_LSTM_BLOCKS = (('embedding',), ('lstm',), ('dense',), ('logits',))
