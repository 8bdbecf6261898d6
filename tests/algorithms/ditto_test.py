"""Ditto: exact proximal steps, the lambda limits, the global model is FedAvg's."""

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tests import test_utils
from tests.algorithms import numpy_reference
from tests.algorithms.fedavg_test import batches_dataset, client_batches, run_next
from tff_personal.algorithms import common
from tff_personal.algorithms import ditto
from tff_personal.algorithms import fedavg
from tff_personal.personal import process as process_lib
from tff_personal.training import client_training

LEARNING_RATE = 0.1
MODEL = test_utils.tiny_model_spec()  # Linear softmax: [kernel 2x2, bias 2].
ModelWeights = tff.learning.models.ModelWeights


def build(ditto_lambda, personal_steps=1, personal_learning_rate=0.05):
  return ditto.build(
      MODEL,
      ditto.Hparams(
          lambda_=ditto_lambda, personal_learning_rate=personal_learning_rate,
          personal_steps=personal_steps,
      ),
      common.Common(client_learning_rate=LEARNING_RATE, seed=8),
  )


def personal(kernel_value, bias_value):
  return ModelWeights(
      trainable=[np.full((2, 2), kernel_value, np.float32), np.full((2,), bias_value, np.float32)],
      non_trainable=[],
  )


def numpy_proximal_steps(v, w, batches, learning_rate, ditto_lambda):
  v = [p.astype(np.float64) for p in v]
  for x, y in batches:
    _, d_kernel, d_bias = numpy_reference.loss_and_gradients(v[0], v[1], x, y)
    v = [p - learning_rate * (g + ditto_lambda * (p - c))
         for p, g, c in zip(v, (d_kernel, d_bias), w)]
  return v


def assert_weights_close(actual_weights, expected_weights):
  for actual, expected in zip(actual_weights, expected_weights):
    np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=1e-6)


def assert_personal_state(output, expected_lambda, expected_v):
  """The first client's new state holds `expected_lambda` and v = `expected_v`."""
  new = output.personal_states[0]
  assert new['ditto_lambda'] == np.float32(expected_lambda)
  assert_weights_close(new['model'].trainable, expected_v)


def assert_global_model_is_sgd(process, output, w, batches):
  """The new global model is FedAvg's: SGD from w over the client's `batches`."""
  expected_w = numpy_reference.sgd(w[0], w[1], batches, LEARNING_RATE)
  assert_weights_close(process.get_model_weights(output.state).trainable, expected_w)


@pytest.mark.parametrize('ditto_lambda', [0.0, 0.5, 3.0])
def test_one_round_exact_numbers(ditto_lambda):
  process = build(ditto_lambda, personal_steps=3)
  state = process.initialize()
  w = process.get_model_weights(state).trainable
  start = personal(0.4, -0.2)
  batches = client_batches(5, [2, 3])  # 3 steps: both batches, then the first again.
  output = run_next(process, state, [batches_dataset(batches)], [start])
  expected_v = numpy_proximal_steps(
      start.trainable, w, batches + batches[:1], 0.05, ditto_lambda
  )
  assert_weights_close(output.personal_states[0].trainable, expected_v)
  assert_global_model_is_sgd(process, output, w, batches)


def test_zero_lambda_is_local_training_of_the_personal_model():
  process = build(0.0, personal_steps=2, personal_learning_rate=LEARNING_RATE)
  state = process.initialize()
  start = personal(0.4, -0.2)
  batches = client_batches(6, [3, 3])
  output = run_next(process, state, [batches_dataset(batches)], [start])
  kernel, bias = numpy_reference.sgd(*start.trainable, batches, LEARNING_RATE)
  np.testing.assert_allclose(output.personal_states[0].trainable[0], kernel, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(output.personal_states[0].trainable[1], bias, rtol=1e-5, atol=1e-6)


def test_large_lambda_holds_the_personal_model_at_the_global_model():
  distances = []
  for ditto_lambda in (0.0, 1.0, 1.0 / 0.05):  # eta_p * lambda = 1: v is reset to w each step.
    process = build(ditto_lambda, personal_steps=4)
    state = process.initialize()
    w = process.get_model_weights(state).trainable
    output = run_next(process,
        state, [batches_dataset(client_batches(7, [4, 4]))], [personal(2.0, 2.0)]
    )
    v = output.personal_states[0].trainable
    distances.append(np.sqrt(sum(np.sum((a - b) ** 2) for a, b in zip(v, w))))
  assert distances[0] > distances[1] > distances[2]
  # With eta_p * lambda = 1 a step gives v = w - eta_p * grad F(v): within
  # eta_p * |grad| (< 0.05 * 2 here, softmax gradients) of w.
  assert distances[2] < 0.1


def test_global_model_is_fedavgs():
  data = [batches_dataset(client_batches(i, [3, 2])) for i in range(3)]
  fedavg_process = fedavg.build(
      MODEL, fedavg.Hparams(),
      common.Common(client_learning_rate=LEARNING_RATE, seed=8),
  )
  ditto_process = build(0.5)
  fedavg_state = run_next(fedavg_process,
      fedavg_process.initialize(), data, process_lib.empty_personal_states(3)
  ).state
  ditto_state = run_next(ditto_process,
      ditto_process.initialize(), data, [personal(0.1 * i, 0.0) for i in range(3)]
  ).state
  for a, b in zip(
      tf.nest.flatten(fedavg_process.get_model_weights(fedavg_state)),
      tf.nest.flatten(ditto_process.get_model_weights(ditto_state)),
  ):
    np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


def test_new_clients_start_from_the_current_global_model():
  process = build(0.5)
  weights = process.get_model_weights(process.initialize())
  start = process.initial_personal_state('new', weights)
  for a, b in zip(tf.nest.flatten(start), tf.nest.flatten(weights)):
    np.testing.assert_array_equal(a, b)


def test_evaluate_uses_the_personal_model():
  process = build(0.5)
  weights = process.get_model_weights(process.initialize())
  (x, y), = client_batches(9, [6])
  result, = process.evaluate(weights, [batches_dataset([(x, y)])], [personal(0.3, -0.3)])
  loss, _, _ = numpy_reference.loss_and_gradients(
      np.full((2, 2), 0.3), np.full((2,), -0.3), x, y
  )
  np.testing.assert_allclose(result['loss'], loss, rtol=1e-5)


def test_negative_lambda_is_refused():
  with pytest.raises(ValueError, match='ditto_lambda must be >= 0'):
    build(-0.1)


GRID = (0.0, 0.5, 5.0)


def build_grid_process(lambda_selection):
  return ditto.build(
      MODEL,
      ditto.Hparams(
          lambda_=0.1, personal_learning_rate=0.3, personal_epochs=1, lambda_grid=GRID,
          lambda_selection=lambda_selection,
      ),
      common.Common(client_learning_rate=LEARNING_RATE, seed=8),
  )


@pytest.fixture(scope='module')
def grid_process():
  return build_grid_process('first')


@pytest.fixture(scope='module')
def every_round_grid_process():
  return build_grid_process('every')


def grid_state(kernel_value, bias_value, ditto_lambda):
  return {'model': personal(kernel_value, bias_value), 'ditto_lambda': np.float32(ditto_lambda)}


def test_grid_keeps_lambda_in_the_personal_state(grid_process):
  personal_type = grid_process.personal_state_type.member
  assert str(personal_type) == (
      '<model=<trainable=<float32[2,2],float32[2]>,non_trainable=<>>,ditto_lambda=float32>'
  )
  weights = grid_process.get_model_weights(grid_process.initialize())
  new = grid_process.initial_personal_state('new', weights)
  assert new['ditto_lambda'] == ditto.UNSELECTED_LAMBDA


@pytest.mark.parametrize('lambda_grid', [(), GRID])
def test_new_clients_can_start_from_the_initial_global_model(lambda_grid):
  process = ditto.build(
      MODEL, ditto.Hparams(lambda_grid=lambda_grid, personal_start='initial'),
      common.Common(client_learning_rate=LEARNING_RATE, seed=8),
  )
  initial = process.get_model_weights(process.initialize())
  later = personal(0.3, -0.3)
  start = process.initial_personal_state('new', later)
  model = start['model'] if lambda_grid else start
  for a, b in zip(tf.nest.flatten(model), tf.nest.flatten(initial)):
    np.testing.assert_array_equal(a, b)
  assert not np.array_equal(initial.trainable[0], later.trainable[0])


def split_heldout(batches):
  """(training batches, held-out (x, y)) as the client splits them."""
  train, heldout_x, heldout_y = [], [], []
  for x, y in batches:
    mask = client_training.heldout_mask((x, y), ditto.HELDOUT_BUCKETS).numpy()
    if (~mask).any():
      train.append((x[~mask], y[~mask]))
    heldout_x.append(x[mask])
    heldout_y.append(y[mask])
  return train, (np.concatenate(heldout_x), np.concatenate(heldout_y))


@pytest.mark.parametrize('seed, selection, previous_lambda', [
    (1, 'first', ditto.UNSELECTED_LAMBDA), (2, 'first', ditto.UNSELECTED_LAMBDA),
    (3, 'first', ditto.UNSELECTED_LAMBDA), (1, 'every', 0.5), (2, 'every', 5.0),
    (3, 'every', ditto.UNSELECTED_LAMBDA),
])
def test_a_choice_picks_the_lowest_heldout_loss(
    grid_process, every_round_grid_process, seed, selection, previous_lambda
):
  process = grid_process if selection == 'first' else every_round_grid_process
  state = process.initialize()
  w = process.get_model_weights(state).trainable
  batches = client_batches(seed, [8, 8, 8, 8, 8])
  start = grid_state(0.4, -0.2, previous_lambda)
  output = run_next(process, state, [batches_dataset(batches)], [start])

  train, (x, y) = split_heldout(batches)
  assert len(x) > 0  # Held-out examples exist, and v never trains on them:
  candidates = [numpy_proximal_steps(start['model'].trainable, w, train, 0.3, c) for c in GRID]
  losses = [numpy_reference.loss_and_gradients(*v, x, y)[0] for v in candidates]
  chosen = int(np.argmin(losses))
  if previous_lambda != ditto.UNSELECTED_LAMBDA:  # A re-choice that keeps lambda shows nothing.
    assert GRID[chosen] != previous_lambda
  assert_personal_state(output, GRID[chosen], candidates[chosen])


def test_with_client_steps_it_trains_on_them_and_validates_on_all_the_round_data():
  steps = 2
  process = ditto.build(
      MODEL,
      ditto.Hparams(personal_learning_rate=0.3, personal_steps=steps, lambda_grid=GRID),
      common.Common(client_learning_rate=LEARNING_RATE, seed=8, client_steps=steps),
  )
  assert process.takes_whole_client_data
  assert not build_grid_process('every').takes_whole_client_data  # No client_steps.
  state = process.initialize()
  w = process.get_model_weights(state).trainable
  batches = client_batches(4, [8, 8, 8, 8, 8])
  start = grid_state(0.4, -0.2, 0.5)
  output = run_next(process, state, [batches_dataset(batches)], [start])

  train, _ = split_heldout(batches[:steps])  # Both models train on the first batches;
  _, (x, y) = split_heldout(batches)  # the choice is made on all the held-out examples (7),
  _, (x_steps, y_steps) = split_heldout(batches[:steps])  # not on those trained batches' (2),
  candidates = [numpy_proximal_steps(start['model'].trainable, w, train, 0.3, c) for c in GRID]
  losses = [numpy_reference.loss_and_gradients(*v, x, y)[0] for v in candidates]
  chosen = int(np.argmin(losses))
  losses_steps = [numpy_reference.loss_and_gradients(*v, x_steps, y_steps)[0] for v in candidates]
  assert (len(x), len(x_steps)) == (7, 2) and int(np.argmin(losses_steps)) != chosen  # which differ.
  assert_personal_state(output, GRID[chosen], candidates[chosen])
  assert_global_model_is_sgd(process, output, w, batches[:steps])


def build_few_heldout(few_lambda, min_heldout, lambda_selection):
  """A grid process whose clients under `min_heldout` held-out examples take `few_lambda`."""
  return ditto.build(
      MODEL,
      ditto.Hparams(
          personal_learning_rate=0.3, personal_epochs=1, lambda_grid=GRID,
          lambda_selection=lambda_selection, few_heldout_lambda=few_lambda,
          min_heldout=min_heldout,
      ),
      common.Common(client_learning_rate=LEARNING_RATE, seed=8),
  )


@pytest.mark.parametrize('few_lambda', [2.0, 0.0])  # Outside the grid, and in it.
@pytest.mark.parametrize('min_heldout, falls_back', [(7, False), (8, True)])
def test_a_client_with_few_heldout_examples_takes_the_fixed_lambda(
    min_heldout, falls_back, few_lambda
):
  process = build_few_heldout(few_lambda, min_heldout, 'every')
  state = process.initialize()
  w = process.get_model_weights(state).trainable
  batches = client_batches(4, [8, 8, 8, 8, 8])
  start = grid_state(0.4, -0.2, 0.5)
  output = run_next(process, state, [batches_dataset(batches)], [start])
  train, (x, y) = split_heldout(batches)
  assert len(x) == 7
  candidates = [numpy_proximal_steps(start['model'].trainable, w, train, 0.3, c) for c in GRID]
  chosen = int(np.argmin([numpy_reference.loss_and_gradients(*v, x, y)[0] for v in candidates]))
  expected_lambda = few_lambda if falls_back else GRID[chosen]
  assert expected_lambda not in (0.5,)  # Not the start's lambda: the test sees the choice.
  expected_v = numpy_proximal_steps(start['model'].trainable, w, train, 0.3, expected_lambda)
  assert_personal_state(output, expected_lambda, expected_v)


def test_a_chosen_lambda_is_kept_with_first_selection(grid_process):
  state = grid_process.initialize()
  w = grid_process.get_model_weights(state).trainable
  batches = client_batches(4, [6, 6, 6, 6, 6])
  start = grid_state(0.1, 0.3, 0.5)
  output = run_next(grid_process, state, [batches_dataset(batches)], [start])
  assert output.personal_states[0]['ditto_lambda'] == np.float32(0.5)
  train, _ = split_heldout(batches)
  assert sum(len(y) for _, y in train) < 30  # Some examples are held out.
  expected_v = numpy_proximal_steps(start['model'].trainable, w, train, 0.3, 0.5)
  assert_weights_close(output.personal_states[0]['model'].trainable, expected_v)


def numpy_steps_choosing_lambda(v, w, batches, learning_rate, heldout, grid, few_lambda=None):
  """(v, each step's lambda): every step takes the candidate of lowest held-out loss."""
  v = [p.astype(np.float64) for p in v]
  chosen = []
  for x, y in batches:
    _, d_kernel, d_bias = numpy_reference.loss_and_gradients(v[0], v[1], x, y)
    steps = [[p - learning_rate * (g + c * (p - a)) for p, g, a in zip(v, (d_kernel, d_bias), w)]
             for c in grid]
    best = int(np.argmin([numpy_reference.loss_and_gradients(*s, *heldout)[0] for s in steps]))
    chosen.append(grid[best] if few_lambda is None else few_lambda)
    v = steps[best] if few_lambda is None else [
        p - learning_rate * (g + few_lambda * (p - a))
        for p, g, a in zip(v, (d_kernel, d_bias), w)
    ]
  return v, chosen


@pytest.fixture(scope='module')
def every_step_grid_process():
  return build_grid_process('step')


@pytest.mark.parametrize('seed', [25, 35])
def test_every_step_chooses_the_lowest_heldout_loss_of_one_step(every_step_grid_process, seed):
  process = every_step_grid_process
  state = process.initialize()
  w = process.get_model_weights(state).trainable
  batches = client_batches(seed, [8, 8, 8, 8, 8])
  start = grid_state(0.4, -0.2, 0.5)
  output = run_next(process, state, [batches_dataset(batches)], [start])

  train, heldout = split_heldout(batches)
  expected_v, chosen = numpy_steps_choosing_lambda(
      start['model'].trainable, w, train, 0.3, heldout, GRID
  )
  assert len(set(chosen)) > 1  # The steps choose differently: one choice a round could not.
  assert_personal_state(output, chosen[-1], expected_v)
  assert_global_model_is_sgd(process, output, w, batches)


@pytest.mark.parametrize('few_lambda', [2.0, 0.5])  # Outside the grid, and in it.
@pytest.mark.parametrize('min_heldout, falls_back', [(7, False), (8, True)])
def test_every_step_with_few_heldout_examples_takes_the_fixed_lambda(
    min_heldout, falls_back, few_lambda
):
  process = build_few_heldout(few_lambda, min_heldout, 'step')
  state = process.initialize()
  w = process.get_model_weights(state).trainable
  batches = client_batches(25, [8, 8, 8, 8, 8])
  start = grid_state(0.4, -0.2, 0.5)
  output = run_next(process, state, [batches_dataset(batches)], [start])
  train, heldout = split_heldout(batches)
  assert len(heldout[1]) == 7
  expected_v, chosen = numpy_steps_choosing_lambda(
      start['model'].trainable, w, train, 0.3, heldout, GRID,
      few_lambda=few_lambda if falls_back else None,
  )
  assert chosen[-1] != 0.5 or falls_back  # The start's lambda is not what the test sees.
  assert_personal_state(output, chosen[-1], expected_v)


def test_grid_evaluates_the_personal_model(grid_process):
  weights = grid_process.get_model_weights(grid_process.initialize())
  (x, y), = client_batches(9, [6])
  result, = grid_process.evaluate(
      weights, [batches_dataset([(x, y)])], [grid_state(0.3, -0.3, 0.5)]
  )
  loss, _, _ = numpy_reference.loss_and_gradients(
      np.full((2, 2), 0.3), np.full((2,), -0.3), x, y
  )
  np.testing.assert_allclose(result['loss'], loss, rtol=1e-5)


def test_negative_grid_value_is_refused():
  with pytest.raises(ValueError, match='--ditto_lambda_grid must hold values >= 0'):
    ditto.build(
      MODEL, ditto.Hparams(lambda_=0.1, lambda_grid=(0.1, -1)),
      common.Common(client_learning_rate=0.1),
  )


@pytest.mark.parametrize('hparams, message', [
    (ditto.Hparams(few_heldout_lambda=1.0), '--ditto_few_heldout_lambda applies with --ditto_lambda_grid'),
    (ditto.Hparams(lambda_grid=(0.1, 1.0), few_heldout_lambda=-1.0), '--ditto_few_heldout_lambda must be >= 0'),
    (ditto.Hparams(lambda_grid=(0.1, 1.0), min_heldout=0), '--ditto_min_heldout must be >= 1'),
])
def test_bad_few_heldout_settings_are_refused(hparams, message):
  with pytest.raises(ValueError, match=message):
    ditto.build(MODEL, hparams, common.Common(client_learning_rate=0.1))


def test_unknown_personal_start_is_refused():
  with pytest.raises(ValueError, match=r"--ditto_personal_start must be one of \['global', 'initial'\]"):
    ditto.build(MODEL, ditto.Hparams(personal_start='random'), common.Common(client_learning_rate=0.1))


def test_unknown_lambda_selection_is_refused():
  with pytest.raises(ValueError, match=r"--ditto_lambda_selection must be one of \['every', 'first', 'step'\]"):
    ditto.build(MODEL, ditto.Hparams(lambda_grid=(0.1, 1.0), lambda_selection='sometimes'),
                common.Common(client_learning_rate=0.1))
