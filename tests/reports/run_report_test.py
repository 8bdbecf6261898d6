"""Run reports: reading a run directory, the figures and the markdown page."""

import csv
import json
import os
import re

import numpy as np
import pytest

from tff_personal.reports import run_report

PNG = b'\x89PNG\r\n\x1a\n'
# The benign clients' accuracies at the last evaluated round (round 4).
FINAL = [0.5, 0.6, 0.7, 0.8, 1.0]


def _write_csv(path, rows):
  columns = list(dict.fromkeys(k for row in rows for k in row))
  with open(path, 'w', newline='') as f:
    writer = csv.DictWriter(f, columns)
    writer.writeheader()
    writer.writerows(rows)


def write_run(directory, algorithm='fedavg', final=FINAL, nfl=False, dp=False):
  """A finished 4-round run of 5 benign clients and one adversary, evaluated at rounds 2 and 4.

  Also a client without test examples, left out of every summary. With
  `nfl`, the detector flags from round 3; with `dp`, epsilon is the round number.
  Returns the run's final_eval.
  """
  os.makedirs(directory, exist_ok=True)
  accuracies = {2: [a - 0.3 for a in final], 4: list(final)}
  per_client = []
  for round_num, values in accuracies.items():
    for i, value in enumerate(values):
      per_client.append({'round': round_num, 'client_id': f'client_{i}',
                         'sparse_categorical_accuracy': value, 'loss': 1 - value,
                         'num_examples': 10, 'num_batches': 1, 'adversary': 0})
    per_client.append({'round': round_num, 'client_id': 'client_adv',
                       'sparse_categorical_accuracy': 0.05, 'loss': 3.0,
                       'num_examples': 10, 'num_batches': 1, 'adversary': 1})
    per_client.append({'round': round_num, 'client_id': 'client_empty',
                       'sparse_categorical_accuracy': 0.0, 'loss': 0.0,
                       'num_examples': 0, 'num_batches': 0, 'adversary': 0})
  _write_csv(os.path.join(directory, 'eval_per_client.csv'), per_client)

  def evaluation(values):
    return {
        'eval/accuracy_mean': float(np.mean(values)),
        'eval/accuracy_std': float(np.std(values)),
        'eval/accuracy_p10': float(np.percentile(values, 10)),
        'eval/accuracy_min': float(np.min(values)),
        'eval/central_accuracy': float(np.mean(values)) - 0.1,
        'eval/num_clients': len(values),
    }

  metrics = []
  for round_num in range(1, 5):
    row = {'round': round_num, 'client_work/train/loss': 2.0 / round_num, 'round_seconds': 1.0}
    if nfl:
      row.update({'nfl/w_div': 0.1 * round_num, 'nfl/windowed_w_div': 0.05 * round_num,
                  'nfl/flagged': int(round_num >= 3),
                  'nfl/round_flagged': 3 if round_num >= 3 else -1})
    if dp:
      row.update({'privacy/epsilon': float(round_num), 'privacy/delta': 1e-3})
    if round_num in accuracies:
      row.update(evaluation(accuracies[round_num]))
    metrics.append(row)
  _write_csv(os.path.join(directory, 'metrics.csv'), metrics)

  config = {'task': 'fmnist', 'algorithm': algorithm, 'seed': 0, 'total_rounds': 4,
            'clients_per_round': 5, 'nfl_threshold': 0.12}
  final_eval = evaluation(final)
  summary = {
      'task': 'fmnist', 'accuracy_metric': 'sparse_categorical_accuracy',
      'rounds_completed': 4, 'num_clients': 50, 'final_eval': final_eval,
      'run_config': config,
      'nfl': {'nfl/flagged': 1.0, 'nfl/round_flagged': 3.0} if nfl else {},
      'privacy': {'privacy/epsilon': 4.0, 'privacy/delta': 1e-3} if dp else {},
  }
  with open(os.path.join(directory, 'run_config.json'), 'w') as f:
    json.dump(config, f)
  with open(os.path.join(directory, 'summary.json'), 'w') as f:
    json.dump(summary, f)
  return final_eval


def _is_png(path):
  with open(path, 'rb') as f:
    return f.read(8) == PNG


def test_load_run_reads_the_series_and_the_benign_final_accuracies(tmp_path):
  write_run(tmp_path / 'fmnist_fedavg')
  run = run_report.load_run(str(tmp_path / 'fmnist_fedavg'))
  assert run.label == 'fmnist_fedavg'
  rounds, means = run.series(run_report.ACCURACY_MEAN)
  assert rounds.tolist() == [2, 4]
  np.testing.assert_allclose(means, [0.42, 0.72])
  assert run.train_loss_column == 'client_work/train/loss'
  np.testing.assert_allclose(sorted(run.final_accuracies()), FINAL)  # Round 4, benign, examples.
  assert run.config['algorithm'] == 'fedavg'
  assert run.round_flagged is None and not run.has(run_report.W_DIV)


def test_load_run_finds_the_first_flagged_round(tmp_path):
  write_run(tmp_path, nfl=True)
  assert run_report.load_run(str(tmp_path), label='x').round_flagged == 3


@pytest.mark.parametrize('missing', ['metrics.csv', 'eval_per_client.csv', 'summary.json'])
def test_load_run_names_the_missing_file(tmp_path, missing):
  write_run(tmp_path)
  os.remove(tmp_path / missing)
  with pytest.raises(ValueError, match=f'^{re.escape(str(tmp_path / missing))} does not exist'):
    run_report.load_run(str(tmp_path))


def test_load_run_of_a_missing_directory_or_a_summary_without_its_metric(tmp_path):
  with pytest.raises(ValueError, match='nowhere is not a directory'):
    run_report.load_run(str(tmp_path / 'nowhere'))
  write_run(tmp_path)
  (tmp_path / 'summary.json').write_text('{}')
  with pytest.raises(ValueError, match='summary.json has no accuracy_metric'):
    run_report.load_run(str(tmp_path))


def test_markdown_report_tabulates_the_final_results(tmp_path):
  write_run(tmp_path / 'fedavg')
  write_run(tmp_path / 'ditto', algorithm='ditto', final=[0.9, 0.9, 1.0, 1.0, 1.0])
  runs = [run_report.load_run(str(tmp_path / 'fedavg'), 'FedAvg'),
          run_report.load_run(str(tmp_path / 'ditto'), 'Ditto')]
  output = tmp_path / 'report'
  lines = run_report.markdown_report(runs, str(output)).splitlines()

  assert lines[0] == '# Run report'
  assert '| FedAvg | fmnist | fedavg | 4 | 50 (5 per round) | 0 |' in lines
  assert '| Ditto | fmnist | ditto | 4 | 50 (5 per round) | 0 |' in lines
  assert '| run | clients | mean | std | p10 | min | central |' in lines
  # mean 0.72, std sqrt(0.0296), p10 0.5 + 0.4 * 0.1, min 0.5, central mean - 0.1.
  assert '| FedAvg | 5 | 0.7200 | 0.1720 | 0.5400 | 0.5000 | 0.6200 |' in lines
  assert '| Ditto | 5 | 0.9600 | 0.0490 | 0.9000 | 0.9000 | 0.8600 |' in lines
  figures = [line for line in lines if line.startswith('![')]
  assert figures == ['![Figure 1](accuracy_per_round.png)',
                     '![Figure 2](final_accuracy_distribution.png)']
  assert sorted(os.listdir(output)) == ['accuracy_per_round.png',
                                        'final_accuracy_distribution.png']
  assert all(_is_png(output / name) for name in os.listdir(output))


def test_nfl_and_epsilon_appear_only_for_the_runs_with_them(tmp_path):
  write_run(tmp_path / 'plain')
  write_run(tmp_path / 'nfl_dp', nfl=True, dp=True)
  runs = [run_report.load_run(str(tmp_path / 'plain')),
          run_report.load_run(str(tmp_path / 'nfl_dp'))]
  output = tmp_path / 'report'
  lines = run_report.markdown_report(runs, str(output)).splitlines()

  assert '| run | clients | mean | std | p10 | min | central | epsilon | NFL flagged |' in lines
  assert '| plain | 5 | 0.7200 | 0.1720 | 0.5400 | 0.5000 | 0.6200 | - | - |' in lines
  assert '| nfl_dp | 5 | 0.7200 | 0.1720 | 0.5400 | 0.5000 | 0.6200 | 4.00 | round 3 |' in lines
  assert '![Figure 3](nfl.png)' in lines and '![Figure 4](epsilon.png)' in lines
  assert _is_png(output / 'nfl.png') and _is_png(output / 'epsilon.png')


def test_nfl_and_epsilon_plots_need_a_run_with_the_column(tmp_path):
  write_run(tmp_path)
  runs = [run_report.load_run(str(tmp_path))]
  with pytest.raises(ValueError, match='No run has nfl/w_div'):
    run_report.plot_nfl(runs, str(tmp_path / 'nfl.png'))
  with pytest.raises(ValueError, match='No run has privacy/epsilon'):
    run_report.plot_epsilon(runs, str(tmp_path / 'epsilon.png'))
  assert not (tmp_path / 'nfl.png').exists()


def test_comparison_figure_is_one_png_in_a_new_directory(tmp_path):
  write_run(tmp_path / 'a')
  write_run(tmp_path / 'b', final=[1.0] * 5)
  runs = [run_report.load_run(str(tmp_path / name), label=name) for name in 'ab']
  path = tmp_path / 'demo' / 'demo.png'
  run_report.comparison_figure(runs, str(path), title='fmnist: 4 rounds')
  assert _is_png(path)
  with pytest.raises(ValueError, match='No runs'):
    run_report.comparison_figure([], str(path))
