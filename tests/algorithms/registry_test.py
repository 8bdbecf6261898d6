"""The algorithm registry builds every algorithm, with robust aggregators too."""

import numpy as np
import pytest
import tensorflow as tf

from tests import test_utils
from tff_personal.algorithms import registry

TASK = test_utils.tiny_task(num_clients=3, hidden=3)


@pytest.mark.parametrize('algorithm, aggregator', [('fedavg', 'krum'), ('ditto', 'trimmed_mean')])
def test_robust_aggregator_runs_a_round(algorithm, aggregator):
  process = registry.build_algorithm(
      algorithm,
      TASK,
      registry.AlgorithmOptions(
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
    registry.build_algorithm('fedsgd', TASK, registry.AlgorithmOptions())
