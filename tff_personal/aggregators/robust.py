"""Robust aggregation of client updates as `tff.aggregators` factories.

Every factory here is a `tff.aggregators.WeightedAggregationFactory`; pass it
as `model_aggregator` to an algorithm's builder. `create(value_type,
weight_type)` returns a `tff.templates.AggregationProcess` whose result has
exactly the value type, so it plugs into
`tff.learning.templates.build_apply_optimizer_finalizer`:

  initialize: ( -> S@SERVER)
  next: (<S@SERVER, {V}@CLIENTS, {W}@CLIENTS> ->
         <state=S@SERVER, result=V@SERVER, measurements=M@SERVER>)

V is a structure (with Python containers, as TFF's learning code makes them)
of float tensors of one dtype and known shapes; W a float or integer scalar.

The rules. x_1..x_n are the round's client updates, each flattened into one
vector of d numbers, w_i their weights, ||.|| the L2 norm.

* `median` (Yin, Chen, Ramchandran, Bartlett, "Byzantine-Robust Distributed
  Learning: Towards Optimal Statistical Rates", ICML 2018): coordinate j of
  the result is the median of x_1j..x_nj; for even n, the mean of the two
  middle values. The weights are ignored.
* `trimmed_mean(trim_fraction)` (Yin et al. 2018): per coordinate, the
  b = floor(trim_fraction * n) largest and the b smallest values are dropped
  and the n - 2b others averaged (plain mean, weights ignored);
  0 <= trim_fraction < 0.5. b is computed exactly from the decimal
  `trim_fraction` (0.2 * 5 is 1).
* `krum(f)` (Blanchard, El Mhamdi, Guerraoui, Stainer, "Machine Learning with
  Adversaries: Byzantine Tolerant Gradient Descent", NeurIPS 2017):
  score(i) = sum of ||x_i - x_j||^2 over the n - f - 2 updates j != i closest
  to x_i; the result is the update of lowest score (ties: the first received).
  Needs n > 2f + 2. Weights ignored.
* `multi_krum(f, m)` (ibid.): the plain mean of the m updates of lowest Krum
  score; m defaults to n - f.
* `k_norm(k)` (the "k-norm" baseline of Ditto: Li, Hu, Beirami, Smith, "Ditto:
  Fair and Robust Federated Learning Through Personalization", ICML 2021): the
  k updates of largest norm are dropped (ties: the later received), the result
  is the weighted mean sum_i w_i x_i / sum_i w_i of the others.
* `norm_clip(clip_norm)`: each update is scaled to x_i * min(1, C / ||x_i||),
  then the weighted mean is taken (`tff.aggregators.clipping_factory` around
  `tff.aggregators.MeanFactory`). Each clipped update has norm <= C, so the
  result has norm <= C and client i moves it by at most w_i / sum(w) * C
  (C / n for equal weights), however large its update. With
  `clip_norm=None`, C adapts (Andrew, Thakkar, McMahan, Ramaswamy,
  "Differentially Private Learning with Adaptive Clipping", NeurIPS 2021,
  without noise: `tff.aggregators.PrivateQuantileEstimationProcess.no_noise`):
  after each round C <- C * exp(-learning_rate * (fraction of the round's
  norms <= C - target_quantile)); a round clips with the estimate made
  before it.
* `tff_robust()`: TFF's `tff.learning.robust_aggregator` (adaptive zeroing
  of very large updates, adaptive clipping, then the weighted mean).

Robustness bounds, checked by the tests: while adversaries are fewer than
half the clients, every coordinate of the median lies between the smallest
and the largest honest value of that coordinate; so does the trimmed mean's
when b is at least the number of adversaries; Krum's result is one of the
submitted updates (with n > 2f + 2 and f adversaries far from the others, an
honest one), and multi-Krum's a mean of m of them.

Which clients count. The server-side rules (median, trimmed mean, Krum,
multi-Krum, k-norm) leave out clients whose weight is not positive: in our
algorithms such a client had no examples, or its non-finite update was
replaced by zeros. n counts the others; with n = 0 the result is zero. When a
round has fewer clients than `max_clients`, the rules use its actual n:
Krum's neighbour count is min(max(n - f - 2, 1), n - 1), multi-Krum's m is
min(m, n) (default max(n - f, 1)), k-norm drops min(k, n - 1) updates.

How. These rules need every update at the server, so each is one
`tff.federated_aggregate` into a fixed-size accumulator

  <rows=float[max_clients, d], weights=float32[max_clients],
   count=int32 (rows filled), clients=int32 (clients received)>

`accumulate` writes a client's update into the next row, `merge` concatenates
the filled rows of two partial accumulators, `report` computes the statistic
over the filled rows (`build_accumulation`). `tff.aggregators.concat_factory`
flattens the value structure into the vector and restores it. A round with
more than `max_clients` clients fails: a `tf.debugging` assertion whose
message names `max_clients` stops the computation (TFF's runtime raises it in
Python, e.g. as a gRPC error from the C++ worker). The server holds
max_clients * d numbers.

Measurements (fixed types): `clients` (n) for every server-side rule, plus
`trimmed_per_side` (b), Krum's `selected_index` (the selected update's row,
in the order the accumulator received them), multi-Krum's `num_selected`,
k-norm's `norm_threshold` (the largest norm kept); the clipping rules report
TFF's `clipping_norm` and `clipped_count`.

`build_aggregator(name, ...)` builds any of `AGGREGATOR_NAMES` from flag-like
arguments.
"""

import collections
import fractions
import functools
import math
from typing import Callable, NamedTuple, Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_personal.aggregators import names

AGGREGATOR_NAMES = names.AGGREGATOR_NAMES

# A statistic maps the filled rows [n, d] (n >= 1) and their weights [n] to
# the result [d] and an OrderedDict of scalar measurements.
Statistic = Callable[[tf.Tensor, tf.Tensor], tuple[tf.Tensor, collections.OrderedDict]]


# ---------------------------------------------------------------------------
# The statistics (TensorFlow only). `rows` is [n, d], one update per row.


def coordinate_median(rows: tf.Tensor) -> tf.Tensor:
  """Per column: the middle value, or the mean of the two middle values."""
  n = tf.shape(rows)[0]
  ordered = tf.sort(rows, axis=0)
  return 0.5 * ordered[(n - 1) // 2] + 0.5 * ordered[n // 2]


def coordinate_trimmed_mean(rows: tf.Tensor, trim: tf.Tensor) -> tf.Tensor:
  """Per column: the mean after dropping the `trim` largest and smallest values."""
  n = tf.shape(rows)[0]
  ordered = tf.sort(rows, axis=0)
  return tf.reduce_mean(ordered[trim:n - trim], axis=0)


def pairwise_squared_distances(rows: tf.Tensor) -> tf.Tensor:
  """[n, n] matrix of ||x_i - x_j||^2, by differences (no cancellation)."""
  return tf.map_fn(
      lambda row: tf.reduce_sum(tf.square(rows - row), axis=1),
      rows,
      fn_output_signature=rows.dtype,
  )


def krum_scores(rows: tf.Tensor, num_neighbours: tf.Tensor) -> tf.Tensor:
  """score_i: sum of the `num_neighbours` smallest ||x_i - x_j||^2, j != i."""
  n = tf.shape(rows)[0]
  distances = tf.linalg.set_diag(
      pairwise_squared_distances(rows), tf.fill([n], tf.constant(np.inf, rows.dtype))
  )
  nearest = tf.sort(distances, axis=1)[:, :num_neighbours]
  return tf.reduce_sum(nearest, axis=1)


def weighted_mean(rows: tf.Tensor, weights: tf.Tensor) -> tf.Tensor:
  """sum_i w_i x_i / sum_i w_i."""
  weights = tf.cast(weights, rows.dtype)
  return tf.tensordot(weights, rows, axes=1) / tf.reduce_sum(weights)


# ---------------------------------------------------------------------------
# The TFF aggregation of all updates at the server.


class Accumulation(NamedTuple):
  """The four computations of a `tff.federated_aggregate` (see the module docstring)."""

  zero: tff.Computation
  accumulate: tff.Computation
  merge: tff.Computation
  report: tff.Computation


def _check_accumulation_types(value_type: tff.Type, weight_type: tff.Type) -> None:
  if not (
      isinstance(value_type, tff.TensorType)
      and len(value_type.shape) == 1
      and value_type.shape[0] is not None
      and np.issubdtype(value_type.dtype, np.floating)
  ):
    raise TypeError(f'Expected a float vector of known length, got {value_type}.')
  if not (
      isinstance(weight_type, tff.TensorType)
      and not weight_type.shape
      and (
          np.issubdtype(weight_type.dtype, np.floating)
          or np.issubdtype(weight_type.dtype, np.integer)
      )
  ):
    raise TypeError(f'Expected a numeric scalar weight, got {weight_type}.')


def _assert_capacity(clients, max_clients: int):
  return tf.debugging.assert_less_equal(
      clients,
      max_clients,
      message=(
          f'A robust aggregator built for max_clients={max_clients} clients per '
          'round received more clients; build it with a larger max_clients.'
      ),
  )


def build_accumulation(
    statistic: Statistic, max_clients: int, value_type: tff.Type, weight_type: tff.Type
) -> Accumulation:
  """Gathers float[d] client vectors into `max_clients` rows; reports `statistic`.

    zero: ( -> A)    A = <rows=float[max_clients,d], weights=float32[max_clients],
                          count=int32, clients=int32>
    accumulate: (<A, <float[d], W>> -> A)
    merge: (<A, A> -> A)
    report: (A -> <result=float[d], measurements=<clients=int32, ...>>)
  """
  _check_accumulation_types(value_type, weight_type)
  size, dtype = value_type.shape[0], value_type.dtype
  assert_capacity = functools.partial(_assert_capacity, max_clients=max_clients)

  def keep_capacity(tensor, shape):
    """The first max_clients rows of `tensor`, with a static shape."""
    return tf.reshape(tensor[:max_clients], shape)

  @tff.tensorflow.computation
  def zero():
    return collections.OrderedDict(
        rows=tf.zeros([max_clients, size], dtype),
        weights=tf.zeros([max_clients], tf.float32),
        count=tf.constant(0, tf.int32),
        clients=tf.constant(0, tf.int32),
    )

  accumulator_type = zero.type_signature.result

  @tff.tensorflow.computation(accumulator_type, (value_type, weight_type))
  def accumulate(accumulator, client):
    value, weight = client[0], tf.cast(client[1], tf.float32)
    clients = accumulator['clients'] + 1
    count = accumulator['count']
    with tf.control_dependencies([assert_capacity(clients)]):
      # The client goes into row `count`; only a positive weight keeps it
      # there (the next client overwrites it otherwise).
      rows = tf.tensor_scatter_nd_update(accumulator['rows'], [[count]], [value])
      weights = tf.tensor_scatter_nd_update(accumulator['weights'], [[count]], [weight])
    return collections.OrderedDict(
        rows=rows,
        weights=weights,
        count=count + tf.cast(weight > 0.0, tf.int32),
        clients=clients,
    )

  @tff.tensorflow.computation(accumulator_type, accumulator_type)
  def merge(a, b):
    clients = a['clients'] + b['clients']
    with tf.control_dependencies([assert_capacity(clients)]):
      # b's filled rows follow a's; the check above guarantees they all fit.
      rows = keep_capacity(
          tf.concat([a['rows'][:a['count']], b['rows']], 0), [max_clients, size]
      )
      weights = keep_capacity(
          tf.concat([a['weights'][:a['count']], b['weights']], 0), [max_clients]
      )
    return collections.OrderedDict(
        rows=rows, weights=weights, count=a['count'] + b['count'], clients=clients
    )

  @tff.tensorflow.computation(accumulator_type)
  def report(accumulator):
    count = accumulator['count']
    # With no (positive-weight) client, the statistic of one zero update: zero.
    rows, weights = tf.cond(
        count > 0,
        lambda: (accumulator['rows'][:count], accumulator['weights'][:count]),
        lambda: (tf.zeros([1, size], dtype), tf.ones([1], tf.float32)),
    )
    result, measurements = statistic(rows, weights)
    return collections.OrderedDict(
        result=tf.reshape(tf.cast(result, dtype), [size]),
        measurements=collections.OrderedDict(clients=count, **measurements),
    )

  return Accumulation(zero, accumulate, merge, report)


class _ServerStatisticFactory(tff.aggregators.WeightedAggregationFactory):
  """Applies a statistic to all client vectors, gathered at the server.

  next: (<<>@SERVER, {float[d]}@CLIENTS, {W}@CLIENTS> ->
         <state=<>@SERVER, result=float[d]@SERVER, measurements=M@SERVER>)
  """

  def __init__(self, statistic: Statistic, max_clients: int):
    self._statistic = statistic
    self._max_clients = max_clients

  def create(self, value_type, weight_type) -> tff.templates.AggregationProcess:
    accumulation = build_accumulation(
        self._statistic, self._max_clients, value_type, weight_type
    )

    @tff.federated_computation
    def init_fn():
      return tff.federated_value((), tff.SERVER)

    @tff.federated_computation(
        init_fn.type_signature.result,
        tff.FederatedType(value_type, tff.CLIENTS),
        tff.FederatedType(weight_type, tff.CLIENTS),
    )
    def next_fn(state, value, weight):
      output = tff.federated_aggregate(
          tff.federated_zip((value, weight)),
          accumulation.zero(),
          accumulation.accumulate,
          accumulation.merge,
          accumulation.report,
      )
      return tff.templates.MeasuredProcessOutput(
          state=state, result=output.result, measurements=output.measurements
      )

    return tff.templates.AggregationProcess(init_fn, next_fn)


def _server_statistic(statistic: Statistic, max_clients: int):
  """The statistic over whole updates: structures flattened by `concat_factory`."""
  return tff.aggregators.concat_factory(_ServerStatisticFactory(statistic, max_clients))


# ---------------------------------------------------------------------------
# Parameter checks.


def _check_int(name: str, value, minimum: int) -> None:
  if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
    raise ValueError(f'{name} must be an integer >= {minimum}, got {value!r}.')


def _is_number(value) -> bool:
  return (
      isinstance(value, (int, float, np.integer, np.floating))
      and not isinstance(value, bool)
      and math.isfinite(value)
  )


def _check_fraction(name: str, value, low: float, high: float, *, low_open: bool) -> None:
  """value in [low, high) (or (low, high) if `low_open`)."""
  ok = _is_number(value) and (low < value if low_open else low <= value) and value < high
  if not ok:
    interval = ('(' if low_open else '[') + f'{low}, {high})'
    raise ValueError(f'{name} must be a number in {interval}, got {value!r}.')


def _check_positive(name: str, value) -> None:
  if not (_is_number(value) and value > 0):
    raise ValueError(f'{name} must be a positive number, got {value!r}.')


# ---------------------------------------------------------------------------
# The factories.


def median(*, max_clients: int) -> tff.aggregators.WeightedAggregationFactory:
  """Coordinate-wise median (Yin et al. 2018); weights ignored.

  Args:
    max_clients: the most clients a round may have (clients per round).
  """
  _check_int('max_clients', max_clients, 1)

  def statistic(rows, weights):
    del weights  # The median ignores them.
    return coordinate_median(rows), collections.OrderedDict()

  return _server_statistic(statistic, max_clients)


def trimmed_mean(
    trim_fraction: float, *, max_clients: int
) -> tff.aggregators.WeightedAggregationFactory:
  """Coordinate-wise trimmed mean (Yin et al. 2018); weights ignored.

  Args:
    trim_fraction: per coordinate, floor(trim_fraction * n) values are dropped
      at each end; in [0, 0.5).
    max_clients: the most clients a round may have (clients per round).
  """
  _check_fraction('trim_fraction', trim_fraction, 0.0, 0.5, low_open=False)
  _check_int('max_clients', max_clients, 1)
  exact_fraction = fractions.Fraction(str(trim_fraction))
  trims = [math.floor(exact_fraction * n) for n in range(max_clients + 1)]

  def statistic(rows, weights):
    del weights  # The trimmed mean ignores them.
    trim = tf.gather(tf.constant(trims, tf.int32), tf.shape(rows)[0])
    return (
        coordinate_trimmed_mean(rows, trim),
        collections.OrderedDict(trimmed_per_side=trim),
    )

  return _server_statistic(statistic, max_clients)


def _krum_neighbours(n, num_adversaries):
  """n - f - 2, or what is left of it in a round with few clients."""
  return tf.minimum(tf.maximum(n - num_adversaries - 2, 1), n - 1)


def _check_krum(name: str, num_adversaries: int, max_clients: int) -> None:
  _check_int('num_adversaries', num_adversaries, 0)
  _check_int('max_clients', max_clients, 1)
  if max_clients <= 2 * num_adversaries + 2:
    raise ValueError(
        f'{name} needs clients per round > 2 * num_adversaries + 2, got '
        f'max_clients={max_clients} and num_adversaries={num_adversaries}.'
    )


def krum(num_adversaries: int, *, max_clients: int) -> tff.aggregators.WeightedAggregationFactory:
  """Krum (Blanchard et al. 2017): the update of lowest score; weights ignored.

  Args:
    num_adversaries: f, the number of Byzantine clients to tolerate.
    max_clients: the most clients a round may have; must exceed 2f + 2.
  """
  _check_krum('krum', num_adversaries, max_clients)

  def statistic(rows, weights):
    del weights  # Krum ignores them.
    n = tf.shape(rows)[0]
    scores = krum_scores(rows, _krum_neighbours(n, num_adversaries))
    selected = tf.argmin(scores, output_type=tf.int32)
    return rows[selected], collections.OrderedDict(selected_index=selected)

  return _server_statistic(statistic, max_clients)


def multi_krum(
    num_adversaries: int, num_selected: Optional[int] = None, *, max_clients: int
) -> tff.aggregators.WeightedAggregationFactory:
  """Multi-Krum (Blanchard et al. 2017): mean of the m lowest-score updates.

  Args:
    num_adversaries: f, the number of Byzantine clients to tolerate.
    num_selected: m, in [1, max_clients - f]; None: n - f.
    max_clients: the most clients a round may have; must exceed 2f + 2.
  """
  _check_krum('multi_krum', num_adversaries, max_clients)
  if num_selected is not None:
    _check_int('num_selected', num_selected, 1)
    if num_selected > max_clients - num_adversaries:
      raise ValueError(
          'multi_krum needs num_selected <= clients per round - num_adversaries, got '
          f'num_selected={num_selected}, max_clients={max_clients}, '
          f'num_adversaries={num_adversaries}.'
      )

  def statistic(rows, weights):
    del weights  # Multi-Krum averages the selected updates plainly.
    n = tf.shape(rows)[0]
    if num_selected is None:
      m = tf.maximum(n - num_adversaries, 1)
    else:
      m = tf.minimum(num_selected, n)
    scores = krum_scores(rows, _krum_neighbours(n, num_adversaries))
    selected = tf.argsort(scores, stable=True)[:m]
    return (
        tf.reduce_mean(tf.gather(rows, selected), axis=0),
        collections.OrderedDict(num_selected=m),
    )

  return _server_statistic(statistic, max_clients)


def k_norm(k: int, *, max_clients: int) -> tff.aggregators.WeightedAggregationFactory:
  """Drops the k largest-norm updates, weighted mean of the rest (Ditto's baseline).

  Args:
    k: the number of updates dropped each round.
    max_clients: the most clients a round may have; must exceed k.
  """
  _check_int('k', k, 0)
  _check_int('max_clients', max_clients, 1)
  if max_clients <= k:
    raise ValueError(
        f'k_norm needs clients per round > k, got max_clients={max_clients} and k={k}.'
    )

  def statistic(rows, weights):
    n = tf.shape(rows)[0]
    norms = tf.norm(rows, axis=1)
    kept = tf.argsort(norms, stable=True)[: n - tf.minimum(k, n - 1)]
    return (
        weighted_mean(tf.gather(rows, kept), tf.gather(weights, kept)),
        collections.OrderedDict(
            norm_threshold=tf.cast(tf.reduce_max(tf.gather(norms, kept)), tf.float32)
        ),
    )

  return _server_statistic(statistic, max_clients)


def norm_clip(
    clip_norm: Optional[float] = None,
    *,
    target_quantile: float = 0.5,
    initial_clip_norm: float = 1.0,
    learning_rate: float = 0.2,
) -> tff.aggregators.WeightedAggregationFactory:
  """Clips each update to L2 norm C, then the weighted mean.

  Args:
    clip_norm: C; None: adapted to the `target_quantile` of the update norms.
    target_quantile: the quantile the adaptive C tracks, in (0, 1).
    initial_clip_norm: the adaptive C of the first round.
    learning_rate: the adaptive C's geometric learning rate.
  """
  if clip_norm is None:
    _check_fraction('target_quantile', target_quantile, 0.0, 1.0, low_open=True)
    _check_positive('initial_clip_norm', initial_clip_norm)
    _check_positive('learning_rate', learning_rate)
    norm = tff.aggregators.PrivateQuantileEstimationProcess.no_noise(
        initial_estimate=float(initial_clip_norm),
        target_quantile=float(target_quantile),
        learning_rate=float(learning_rate),
    )
  else:
    _check_positive('clip_norm', clip_norm)
    norm = float(clip_norm)
  return tff.aggregators.clipping_factory(norm, tff.aggregators.MeanFactory())


def tff_robust() -> tff.aggregators.WeightedAggregationFactory:
  """TFF's `tff.learning.robust_aggregator`: adaptive zeroing and clipping, weighted mean."""
  return tff.learning.robust_aggregator(zeroing=True, clipping=True, weighted=True)


def build_aggregator(
    name: str,
    *,
    clients_per_round: int,
    num_adversaries: int = 0,
    trim_fraction: float = 0.1,
    num_selected: Optional[int] = None,
    k: int = 1,
    clip_norm: Optional[float] = None,
    target_quantile: float = 0.5,
) -> tff.aggregators.WeightedAggregationFactory:
  """The aggregation factory `name` (one of `AGGREGATOR_NAMES`).

  Args:
    name: 'mean' is `tff.aggregators.MeanFactory()`; the others are this
      module's factories of the same name.
    clients_per_round: the clients of a round (the server-side rules'
      `max_clients`).
    num_adversaries: Krum's and multi-Krum's f.
    trim_fraction: the trimmed mean's fraction dropped at each end.
    num_selected: multi-Krum's m (None: n - f).
    k: k-norm's number of dropped updates.
    clip_norm: norm_clip's C; None: adaptive.
    target_quantile: the adaptive clip's quantile.

  Raises:
    ValueError: naming the parameter that is out of range.
  """
  if name not in AGGREGATOR_NAMES:
    raise ValueError(f'name must be one of {", ".join(AGGREGATOR_NAMES)}; got {name!r}.')
  _check_int('clients_per_round', clients_per_round, 1)
  if name == 'mean':
    return tff.aggregators.MeanFactory()
  if name == 'median':
    return median(max_clients=clients_per_round)
  if name == 'trimmed_mean':
    return trimmed_mean(trim_fraction, max_clients=clients_per_round)
  if name == 'krum':
    return krum(num_adversaries, max_clients=clients_per_round)
  if name == 'multi_krum':
    return multi_krum(num_adversaries, num_selected, max_clients=clients_per_round)
  if name == 'k_norm':
    return k_norm(k, max_clients=clients_per_round)
  if name == 'norm_clip':
    return norm_clip(clip_norm, target_quantile=target_quantile)
  return tff_robust()
