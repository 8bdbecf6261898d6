"""LINDT's dual model: the attaching module, one exact round, what is sent."""

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tests import test_utils
from tests.algorithms.fedavg_test import batches_dataset, client_batches, run_next
from tff_personal.algorithms import lindt
from tff_personal.tasks import cifar100

LEARNING_RATE = 0.1
MODEL = test_utils.tiny_model_spec(hidden=3)  # Blocks: [hidden], [logits].
ModelWeights = tff.learning.models.ModelWeights


def test_attaching_module_numbers():
  g = np.array([[1.0, 2.0], [0.0, 1.0]], np.float32)
  l = np.array([[2.0, 0.0], [1.0, 1.0]], np.float32)
  h = lindt.AttachingModule()([tf.constant(g), tf.constant(l)]).numpy()
  score = np.array([2.0 / (2.0 * np.sqrt(2)), 1.0 / (np.sqrt(2) * np.sqrt(2))])
  expected = l + (1 / (1 + np.exp(-score)))[:, None] * g
  np.testing.assert_allclose(h, expected, rtol=1e-6)


@pytest.fixture(scope='module')
def process():
  return lindt.build_lindt(MODEL, client_learning_rate=LEARNING_RATE, seed=6)


def test_only_the_global_model_is_sent(process):
  signature = process.next.type_signature
  weights = '<trainable=<float32[2,3],float32[3],float32[3,2],float32[2]>,non_trainable=<>>'
  assert str(signature.parameter[2]) == '{' + weights + '}@CLIENTS'
  state = str(signature.result[0])
  assert 'global_model_weights=' + weights in state
  # The personal (local) model appears nowhere in the server state or metrics.
  assert str(signature.result[1]) == '{' + weights + '}@CLIENTS'


def reference_step(w, v, x, y):
  """One SGD step of the dual loss, written from the formulas directly."""
  w = [tf.Variable(p, dtype=tf.float64) for p in w]
  v = [tf.Variable(p, dtype=tf.float64) for p in v]
  x = tf.constant(x, tf.float64)
  with tf.GradientTape() as tape:
    g1 = tf.nn.relu(x @ w[0] + w[1])
    l1 = tf.nn.relu(x @ v[0] + v[1])
    norm = tf.sqrt(tf.maximum(tf.reduce_sum(l1 * l1, axis=1), 1e-12))  # Floored.
    score = tf.reduce_sum(g1 * l1, axis=1) / (norm * np.sqrt(3.0))
    h = l1 + tf.sigmoid(score)[:, None] * g1
    global_logits = g1 @ w[2] + w[3]
    local_logits = h @ v[2] + v[3]
    ce = lambda logits: tf.reduce_mean(
        tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits)
    )
    loss = ce(global_logits) + ce(local_logits)
  grads = tape.gradient(loss, w + v)
  new = [p - LEARNING_RATE * g for p, g in zip(w + v, grads)]
  return [t.numpy() for t in new[:4]], [t.numpy() for t in new[4:]]


def test_one_round_matches_the_formulas(process):
  state = process.initialize()
  w = process.get_model_weights(state).trainable
  rng = np.random.default_rng(3)
  v = [p + rng.normal(scale=0.3, size=p.shape).astype(np.float32) for p in w]
  (x, y), = client_batches(4, [5])
  output = run_next(
      process, state, [batches_dataset([(x, y)])],
      [ModelWeights(trainable=v, non_trainable=[])],
  )
  expected_w, expected_v = reference_step(w, v, x, y)
  for actual, expected in zip(process.get_model_weights(output.state).trainable, expected_w):
    np.testing.assert_allclose(actual, expected, rtol=1e-4, atol=1e-6)
  for actual, expected in zip(output.personal_states[0].trainable, expected_v):
    np.testing.assert_allclose(actual, expected, rtol=1e-4, atol=1e-6)
  assert output.metrics['client_work']['train']['num_examples'] == 5


def test_evaluate_predicts_with_the_local_logits(process):
  weights = process.get_model_weights(process.initialize())
  w = weights.trainable
  v = [p * 0.5 + 0.1 for p in w]
  (x, y), = client_batches(8, [6])
  result, = process.evaluate(
      weights, [batches_dataset([(x, y)])], [ModelWeights(trainable=v, non_trainable=[])]
  )
  g1 = np.maximum(x @ w[0] + w[1], 0)
  l1 = np.maximum(x @ v[0] + v[1], 0)
  score = np.sum(g1 * l1, axis=1) / (np.maximum(np.linalg.norm(l1, axis=1), 1e-6) * np.sqrt(3))
  logits = (l1 + (1 / (1 + np.exp(-score)))[:, None] * g1) @ v[2] + v[3]
  assert result['sparse_categorical_accuracy'] == pytest.approx(
      np.mean(np.argmax(logits, axis=1) == y)
  )
  shifted = logits - logits.max(axis=1, keepdims=True)
  log_p = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
  assert result['loss'] == pytest.approx(-np.mean(log_p[np.arange(len(y)), y]), rel=1e-5)


def test_a_model_with_skip_connections_across_blocks_is_refused():
  with pytest.raises(ValueError, match='no place for attaching modules'):
    lindt.build_lindt(cifar100.resnet_spec(), client_learning_rate=0.1)
  with pytest.raises(ValueError, match='at least two blocks'):
    lindt.build_lindt(test_utils.tiny_model_spec(), client_learning_rate=0.1)
