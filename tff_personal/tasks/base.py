"""What a task is: federated train/test data, a model, and how to batch data.

A `Task` bundles
  * `train_data` / `test_data`: `tff.simulation.datasets.ClientData` holding the
    *raw* examples of the same clients (every training client has its own
    test split);
  * `model`: a `models.model_spec.ModelSpec`, the Keras builder plus its blocks;
  * two preprocessing functions turning a client's raw dataset into batches
    of `(x, y)`: `preprocess_train(ds, epochs, batch_size, seed)` (seeded
    shuffle, so the same seed gives the same batches) and
    `preprocess_eval(ds, batch_size)` (no shuffle, one pass);
  * `default_personal_blocks`: how many blocks from the top FedPer keeps
    personal by default.

The datasets a `Task` returns have tf.data's autotuning off
(`runtime.client_datasets.without_autotuning` says why), also for client
work that is TFF's own (Local, FedProx). They come from one `tf.function`
per (split, epochs, batch size), traced once and then called with the
client id and seed: building the pipeline in Python traced its `map`
functions again for every client (FEMNIST: 21 ms a dataset against 1.2 ms;
the program builds every round's datasets, and every evaluated client's).
A task whose raw examples are arrays in this process (`examples_in_memory`,
fmnist) reads a client's raw dataset with its Python id instead, and only
the preprocessing is traced: read with a string tensor, such data puts every
client's examples into each dataset's graph (fmnist: 41 MB, serialized into
every call, against 0.2 MB for the client's own slice).
"""

import dataclasses
from typing import Any, Callable, Sequence

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_personal.models import model_spec
from tff_personal.runtime import client_datasets

ClientData = tff.simulation.datasets.ClientData


@dataclasses.dataclass(frozen=True)
class Task:
  """A federated task; see the module docstring."""

  name: str
  train_data: ClientData
  test_data: ClientData
  model: model_spec.ModelSpec
  preprocess_train: Callable[[tf.data.Dataset, int, int, int], tf.data.Dataset]
  preprocess_eval: Callable[[tf.data.Dataset, int], tf.data.Dataset]
  default_personal_blocks: int = 1
  # The raw examples are arrays in this process (module docstring).
  examples_in_memory: bool = False
  # The traced dataset builders, by (split, epochs, batch size); not a field
  # that `dataclasses.replace` copies, so a changed task traces its own.
  _builders: dict = dataclasses.field(
      default_factory=dict, init=False, repr=False, compare=False, hash=False
  )

  @property
  def client_ids(self) -> list[str]:
    return self.train_data.client_ids

  def _dataset(self, data: ClientData, key: tuple[Any, ...], client_id: str, seed: int,
               preprocess: Callable[[tf.data.Dataset, Any], tf.data.Dataset]) -> tf.data.Dataset:
    """`preprocess(client_id's raw dataset, seed)` through a `tf.function`
    traced once per `key` (module docstring), autotuning off."""
    read = data.serializable_dataset_fn
    if key not in self._builders:
      if self.examples_in_memory:
        self._builders[key] = tf.function(preprocess)
      else:
        self._builders[key] = tf.function(
            lambda client, seed_: preprocess(read(client), seed_),
            input_signature=[tf.TensorSpec([], tf.string), tf.TensorSpec([], tf.int64)],
        )
    first = read(client_id) if self.examples_in_memory else client_id
    return client_datasets.without_autotuning(self._builders[key](first, np.int64(seed)))

  def train_dataset(
      self, client_id: str, *, epochs: int, batch_size: int, seed: int
  ) -> tf.data.Dataset:
    """Batches of `(x, y)` for one client's local training."""
    return self._dataset(
        self.train_data, ('train', epochs, batch_size), client_id, seed,
        lambda raw, seed_: self.preprocess_train(raw, epochs, batch_size, seed_),
    )

  def train_dataset_of_rounds(
      self, client_id: str, *, epochs: int, batch_size: int, seeds: Sequence[int],
      steps: int = 0,
      transform: Callable[[tf.data.Dataset, tf.Tensor], tf.data.Dataset] = lambda d, _: d,
  ) -> tf.data.Dataset:
    """The batches of several rounds of one client, in round order.

    For each seed s of `seeds`: `transform(train_dataset(client_id, seed=s)
    cut to its first `steps` batches (0: all), s)`, the same batches (tested);
    s is a tensor in `transform`. The client's examples enter the dataset's
    graph once (a `flat_map` over the seeds), not once a round.
    """
    read = self.train_data.serializable_dataset_fn
    # A string tensor, not a new trace a client; in-memory arrays: the Python
    # id, so only the client's own examples enter the graph (module docstring).
    raw = read(client_id if self.examples_in_memory else tf.constant(client_id))

    def one_round(seed):
      batches = self.preprocess_train(raw, epochs, batch_size, seed)
      return transform(client_datasets.first_steps(batches, steps), seed)

    seeds = tf.data.Dataset.from_tensor_slices(np.asarray(seeds, np.int64))
    return client_datasets.without_autotuning(seeds.flat_map(one_round))

  def train_dataset_computation(
      self, *, epochs: int, batch_size: int, steps: int = 0
  ) -> tff.Computation:
    """`train_dataset` built inside the TFF runtime from a client id and seed.

    Type signature: `(<client_id=str, seed=int64> -> (x, y)*)`. Composed
    in front of a round (`tff.simulation.compose_dataset_computation_with_computation`)
    the clients receive ids and read their examples where they run, instead
    of having their batches serialized into every call. Same id and seed,
    same batches as `train_dataset` (cut to its first `steps`; 0: all).
    With `examples_in_memory` the computation carries every client's
    examples (fmnist: 41 MB), and TFF's runtime receives it with every call.
    """
    read = self.train_data.serializable_dataset_fn

    @tff.tensorflow.computation(
        tff.StructType([('client_id', np.str_), ('seed', np.int64)])
    )
    def client_dataset(arg):
      batches = self.preprocess_train(read(arg.client_id), epochs, batch_size, arg.seed)
      return client_datasets.without_autotuning(client_datasets.first_steps(batches, steps))

    return client_dataset

  def test_dataset(self, client_id: str, *, batch_size: int) -> tf.data.Dataset:
    """Batches of `(x, y)` of one client's own test split."""
    return self._dataset(
        self.test_data, ('test', batch_size), client_id, 0,
        lambda raw, _: self.preprocess_eval(raw, batch_size),
    )


class DataUnavailableError(Exception):
  """Data a task needs is missing; the message says what to do.

  Drivers print the message as a one-line error and exit with code 2.
  """


def shuffled_epochs(
    dataset: tf.data.Dataset, epochs: int, seed: int, shuffle_buffer: int = 1000
) -> tf.data.Dataset:
  """`epochs` passes over `dataset`, epoch e shuffled with seed (seed, e).

  Each epoch has its own order, and the order depends only on (seed, epoch):
  not on how many times the dataset was iterated before. So a client that
  passes over its data twice (Ditto's global and personal models) sees the
  same batches both times, whether its dataset was built in Python and
  serialized into the round or built inside the TFF runtime from a client id
  (`Task.train_dataset_computation`); and a resumed run replays the same
  batches. (`shuffle(reshuffle_each_iteration=True)` would give the second
  iteration of the same dataset object a new order.)

  The epochs are concatenated here rather than built by a `flat_map` over
  `range(epochs)`: the same elements in the same order (tested), without
  tracing a function for every client's dataset (6 ms against 20 ms a
  dataset; the program builds the round's datasets every round).
  """
  if epochs < 0:
    raise ValueError(f'epochs must be >= 0, got {epochs}.')
  seed = tf.cast(seed, tf.int64)
  passes = [
      dataset.shuffle(shuffle_buffer, seed=seed * 1_000_003 + e, reshuffle_each_iteration=False)
      for e in range(epochs)
  ]
  if not passes:
    return dataset.take(0)
  result = passes[0]
  for epoch in passes[1:]:
    result = result.concatenate(epoch)
  return result


def shuffle_repeat_batch(
    dataset: tf.data.Dataset,
    epochs: int,
    batch_size: int,
    seed: int,
    shuffle_buffer: int = 1000,
) -> tf.data.Dataset:
  """`shuffled_epochs`, then batches (across epoch boundaries)."""
  return shuffled_epochs(dataset, epochs, seed, shuffle_buffer).batch(batch_size)


def example_preprocessing(
    element_to_xy: Callable[[Any], tuple[tf.Tensor, tf.Tensor]],
) -> tuple[Callable[..., tf.data.Dataset], Callable[..., tf.data.Dataset]]:
  """`(preprocess_train, preprocess_eval)` for one example per raw element.

  Training maps `element_to_xy`, then `shuffle_repeat_batch`; evaluation maps
  and batches.
  """

  def preprocess_train(dataset, epochs, batch_size, seed):
    return shuffle_repeat_batch(dataset.map(element_to_xy), epochs, batch_size, seed)

  def preprocess_eval(dataset, batch_size):
    return dataset.map(element_to_xy).batch(batch_size)

  return preprocess_train, preprocess_eval
