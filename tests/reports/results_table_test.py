"""Tables of runs: flagfile discovery, cells from summaries, markdown, checks."""

import json

import numpy as np
import pytest

from tff_personal.attacks import roles
from tff_personal.reports import results_table


def summary(mean, std=0.1, worst=0.05, before=None):
  final = {
      'eval/accuracy_mean': mean,
      'eval/accuracy_std': std,
      'eval/accuracy_worst10_mean': worst,
  }
  if before is not None:
    final.update({
        'eval/before_finetune_accuracy_mean': before,
        'eval/before_finetune_accuracy_std': 0.2,
        'eval/before_finetune_accuracy_worst10_mean': 0.01,
    })
  return {'final_eval': final, 'rounds_completed': 30}


def test_find_runs_orders_settings_then_columns(tmp_path):
  for name in ['fmnist__a3_10__ditto', 'fmnist__clean__local', 'fmnist__clean__fedavg',
               'femnist__clean__ditto', 'fmnist__a1_20__ditto_median', 'fmnist.flags_',
               'clean']:
    (tmp_path / f'{name}.flags').write_text('')
  runs = results_table.find_runs(str(tmp_path), 'fmnist')
  assert [r.name for r in runs] == [
      'fmnist__clean__fedavg', 'fmnist__clean__local', 'fmnist__a1_20__ditto_median',
      'fmnist__a3_10__ditto',
  ]
  assert runs[0].flagfile == str(tmp_path / 'fmnist__clean__fedavg.flags')
  with pytest.raises(FileNotFoundError, match='No cifar__<setting>__<column>.flags'):
    results_table.find_runs(str(tmp_path), 'cifar')


def test_a_finetuning_run_fills_two_columns():
  cells = results_table.cells_of_summary('fedavg', summary(0.9, before=0.7))
  assert cells == {
      'fedavg': results_table.Cell(0.7, 0.2, 0.01),
      'fedavg+ft': results_table.Cell(0.9, 0.1, 0.05),
  }
  assert results_table.cells_of_summary('ditto', summary(0.8)) == {
      'ditto': results_table.Cell(0.8, 0.1, 0.05)
  }
  assert str(results_table.Cell(0.8, 0.1, 0.05)) == '0.8000 ± 0.1000 (0.0500)'


def test_read_summary_needs_every_round(tmp_path):
  path = tmp_path / 'summary.json'
  assert results_table.read_summary(str(path)) is None
  path.write_text(json.dumps(summary(0.5)))
  assert results_table.read_summary(str(path), 30)['rounds_completed'] == 30
  assert results_table.read_summary(str(path), 40) is None


def test_stale_settings_compare_the_flagfile_with_the_run():
  run_config = {'algorithm': 'ditto', 'ditto_lambda': 1.0, 'client_steps': 2, 'seed': 3,
                'finetune': False, 'ditto_lambda_grid': [0.05, 0.1], 'aggregator_clip_norm': None,
                'total_rounds': 150}
  same = {'algorithm': 'ditto', 'ditto_lambda': '1', 'client_steps': '2', 'finetune': 'false',
          'ditto_lambda_grid': '0.05,0.1', 'aggregator_clip_norm': 'None',
          'total_rounds': '300',  # Checked by read_summary: a shorter run is resumed.
          'root_output_dir': 'output/x', 'flagfile': 'base.flags'}  # No settings of a run.
  assert results_table.stale_settings(same, run_config, seed=3) == []
  changed = dict(same, ditto_lambda='0.1', ditto_lambda_grid='0.05,0.1,0.2', finetune='true')
  assert results_table.stale_settings(changed, run_config, seed=4) == [
      '--ditto_lambda=0.1 vs 1.0', '--ditto_lambda_grid=0.05,0.1,0.2 vs [0.05, 0.1]',
      "--finetune=true vs False", '--seed=4 vs 3',
  ]
  assert results_table.stale_settings({'seed': '3'}, run_config, seed=None) == []


def test_markdown_rows_and_missing_cells():
  results = {('clean', 'ditto'): results_table.Cell(0.9, 0.1, 0.5), ('a3_10', 'fedavg'): 'failed'}
  text = results_table.markdown(results, ['clean', 'a3_10'], ['fedavg', 'ditto'])
  assert text.splitlines() == [
      '| setting | FedAvg | Ditto |',
      '|---|---|---|',
      '| clean | not run | 0.9000 ± 0.1000 (0.5000) |',
      '| A3 model replacement, 10% | failed | not run |',
  ]


def test_ditto_shape_checks():
  cell = lambda mean: results_table.Cell(mean, 0.0, 0.0)
  results = {
      ('clean', 'fedavg'): cell(0.80), ('clean', 'ditto'): cell(0.85),
      ('a1_50', 'fedavg'): cell(0.60), ('a1_50', 'ditto'): cell(0.64),
      ('a3_10', 'fedavg'): cell(0.30), ('a3_10', 'ditto'): cell(0.80),
  }
  checks = results_table.ditto_shape_checks(results)
  assert [passed for _, passed in checks] == [True, False, True, True, True, True, True]
  assert checks[1][0] == 'a1_50: Ditto 0.6400 >= FedAvg 0.6000 + 0.05'
  assert checks[4][0] == 'clean: Ditto 0.8500 >= the best baseline, FedAvg 0.8000'


def test_ditto_is_checked_against_the_best_baseline_of_each_row():
  cell = lambda mean: results_table.Cell(mean, 0.0, 0.0)
  results = {
      ('clean', 'fedavg'): cell(0.80), ('clean', 'fedavg+ft'): cell(0.90),
      ('clean', 'term'): cell(0.70), ('clean', 'ditto'): cell(0.85),
      ('clean', 'ditto_clipping'): cell(0.95),  # A Ditto variant is no baseline.
      ('a2_20', 'fedavg_krum'): cell(0.60), ('a2_20', 'ditto'): cell(0.60),
      ('a2_50', 'ditto'): cell(0.5),  # No baseline ran: no check.
  }
  checks = results_table.ditto_shape_checks(results)[1:]
  assert checks == [
      ('clean: Ditto 0.8500 >= the best baseline, Fine-tuning 0.9000', False),
      ('a2_20: Ditto 0.6000 >= the best baseline, Krum 0.6000', True),
  ]


def test_a_seed_that_did_not_finish_is_the_cell_of_its_fine_tuning_column_too():
  seed0 = results_table.Cell(0.8, 0.1, 0.5)
  per_seed = {
      ('clean', 'fedavg'): [seed0, 'not run'],  # Seed 1 left no summary ...
      ('clean', 'fedavg+ft'): [results_table.Cell(0.9, 0.1, 0.6)],  # ... so no cell here.
      ('clean', 'ditto'): [seed0, seed0],
  }
  filled = results_table.with_notes_of_derived_columns(per_seed)
  assert filled == {
      ('clean', 'fedavg'): [seed0, 'not run'],
      ('clean', 'fedavg+ft'): [results_table.Cell(0.9, 0.1, 0.6), 'not run'],
      ('clean', 'ditto'): [seed0, seed0],
  }
  assert results_table.over_seeds(filled[('clean', 'fedavg+ft')]) == 'not run'
  assert per_seed[('clean', 'fedavg+ft')] == [results_table.Cell(0.9, 0.1, 0.6)]


def test_seeds_keep_the_flagfile_seed_name_and_average_cells():
  run = results_table.Run('f.flags', 'fmnist', 'clean', 'ditto')
  assert run.name_for_seed(None, 0) == 'fmnist__clean__ditto'
  assert run.name_for_seed(0, 0) == 'fmnist__clean__ditto'
  assert run.name_for_seed(2, 0) == 'fmnist__clean__ditto__seed2'
  one = results_table.Cell(0.5, 0.2, 0.1)
  assert results_table.over_seeds([one]) is one
  cell = results_table.over_seeds([one, results_table.Cell(0.7, 0.1, 0.3)])
  assert (cell.mean, cell.std, cell.worst10) == pytest.approx((0.6, 0.15, 0.2))
  # 95% interval over 2 seeds: t(0.975, 1) = 12.706 times std 0.1414 / sqrt(2).
  assert cell.interval95 == pytest.approx(12.7062 * 0.1, rel=1e-4)
  assert str(cell) == '0.6000 ± 1.2706 (0.2000) [0.500, 0.700]'
  three = results_table.over_seeds([results_table.Cell(m, 0.0, 0.0) for m in (0.5, 0.6, 0.7)])
  assert three.interval95 == pytest.approx(4.3027 * 0.1 / np.sqrt(3), rel=1e-4)
  with pytest.raises(ValueError, match='two or more values'):
    results_table.interval95([0.5])
  assert results_table.over_seeds([one, 'failed (exit 1)']) == 'failed (exit 1)'
  checks = results_table.ditto_shape_checks(
      {('clean', 'fedavg'): cell, ('clean', 'ditto'): one}
  )
  assert checks == [
      ('clean: Ditto 0.5000 >= FedAvg 0.6000', False),
      ('clean: Ditto 0.5000 >= the best baseline, FedAvg 0.6000', False),
  ]


def _local_flags(**extra):
  values = {'flagfile': 'configs/t/fmnist.flags', 'algorithm': 'local', 'seed': '0'}
  return {**values, **extra}


def test_an_attacked_local_run_is_read_from_the_clean_run_of_the_same_flags():
  runs = [results_table.Run(f'{s}__{c}.flags', 'fmnist', s, c)
          for s in ('clean', 'a1_50') for c in ('local', 'ditto')]
  values = {
      runs[0]: _local_flags(attack='none', experiment_name='fmnist__clean__local'),
      runs[2]: _local_flags(attack='label_poison', attack_fraction='0.5',
                            experiment_name='fmnist__a1_50__local'),
  }
  twin = lambda run, flags: results_table.clean_twin(run, flags, runs, values.get)
  assert twin(runs[2], values[runs[2]]) == runs[0]
  # Any other difference, a clean run, or an algorithm that shares a model: no twin.
  assert twin(runs[2], {**values[runs[2]], 'client_learning_rate': '0.1'}) is None
  assert twin(runs[0], values[runs[0]]) is None
  assert twin(runs[3], {**values[runs[2]], 'algorithm': 'ditto'}) is None


def test_the_benign_cell_of_a_clean_run_leaves_out_the_attacks_adversaries(tmp_path):
  clients = [f'client_{i}' for i in range(5)]
  accuracy = {c: 0.1 * (i + 1) for i, c in enumerate(clients)}
  lines = ['round,client_id,acc,num_examples,adversary']
  lines += [f'1,{c},0.0,3,0' for c in clients]  # An earlier evaluation.
  lines += [f'2,{c},{accuracy[c]},3,0' for c in reversed(clients)]
  (tmp_path / 'eval_per_client.csv').write_text('\n'.join(lines) + '\n')
  summary = {'rounds_completed': 2, 'num_clients': 5, 'accuracy_metric': 'acc',
             'run_config': {'seed': 3, 'population': 0, 'eval_clients': 0}}
  cell = results_table.benign_cell_of_clean_run(str(tmp_path), summary, 0.4)
  adversaries = roles.choose_adversaries(clients, 0.4, seed=3)
  benign = [accuracy[c] for c in clients if c not in adversaries]
  assert len(benign) == 3
  assert (cell.mean, cell.std, cell.worst10) == pytest.approx(
      (np.mean(benign), np.std(benign), min(benign))
  )
  assert results_table.benign_cell_of_clean_run(str(tmp_path), summary, 0.0).mean == (
      pytest.approx(0.3)
  )
  with pytest.raises(ValueError, match='subset'):
    results_table.benign_cell_of_clean_run(
        str(tmp_path), {**summary, 'run_config': {'seed': 3, 'eval_clients': 4}}, 0.4
    )
  with pytest.raises(ValueError, match='every client at its last round'):
    results_table.benign_cell_of_clean_run(str(tmp_path), {**summary, 'num_clients': 6}, 0.4)
