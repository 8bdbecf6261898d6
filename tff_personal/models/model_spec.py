"""A model as the algorithms see it: a Keras builder, its blocks, loss and metrics.

Blocks follow FedPer (Arivazhagan et al. 2019): a model is a stack of blocks,
numbered from the top, the classifier being block 1. `ModelSpec.blocks` lists
the Keras layer names of each block from the *bottom* (input side) to the top.
"""

import dataclasses
import random
from typing import Callable, Sequence

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff


@dataclasses.dataclass(frozen=True)
class ModelSpec:
  """A Keras model builder and the metadata the algorithms need.

  Attributes:
    build: returns a new, built, uncompiled `tf.keras.Model`. Runs must be
      reproducible and FL-friendly: dropout only as `SeededDropout` (masks
      drawn from the batch, not a stateful RNG), no batch statistics
      (BatchNorm). Initial weights are drawn from Keras' global RNG, so
      `initial_weights(seed)` is deterministic.
    blocks: Keras layer names per block, bottom to top; the last block is the
      classifier (FedPer's block 1). Every trainable layer is in one block.
    loss: builds the training loss (expects the model's output and `y`).
    metrics: builds the Keras metrics; the first is the task's accuracy.
    input_spec: the element spec of a batched `(x, y)` dataset.
  """

  build: Callable[[], tf.keras.Model]
  blocks: Sequence[Sequence[str]]
  loss: Callable[[], tf.keras.losses.Loss]
  metrics: Callable[[], list[tf.keras.metrics.Metric]]
  input_spec: tuple[tf.TensorSpec, tf.TensorSpec]

  def initial_weights(self, seed: int) -> tff.learning.models.ModelWeights:
    """The model's initial weights (NumPy), drawn with `seed`.

    Keras draws initial weights from global RNGs; they are seeded for the
    build and restored afterwards (TF's global seed back to unset), so that
    nothing else, e.g. the order of a seeded `shuffle`, depends on whether or
    when a model was initialized.
    """
    python_state, numpy_state = random.getstate(), np.random.get_state()
    tf.keras.utils.set_random_seed(seed)
    try:
      model = self.build()
    finally:
      tf.random.set_seed(None)
      random.setstate(python_state)
      np.random.set_state(numpy_state)
    return tff.learning.models.ModelWeights(
        trainable=[v.numpy() for v in model.trainable_weights],
        non_trainable=[v.numpy() for v in model.non_trainable_weights],
    )

  def tff_model_fn(self) -> tff.learning.models.VariableModel:
    """A `tff.learning` model over this Keras model (a TFF `model_fn`)."""
    return tff.learning.models.from_keras_model(
        self.build(),
        loss=self.loss(),
        input_spec=self.input_spec,
        metrics=self.metrics(),
    )
