"""The NFL table's reading: beta against the right Local run, the detector's counts."""

import csv
import json
import os

import pytest

from tff_personal.reports import nfl_table

ACC = 'sparse_categorical_accuracy'


def write_run(root, name, accuracies, *, classes=5, seed=0, clients_per_round=2,
              central=None, flagged=None, round_flagged=-1, adversaries=(),
              before_finetune=None, config=None, windowed_peak=None):
  """A finished run: run_config.json, summary.json and eval_per_client.csv
  (evaluated at rounds 10 and 20); with the detector, metrics.csv whose
  windowed w_div peaks at `windowed_peak` (default: over the threshold 0.03
  iff flagged; a flag under it is the flag-when-blind rule's)."""
  path = os.path.join(root, name)
  os.makedirs(path)
  config = {'task': 'fmnist', 'classes_per_client': classes, 'seed': seed,
            'clients_per_round': clients_per_round, 'total_rounds': 20, **(config or {})}
  if flagged is not None:
    config.update(nfl_threshold=0.03, nfl_warmup_rounds=2, nfl_window=1)
    if windowed_peak is None:
      windowed_peak = 0.05 if flagged else 0.01
    with open(os.path.join(path, 'metrics.csv'), 'w', newline='') as f:
      writer = csv.DictWriter(f, ['round', 'nfl/windowed_w_div'])
      writer.writeheader()
      for round_num, value in enumerate([0.9, 0.9, 0.0, windowed_peak], start=1):
        writer.writerow({'round': round_num, 'nfl/windowed_w_div': value})  # 1-2: warm-up.
  with open(os.path.join(path, 'run_config.json'), 'w') as f:
    json.dump(config, f)
  final = {'eval/accuracy_mean': sum(
      a for c, a in accuracies.items() if c not in adversaries
  ) / sum(c not in adversaries for c in accuracies)}
  if before_finetune:
    final['eval/before_finetune_accuracy_mean'] = sum(before_finetune.values()) / len(
        before_finetune
    )
  if central is not None:
    final['eval/central_accuracy'] = central
  summary = {'accuracy_metric': ACC, 'final_eval': final, 'nfl': {}}
  if flagged is not None:
    summary['nfl'] = {'nfl/flagged': float(flagged), 'nfl/round_flagged': float(round_flagged)}
  with open(os.path.join(path, 'summary.json'), 'w') as f:
    json.dump(summary, f)
  with open(os.path.join(path, 'eval_per_client.csv'), 'w', newline='') as f:
    columns = ['round', 'client_id', ACC, 'num_examples', 'adversary']
    if before_finetune:
      columns.insert(3, f'before_finetune/{ACC}')
    writer = csv.DictWriter(f, columns)
    writer.writeheader()
    for round_num, shift in ((10, -0.5), (20, 0.0)):  # Round 10 must be ignored.
      for client, accuracy in accuracies.items():
        row = {'round': round_num, 'client_id': client, ACC: accuracy + shift,
               'num_examples': 10, 'adversary': int(client in adversaries)}
        if before_finetune:
          row[f'before_finetune/{ACC}'] = before_finetune[client] + shift
        writer.writerow(row)
  return path


@pytest.fixture
def table(tmp_path):
  root = str(tmp_path)
  dirs = {
      ('default', 'local', 0): write_run(
          root, 'dl0', {'a': 0.8, 'b': 0.6, 'c': 0.5}, clients_per_round=3),
      ('classes_2', 'local', 0): write_run(
          root, 'cl0', {'a': 0.9, 'b': 0.9, 'c': 0.9}, classes=2, clients_per_round=3),
      # FedAvg in the default setting: global model a=.7, b=.8, c=.9 -> gains
      # -.1, +.2, +.4 -> beta +.5/3; fine-tuned: .9 each -> .1, .3, .4.
      ('default', 'fedavg', 0): write_run(
          root, 'df0', {'a': 0.9, 'b': 0.9, 'c': 0.9}, central=0.75, flagged=False,
          before_finetune={'a': 0.7, 'b': 0.8, 'c': 0.9},
      ),
      # Fewer clients a round, same data: the default's Local; c is an adversary.
      ('ratio_10', 'lindt', 0): write_run(
          root, 'rl0', {'a': 0.9, 'b': 0.7, 'c': 0.0}, central=0.5, adversaries=('c',),
          clients_per_round=1,
      ),
      # Two classes: against the own Local (0.9 each): beta -0.2, flagged at round 7.
      ('classes_2', 'fedavg', 0): write_run(
          root, 'cf0', {'a': 0.7, 'b': 0.7, 'c': 0.7}, classes=2, central=0.7, flagged=True,
          round_flagged=7, before_finetune={'a': 0.7, 'b': 0.7, 'c': 0.7},
      ),
      ('classes_2', 'local', 1): write_run(
          root, 'cl1', {'a': 0.5, 'b': 0.5, 'c': 0.5}, classes=2, seed=1),
      ('classes_2', 'fedavg', 1): write_run(
          root, 'cf1', {'a': 0.7, 'b': 0.7, 'c': 0.7}, classes=2, seed=1, central=0.7,
          flagged=True, round_flagged=9, before_finetune={'a': 0.7, 'b': 0.7, 'c': 0.7},
          windowed_peak=0.02,  # Flagged by the flag-when-blind rule.
      ),
      # Another setting with two classes per client (all clients a round).
      ('full_2', 'fedavg', 0): write_run(
          root, 'ff0', {'a': 1.0, 'b': 1.0, 'c': 1.0}, classes=2, clients_per_round=3,
          before_finetune={'a': 1.0, 'b': 1.0, 'c': 1.0},
      ),
      # No Local run has ten classes: no beta.
      ('classes_10', 'fedavg', 0): write_run(
          root, 'tf0', {'a': 1.0, 'b': 1.0, 'c': 1.0}, classes=10,
          before_finetune={'a': 1.0, 'b': 1.0, 'c': 1.0},
      ),
  }
  return nfl_table.collect(dirs)


def test_beta_is_against_the_settings_local_run_at_the_last_round(table):
  assert table[('default', 'fedavg')][0].beta == pytest.approx(0.5 / 3)
  assert table[('default', 'fedavg+ft')][0].beta == pytest.approx(0.8 / 3)
  assert table[('default', 'fedavg')][0].local == pytest.approx(0.8)
  assert table[('default', 'fedavg+ft')][0].local == pytest.approx(0.9)
  # Fine-tuning shares FedAvg's global model.
  assert table[('default', 'fedavg+ft')][0].central == 0.75
  assert table[('classes_2', 'fedavg')][0].beta == pytest.approx(-0.2)
  assert table[('classes_2', 'fedavg')][1].beta == pytest.approx(0.2)


def test_the_local_run_is_the_one_with_the_same_data_and_seed(table):
  assert table[('full_2', 'fedavg')][0].beta == pytest.approx(0.1)  # classes_2's Local.
  assert table[('classes_10', 'fedavg')][0].beta is None


def test_data_paths_match_once_resolved(tmp_path):
  """Runs made from two checkouts record the same data file spelled two ways."""
  root = str(tmp_path)
  spelled = lambda checkout: {'femnist_path': os.path.join(root, checkout, '..', 'data.npz')}
  dirs = {
      ('default', 'local', 0): write_run(root, 'l', {'a': 0.5}, config=spelled('main')),
      ('default', 'fedavg', 0): write_run(root, 'f', {'a': 0.7}, config=spelled('other')),
  }
  assert nfl_table.collect(dirs)[('default', 'fedavg')][0].beta == pytest.approx(0.2)
  dirs[('default', 'fedavg', 0)] = write_run(
      root, 'g', {'a': 0.7}, config={'femnist_path': os.path.join(root, 'elsewhere.npz')}
  )
  assert nfl_table.collect(dirs)[('default', 'fedavg')][0].beta is None


def test_other_knobs_use_the_default_local_and_benign_clients_only(table):
  # a: .9 - .8, b: .7 - .6; the adversary c is left out.
  result = table[('ratio_10', 'lindt')][0]
  assert result.beta == pytest.approx(0.1)
  assert result.flagged is None and result.central == 0.5


def test_confusion_counts_and_first_flags(table):
  matrix = nfl_table.confusion(table)
  # default seed 0: no flag, beta > 0; classes_2 seed 0: flag, NFL; seed 1: flag,
  # no NFL; full_2 and classes_10 have no detector.
  assert (matrix.true_positive, matrix.false_positive, matrix.false_negative,
          matrix.true_negative) == (1, 1, 0, 1)
  assert matrix.first_rounds == (('classes_2', 0, 7), ('classes_2', 1, 9))


def test_confusion_counts_without_the_blind_rule_replay_the_threshold(table):
  assert table[('classes_2', 'fedavg')][0].flagged_without_blind_rule is True
  assert table[('classes_2', 'fedavg')][1].flagged_without_blind_rule is False
  assert table[('default', 'fedavg')][0].flagged_without_blind_rule is False
  matrix = nfl_table.confusion(table, blind_rule=False)
  # classes_2 seed 1 (no NFL) was flagged only by the blind rule: now a true negative.
  assert (matrix.true_positive, matrix.false_positive, matrix.false_negative,
          matrix.true_negative) == (1, 0, 0, 2)
  assert matrix.first_rounds == ()


def test_markdown_and_checks(table):
  text = nfl_table.markdown(table)
  assert '| classes 2 | 0.700 / 0.700 / +0.000 [-0.200, +0.200] |' in text
  checks = dict(nfl_table.checks(table))
  assert checks['ratio_10: LINDT beta +0.100 > 0'] is True
  assert checks['FedAvg cells in NFL: flagged in 1 of 1'] is True


def test_a_local_run_missing_clients_is_an_error(tmp_path):
  root = str(tmp_path)
  dirs = {
      ('default', 'local', 0): write_run(root, 'l', {'a': 0.8}, clients_per_round=1),
      ('default', 'fedavg', 0): write_run(root, 'f', {'a': 0.8, 'b': 0.1}, central=0.5),
  }
  with pytest.raises(ValueError, match='did not evaluate 1'):
    nfl_table.collect(dirs)


def test_calibration_reads_the_rounds_the_detector_may_flag(tmp_path):
  path = str(tmp_path)
  with open(os.path.join(path, 'run_config.json'), 'w') as f:
    json.dump({'nfl_warmup_rounds': 2, 'nfl_window': 4}, f)
  with open(os.path.join(path, 'metrics.csv'), 'w', newline='') as f:
    writer = csv.DictWriter(f, ['round', 'nfl/windowed_w_div'])
    writer.writeheader()
    # Rounds 1-3 cannot flag (window of 4 not full), whatever their values.
    for round_num, value in enumerate([0.9, 0.8, 0.7, 0.02, 0.05, 0.03], start=1):
      writer.writerow({'round': round_num, 'nfl/windowed_w_div': value})
  assert nfl_table.largest_windowed_w_div(path) == 0.05
  with open(os.path.join(path, 'run_config.json'), 'w') as f:
    json.dump({'nfl_warmup_rounds': 6, 'nfl_window': 1}, f)
  assert nfl_table.largest_windowed_w_div(path) is None  # Ended before the detector armed.


def test_the_clean_full_participation_cells_must_not_be_flagged(tmp_path):
  root = str(tmp_path)
  dirs = {
      ('classes_10', 'local', s): write_run(root, f'l{s}', {'a': 0.5}, classes=10, seed=s)
      for s in (0, 1)
  }
  for setting, flags in (('iid_full', (False, False)), ('iid_full_noise_moderate', (False, True))):
    for seed, flagged in enumerate(flags):
      dirs[(setting, 'fedavg', seed)] = write_run(
          root, f'{setting}{seed}', {'a': 0.7}, classes=10, seed=seed, flagged=flagged,
          round_flagged=6 if flagged else -1,
      )
  checks = dict(nfl_table.checks(nfl_table.collect(dirs)))
  assert checks['iid_full: the detector flags 0 of 2 seeds (should be 0)'] is True
  assert checks['iid_full_noise_moderate: the detector flags 1 of 2 seeds (should be 0)'] is False


def test_a_detector_run_that_ended_during_its_warm_up_is_reported(tmp_path):
  """Too short for the detector to arm: not flagged without the rule, and the
  calibration line says why it gives no threshold."""
  root = str(tmp_path)
  dirs = {
      ('iid_full', 'local', 0): write_run(root, 'l0', {'a': 0.5}, classes=10),
      ('iid_full', 'fedavg', 0): write_run(
          root, 'f0', {'a': 0.7}, classes=10, flagged=False),
  }
  # write_run fixes the warm-up at 2; a longer one leaves no detector round.
  path = dirs[('iid_full', 'fedavg', 0)]
  with open(os.path.join(path, 'run_config.json')) as f:
    config = json.load(f)
  config['nfl_warmup_rounds'] = 10
  with open(os.path.join(path, 'run_config.json'), 'w') as f:
    json.dump(config, f)
  assert nfl_table.collect(dirs)[('iid_full', 'fedavg')][0].flagged_without_blind_rule is False
  assert 'Calibration: iid_full seed 0: no rounds after the warm-up.' in nfl_table.report(
      dirs, 'fmnist')
