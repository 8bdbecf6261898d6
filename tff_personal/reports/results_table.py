"""Tables of runs: one flagfile per (task, setting, column), read back as markdown.

A table is a directory of flagfiles named `<task>__<setting>__<column>.flags`
(e.g. `configs/ditto_table/fmnist__a3_10__ditto.flags`); each is one
`bin/train.py` run whose `--experiment_name` is the file's stem. A run with
`--finetune_epochs` fills two columns: `<column>` (its models as trained,
`eval/before_finetune_*`) and `<column>+ft` (fine-tuned, `eval/*`).

Cells are the mean, standard deviation and worst-10% mean of the benign
clients' test accuracy (Ditto, Li et al. 2021, Tables 1-2 report the mean
and spread over benign devices). A table run over several seeds (the same
flagfile with `--seed=s`, experiment `<name>__seed<s>`) shows, per cell, the
mean over seeds of the benign means with the half-width of its 95%
Student-t interval over seeds, the mean worst-10% mean, and each seed's
benign mean.

Local shares nothing, so an attack reaches none of its benign clients: a
Local cell under an attack is read from the clean Local run of the same flags
(`clean_twin`, `benign_cell_of_clean_run`), one run for every row.

No TensorFlow here: the runner only starts `bin/train.py` processes and reads
their `summary.json` (and a clean Local run's `eval_per_client.csv`).
"""

import csv
import dataclasses
import json
import math
import os
import re
from typing import Any, Callable, Mapping, Optional, Sequence

from scipy import stats

from tff_personal.attacks import roles
from tff_personal.evaluation import summary as summary_lib

# Known settings and columns, in table order, with their printed names.
SETTINGS = {
    'clean': 'clean',
    'a1_20': 'A1 label poisoning, 20%',
    'a1_50': 'A1 label poisoning, 50%',
    'a1_80': 'A1 label poisoning, 80%',
    'a2_20': 'A2 random updates, 20%',
    'a2_50': 'A2 random updates, 50%',
    'a2_80': 'A2 random updates, 80%',
    'a3_10': 'A3 model replacement, 10%',
    'a3_20': 'A3 model replacement, 20%',
    'a3_50': 'A3 model replacement, 50%',
    'eps_inf': 'DP clipping, no noise (epsilon = inf)',
    'eps_8': 'DP, epsilon = 8',
    'eps_2': 'DP, epsilon = 2',
    'eps_8_clip01': 'DP, epsilon = 8, clip norm 0.1',
    'eps_2_clip01': 'DP, epsilon = 2, clip norm 0.1',
    'eps_inf_clip001': 'DP clipping to 0.01, no noise (epsilon = inf)',
    'eps_8_clip001': 'DP, epsilon = 8, clip norm 0.01',
    'eps_2_clip001': 'DP, epsilon = 2, clip norm 0.01',
    'classes_4': 'k = 4 classes per client',
    'classes_8': 'k = 8 classes per client',
    'classes_10': 'k = 10 classes per client (IID)',
}
COLUMNS = {
    'fedavg': 'FedAvg',
    'local': 'Local',
    'fedavg+ft': 'Fine-tuning',
    'qffl': 'q-FFL',
    'term': 'TERM',
    'fedavg_median': 'Median',
    'fedavg_krum': 'Krum',
    'fedavg_multi_krum': 'Multi-Krum',
    'fedavg_k_norm': 'k-norm',
    'fedavg_clipping': 'Clipping',
    'fedper': 'FedPer',
    'fedper_kp1': 'FedPer K_P=1',
    'fedper_kp2': 'FedPer K_P=2',
    'fedper_kp3': 'FedPer K_P=3',
    'fedper_linear': 'FedPer, linear base',
    'ditto': 'Ditto',
    'ditto_median': 'Ditto + median',
    'ditto_clipping': 'Ditto + clipping',
}
DITTO_COLUMNS = ('ditto', 'ditto_median', 'ditto_clipping')
_NAME = re.compile(r'^(?P<task>[a-z0-9]+)__(?P<setting>[a-z0-9_]+)__(?P<column>[a-z0-9_]+)$')


@dataclasses.dataclass(frozen=True)
class Run:
  """One flagfile of a table."""

  flagfile: str
  task: str
  setting: str
  column: str

  @property
  def name(self) -> str:
    return f'{self.task}__{self.setting}__{self.column}'

  def name_for_seed(self, seed: Optional[int], flagfile_seed: Optional[int]) -> str:
    """The experiment name of this run with `seed` (None: the flagfile's).

    The flagfile's own seed keeps the plain name, so a one-seed table's
    results are reused when more seeds are added.
    """
    if seed is None or seed == flagfile_seed:
      return self.name
    return f'{self.name}__seed{seed}'


def _order(key: str, known: Mapping[str, str]) -> tuple[int, str]:
  keys = list(known)
  return (keys.index(key) if key in known else len(keys), key)


def in_table_order(keys, known: Mapping[str, str]) -> list[str]:
  """`keys` sorted as in `known` (SETTINGS or COLUMNS), unknown ones last."""
  return sorted(keys, key=lambda k: _order(k, known))


def find_runs(configs_dir: str, task: str) -> list[Run]:
  """The table's runs for `task`, in table order (setting, then column)."""
  runs = []
  for filename in os.listdir(configs_dir):
    stem, extension = os.path.splitext(filename)
    match = _NAME.match(stem)
    if extension != '.flags' or not match or match['task'] != task:
      continue
    runs.append(
        Run(os.path.join(configs_dir, filename), task, match['setting'], match['column'])
    )
  if not runs:
    raise FileNotFoundError(
        f'No {task}__<setting>__<column>.flags file in {configs_dir}.'
    )
  return sorted(
      runs, key=lambda r: (_order(r.setting, SETTINGS), _order(r.column, COLUMNS))
  )


def interval95(values: Sequence[float]) -> float:
  """Half-width of the 95% Student-t interval of the mean of `values` (two or more)."""
  n = len(values)
  if n < 2:
    raise ValueError(f'An interval over seeds needs two or more values, got {n}.')
  mean = sum(values) / n
  spread = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
  return float(stats.t.ppf(0.975, n - 1)) * spread / math.sqrt(n)


@dataclasses.dataclass(frozen=True)
class Cell:
  """Benign clients' accuracy summary of one column of one run."""

  mean: float
  std: float
  worst10: float

  def __str__(self) -> str:
    return f'{self.mean:.4f} ± {self.std:.4f} ({self.worst10:.4f})'


@dataclasses.dataclass(frozen=True)
class SeedsCell:
  """One cell over several seeds: the mean of each `Cell` field over seeds."""

  cells: tuple[Cell, ...]

  @property
  def mean(self) -> float:
    return sum(c.mean for c in self.cells) / len(self.cells)

  @property
  def std(self) -> float:
    return sum(c.std for c in self.cells) / len(self.cells)

  @property
  def worst10(self) -> float:
    return sum(c.worst10 for c in self.cells) / len(self.cells)

  @property
  def interval95(self) -> float:
    """Half-width of the 95% Student-t interval of the mean over seeds."""
    return interval95([c.mean for c in self.cells])

  def __str__(self) -> str:
    per_seed = ', '.join(f'{c.mean:.3f}' for c in self.cells)
    return f'{self.mean:.4f} ± {self.interval95:.4f} ({self.worst10:.4f}) [{per_seed}]'


def over_seeds(cells: Sequence[Any]) -> Any:
  """One seed's cell as it is; several seeds' `Cell`s as a `SeedsCell`.

  A note (a failed run, str) among them is the cell: a mean that silently
  drops a seed would not be the mean over the stated seeds.
  """
  notes = [c for c in cells if not isinstance(c, Cell)]
  if notes:
    return notes[0]
  return cells[0] if len(cells) == 1 else SeedsCell(tuple(cells))


def with_notes_of_derived_columns(per_seed: Mapping[tuple, list]) -> dict[tuple, list]:
  """`per_seed` with each run's note also in the columns its summary would fill.

  A fine-tuning run fills `column` and `column+ft`; a seed of it that did not
  finish (not run, failed, stale) leaves its note under `column` only, and
  without it `column+ft` would be the mean of the other seeds alone.
  """
  filled = {key: list(cells) for key, cells in per_seed.items()}
  for (setting, column), cells in filled.items():
    base = column.split('+')[0]
    if base != column:
      cells.extend(c for c in per_seed.get((setting, base), ()) if not isinstance(c, Cell))
  return filled


def cells_of_summary(column: str, summary: Mapping[str, Any]) -> dict[str, Cell]:
  """The run's cells: `column`, and `column+ft` for a fine-tuning run."""
  final = summary['final_eval']

  def cell(prefix):
    return Cell(
        final[f'eval/{prefix}accuracy_mean'],
        final[f'eval/{prefix}accuracy_std'],
        final[f'eval/{prefix}accuracy_worst10_mean'],
    )

  if 'eval/before_finetune_accuracy_mean' in final:
    return {column: cell('before_finetune_'), f'{column}+ft': cell('')}
  return {column: cell('')}


def read_summary(path: str, total_rounds: Optional[int] = None) -> Optional[dict]:
  """The run's summary.json, or None if absent or short of `total_rounds`."""
  try:
    with open(path) as f:
      summary = json.load(f)
  except FileNotFoundError:
    return None
  if total_rounds is not None and summary.get('rounds_completed') != total_rounds:
    return None
  return summary


# Settings a finished run may differ in from its flagfile: they do not change
# its trained models (total_rounds is checked by `read_summary`).
_FREE_SETTINGS = frozenset({'total_rounds', 'rounds_per_eval', 'rounds_per_checkpoint'})


def stale_settings(
    flag_values: Mapping[str, str], run_config: Mapping[str, Any], seed: Optional[int]
) -> list[str]:
  """Where a finished run's settings differ from its flagfile's.

  `flag_values`: the flagfile's `--name=value` (its last value, included
  flagfiles read); `run_config`: the run's `summary.json` settings; `seed`:
  the table's `--seed` for the run (None: the flagfile's). Flags that are no
  setting of the run (`--flagfile`, `--root_output_dir`, ...) are skipped.
  Returns `--name=<flagfile's> vs <run's>` for each difference: a summary
  kept from before a flagfile changed is not the flagfile's run.
  """
  wanted = dict(flag_values)
  if seed is not None:
    wanted['seed'] = str(seed)
  return [
      f'--{name}={value} vs {run_config[name]!r}'
      for name, value in sorted(wanted.items())
      if name in run_config and name not in _FREE_SETTINGS
      and not _same_setting(value, run_config[name])
  ]


def _same_setting(flag_value: str, setting: Any) -> bool:
  if isinstance(setting, bool):
    return flag_value.lower() in (('true', '1') if setting else ('false', '0'))
  if isinstance(setting, (int, float)):
    try:
      return float(flag_value) == setting
    except ValueError:
      return False
  if isinstance(setting, (list, tuple)):
    values = [v.strip() for v in flag_value.split(',') if v.strip()]
    return len(values) == len(setting) and all(map(_same_setting, values, setting))
  if setting is None:
    return flag_value in ('', 'None')
  return flag_value == str(setting)


# Flags that say only who attacks and how, and where the run is written.
_ATTACK_FLAGS = frozenset(
    {'attack', 'attack_fraction', 'attack_boost', 'attack_poison_labels', 'experiment_name'}
)


def clean_twin(
    run: Run, flag_values: Mapping[str, str], runs: Sequence[Run],
    values_of: Callable[[Run], Mapping[str, str]],
) -> Optional[Run]:
  """The clean run whose benign clients are `run`'s, or None.

  That is the run of the same column in the `clean` row when `run` is a Local
  run (`--algorithm=local`) under an attack and its flags differ from that
  run's only in the attack (`_ATTACK_FLAGS`). Local shares nothing: an attack
  changes its adversaries' own data and updates nobody aggregates, and no
  client's sampling or batches depend on it, so its benign clients end
  exactly as in the clean run (tests/program/training_loop_test.py checks
  every attack). `values_of(run)`: a run's flagfile values.
  """
  if flag_values.get('algorithm') != 'local' or flag_values.get('attack', 'none') == 'none':
    return None
  for other in runs:
    if other.task != run.task or other.column != run.column or other.setting != 'clean':
      continue
    clean = values_of(other)
    if clean.get('attack', 'none') != 'none':
      return None
    strip = lambda values: {k: v for k, v in values.items() if k not in _ATTACK_FLAGS}
    return other if strip(clean) == strip(flag_values) else None
  return None


def benign_cell_of_clean_run(
    run_dir: str, summary: Mapping[str, Any], attack_fraction: float
) -> Cell:
  """The cell of the clients that are benign under `attack_fraction`, read
  from a clean run's last evaluation (`eval_per_client.csv` in `run_dir`).

  The adversaries are those the attacked run would choose
  (`roles.choose_adversaries` over the sorted clients with the run's seed),
  so the run must have trained and evaluated every client (no
  --population or --eval_clients subset); else ValueError.
  """
  run_config = summary.get('run_config', {})
  if run_config.get('population') or run_config.get('eval_clients'):
    raise ValueError(f'{run_dir} trained or evaluated a subset of the clients')
  with open(os.path.join(run_dir, 'eval_per_client.csv'), newline='') as f:
    rows = list(csv.DictReader(f))
  last = max(int(r['round']) for r in rows)
  rows = [r for r in rows if int(r['round']) == last]
  if last != summary['rounds_completed'] or len(rows) != summary['num_clients']:
    raise ValueError(f'{run_dir}: its last evaluation is not of every client at its last round')
  adversaries = roles.choose_adversaries(
      sorted(r['client_id'] for r in rows), attack_fraction, seed=int(run_config['seed'])
  )
  accuracies = [
      float(r[summary['accuracy_metric']]) for r in rows
      if r['client_id'] not in adversaries and int(r['num_examples']) > 0
  ]
  cell = summary_lib.summarize(accuracies, 'accuracy')
  return Cell(cell['accuracy_mean'], cell['accuracy_std'], cell['accuracy_worst10_mean'])


def markdown(
    results: Mapping[tuple[str, str], Any], settings: Sequence[str], columns: Sequence[str]
) -> str:
  """A markdown table: rows are settings, cells `Cell`s or notes (str)."""
  header = ['setting'] + [COLUMNS.get(c, c) for c in columns]
  lines = ['| ' + ' | '.join(header) + ' |', '|' + '---|' * len(header)]
  for setting in settings:
    cells = [str(results.get((setting, c), 'not run')) for c in columns]
    lines.append('| ' + ' | '.join([SETTINGS.get(setting, setting)] + cells) + ' |')
  return '\n'.join(lines)


def ditto_shape_checks(results: Mapping[tuple[str, str], Any]) -> list[tuple[str, bool]]:
  """The shape Ditto's paper reports, checked on benign mean accuracies.

  Ditto at or above FedAvg clean; Ditto at least 5 points above FedAvg under
  A1 50% and A3; FedAvg degrading sharply under A3 (here: by 10 points or
  more from clean); and, in every row where Ditto and another column ran,
  Ditto at or above the best column that is not Ditto (the paper's tables
  have Ditto first or tied in every row). Checks whose cells are missing are
  left out.
  """

  def mean(setting, column):
    cell = results.get((setting, column))
    return cell.mean if isinstance(cell, (Cell, SeedsCell)) else None

  checks = []
  ditto_clean, fedavg_clean = mean('clean', 'ditto'), mean('clean', 'fedavg')
  if ditto_clean is not None and fedavg_clean is not None:
    checks.append((
        f'clean: Ditto {ditto_clean:.4f} >= FedAvg {fedavg_clean:.4f}',
        ditto_clean >= fedavg_clean,
    ))
  for setting in ('a1_50', 'a3_10', 'a3_20'):
    ditto, fedavg = mean(setting, 'ditto'), mean(setting, 'fedavg')
    if ditto is not None and fedavg is not None:
      checks.append((
          f'{setting}: Ditto {ditto:.4f} >= FedAvg {fedavg:.4f} + 0.05',
          ditto >= fedavg + 0.05,
      ))
  for setting in ('a3_10', 'a3_20'):
    fedavg = mean(setting, 'fedavg')
    if fedavg is not None and fedavg_clean is not None:
      checks.append((
          f'{setting}: FedAvg {fedavg:.4f} <= clean {fedavg_clean:.4f} - 0.10',
          fedavg <= fedavg_clean - 0.10,
      ))
  return checks + _best_baseline_checks(results, mean)


def _best_baseline_checks(results, mean) -> list[tuple[str, bool]]:
  """Per row: Ditto at or above the best column that is not a Ditto."""
  checks = []
  settings = in_table_order({s for s, _ in results}, SETTINGS)
  for setting in settings:
    ditto = mean(setting, 'ditto')
    baselines = {
        c: mean(setting, c) for s, c in results
        if s == setting and c not in DITTO_COLUMNS and mean(setting, c) is not None
    }
    if ditto is None or not baselines:
      continue
    best = max(baselines, key=lambda c: (baselines[c], c))
    checks.append((
        f'{setting}: Ditto {ditto:.4f} >= the best baseline, {COLUMNS.get(best, best)}'
        f' {baselines[best]:.4f}',
        ditto >= baselines[best],
    ))
  return checks
