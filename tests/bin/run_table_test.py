"""bin/run_table.py's table files: table.md and table.csv beside the runs."""

import csv
import json
import subprocess
import sys

import numpy as np
import pytest

from tests.bin import binaries
from tff_personal.attacks import roles
from tff_personal.reports import nfl_table
from tff_personal.reports import results_table
from tff_personal.reports import table_files

SCRIPT = f'{binaries.REPO_ROOT}/bin/run_table.py'
Cell = results_table.Cell


def _read_csv(path):
  with open(path, newline='') as f:
    return list(csv.DictReader(f))


def test_cell_rows_one_row_per_setting_and_column():
  results = {
      ('clean', 'fedavg'): Cell(0.8, 0.1, 0.5),
      ('clean', 'ditto'): results_table.SeedsCell((Cell(0.9, 0.1, 0.6), Cell(0.7, 0.3, 0.2))),
      ('a3_10', 'fedavg'): 'failed (exit 1): out of memory',
  }
  rows = table_files.cell_rows(results, ['clean', 'a3_10'], ['fedavg', 'ditto'])
  assert rows == [
      {'setting': 'clean', 'column': 'fedavg', 'mean': 0.8, 'std': 0.1, 'worst10_mean': 0.5,
       'seeds': 1, 'per_seed_means': '0.8'},
      {'setting': 'clean', 'column': 'ditto', 'mean': pytest.approx(0.8),
       'std': pytest.approx(0.2), 'worst10_mean': pytest.approx(0.4), 'seeds': 2,
       'per_seed_means': '0.9;0.7', 'interval95': pytest.approx(12.7062 * 0.1, rel=1e-4)},
      {'setting': 'a3_10', 'column': 'fedavg', 'note': 'failed (exit 1): out of memory'},
      {'setting': 'a3_10', 'column': 'ditto', 'note': 'not run'},
  ]


def test_nfl_rows_one_row_per_seed_in_table_order():
  table = {
      ('poison_20', 'fedavg'): {1: nfl_table.RunResult(0.5, 0.6, -0.1, True, 7),
                                0: nfl_table.RunResult(0.55, 0.65, 0.02, False, None)},
      ('default', 'lindt'): {0: nfl_table.RunResult(None, 0.9, 0.2)},
  }
  rows = table_files.nfl_rows(table)
  assert [(r['setting'], r['column'], r['seed']) for r in rows] == [
      ('default', 'lindt', 0), ('poison_20', 'fedavg', 0), ('poison_20', 'fedavg', 1)
  ]
  assert rows[2] == {'setting': 'poison_20', 'column': 'fedavg', 'seed': 1,
                     'central_accuracy': 0.5, 'local_accuracy': 0.6, 'beta': -0.1,
                     'flagged': True, 'round_flagged': 7}


def test_write_puts_table_md_and_table_csv_in_the_directory(tmp_path):
  rows = table_files.cell_rows({('clean', 'fedavg'): Cell(0.8, 0.1, 0.5)}, ['clean'],
                               ['fedavg', 'local'])
  paths = table_files.write(str(tmp_path / 'out'), '| table |', table_files.CELL_FIELDS, rows)
  assert paths == (f'{tmp_path}/out/table.md', f'{tmp_path}/out/table.csv')
  assert (tmp_path / 'out' / 'table.md').read_text() == '| table |\n'
  assert _read_csv(paths[1]) == [
      {'setting': 'clean', 'column': 'fedavg', 'mean': '0.8', 'interval95': '', 'std': '0.1',
       'worst10_mean': '0.5', 'seeds': '1', 'per_seed_means': '0.8', 'note': ''},
      {'setting': 'clean', 'column': 'local', 'mean': '', 'interval95': '', 'std': '',
       'worst10_mean': '', 'seeds': '', 'per_seed_means': '', 'note': 'not run'},
  ]


def test_reading_finished_runs_writes_the_table_files(tmp_path):
  configs, root = tmp_path / 'configs', tmp_path / 'out'
  configs.mkdir()
  for column in ('fedavg', 'ditto'):
    (configs / f'fmnist__clean__{column}.flags').write_text('--total_rounds=3\n--seed=0\n')
  finished = {'fmnist__clean__fedavg': 0.8, 'fmnist__clean__fedavg__seed1': 0.6,
              'fmnist__clean__ditto': 0.9}  # Ditto's seed 1 is not run.
  for name, mean in finished.items():
    (root / name).mkdir(parents=True)
    final = {'eval/accuracy_mean': mean, 'eval/accuracy_std': 0.1,
             'eval/accuracy_worst10_mean': mean - 0.3}
    (root / name / 'summary.json').write_text(
        json.dumps({'final_eval': final, 'rounds_completed': 3})
    )
  result = subprocess.run(
      [sys.executable, SCRIPT, f'--configs_dir={configs}', '--task=fmnist',
       f'--root_output_dir={root}', '--norun', '--seeds=0,1',
       f'--output_markdown={tmp_path}/copy.md'],
      cwd=binaries.REPO_ROOT, capture_output=True, text=True, check=False,
  )
  assert result.returncode == 0, result.stderr
  markdown = (root / 'table.md').read_text()
  assert markdown == result.stdout == (tmp_path / 'copy.md').read_text()
  assert '| clean | 0.7000 ± 1.2706 (0.4000) [0.800, 0.600] | not run |' in markdown
  rows = _read_csv(root / 'table.csv')
  assert [(r['setting'], r['column'], r['note']) for r in rows] == [
      ('clean', 'fedavg', ''), ('clean', 'ditto', 'not run')
  ]
  assert float(rows[0]['mean']) == pytest.approx(0.7) and rows[0]['per_seed_means'] == '0.8;0.6'
  assert rows[0]['seeds'] == '2' and float(rows[0]['interval95']) == pytest.approx(1.2706, 1e-4)
  assert (root / 'table.png').read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'


def test_a_fine_tuning_cell_is_not_run_where_a_seed_of_its_run_is_not(tmp_path):
  configs, root = tmp_path / 'configs', tmp_path / 'out'
  configs.mkdir()
  (configs / 'fmnist__clean__fedavg.flags').write_text('--total_rounds=3\n--seed=0\n')
  (root / 'fmnist__clean__fedavg').mkdir(parents=True)  # Seed 1 is not run.
  final = {f'eval/{prefix}accuracy_{stat}': value
           for prefix, mean in (('before_finetune_', 0.8), ('', 0.9))
           for stat, value in (('mean', mean), ('std', 0.1), ('worst10_mean', mean - 0.3))}
  (root / 'fmnist__clean__fedavg' / 'summary.json').write_text(
      json.dumps({'final_eval': final, 'rounds_completed': 3})
  )
  result = subprocess.run(
      [sys.executable, SCRIPT, f'--configs_dir={configs}', '--task=fmnist',
       f'--root_output_dir={root}', '--norun', '--seeds=0,1'],
      cwd=binaries.REPO_ROOT, capture_output=True, text=True, check=False,
  )
  assert result.returncode == 0, result.stderr
  assert '| setting | FedAvg | Fine-tuning |\n|---|---|---|\n| clean | not run | not run |' in (
      result.stdout
  )


def test_runs_go_one_per_worker_and_failures_are_cells(tmp_path):
  """With --workers, each run gets one worker's --workers; a run that fails is a note."""
  configs, root = tmp_path / 'configs', tmp_path / 'out'
  configs.mkdir()
  for column in ('fedavg', 'ditto'):  # An unknown task: train.py refuses it at once.
    (configs / f'fmnist__clean__{column}.flags').write_text(
        '--task=no_such_task\n--total_rounds=3\n--seed=0\n'
    )
  result = subprocess.run(
      [sys.executable, SCRIPT, f'--configs_dir={configs}', '--task=fmnist',
       f'--root_output_dir={root}', '--workers=hosta:1,hostb:2'],
      cwd=binaries.REPO_ROOT, capture_output=True, text=True, check=False,
  )
  assert result.returncode == 0, result.stderr
  started = sorted(line for line in result.stderr.splitlines() if line.startswith('running'))
  assert len(started) == 2
  assert {line.split(' on ')[1].split()[0] for line in started} == {'hosta:1', 'hostb:2'}
  assert '| clean | failed (exit 2): train.py: error: flag --task=no_such_task' in result.stdout
  assert not (root / 'table.png').exists()  # No cell ran.


def test_a_run_with_other_settings_than_its_flagfile_is_left_out(tmp_path):
  """A summary kept from before its flagfile changed is no cell, and is not run over."""
  configs, root = tmp_path / 'configs', tmp_path / 'out'
  configs.mkdir()
  (configs / 'fmnist__clean__fedavg.flags').write_text(
      '--total_rounds=3\n--seed=0\n--client_learning_rate=0.1\n'
  )
  (root / 'fmnist__clean__fedavg').mkdir(parents=True)
  summary = {'final_eval': {'eval/accuracy_mean': 0.8, 'eval/accuracy_std': 0.1,
                            'eval/accuracy_worst10_mean': 0.5},
             'rounds_completed': 3,
             'run_config': {'total_rounds': 3, 'seed': 0, 'client_learning_rate': 0.3}}
  (root / 'fmnist__clean__fedavg' / 'summary.json').write_text(json.dumps(summary))
  result = subprocess.run(
      [sys.executable, SCRIPT, f'--configs_dir={configs}', '--task=fmnist',
       f'--root_output_dir={root}'],
      cwd=binaries.REPO_ROOT, capture_output=True, text=True, check=False,
  )
  assert result.returncode == 0, result.stderr
  assert '| clean | stale: --client_learning_rate=0.1 vs 0.3 |' in result.stdout
  assert 'remove its directory to run it again' in result.stderr
  assert 'running' not in result.stderr


def test_attacked_local_cells_are_read_from_the_clean_local_run(tmp_path):
  """No Local run under an attack: its cell is the clean run's benign clients."""
  configs, root = tmp_path / 'configs', tmp_path / 'out'
  configs.mkdir()
  (configs / 'base.flags').write_text('--task=no_such_task\n--total_rounds=2\n--seed=0\n')
  for setting, attack in (('clean', '--attack=none'),
                          ('a1_50', '--attack=label_poison\n--attack_fraction=0.5')):
    (configs / f'fmnist__{setting}__local.flags').write_text(
        f'--flagfile={configs}/base.flags\n{attack}\n--algorithm=local\n'
        f'--experiment_name=fmnist__{setting}__local\n'
    )
  clients = [f'c{i}' for i in range(4)]
  run_dir = root / 'fmnist__clean__local'
  run_dir.mkdir(parents=True)
  (run_dir / 'eval_per_client.csv').write_text(
      'round,client_id,acc,num_examples,adversary\n'
      + ''.join(f'2,{c},{0.2 * (i + 1)},5,0\n' for i, c in enumerate(clients))
  )
  run_config = {'total_rounds': 2, 'seed': 0, 'task': 'no_such_task', 'population': 0,
                'eval_clients': 0, 'attack': 'none', 'algorithm': 'local'}
  (run_dir / 'summary.json').write_text(json.dumps({
      'final_eval': {'eval/accuracy_mean': 0.5, 'eval/accuracy_std': 0.2236,
                     'eval/accuracy_worst10_mean': 0.2},
      'rounds_completed': 2, 'num_clients': 4, 'accuracy_metric': 'acc',
      'run_config': run_config,
  }))
  result = subprocess.run(
      [sys.executable, SCRIPT, f'--configs_dir={configs}', '--task=fmnist',
       f'--root_output_dir={root}'],
      cwd=binaries.REPO_ROOT, capture_output=True, text=True, check=False,
  )
  assert result.returncode == 0, result.stderr
  assert 'running' not in result.stderr  # The clean run is done; nothing else runs.
  benign = [0.2 * (i + 1) for i, c in enumerate(clients)
            if c not in roles.choose_adversaries(clients, 0.5, seed=0)]
  cell = results_table.Cell(float(np.mean(benign)), float(np.std(benign)), min(benign))
  assert f'| A1 label poisoning, 50% | {cell} |' in result.stdout
  assert 'Read from the clean run' in result.stdout and 'fmnist__a1_50__local' in result.stdout
  # Without the clean run, the clean run is what runs (here it fails at once).
  (run_dir / 'summary.json').unlink()
  result = subprocess.run(
      [sys.executable, SCRIPT, f'--configs_dir={configs}', '--task=fmnist',
       f'--root_output_dir={root}', '--settings=a1_50'],
      cwd=binaries.REPO_ROOT, capture_output=True, text=True, check=False,
  )
  assert result.returncode == 0, result.stderr
  assert [line.split()[1] for line in result.stderr.splitlines() if line.startswith('running')] == [
      'fmnist__clean__local'
  ]
  assert '| A1 label poisoning, 50% | failed (exit 2)' in result.stdout
