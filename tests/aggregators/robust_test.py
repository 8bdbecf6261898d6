"""Robust aggregators: exact results on tiny inputs, bounds, errors, FedPer."""

import collections
import math

import numpy as np
import pytest
import tensorflow_federated as tff

from tests import test_utils
from tests.algorithms import numpy_reference
from tests.algorithms.fedavg_test import batches_dataset, client_batches
from tff_personal.aggregators import robust
from tff_personal.algorithms import common

MAX_CLIENTS = 6
SCALAR = tff.TensorType(np.float32)
VECTOR = tff.TensorType(np.float32, [2])
# The base of FedPer's tiny model: a list of two tensors.
MODEL_DELTA = tff.StructWithPythonType(
    [tff.TensorType(np.float32, [2, 3]), tff.TensorType(np.float32, [3])], list
)


def build_round(factory, value_type):
  """(value@CLIENTS, weight@CLIENTS) -> <result@SERVER, measurements@SERVER>."""
  process = factory.create(value_type, tff.TensorType(np.float32))

  @tff.federated_computation(
      tff.FederatedType(value_type, tff.CLIENTS),
      tff.FederatedType(np.float32, tff.CLIENTS),
  )
  def one_round(values, weights):
    output = process.next(process.initialize(), values, weights)
    return output.result, output.measurements

  return one_round


@pytest.fixture(scope='module')
def aggregate():
  """aggregate(name, values, weights=None, **params) -> (result, measurements).

  Runs one round of `robust.build_aggregator(name, **params)`; the built
  computations are shared by the module's tests.
  """
  cache = {}

  def run(name, values, weights=None, *, value_type=SCALAR, **params):
    params.setdefault('clients_per_round', MAX_CLIENTS)
    key = (name, str(value_type), tuple(sorted(params.items())))
    if key not in cache:
      cache[key] = build_round(robust.build_aggregator(name, **params), value_type)
    if weights is None:
      weights = [1.0] * len(values)
    return cache[key](values, [np.float32(w) for w in weights])

  return run


def vectors(*points):
  return [np.array(p, np.float32) for p in points]


def test_median_of_odd_and_even_counts(aggregate):
  result, measurements = aggregate('median', [1.0, 2.0, 100.0])
  assert result == 2.0
  assert measurements['clients'] == 3
  result, measurements = aggregate('median', [1.0, 2.0, 3.0, 100.0])
  assert result == 2.5
  assert measurements['clients'] == 4


def test_median_is_coordinate_wise_on_a_structure(aggregate):
  value_type = tff.StructWithPythonType(
      [('a', VECTOR), ('b', SCALAR)], collections.OrderedDict
  )
  values = [
      collections.OrderedDict(a=np.array([1.0, 10.0], np.float32), b=np.float32(5.0)),
      collections.OrderedDict(a=np.array([2.0, -10.0], np.float32), b=np.float32(6.0)),
      collections.OrderedDict(a=np.array([100.0, 0.0], np.float32), b=np.float32(-7.0)),
  ]
  result, _ = aggregate('median', values, value_type=value_type)
  assert list(result) == ['a', 'b']
  np.testing.assert_array_equal(result['a'], [2.0, 0.0])
  assert result['b'] == 5.0


def test_trimmed_mean_drops_floor_of_fraction_times_n_at_each_end(aggregate):
  values = [1.0, 2.0, 3.0, 4.0, 100.0]
  result, measurements = aggregate('trimmed_mean', values, trim_fraction=0.2)
  assert result == 3.0  # floor(0.2 * 5) = 1: mean of 2, 3, 4.
  assert measurements['trimmed_per_side'] == 1
  result, measurements = aggregate('trimmed_mean', values, trim_fraction=0.1)
  assert result == 22.0  # floor(0.5) = 0: the plain mean.
  assert measurements['trimmed_per_side'] == 0


# Four clustered points and two far ones. With n = 6, f = 1, each score sums
# the 3 smallest squared distances: (0,0): 1+2+4 = 7, (1,0): 1+1+5 = 7,
# (0,2): 2+4+5 = 11, (1,1): 1+2+2 = 5; (-50,80): 8584+8842+8900 = 26326;
# (100,100): 19602+19604+19801 = 59007.
KRUM_POINTS = vectors((0, 0), (100, 100), (1, 0), (1, 1), (-50, 80), (0, 2))


def test_krum_selects_the_update_with_the_lowest_score(aggregate):
  result, measurements = aggregate(
      'krum', KRUM_POINTS, value_type=VECTOR, num_adversaries=1
  )
  np.testing.assert_array_equal(result, [1.0, 1.0])
  assert measurements['selected_index'] == 3
  assert measurements['clients'] == 6


def test_multi_krum_averages_the_m_lowest_scores(aggregate):
  result, measurements = aggregate(
      'multi_krum', KRUM_POINTS, value_type=VECTOR, num_adversaries=1, num_selected=3
  )
  # (1,1), (0,0), (1,0).
  np.testing.assert_allclose(result, [2 / 3, 1 / 3], rtol=1e-6)
  assert measurements['num_selected'] == 3
  # Default m = n - f = 5: all but (100,100).
  result, measurements = aggregate(
      'multi_krum', KRUM_POINTS, value_type=VECTOR, num_adversaries=1
  )
  np.testing.assert_allclose(result, [-48 / 5, 83 / 5], rtol=1e-6)
  assert measurements['num_selected'] == 5


def test_k_norm_drops_the_largest_norms_then_weighted_mean(aggregate):
  values = vectors((3, 4), (1, 0), (30, 40), (0, 2))  # Norms 5, 1, 50, 2.
  result, measurements = aggregate(
      'k_norm', values, [1.0, 2.0, 1.0, 1.0], value_type=VECTOR, k=1
  )
  np.testing.assert_allclose(result, [(3 + 2) / 4, (4 + 2) / 4], rtol=1e-6)
  assert measurements['norm_threshold'] == 5.0
  result, measurements = aggregate(
      'k_norm', values, [1.0, 2.0, 1.0, 1.0], value_type=VECTOR, k=2
  )
  np.testing.assert_allclose(result, [2 / 3, 2 / 3], rtol=1e-6)
  assert measurements['norm_threshold'] == 2.0


def test_norm_clip_bounds_each_clients_contribution(aggregate):
  # Bound: each clipped update has norm <= C, so client i moves the weighted
  # mean by at most w_i / sum(w) * C, however large its update.
  clip_norm, weights = 1.0, [1.0, 1.0, 2.0]
  values = vectors((0.5, 0), (0, 3), (1e6, 0))
  result, measurements = aggregate(
      'norm_clip', values, weights, value_type=VECTOR, clip_norm=clip_norm
  )
  np.testing.assert_allclose(result, [(0.5 + 2) / 4, 1 / 4], rtol=1e-6)
  without_huge = np.array([0.5, 1.0]) / 4  # The others' (clipped) contributions.
  assert np.linalg.norm(result - without_huge) <= 2 / 4 * clip_norm + 1e-6
  assert measurements['clipping_norm'] == clip_norm
  assert measurements['clipped_count'] == 2


def test_adaptive_norm_clip_tracks_the_quantile_of_the_norms():
  factory = robust.norm_clip(None, target_quantile=0.5, initial_clip_norm=1.0, learning_rate=0.2)
  process = factory.create(VECTOR, tff.TensorType(np.float32))
  state = process.initialize()
  values, weights = vectors((6, 8), (0, 10)), [1.0, 1.0]  # Norms 10 > C.
  first = process.next(state, values, weights)
  assert first.measurements['clipping_norm'] == 1.0
  np.testing.assert_allclose(first.result, [0.3, 0.9], rtol=1e-6)
  second = process.next(first.state, values, weights)
  # No norm <= C: C <- C * exp(-0.2 * (0 - 0.5)).
  np.testing.assert_allclose(second.measurements['clipping_norm'], math.exp(0.1), rtol=1e-6)


HONEST = vectors((1, 4), (2, 3), (3, 1), (4, 2))
ATTACKED = HONEST[:2] + vectors((1e6, -1e6)) + HONEST[2:]


@pytest.mark.parametrize(
    'name, params',
    [
        ('median', {}),
        ('trimmed_mean', {'trim_fraction': 0.2}),  # b = 1 >= 1 adversary.
        ('krum', {'num_adversaries': 1}),
    ],
)
def test_one_huge_update_stays_within_the_honest_range(aggregate, name, params):
  honest = np.array(HONEST)
  result, _ = aggregate(name, ATTACKED, value_type=VECTOR, **params)
  assert np.all(honest.min(axis=0) <= result)
  assert np.all(result <= honest.max(axis=0))
  if name == 'krum':
    assert any(np.array_equal(result, h) for h in HONEST)
  mean, _ = aggregate('mean', ATTACKED, value_type=VECTOR)
  assert mean[0] > 1e5  # The plain mean is not robust.


def test_clients_with_zero_weight_are_left_out(aggregate):
  result, measurements = aggregate('median', [1.0, 2.0, 100.0], [1.0, 1.0, 0.0])
  assert result == 1.5
  assert measurements['clients'] == 2
  result, measurements = aggregate('median', [1.0, 2.0], [0.0, 0.0])
  assert result == 0.0
  assert measurements['clients'] == 0


def test_more_clients_than_max_clients_fails(aggregate):
  with pytest.raises(Exception, match=r'max_clients=2'):
    aggregate('median', [1.0, 2.0, 3.0], clients_per_round=2)


def test_merge_concatenates_the_filled_rows():
  def first_row(rows, weights):
    del weights
    return rows[0], collections.OrderedDict()

  accumulation = robust.build_accumulation(
      first_row, 4, VECTOR, tff.TensorType(np.float32)
  )
  accumulate = lambda acc, value, weight: accumulation.accumulate(
      acc, (np.array(value, np.float32), np.float32(weight))
  )
  a = accumulate(accumulate(accumulation.zero(), [1, 1], 1), [9, 9], 0)  # 9: no weight.
  b = accumulate(accumulate(accumulation.zero(), [2, 2], 2), [3, 3], 3)
  merged = accumulation.merge(a, b)
  np.testing.assert_array_equal(merged['rows'][:3], [[1, 1], [2, 2], [3, 3]])
  np.testing.assert_array_equal(merged['weights'][:3], [1, 2, 3])
  assert (merged['count'], merged['clients']) == (3, 4)
  np.testing.assert_array_equal(accumulation.report(merged)['result'], [1, 1])
  with pytest.raises(Exception, match=r'max_clients=4'):
    accumulation.merge(merged, b)


@pytest.mark.parametrize(
    'build, message',
    [
        (lambda: robust.build_aggregator('nope', clients_per_round=3), 'name must be one of'),
        (lambda: robust.build_aggregator('median', clients_per_round=0), 'clients_per_round'),
        (
            lambda: robust.build_aggregator('trimmed_mean', clients_per_round=5, trim_fraction=0.5),
            'trim_fraction',
        ),
        (
            lambda: robust.build_aggregator('krum', clients_per_round=4, num_adversaries=1),
            r'krum needs clients per round > 2 \* num_adversaries \+ 2',
        ),
        (
            lambda: robust.build_aggregator('krum', clients_per_round=9, num_adversaries=-1),
            'num_adversaries',
        ),
        (
            lambda: robust.build_aggregator(
                'multi_krum', clients_per_round=6, num_adversaries=1, num_selected=6
            ),
            'num_selected',
        ),
        (lambda: robust.build_aggregator('k_norm', clients_per_round=3, k=3), 'k_norm needs'),
        (
            lambda: robust.build_aggregator('norm_clip', clients_per_round=3, clip_norm=0.0),
            'clip_norm',
        ),
        (
            lambda: robust.build_aggregator('norm_clip', clients_per_round=3, target_quantile=1.0),
            'target_quantile',
        ),
        (lambda: robust.median(max_clients=2.5), 'max_clients'),
    ],
)
def test_bad_parameters_are_named(build, message):
  with pytest.raises(ValueError, match=message):
    build()


@pytest.mark.parametrize('name', robust.AGGREGATOR_NAMES)
def test_result_type_is_the_value_type(name):
  factory = robust.build_aggregator(name, clients_per_round=MAX_CLIENTS)
  assert isinstance(factory, tff.aggregators.WeightedAggregationFactory)
  process = factory.create(MODEL_DELTA, tff.TensorType(np.float32))
  result_type = process.next.type_signature.result.result
  assert result_type.placement is tff.SERVER
  assert result_type.member == MODEL_DELTA
  model_weights_type = tff.StructWithPythonType(
      [('trainable', MODEL_DELTA), ('non_trainable', [])], tff.learning.models.ModelWeights
  )
  finalizer = tff.learning.templates.build_apply_optimizer_finalizer(
      tff.learning.optimizers.build_sgdm(1.0), model_weights_type
  )
  assert finalizer.next.type_signature.parameter[2].member.is_assignable_from(result_type.member)


@pytest.mark.parametrize('name', robust.AGGREGATOR_NAMES)
def test_equal_updates_aggregate_to_that_update(aggregate, name):
  update = np.array([0.25, -0.5], np.float32)  # Norm < 1: no clipping.
  result, _ = aggregate(name, [update] * 3, [1.0, 2.0, 3.0], value_type=VECTOR)
  np.testing.assert_allclose(result, update, rtol=1e-6)


def test_fedper_with_the_median_aggregator():
  from tff_personal.algorithms import fedper  # pylint: disable=g-import-not-at-top

  learning_rate = 0.1
  process = fedper.build(
      test_utils.tiny_model_spec(hidden=3), fedper.Hparams(personal_layers=1),
      common.Common(
          client_learning_rate=learning_rate,
          seed=4,
          model_aggregator=robust.build_aggregator('median', clients_per_round=3),
      ),
  )
  state = process.initialize()
  base = process.get_model_weights(state).trainable
  clients = [client_batches(1, [3, 2]), client_batches(2, [4]), client_batches(3, [5])]
  personal = [process.initial_personal_state(f'c{i}', None) for i in range(3)]
  output = process.next(
      state, [process.client_input(batches_dataset(b)) for b in clients], personal
  )

  trained = [
      numpy_reference.mlp_sgd([*base, *p.trainable], batches, learning_rate)
      for p, batches in zip(personal, clients)
  ]
  new_base = process.get_model_weights(output.state).trainable
  for i in range(2):  # The base moves by the coordinate-wise median delta.
    expected = base[i] - np.median([base[i] - t[i] for t in trained], axis=0)
    np.testing.assert_allclose(new_base[i], expected, rtol=1e-5, atol=1e-6)
  assert output.metrics['aggregator']['clients'] == 3
