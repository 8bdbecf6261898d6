"""Synthetic federated partitions of a centralized labelled dataset.

Pure NumPy. Every partition but `ditto_code` takes the labels of the pooled
dataset and returns one sorted array of example indices per client; no
example is given to two clients, and the same `seed` gives the same
partition.

* `k_classes`: every client holds exactly k classes in equal amounts, the
  pathological non-IID shards of McMahan et al. 2017 ("Communication-Efficient
  Learning of Deep Networks from Decentralized Data") as used by FedPer
  (Arivazhagan et al. 2019, "Federated Learning with Personalization
  Layers"); k = number of classes is IID.
* `ditto`: many devices, few classes each, log-normal sample sizes, in the
  style of the FMNIST/MNIST set-ups of FedProx and Ditto (Li et al. 2020,
  "Federated Optimization in Heterogeneous Networks"; Li et al. 2021, "Ditto:
  Fair and Robust Federated Learning Through Personalization").
* `ditto_code`: the devices Ditto's Fashion-MNIST data script builds
  (overlapping windows of classes, log-normal sizes and class shares, train
  and test examples from the dataset's own train and test sets); unlike the
  others it may give an example to several devices, as that script does.
* `dirichlet`: label skew with per-class client proportions drawn from
  Dirichlet(alpha) (Hsu et al. 2019, "Measuring the Effects of Non-Identical
  Data Distribution for Federated Visual Classification").

`train_test_split` then splits one client's examples (all but `ditto_code`,
which draws each device's test examples from the test set) into its own train and
test sets, stratified by label.
"""

from typing import Optional

import numpy as np


def _check_labels(labels: np.ndarray) -> np.ndarray:
  labels = np.asarray(labels)
  if labels.ndim != 1 or labels.size == 0:
    raise ValueError(f'labels must be a non-empty 1-D array, got shape {labels.shape}.')
  if not np.issubdtype(labels.dtype, np.integer) or labels.min() < 0:
    raise ValueError('labels must be non-negative integers.')
  return labels


def _classes(labels: np.ndarray, num_classes: Optional[int]) -> np.ndarray:
  present = np.unique(labels)
  if num_classes is None:
    return present
  if present.max() >= num_classes:
    raise ValueError(f'A label is >= num_classes={num_classes}.')
  return np.arange(num_classes)


def _assign_classes_round_robin(
    classes: np.ndarray, num_clients: int, classes_per_client: int, rng
) -> np.ndarray:
  """[num_clients, k] class ids: slot j of client i is order[(i*k + j) % C].

  `order` is a seeded permutation of the classes. k <= C consecutive slots
  are distinct classes, and every class gets floor or ceil of
  num_clients * k / C slots.
  """
  order = rng.permutation(classes)
  slots = np.arange(num_clients)[:, None] * classes_per_client + np.arange(
      classes_per_client
  )
  return order[slots % len(classes)]


def _check_clients(num_clients: int, classes_per_client: int, num_classes: int):
  if num_clients < 1:
    raise ValueError(f'num_clients must be >= 1, got {num_clients}.')
  if not 1 <= classes_per_client <= num_classes:
    raise ValueError(
        f'classes_per_client must be in [1, {num_classes}] (the number of'
        f' classes), got {classes_per_client}.'
    )


def k_classes(
    labels: np.ndarray,
    num_clients: int,
    classes_per_client: int,
    seed: int,
    num_classes: Optional[int] = None,
) -> list[np.ndarray]:
  """Every client gets exactly `classes_per_client` classes, equal shards.

  Classes are assigned round-robin over a seeded permutation of the classes
  (client i gets classes `order[i*k .. i*k + k - 1]`, modulo C), so every
  class serves floor or ceil of N*k/C clients. Each (client, class) slot then
  receives a shard of s examples of that class, s being the largest size every
  class can give to all its slots; so all clients have exactly k*s examples
  and leftovers are unused. With k = C every client holds an equal share of
  every class (IID).

  Args:
    labels: int labels of the pooled dataset.
    num_clients: N, number of clients.
    classes_per_client: k.
    seed: seeds the class order and which examples go to which shard.
    num_classes: C; defaults to the number of distinct labels.

  Returns:
    N sorted index arrays.

  Raises:
    ValueError: if k is not in [1, C], or a class is too small to give every
      one of its clients at least one example.
  """
  labels = _check_labels(labels)
  classes = _classes(labels, num_classes)
  _check_clients(num_clients, classes_per_client, len(classes))
  rng = np.random.default_rng(seed)
  assignment = _assign_classes_round_robin(classes, num_clients, classes_per_client, rng)
  slots_per_class = {c: int(np.sum(assignment == c)) for c in classes}
  counts = {c: int(np.sum(labels == c)) for c in classes}
  shard = min(counts[c] // n for c, n in slots_per_class.items() if n)
  if shard == 0:
    raise ValueError(
        f'Not enough examples for {num_clients} clients with'
        f' {classes_per_client} classes each: some class has fewer examples'
        ' than clients holding it.'
    )
  per_client = [[] for _ in range(num_clients)]
  for c in classes:
    holders = np.nonzero(np.any(assignment == c, axis=1))[0]
    if not len(holders):
      continue
    members = rng.permutation(np.nonzero(labels == c)[0])
    for position, client in enumerate(holders):
      per_client[client].append(members[position * shard:(position + 1) * shard])
  return [np.sort(np.concatenate(parts)) for parts in per_client]


DITTO_LOGNORMAL_MEAN = 0.0
DITTO_LOGNORMAL_SIGMA = 1.0


def ditto(
    labels: np.ndarray,
    num_clients: int,
    classes_per_client: int,
    seed: int,
    num_classes: Optional[int] = None,
    sigma: float = DITTO_LOGNORMAL_SIGMA,
    min_per_class: int = 5,
) -> list[np.ndarray]:
  """Many devices, `classes_per_client` classes each, log-normal sizes.

  Classes are assigned round-robin over a seeded class order (as in
  `k_classes`). Device i draws a weight w_i ~ LogNormal(mean=0, sigma) (the
  mean and sigma of the underlying normal; sigma=1 by default) and gets, from
  each of its k classes, `min_per_class + floor(scale * w_i / k)` examples,
  where `scale` is the largest value the data allows: the most demanded class
  is used up entirely. Sizes are therefore `k * min_per_class` plus a
  log-normal amount; every example is used at most once.

  Args:
    labels: int labels of the pooled dataset.
    num_clients: number of devices (Ditto uses 100s).
    classes_per_client: classes per device.
    seed: seeds class order, sizes and examples.
    num_classes: defaults to the number of distinct labels.
    sigma: sigma of the log-normal sizes.
    min_per_class: examples every device gets from each of its classes.

  Returns:
    `num_clients` sorted index arrays.

  Raises:
    ValueError: if a class cannot give `min_per_class` examples to each of
      its devices, or arguments are out of range.
  """
  labels = _check_labels(labels)
  classes = _classes(labels, num_classes)
  _check_clients(num_clients, classes_per_client, len(classes))
  if min_per_class < 1 or sigma < 0:
    raise ValueError('min_per_class must be >= 1 and sigma >= 0.')
  rng = np.random.default_rng(seed)
  assignment = _assign_classes_round_robin(classes, num_clients, classes_per_client, rng)
  weights = rng.lognormal(DITTO_LOGNORMAL_MEAN, sigma, size=num_clients)
  demand = weights / classes_per_client
  scale = np.inf
  for c in classes:
    holders = np.any(assignment == c, axis=1)
    if not holders.any():
      continue
    spare = np.sum(labels == c) - min_per_class * holders.sum()
    if spare < 0:
      raise ValueError(
          f'Class {c} has {np.sum(labels == c)} examples, fewer than'
          f' min_per_class={min_per_class} for each of its {holders.sum()}'
          ' devices; use fewer devices or classes per device.'
      )
    scale = min(scale, spare / demand[holders].sum())
  take = min_per_class + np.floor(scale * demand).astype(np.int64)
  per_client = [[] for _ in range(num_clients)]
  for c in classes:
    members = rng.permutation(np.nonzero(labels == c)[0])
    start = 0
    for client in np.nonzero(np.any(assignment == c, axis=1))[0]:
      per_client[client].append(members[start:start + take[client]])
      start += take[client]
  return [np.sort(np.concatenate(parts)) for parts in per_client]


def dirichlet(
    labels: np.ndarray,
    num_clients: int,
    alpha: float,
    seed: int,
    min_size: int = 10,
    max_attempts: int = 100,
) -> list[np.ndarray]:
  """Label skew: per class, client shares ~ Dirichlet(alpha) (Hsu et al. 2019).

  Every example goes to exactly one client. A draw where some client gets
  fewer than `min_size` examples is rejected and the whole partition redrawn
  (from the same seeded generator), up to `max_attempts` times.

  Raises:
    ValueError: on alpha <= 0, too few examples for `min_size` per client, or
      no acceptable draw within `max_attempts`.
  """
  labels = _check_labels(labels)
  if num_clients < 1 or alpha <= 0:
    raise ValueError(f'Need num_clients >= 1 and alpha > 0, got {num_clients}, {alpha}.')
  if num_clients * min_size > labels.size:
    raise ValueError(
        f'{labels.size} examples cannot give {num_clients} clients'
        f' min_size={min_size} each.'
    )
  rng = np.random.default_rng(seed)
  classes = np.unique(labels)
  for _ in range(max_attempts):
    per_client = [[] for _ in range(num_clients)]
    for c in classes:
      members = rng.permutation(np.nonzero(labels == c)[0])
      shares = rng.dirichlet(np.full(num_clients, alpha))
      bounds = np.round(np.cumsum(shares)[:-1] * len(members)).astype(np.int64)
      for client, part in enumerate(np.split(members, bounds)):
        per_client[client].append(part)
    result = [np.sort(np.concatenate(parts)) for parts in per_client]
    if min(len(r) for r in result) >= min_size:
      return result
  raise ValueError(
      f'No Dirichlet(alpha={alpha}) draw gave all {num_clients} clients'
      f' >= {min_size} examples in {max_attempts} attempts; raise alpha or'
      ' lower the number of clients.'
  )


def train_test_split(
    indices: np.ndarray, labels: np.ndarray, test_fraction: float, seed: int
) -> tuple[np.ndarray, np.ndarray]:
  """Splits one client's `indices` into (train, test), stratified by label.

  The test set has round(n * test_fraction) examples, at least one and at
  most n - 1 when n >= 2 (a client of one example keeps it for training).
  Each class contributes floor(n_c * test_fraction) test examples; the rest
  go to the classes with the largest remainders (seeded tie-breaks), so the
  test split follows the client's own label distribution.

  Args:
    indices: the client's example indices.
    labels: labels of the whole pooled dataset (indexed by `indices`).
    test_fraction: in [0, 1).
    seed: seeds which examples go to test.

  Returns:
    Sorted (train, test) index arrays.
  """
  if not 0 <= test_fraction < 1:
    raise ValueError(f'test_fraction must be in [0, 1), got {test_fraction}.')
  indices = np.asarray(indices)
  n = len(indices)
  n_test = int(round(n * test_fraction))
  if n >= 2 and test_fraction > 0:
    n_test = min(max(n_test, 1), n - 1)
  rng = np.random.default_rng(seed)
  client_labels = np.asarray(labels)[indices]
  classes = np.unique(client_labels)
  exact = np.array([np.sum(client_labels == c) * test_fraction for c in classes])
  quota = np.floor(exact).astype(np.int64)
  sizes = np.array([np.sum(client_labels == c) for c in classes])
  quota = np.minimum(quota, sizes)
  remainder = exact - quota + rng.uniform(0, 1e-6, size=len(classes))
  for i in np.argsort(-remainder):
    if quota.sum() >= n_test:
      break
    if quota[i] < sizes[i]:
      quota[i] += 1
  test = []
  for c, q in zip(classes, quota):
    members = rng.permutation(indices[client_labels == c])
    test.append(members[:q])
  test = np.sort(np.concatenate(test)) if test else np.array([], np.int64)
  train = np.setdiff1d(indices, test)
  return train, test.astype(indices.dtype)


DITTO_CODE_SEED = 233  # The fixed seed of Ditto's data script: one partition for every run.


def ditto_code(
    train_labels: np.ndarray,
    test_labels: np.ndarray,
    num_clients: int = 500,
    classes_per_client: int = 5,
    num_classes: int = 10,
) -> tuple[list[np.ndarray], list[np.ndarray]]:
  """Devices as Ditto's Fashion-MNIST script builds them (`data/fmnist/create_dataset.py`
  of Li et al. 2021's code, 500 devices of 5 classes).

  Device u holds classes (u + j) mod C for j < k: overlapping windows, so
  neighbouring devices share k - 1 classes. Its size is
  n_u = N * s_u / sum(s), s_u = 10 + LogNormal(3, 1), N the train set's size;
  its class shares p_j are k LogNormal(1, 1) draws normalized to 1. From its
  j-th class it takes floor(p_j n_u) + 1 train and floor(p_j n_u / 6) + 1
  test examples: the next ones of that class in the dataset's order, starting
  over at the class's first example when the class has too few left (so an
  example can sit on several devices, as in the script). The draws are
  `numpy.random.RandomState(233)`'s in the script's order: with the
  dataset's own files this gives the script's devices, whatever a run's seed.

  Args:
    train_labels: labels of the train set, in its order.
    test_labels: labels of the test set, in its order.
    num_clients: devices (the script: 500).
    classes_per_client: classes per device (the script: 5).
    num_classes: classes of the dataset.

  Returns:
    (train index arrays into `train_labels`, test index arrays into
    `test_labels`), one sorted array a device each.
  """
  train_labels, test_labels = _check_labels(train_labels), _check_labels(test_labels)
  _check_clients(num_clients, classes_per_client, num_classes)
  train_pools = [np.flatnonzero(train_labels == c) for c in range(num_classes)]
  test_pools = [np.flatnonzero(test_labels == c) for c in range(num_classes)]
  rng = np.random.RandomState(DITTO_CODE_SEED)
  sizes = rng.lognormal(3, 1, num_clients) + 10
  sizes = len(train_labels) * sizes / sizes.sum()
  train_next, test_next = np.zeros(num_classes, np.int64), np.zeros(num_classes, np.int64)
  train_parts, test_parts = [], []
  for device in range(num_clients):
    shares = rng.lognormal(1, 1, classes_per_client)
    shares = shares / shares.sum()
    train, test = [], []
    for j in range(classes_per_client):
      c = (device + j) % num_classes
      train.append(_take_next(train_pools[c], train_next, c, int(shares[j] * sizes[device]) + 1))
      test.append(_take_next(test_pools[c], test_next, c, int(shares[j] * sizes[device] / 6) + 1))
    train_parts.append(np.sort(np.concatenate(train)))
    test_parts.append(np.sort(np.concatenate(test)))
  return train_parts, test_parts


def _take_next(pool: np.ndarray, cursors: np.ndarray, c: int, count: int) -> np.ndarray:
  """The next `count` examples of class c's `pool`, from its start if too few are left."""
  if count > len(pool):
    raise ValueError(f'Class {c} has {len(pool)} examples; a device needs {count} of it.')
  if cursors[c] + count > len(pool):
    cursors[c] = 0
  taken = pool[cursors[c]:cursors[c] + count]
  cursors[c] += count
  return taken
