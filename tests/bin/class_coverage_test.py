"""bin/class_coverage.py on a small Ditto run: the run's own per-client accuracies, split."""

import csv

from absl.testing import flagsaver
import pytest

from tests.bin import binaries
from tests.bin import train_test
from tff_personal.program import outputs

class_coverage = binaries.load('class_coverage')


@pytest.fixture(scope='module')
def ditto_run(tmp_path_factory):
  """A 2-round Ditto run on 6 FEMNIST writers, checkpointed at round 2."""
  root = tmp_path_factory.mktemp('runs')
  cache_dir = tmp_path_factory.mktemp('cache')
  argv = train_test.SMALL_RUN + [
      f'--cache_dir={cache_dir}', f'--root_output_dir={root}', '--experiment_name=ditto',
      '--algorithm=ditto', '--population=6', '--total_rounds=2', '--client_steps=2',
      '--ditto_lambda_grid=0.1,1',
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
