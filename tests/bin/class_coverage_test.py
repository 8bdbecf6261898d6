"""bin/class_coverage.py on a small Ditto run: the run's own per-client accuracies, split."""

import csv

from absl.testing import flagsaver
import numpy as np
import pytest
import tensorflow as tf

from tests.bin import binaries
from tests.bin import train_test
from tff_personal.models import seeded_dropout
from tff_personal.program import outputs

class_coverage = binaries.load('class_coverage')


@pytest.fixture(scope='module')
def ditto_run(tmp_path_factory):
  """A 2-round Ditto run of Ditto's CNN (it has dropout) on 6 FEMNIST writers.

  Checkpointed at round 2.
  """
  root = tmp_path_factory.mktemp('runs')
  cache_dir = tmp_path_factory.mktemp('cache')
  argv = train_test.SMALL_RUN + [
      f'--cache_dir={cache_dir}', f'--root_output_dir={root}', '--experiment_name=ditto',
      '--algorithm=ditto', '--population=6', '--total_rounds=2', '--client_steps=2',
      '--ditto_lambda_grid=0.1,1', '--cnn=ditto',
  ]
  train_test.run_main(argv)
  return argv, outputs.ExperimentDir(str(root), 'ditto')


def test_splits_the_runs_own_per_client_accuracies(ditto_run, capsys):
  argv, experiment = ditto_run
  train_test.run_main(argv, binary=class_coverage)
  out = capsys.readouterr().out
  with open(f'{experiment.path}/class_coverage_round_2.csv') as f:
    counts = list(csv.DictReader(f))
  evaluated = {
      row['client_id']: row
      for row in csv.DictReader(open(experiment.eval_path)) if row['round'] == '2'
  }
  assert sorted(c['client_id'] for c in counts) == sorted(evaluated) and len(counts) == 6
  for c in counts:
    n = int(c['test_examples'])
    row = evaluated[c['client_id']]
    assert n == int(row['num_examples'])
    personal = (int(c['personal_correct_seen']) + int(c['personal_correct_unseen'])) / n
    global_ = (int(c['global_correct_seen']) + int(c['global_correct_unseen'])) / n
    assert personal == pytest.approx(float(row['sparse_categorical_accuracy']), abs=1e-6)
    assert global_ == pytest.approx(float(row['global_model/sparse_categorical_accuracy']), abs=1e-6)
  assert f'{experiment.path}, round 2: the personal models against the global model' in out
  assert '| all (6 clients, mean per-client accuracy) |' in out


def test_refuses_a_round_without_checkpoint(ditto_run, capsys):
  argv, _ = ditto_run
  with pytest.raises(SystemExit) as excinfo:
    train_test.run_main(argv + ['--coverage_round=1'], binary=class_coverage)
  assert excinfo.value.code == 2
  assert 'No checkpoint of round 1 is kept; the kept rounds are 2' in capsys.readouterr().err


def test_refuses_an_algorithm_without_a_personal_model_of_its_own(ditto_run, capsys):
  argv, _ = ditto_run
  with pytest.raises(SystemExit) as excinfo:
    train_test.run_main(argv + ['--algorithm=fedavg'], binary=class_coverage)
  assert excinfo.value.code == 2
  assert ('--algorithm=fedavg: bin/class_coverage.py compares the personal models of ditto, local'
          in capsys.readouterr().err)


def test_with_dropout_passes_it_also_splits_expected_counts_over_the_masks(ditto_run, capsys):
  argv, experiment = ditto_run
  train_test.run_main(argv + ['--dropout_passes=2'], binary=class_coverage)
  out = capsys.readouterr().out
  assert "With dropout active, as Ditto's code evaluates (mean over 2 mask draws):" in out
  assert out.count('| all (6 clients, mean per-client accuracy) |') == 2
  with open(f'{experiment.path}/class_coverage_round_2_dropout.csv') as f:
    expected_counts = list(csv.DictReader(f))
  assert len(expected_counts) == 6
  for c in expected_counts:
    for column in ('global_correct_seen', 'global_correct_unseen', 'personal_correct_seen',
                   'personal_correct_unseen'):
      twice = 2 * float(c[column])  # Each example is right under 0, 1 or 2 of the draws.
      assert twice == int(twice) and 0 <= twice <= 2 * int(c['test_examples'])


def test_dropout_passes_need_a_model_with_dropout(ditto_run, capsys):
  argv, _ = ditto_run
  with pytest.raises(SystemExit) as excinfo:
    train_test.run_main(argv + ['--cnn=fedavg', '--dropout_passes=2'], binary=class_coverage)
  assert excinfo.value.code == 2
  assert '--dropout_passes: the model has no dropout layer to activate' in capsys.readouterr().err


def test_dropout_correctness_is_the_share_of_draws_that_keep_the_deciding_unit():
  # One input unit behind dropout 0.5 decides the class: kept (scaled to 2), the
  # logits are (2, -1.5) and class 0 wins; dropped, (0, 0.5) and class 1 wins.
  inputs = tf.keras.Input((1,))
  h = seeded_dropout.SeededDropout(0.5, salt=1)(inputs)
  logits = tf.keras.layers.Dense(2, name='logits')(h)
  model = tf.keras.Model(inputs, logits)
  weights = tf.nest.map_structure(np.float32, {
      'trainable': [np.array([[1.0, -1.0]]), np.array([0.0, 0.5])], 'non_trainable': [],
  })
  examples = (np.ones((400, 1), np.float32), np.zeros(400))
  dataset = tf.data.Dataset.from_tensor_slices(examples).batch(400)
  labels = np.zeros(400, int)
  assert (class_coverage._predict(model, weights, dataset) == 0).all()  # Inference keeps it.
  right = class_coverage._correct_with_dropout(model, weights, dataset, labels, passes=8)
  assert set(np.round(8 * right, 6)) <= set(range(9))
  # 3,200 draws of a unit kept with probability 0.5: binomial sd 0.009.
  assert 0.45 < right.mean() < 0.55
