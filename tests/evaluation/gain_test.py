"""The gain of federation per client and beta."""

import csv
import os
import subprocess
import sys

import pytest

from tff_personal.evaluation import gain

COMPARE = os.path.join(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), 'bin', 'compare.py'
)
HEADER = ['round', 'client_id', 'sparse_categorical_accuracy', 'num_examples']


def write_eval(path, rows):
  with open(path, 'w', newline='') as f:
    writer = csv.writer(f)
    writer.writerow(HEADER)
    writer.writerows(rows)


@pytest.fixture
def runs(tmp_path):
  (tmp_path / 'fed').mkdir()
  (tmp_path / 'local').mkdir()
  write_eval(tmp_path / 'fed' / 'eval_per_client.csv', [
      [5, 'a', 0.5, 10], [5, 'b', 0.9, 30], [10, 'a', 0.6, 10], [10, 'b', 0.7, 30],
  ])
  write_eval(tmp_path / 'local' / 'eval_per_client.csv', [
      [10, 'a', 0.4, 10], [10, 'b', 0.8, 30],
  ])
  return tmp_path


def test_beta_uniform_and_by_examples(runs):
  federated = gain.read_round(str(runs / 'fed' / 'eval_per_client.csv'), HEADER[2])
  private = gain.read_round(str(runs / 'local' / 'eval_per_client.csv'), HEADER[2], 10)
  gains = gain.client_gains(federated, private)
  assert [round(g.gain, 6) for g in gains] == [0.2, -0.1]
  assert gain.beta(gains, 'uniform') == pytest.approx(0.05)
  assert gain.beta(gains, 'examples') == pytest.approx((10 * 0.2 - 30 * 0.1) / 40)


def test_mismatched_clients_and_rounds_are_errors(runs):
  federated = gain.read_round(str(runs / 'fed' / 'eval_per_client.csv'), HEADER[2])
  with pytest.raises(ValueError, match='different clients'):
    gain.client_gains(federated, {'a': (0.1, 10)})
  with pytest.raises(ValueError, match='no evaluation at round 7'):
    gain.read_round(str(runs / 'fed' / 'eval_per_client.csv'), HEADER[2], 7)


def test_compare_binary(runs, tmp_path):
  result = subprocess.run(
      [sys.executable, COMPARE, f'--run={runs / "fed"}', f'--local={runs / "local"}',
       '--weighting=examples', f'--per_client_csv={tmp_path / "g.csv"}'],
      capture_output=True, text=True, check=True,
  )
  assert 'round 10: beta (examples) = -0.0250 over 2 clients; 1 (50%) lose' in result.stdout
  assert 'NFL' in result.stdout
  with open(tmp_path / 'g.csv') as f:
    assert len(list(csv.DictReader(f))) == 2
  bad = subprocess.run(
      [sys.executable, COMPARE, f'--run={runs / "fed"}', f'--local={tmp_path}'],
      capture_output=True, text=True,
  )
  assert bad.returncode == 2 and 'does not exist' in bad.stderr
