"""The split of a model into shared base blocks and personal top blocks.

FedPer (Arivazhagan et al. 2019, "Federated Learning with Personalization
Layers") keeps the top K_P blocks of a model on the client and shares the
rest. Blocks are counted from the top, the classifier being block 1; a
`ModelSpec` lists its blocks bottom to top (`ModelSpec.blocks`).

A `PersonalSplit` knows which of the model's weights (in Keras order, as in
`tff.learning.models.ModelWeights`) belong to the personal blocks, and splits
and merges weight lists accordingly. It works on any values in those lists
(NumPy arrays, tensors, variables).
"""

import dataclasses
from typing import Any, Sequence

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_personal.models import model_spec

ModelWeights = tff.learning.models.ModelWeights


def _pick(values: Sequence[Any], indices: Sequence[int]) -> list[Any]:
  return [values[i] for i in indices]


def _interleave(size, first_positions, first, second) -> list[Any]:
  """`first`'s values at `first_positions`, `second`'s elsewhere, in order."""
  first_values, second_values = iter(first), iter(second)
  return [
      next(first_values) if i in first_positions else next(second_values)
      for i in range(size)
  ]


@dataclasses.dataclass(frozen=True)
class PersonalSplit:
  """Positions of the base and personal weights in a model's weight lists."""

  personal_blocks: int
  personal_layers: tuple[str, ...]
  personal_trainable: tuple[int, ...]
  personal_non_trainable: tuple[int, ...]
  num_trainable: int
  num_non_trainable: int

  @classmethod
  def of(cls, model: model_spec.ModelSpec, personal_blocks: int) -> 'PersonalSplit':
    """The split of `model` with its top `personal_blocks` blocks personal."""
    blocks = [tuple(block) for block in model.blocks]
    if not 0 <= personal_blocks <= len(blocks):
      raise ValueError(
          f'personal_blocks must be in [0, {len(blocks)}] (the model has'
          f' {len(blocks)} blocks), got {personal_blocks}.'
      )
    personal_layers = tuple(
        name for block in blocks[len(blocks) - personal_blocks :] for name in block
    )
    with tf.Graph().as_default():  # No eager variables are created.
      keras_model = model.build()
    layer_names = {layer.name for layer in keras_model.layers}
    in_blocks = {name for block in blocks for name in block}
    missing = in_blocks - layer_names
    if missing:
      raise ValueError(f'Blocks name layers the model lacks: {sorted(missing)}.')
    owner = {}
    for layer in keras_model.layers:
      for variable in layer.weights:
        owner[id(variable)] = layer.name
    unblocked = sorted({owner[id(v)] for v in keras_model.weights} - in_blocks)
    if unblocked:
      raise ValueError(f'Layers with weights in no block: {unblocked}.')

    def personal_positions(variables):
      return tuple(
          i for i, v in enumerate(variables) if owner[id(v)] in personal_layers
      )

    return cls(
        personal_blocks=personal_blocks,
        personal_layers=personal_layers,
        personal_trainable=personal_positions(keras_model.trainable_weights),
        personal_non_trainable=personal_positions(keras_model.non_trainable_weights),
        num_trainable=len(keras_model.trainable_weights),
        num_non_trainable=len(keras_model.non_trainable_weights),
    )

  @property
  def base_trainable(self) -> tuple[int, ...]:
    return tuple(i for i in range(self.num_trainable) if i not in self.personal_trainable)

  @property
  def base_non_trainable(self) -> tuple[int, ...]:
    return tuple(
        i for i in range(self.num_non_trainable) if i not in self.personal_non_trainable
    )

  def base(self, weights: ModelWeights) -> ModelWeights:
    return ModelWeights(
        trainable=_pick(weights.trainable, self.base_trainable),
        non_trainable=_pick(weights.non_trainable, self.base_non_trainable),
    )

  def personal(self, weights: ModelWeights) -> ModelWeights:
    return ModelWeights(
        trainable=_pick(weights.trainable, self.personal_trainable),
        non_trainable=_pick(weights.non_trainable, self.personal_non_trainable),
    )

  def merge(self, base_weights: ModelWeights, personal_weights: ModelWeights) -> ModelWeights:
    """The whole model's weights from its base and personal parts."""
    return ModelWeights(
        trainable=_interleave(
            self.num_trainable,
            self.personal_trainable,
            list(personal_weights.trainable),
            list(base_weights.trainable),
        ),
        non_trainable=_interleave(
            self.num_non_trainable,
            self.personal_non_trainable,
            list(personal_weights.non_trainable),
            list(base_weights.non_trainable),
        ),
    )


def with_linear_base(model: model_spec.ModelSpec, personal_blocks: int) -> model_spec.ModelSpec:
  """FedPer's ablation: the base blocks replaced by a single linear layer.

  The paper's appendix asks whether the base layers learn anything: the
  input is flattened and mapped by one linear (Dense, no activation) layer to
  the input shape of the personal blocks, which follow unchanged. The new
  model has `personal_blocks + 1` blocks, the linear base being the lowest.

  Raises:
    ValueError: if no base is left to replace, the model's input is not
      floating point, or the personal blocks are not a chain of layers.
  """
  blocks = [tuple(block) for block in model.blocks]
  if not 1 <= personal_blocks < len(blocks):
    raise ValueError(
        f'A linear base needs 1 <= personal blocks < {len(blocks)} (the model'
        f' has {len(blocks)} blocks), got {personal_blocks}.'
    )
  personal_block_names = blocks[len(blocks) - personal_blocks :]
  personal_names = [name for block in personal_block_names for name in block]

  def build() -> tf.keras.Model:
    original = model.build()
    if not original.inputs[0].dtype.is_floating:
      raise ValueError('A linear base needs a model with floating-point inputs.')
    layers = [original.get_layer(name) for name in personal_names]
    for previous, layer in zip(layers, layers[1:]):
      inbound = tf.nest.flatten(layer.inbound_nodes[0].inbound_layers)
      if inbound != [previous]:
        raise ValueError(
            f'A linear base needs personal blocks that form a chain of layers;'
            f' {layer.name} does not follow {previous.name} alone.'
        )
    personal_input_shape = tuple(layers[0].input_shape[1:])
    inputs = tf.keras.Input(shape=original.input_shape[1:], name='x')
    h = tf.keras.layers.Flatten(name='linear_base_flatten')(inputs)
    h = tf.keras.layers.Dense(
        int(np.prod(personal_input_shape)), name='linear_base'
    )(h)
    h = tf.keras.layers.Reshape(personal_input_shape, name='linear_base_reshape')(h)
    for layer in layers:
      h = layer.__class__.from_config(layer.get_config())(h)
    return tf.keras.Model(inputs, h, name=f'{original.name}_linear_base')

  return dataclasses.replace(
      model,
      build=build,
      blocks=(('linear_base_flatten', 'linear_base', 'linear_base_reshape'),)
      + tuple(personal_block_names),
  )
