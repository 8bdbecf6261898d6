"""Client-side SGD in plain TensorFlow, shared by the personalized algorithms.

The same steps as TFF's model-delta client work (`tff.learning`'s FedAvg):
for each batch, the gradient of `model.forward_pass(batch).loss` and the SGD
update `w <- w - learning_rate * g`, here on a chosen subset of the model's
variables (all of them, or only the personal ones when fine-tuning).
"""

from typing import Sequence

import tensorflow as tf
import tensorflow_federated as tff

from tff_personal.runtime import client_datasets


def sgd_pass(
    model: tff.learning.models.VariableModel,
    dataset: tf.data.Dataset,
    variables: Sequence[tf.Variable],
    learning_rate: float,
) -> tf.Tensor:
  """One pass of SGD over `dataset` updating `variables`; returns #examples.

  Call inside a `tf.function`. The model's metrics accumulate the pass.
  """
  variables = list(variables)

  def step(num_examples, batch):
    with tf.GradientTape() as tape:
      output = model.forward_pass(batch, training=True)
    gradients = dense_gradients(tape.gradient(output.loss, variables))
    for variable, gradient in zip(variables, gradients):
      variable.assign(variable - learning_rate * gradient)
    return num_examples + tf.cast(output.num_examples, tf.int64)

  return reduce_batches(dataset, tf.constant(0, tf.int64), step)


def proximal_sgd_pass(model, dataset, variables, anchor, learning_rate, strength):
  """One pass of SGD on F(v) + strength/2 ||v - anchor||^2; returns #examples.

  The step is v <- v - learning_rate * (grad F(v) + strength * (v - anchor)):
  Ditto's personal step (strength lambda) and FedProx's (mu). Call inside a
  `tf.function`.
  """
  variables = list(variables)

  def step(num_examples, batch):
    with tf.GradientTape() as tape:
      output = model.forward_pass(batch, training=True)
    gradients = dense_gradients(tape.gradient(output.loss, variables))
    for variable, gradient, center in zip(variables, gradients, anchor):
      variable.assign(variable - learning_rate * (gradient + strength * (variable - center)))
    return num_examples + tf.cast(output.num_examples, tf.int64)

  return reduce_batches(dataset, tf.constant(0, tf.int64), step)


def mean_loss(model, dataset):
  """The example-weighted mean loss of `model` over `dataset` (0 if empty); no step.

  Call inside a `tf.function`. The model's metrics accumulate the pass.
  """
  return mean_loss_and_count(model, dataset)[0]


def mean_loss_and_count(model, dataset):
  """(`mean_loss`, the number of examples as float32) of one pass; no step."""

  def accumulate(totals, batch):
    output = model.forward_pass(batch, training=False)
    n = tf.cast(output.num_examples, tf.float32)
    return totals[0] + output.loss * n, totals[1] + n

  zero = tf.constant(0.0)
  total, count = reduce_batches(dataset, (zero, zero), accumulate)
  return tf.math.divide_no_nan(total, count), count


def reduce_batches(dataset: tf.data.Dataset, initial_state, step_fn):
  """`dataset.reduce(initial_state, step_fn)`, as a loop over the batches.

  Call inside a `tf.function` (autograph makes the loop a `tf.while_loop`).
  The two compute the same; the loop is cheaper in TFF's runtime: the
  gradient function of a convolution also builds the gradient with respect
  to its input, which nothing uses at a model's first layer. TFF's worker
  prunes such unused ops from a loop body but runs them in a
  `dataset.reduce` function: one extra backward convolution a step
  (`ONEDNN_VERBOSE=1` counted 2 a step with `reduce`, 1 with the loop, on
  the FEMNIST CNN; docs/results_scale.md). And TFF's worker places a loop's
  ops on a GPU when it sees one, while a `dataset.reduce` function runs on
  the CPU device of its dataset op (`tests/runtime/device_placement_test.py`
  checks that no model op runs inside a dataset function).
  """
  state = initial_state
  for batch in iter(client_datasets.without_autotuning(dataset)):
    state = step_fn(state, batch)
  return state


def dense_gradients(gradients):
  """Embedding gradients (`tf.IndexedSlices`) as dense tensors, as TFF's optimizers do."""
  return [tf.convert_to_tensor(g) if isinstance(g, tf.IndexedSlices) else g for g in gradients]


def all_finite(structure) -> tf.Tensor:
  """True iff every floating value in the structure of tensors is finite."""
  flags = [
      tf.reduce_all(tf.math.is_finite(t))
      for t in tf.nest.flatten(structure)
      if tf.as_dtype(t.dtype).is_floating
  ]
  return tf.reduce_all(tf.stack(flags)) if flags else tf.constant(True)


_PRIME = 2_147_483_647  # 2^31 - 1: products of two residues fit in int64.


def _example_words(tensor: tf.Tensor) -> tf.Tensor:
  """[batch, n] int64 in [0, 2^32): each example's values as 32-bit words."""
  flat = tf.reshape(tensor, [tf.shape(tensor)[0], -1])
  if flat.dtype == tf.string:
    return tf.strings.to_hash_bucket_fast(flat, 2**32)
  if flat.dtype.is_floating:
    flat = tf.bitcast(tf.cast(flat, tf.float32), tf.int32)
  return tf.math.floormod(tf.cast(flat, tf.int64), 2**32)


def heldout_mask(batch, num_buckets: int) -> tf.Tensor:
  """True for the examples of `batch` held out: a fixed 1/num_buckets of a client's data.

  An example is held out when a hash of its feature and label values falls
  in bucket 0, so the same examples are held out in every round whatever the
  shuffling and batching (a validation set that the personal model never
  trains on, as Ditto's code holds out 10% of a device's training data). The
  hash is a weighted sum of the values' bits modulo a prime: integer ops
  only, cheap next to a training step.
  """
  tensors = tf.nest.flatten(batch)
  fingerprint = tf.zeros([tf.shape(tensors[0])[0]], tf.int64)
  for tensor in tensors:
    words = tf.math.floormod(_example_words(tensor), _PRIME)
    positions = tf.range(1, tf.shape(words)[1] + 1, dtype=tf.int64)
    weights = tf.math.floormod(positions * 2_654_435_761, _PRIME)
    value = tf.reduce_sum(tf.math.floormod(words * weights, _PRIME), axis=1)
    fingerprint = tf.math.floormod(fingerprint * 1_000_003 + value, _PRIME)
  mixed = tf.math.floormod(fingerprint * 48_271, _PRIME)
  return tf.equal(tf.math.floormod(mixed, num_buckets), 0)


def split_heldout(dataset: tf.data.Dataset, num_buckets: int):
  """(training, held-out) batches of `dataset` by `heldout_mask`; empty batches dropped."""

  # A dataset of tuples passes a batch to map and filter as separate arguments.
  as_batch = lambda components: components[0] if len(components) == 1 else components

  def select(keep_heldout):
    def masked(*components):
      batch = as_batch(components)
      mask = heldout_mask(batch, num_buckets)
      mask = mask if keep_heldout else tf.logical_not(mask)
      return tf.nest.map_structure(lambda t: tf.boolean_mask(t, mask), batch)

    def non_empty(*components):
      return tf.shape(tf.nest.flatten(as_batch(components))[0])[0] > 0

    return dataset.map(masked).filter(non_empty)

  return select(keep_heldout=False), select(keep_heldout=True)
