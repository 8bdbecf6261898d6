"""PersonalSplit and the linear-base ablation on the tasks' real models."""

import numpy as np
import pytest
import tensorflow as tf

from tff_personal.models import split as split_lib
from tff_personal.tasks import cifar100
from tff_personal.tasks import emnist
from tff_personal.tasks import shakespeare

CNN = emnist.cnn_spec()  # Blocks: [conv1, pool1], [conv2, pool2, flatten], [dense], [logits].


@pytest.mark.parametrize(
    'personal_blocks, personal_shapes',
    [
        (0, []),
        (1, [(512, 62), (62,)]),
        (2, [(3136, 512), (512,), (512, 62), (62,)]),
        (4, [(5, 5, 1, 32), (32,), (5, 5, 32, 64), (64,), (3136, 512), (512,), (512, 62), (62,)]),
    ],
)
def test_cnn_split_counts_blocks_from_the_top(personal_blocks, personal_shapes):
  split = split_lib.PersonalSplit.of(CNN, personal_blocks)
  weights = CNN.initial_weights(0)
  assert [w.shape for w in split.personal(weights).trainable] == personal_shapes
  assert len(split.base(weights).trainable) == 8 - len(personal_shapes)
  merged = split.merge(split.base(weights), split.personal(weights))
  for a, b in zip(tf.nest.flatten(merged), tf.nest.flatten(weights)):
    assert a is b  # The same arrays, back in Keras order.


def test_too_many_personal_blocks():
  with pytest.raises(ValueError, match=r'personal_blocks must be in \[0, 4\]'):
    split_lib.PersonalSplit.of(CNN, 5)


def test_resnet_and_char_rnn_blocks_cover_their_weights():
  resnet = cifar100.resnet_spec()
  split = split_lib.PersonalSplit.of(resnet, 2)  # Stage 3 and the classifier.
  assert split.personal_layers[-2:] == ('pool', 'logits')
  char_rnn = shakespeare.build_shakespeare_model_spec()
  assert split_lib.PersonalSplit.of(char_rnn, 2).personal_layers == ('rnn1', 'logits')


def test_linear_base_replaces_the_base_by_one_dense_layer():
  model = split_lib.with_linear_base(CNN, 1)
  keras_model = model.build()
  assert [layer.name for layer in keras_model.layers] == [
      'x', 'linear_base_flatten', 'linear_base', 'linear_base_reshape', 'logits'
  ]
  assert keras_model.get_layer('linear_base').kernel.shape == (784, 512)
  split = split_lib.PersonalSplit.of(model, 1)
  assert [w.shape for w in split.personal(model.initial_weights(0)).trainable] == [(512, 62), (62,)]
  logits = keras_model(np.zeros((2, 28, 28, 1), np.float32))
  assert logits.shape == (2, 62)


@pytest.mark.parametrize('personal_blocks', [0, 4])
def test_linear_base_needs_a_base_to_replace(personal_blocks):
  with pytest.raises(ValueError, match='1 <= personal blocks < 4'):
    split_lib.with_linear_base(CNN, personal_blocks)


def test_linear_base_refuses_branching_personal_blocks():
  model = split_lib.with_linear_base(cifar100.resnet_spec(), 2)
  with pytest.raises(ValueError, match='chain of layers'):
    model.build()


def test_linear_base_refuses_token_inputs():
  model = split_lib.with_linear_base(shakespeare.build_shakespeare_model_spec(), 1)
  with pytest.raises(ValueError, match='floating-point inputs'):
    model.build()
