"""Dropout that runs reproducibly inside TFF computations.

Keras' `Dropout` draws its masks from a stateful RNG, so two runs of the same
TFF computation (or a run and its export) train differently. `SeededDropout`
draws each mask from a stateless RNG seeded by the layer's salt and the bits
of the sum of its input batch: the same batch at the same weights gets the
same mask, other batches get other masks, and a run reproduces itself.
`mask_draw` gives every layer of a model other masks for the same batches,
to average a prediction over masks.
"""

import contextlib

import tensorflow as tf

_DRAW_STRIDE = 1_000_003  # Salt offset between draws; keeps the draws of different salts apart.
MAX_DRAW = 2_000  # Salt + draw offset stays an int32.


class SeededDropout(tf.keras.layers.Layer):
  """Inverted dropout (Srivastava et al. 2014) with batch-seeded masks.

  While training, each unit is zeroed with probability `rate` and the kept
  ones are scaled by 1 / (1 - rate); otherwise the layer is the identity.
  """

  def __init__(self, rate: float, salt: int, **kwargs):
    super().__init__(**kwargs)
    if not 0.0 <= rate < 1.0:
      raise ValueError(f'Dropout rate must be in [0, 1), got {rate}.')
    self.rate = rate
    self.salt = salt

  def call(self, inputs, training=None):
    if not self.rate:
      return inputs

    def dropped():
      fingerprint = tf.bitcast(tf.reduce_sum(tf.stop_gradient(inputs)), tf.int32)
      seed = tf.stack([tf.constant(self.salt, tf.int32), fingerprint])
      keep = tf.random.stateless_uniform(tf.shape(inputs), seed=seed) >= self.rate
      return tf.where(keep, inputs / (1.0 - self.rate), tf.zeros_like(inputs))

    return tf.__internal__.smart_cond.smart_cond(
        bool(training) if training is None or isinstance(training, bool) else training,
        dropped,
        lambda: inputs,
    )

  def get_config(self):
    return {**super().get_config(), 'rate': self.rate, 'salt': self.salt}


def dropout_layers(model: tf.Module) -> list[SeededDropout]:
  """The SeededDropout layers of `model` (a layer, a Keras model or any tf.Module)."""
  layers = [model] if isinstance(model, SeededDropout) else []
  return layers + [m for m in model.submodules if isinstance(m, SeededDropout)]


@contextlib.contextmanager
def mask_draw(model: tf.Module, draw: int):
  """Within it, the SeededDropout layers of `model` draw the masks of `draw`.

  Draw 0 is the layers' own masks; each other draw gives every layer other
  masks for the same batch, so predictions averaged over draws estimate the
  expectation over masks (evaluating with dropout active, as Ditto's code
  does). For eager calls: a traced function keeps the masks it was traced with.
  """
  if not 0 <= draw <= MAX_DRAW:
    raise ValueError(f'draw must be in [0, {MAX_DRAW}], got {draw}.')
  layers = dropout_layers(model)
  salts = [layer.salt for layer in layers]
  try:
    for layer, salt in zip(layers, salts):
      layer.salt = salt + _DRAW_STRIDE * draw
    yield
  finally:
    for layer, salt in zip(layers, salts):
      layer.salt = salt
