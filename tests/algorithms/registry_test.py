"""The algorithm registry builds every algorithm, with robust aggregators too."""

import dataclasses

import numpy as np
import pytest
import tensorflow as tf

from tests import test_utils
from tff_personal.algorithms import registry
from tff_personal.personal import process as process_lib

TASK = test_utils.tiny_task(num_clients=3, hidden=3)


@pytest.mark.parametrize('algorithm, aggregator', [('fedavg', 'krum'), ('ditto', 'trimmed_mean')])
def test_robust_aggregator_runs_a_round(algorithm, aggregator):
  process = registry.build_algorithm(
      algorithm,
      TASK,
      setup=registry.Setup(
          client_learning_rate=0.1, aggregator=aggregator, clients_per_round=3,
          aggregator_num_adversaries=0, aggregator_trim_fraction=0.34,
      ),
  )
  state = process.initialize()
  weights = process.get_model_weights(state)
  data = [TASK.train_dataset(c, epochs=1, batch_size=4, seed=1) for c in TASK.client_ids]
  personal = [process.initial_personal_state(c, weights) for c in TASK.client_ids]
  output = process.next(state, [process.client_input(d) for d in data], personal)
  assert output.metrics['aggregator']['clients'] == 3
  moved = process.get_model_weights(output.state)
  assert not np.array_equal(tf.nest.flatten(weights)[0], tf.nest.flatten(moved)[0])


def test_unknown_algorithm():
  with pytest.raises(ValueError, match='Unknown algorithm'):
    registry.build_algorithm('fedsgd', TASK)


def _assert_same(actual, expected):
  tf.nest.map_structure(np.testing.assert_array_equal, actual, expected)


@pytest.mark.parametrize('algorithm, hparams, nfl_detection', [
    ('fedavg', None, True),
    ('fedper', None, False),
    ('ditto', None, False),
    ('apfl', None, False),
    ('lindt', dict(mode='on_detection'), True),
    ('local', None, False),
    ('fedprox', None, True),
    ('local', None, True),
])
def test_split_round_gives_next_results(algorithm, hparams, nfl_detection):
  """`process.split_round` (client phase, then server phase) is `next` in
  two calls: the same state, personal states and metrics over two rounds."""
  module = registry.module(algorithm)
  process = registry.build_algorithm(
      algorithm, TASK, module.Hparams(**(hparams or {})),
      registry.Setup(client_learning_rate=0.1, nfl_detection=nfl_detection),
  )
  split = process.split_round
  assert split is not None
  state = split_state = process.initialize()
  weights = process.get_model_weights(state)
  personal = [process.initial_personal_state(c, weights) for c in TASK.client_ids]
  split_personal = personal
  for round_num in range(2):
    data = [
        process.client_input(TASK.train_dataset(c, epochs=1, batch_size=4, seed=round_num))
        for c in TASK.client_ids
    ]
    output = process.next(state, data, personal)
    split_output = process_lib.run_split_round(split, split_state, data, split_personal)
    _assert_same(split_output.state, output.state)
    _assert_same(split_output.personal_states, output.personal_states)
    _assert_same(split_output.metrics, output.metrics)
    state, personal = output.state, output.personal_states
    split_state, split_personal = split_output.state, split_output.personal_states
  moved = personal[0] if algorithm == 'local' else process.get_model_weights(state)
  assert not np.array_equal(tf.nest.flatten(weights)[0], tf.nest.flatten(moved)[0])
  assert str(split.client_phase.type_signature.result).startswith('{<update=')
  if nfl_detection:
    assert 0.0 <= output.metrics['nfl']['w_div'] < np.inf
  assert 'personal_state' not in str(split.server_phase.type_signature.parameter[1])


@pytest.mark.parametrize('algorithm, setup, message', [
    ('local', dict(aggregator='median'), '--aggregator=median: --algorithm=local aggregates no'),
    ('local', dict(dp_clip_norm=1.0), '--algorithm=local sends no update'),
    ('fedavg', dict(dp_clip_norm=1.0, aggregator='krum'), 'cannot be combined with DP'),
    ('ditto', dict(aggregator='krum', clients_per_round=4, aggregator_num_adversaries=1),
     'needs --clients_per_round > 2 \\* --aggregator_num_adversaries \\+ 2 = 4'),
    ('fedavg', dict(nfl_detection=True, nfl_window=5, total_rounds=3), 'would never fill'),
    ('fedavg', dict(nfl_detection=True, dp_adaptive_clipping=True), 'needs a fixed --dp_clip_norm'),
    ('fedavg', dict(attack='label_poison'), 'needs --attack_fraction in'),
    ('term', dict(aggregator='median'), '--aggregator=median: --algorithm=term weighs'),
    ('qffl', dict(dp_clip_norm=1.0), '--dp_clip_norm/--dp_adaptive_clipping: --algorithm=qffl'),
])
def test_check_refuses_what_cannot_combine(algorithm, setup, message):
  with pytest.raises(ValueError, match=message):
    registry.check(algorithm, registry.Setup(**setup))


@pytest.mark.parametrize('algorithm', registry.ALGORITHM_NAMES)
def test_every_algorithm_module_exports_the_registry_interface(algorithm):
  module = registry.module(algorithm)
  assert dataclasses.is_dataclass(module.Hparams) and module.Hparams.__dataclass_params__.frozen
  assert isinstance(module.CAPABILITIES.personal_state, bool)
  assert callable(module.build)
  registry.check(algorithm, registry.Setup(nfl_detection=True))  # Every algorithm takes it.
