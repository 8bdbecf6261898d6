"""The NFL table (LINDT, Lin et al. 2020): accuracy, beta and the detector.

A table of `configs/nfl_table` runs (`results_table.find_runs`) is read back
per (setting, column) over the seeds that finished:

  * central accuracy: the global model on the benign evaluated clients' test
    sets pooled (`eval/central_accuracy` of the run's summary; FedAvg's
    fine-tuning column shares FedAvg's global model);
  * local accuracy: the benign clients' mean accuracy of the models they
    predict with (`eval/accuracy_mean`; FedAvg's column: the global model,
    `eval/before_finetune_accuracy_mean`);
  * beta = (1/N) sum_i (V_i^G - V_i^P) over the N benign evaluated clients
    (`evaluation.gain`), V_i^P from the table's Local run whose clients,
    data and local training are the run's: equal `PRIVATE_MODEL_FLAGS` in
    both runs' run_config.json (the seed among them). The other knobs
    (participation, poisoning, DP, the aggregator) do not change a benign
    client's data or its private model, so one Local run serves them all;
  * the detector's verdict where the run has it (`summary['nfl']`): flagged
    or not, and the round of the first flag; and the verdict it would have
    given without the flag-when-blind rule, replayed from the run's logged
    windowed w_div (flagged iff it reached the threshold in a round the
    detector may flag).

The detector is judged on FedAvg's runs: a (cell, seed) is in NFL when
FedAvg's beta is negative; confusion counts compare that with the flag.
No TensorFlow here.
"""

import csv
import dataclasses
import json
import os
import statistics
from typing import Mapping, Optional

from tff_personal.evaluation import gain

LOCAL_COLUMN = 'local'
# The flags that make a client's data and its private (Local) model.
PRIVATE_MODEL_FLAGS = (
    'task', 'seed', 'population', 'eval_clients', 'partition', 'num_clients',
    'classes_per_client', 'dirichlet_alpha', 'test_fraction', 'sequence_length',
    'data_dir', 'femnist_path', 'cache_dir', 'stackoverflow_task',
    'stackoverflow_vocab_source', 'cnn', 'total_rounds', 'client_epochs', 'client_batch_size',
    'client_learning_rate',
)
# Values of those flags in runs recorded before the flag existed.
_MISSING_FLAG_VALUES = {'cnn': 'fedavg'}
# Settings and columns in table order, with their printed names.
SETTINGS = {
    'default': 'default',
    'classes_10': 'classes 10 (label-IID)',
    'classes_2': 'classes 2',
    'ratio_90': 'active 90%',
    'ratio_10': 'active 10%',
    'poison_20': 'poisoned 20%',
    'poison_50': 'poisoned 50%',
    'noise_moderate': 'DP noise moderate',
    'noise_large': 'DP noise large',
    'iid_full': 'IID, clean, full participation',
    'full': 'clean, full participation',
    'iid_full_noise_moderate': 'IID, clean, full participation, DP noise moderate',
}
COLUMNS = {
    'fedavg': 'FedAvg',
    'local_sampled': 'Local, sampled rounds only',
    'fedprox': 'FedProx',
    'trimmed': 'trimmed mean',
    'fedavg+ft': 'FB (fine-tuning)',
    'apfl': 'APFL',
    'lindt': 'LINDT',
    'lindt_gates': 'LINDT, learned gates',
    'lindt_own': 'LINDT, own G',
    'lindt_scale': 'LINDT, G at L\'s scale',
    'lindt_detach': 'LINDT, G detached from L\'s loss',
    'lindt_ft': 'LINDT (its fine-tuning run, as trained)',
    'lindt_ft+ft': 'LINDT + fine-tuning',
    'lindt_detect': 'LINDT on detection',
}


@dataclasses.dataclass(frozen=True)
class RunResult:
  """One run (one column, one seed) of the table."""

  central: Optional[float]
  local: float
  beta: Optional[float]
  flagged: Optional[bool] = None
  round_flagged: Optional[int] = None
  flagged_without_blind_rule: Optional[bool] = None


def read_eval_rows(experiment_dir: str) -> list[dict]:
  """The rows of the last evaluated round of a run's eval_per_client.csv."""
  path = os.path.join(experiment_dir, 'eval_per_client.csv')
  with open(path, newline='') as f:
    rows = list(csv.DictReader(f))
  if not rows:
    raise ValueError(f'{path} has no evaluation rows.')
  last = max(int(r['round']) for r in rows)
  return [r for r in rows if int(r['round']) == last]


def _accuracies(rows, column: str, benign_only: bool) -> dict[str, tuple[float, int]]:
  return {
      r['client_id']: (float(r[column]), int(float(r['num_examples'])))
      for r in rows
      if not (benign_only and r.get('adversary') == '1') and float(r['num_examples']) > 0
  }


def beta_of(run_rows, local_rows, column: str, local_column: str) -> float:
  """beta over the run's benign clients against their private (Local) models."""
  federated = _accuracies(run_rows, column, benign_only=True)
  private = _accuracies(local_rows, local_column, benign_only=False)
  missing = set(federated) - set(private)
  if missing:
    raise ValueError(
        f'The Local run did not evaluate {len(missing)} of the run\'s clients'
        f' (e.g. {sorted(missing)[0]}).'
    )
  private = {c: private[c] for c in federated}
  return gain.beta(gain.client_gains(federated, private), 'uniform')


def results_of_run(
    column: str, experiment_dir: str, local_dir: Optional[str]
) -> dict[str, RunResult]:
  """The run's table entries: `column`, and `column+ft` for a fine-tuning run."""
  with open(os.path.join(experiment_dir, 'summary.json')) as f:
    summary = json.load(f)
  accuracy = summary['accuracy_metric']
  final = summary['final_eval']
  nfl = summary.get('nfl') or {}
  flagged = bool(nfl['nfl/flagged']) if 'nfl/flagged' in nfl else None
  round_flagged = int(nfl['nfl/round_flagged']) if flagged else None
  flagged_without_blind_rule = None
  if flagged is not None:
    with open(os.path.join(experiment_dir, 'run_config.json')) as f:
      threshold = json.load(f)['nfl_threshold']
    largest = largest_windowed_w_div(experiment_dir)
    # A run that ended before the detector armed could not flag without the rule.
    flagged_without_blind_rule = largest is not None and largest >= threshold
  rows = read_eval_rows(experiment_dir)
  local_rows = read_eval_rows(local_dir) if local_dir else None

  def result(prefix_key, row_column):
    beta = None
    if local_rows is not None:
      beta = beta_of(rows, local_rows, row_column, accuracy)
    return RunResult(
        central=final.get('eval/central_accuracy'),
        local=final[f'eval/{prefix_key}accuracy_mean'],
        beta=beta,
        flagged=flagged,
        round_flagged=round_flagged,
        flagged_without_blind_rule=flagged_without_blind_rule,
    )

  if 'eval/before_finetune_accuracy_mean' in final:
    return {
        column: result('before_finetune_', f'before_finetune/{accuracy}'),
        f'{column}+ft': result('', accuracy),
    }
  return {column: result('', accuracy)}


# Of those, the paths: compared once resolved, since runs made from another
# checkout of the repository record its own spelling of the same file.
_PATH_FLAGS = ('data_dir', 'femnist_path', 'cache_dir')


def private_model_key(experiment_dir: str) -> tuple:
  """The run's `PRIVATE_MODEL_FLAGS` values (from its run_config.json)."""
  with open(os.path.join(experiment_dir, 'run_config.json')) as f:
    config = json.load(f)
  for name in _PATH_FLAGS:
    if config.get(name):
      config[name] = os.path.realpath(config[name])
  return tuple(
      json.dumps(config.get(name, _MISSING_FLAG_VALUES.get(name))) for name in PRIVATE_MODEL_FLAGS
  )


def collect(
    experiment_dirs: Mapping[tuple[str, str, int], str]
) -> dict[tuple[str, str], dict[int, RunResult]]:
  """{(setting, column): {seed: RunResult}} of the finished runs.

  Args:
    experiment_dirs: (setting, column, seed) -> the run's directory, for the
      runs with a complete summary.
  """
  local_dirs = {
      private_model_key(path): path
      for (_, column, _), path in sorted(experiment_dirs.items())
      if column == LOCAL_COLUMN
  }
  table = {}
  for (setting, column, seed), path in sorted(experiment_dirs.items()):
    if column == LOCAL_COLUMN:
      continue
    local_dir = local_dirs.get(private_model_key(path))
    for name, result in results_of_run(column, path, local_dir).items():
      table.setdefault((setting, name), {})[seed] = result
  return table


def _mean(values) -> Optional[float]:
  values = [v for v in values if v is not None]
  return statistics.fmean(values) if values else None


def _number(value: Optional[float], signed: bool = False) -> str:
  if value is None:
    return '-'
  value = round(value, 3) + 0.0  # No '-0.000'.
  return f'{value:+.3f}' if signed else f'{value:.3f}'


def cell_text(per_seed: Mapping[int, RunResult]) -> str:
  """'central / local / beta' (means over seeds), and the seeds' betas if several."""
  results = list(per_seed.values())
  text = ' / '.join([
      _number(_mean(r.central for r in results)),
      _number(_mean(r.local for r in results)),
      _number(_mean(r.beta for r in results), signed=True),
  ])
  if len(results) > 1:
    text += f' [{", ".join(_number(r.beta, signed=True) for r in results)}]'
  return text


def _order(key, known):
  keys = list(known)
  return (keys.index(key) if key in known else len(keys), key)


def markdown(table: Mapping[tuple[str, str], Mapping[int, RunResult]]) -> str:
  """Rows: settings; columns: methods; cells: `cell_text`."""
  settings = sorted({s for s, _ in table}, key=lambda s: _order(s, SETTINGS))
  columns = sorted({c for _, c in table}, key=lambda c: _order(c, COLUMNS))
  header = ['setting'] + [COLUMNS.get(c, c) for c in columns]
  lines = ['| ' + ' | '.join(header) + ' |', '|' + '---|' * len(header)]
  for setting in settings:
    cells = [cell_text(table[(setting, c)]) if (setting, c) in table else '' for c in columns]
    lines.append('| ' + ' | '.join([SETTINGS.get(setting, setting)] + cells) + ' |')
  return '\n'.join(lines)


@dataclasses.dataclass(frozen=True)
class Confusion:
  """The detector on FedAvg's runs: NFL (beta < 0) against the flag."""

  true_positive: int
  false_positive: int
  false_negative: int
  true_negative: int
  first_rounds: tuple[tuple[str, int, int], ...]  # (setting, seed, round flagged)

  def __str__(self) -> str:
    return (
        f'flagged & NFL {self.true_positive}, flagged & no NFL {self.false_positive},'
        f' not flagged & NFL {self.false_negative},'
        f' not flagged & no NFL {self.true_negative}'
    )


def confusion(
    table: Mapping[tuple[str, str], Mapping[int, RunResult]], column: str = 'fedavg',
    blind_rule: bool = True,
) -> Confusion:
  """Confusion counts of the detector over every (setting, seed) of `column`,
  with the runs' verdicts or, `blind_rule=False`, those replayed without the
  flag-when-blind rule (first rounds are then not known and left empty)."""
  counts = {(True, True): 0, (True, False): 0, (False, True): 0, (False, False): 0}
  first_rounds = []
  for (setting, name), per_seed in sorted(table.items()):
    if name != column:
      continue
    for seed, result in sorted(per_seed.items()):
      flagged = result.flagged if blind_rule else result.flagged_without_blind_rule
      if flagged is None or result.beta is None:
        continue
      counts[(flagged, result.beta < 0)] += 1
      if flagged and blind_rule:
        first_rounds.append((setting, seed, result.round_flagged))
  return Confusion(
      counts[(True, True)], counts[(True, False)], counts[(False, True)],
      counts[(False, False)], tuple(first_rounds),
  )


def checks(table: Mapping[tuple[str, str], Mapping[int, RunResult]]) -> list[tuple[str, bool]]:
  """The shape LINDT reports (beta > 0, above FedAvg's; no false alarm), on
  means over seeds where both cells exist."""

  def beta(setting, column):
    per_seed = table.get((setting, column))
    return _mean(r.beta for r in per_seed.values()) if per_seed else None

  result = []
  settings = sorted({s for s, _ in table}, key=lambda s: _order(s, SETTINGS))
  for setting in settings:
    lindt, fedavg = beta(setting, 'lindt'), beta(setting, 'fedavg')
    if lindt is None:
      continue
    result.append((f'{setting}: LINDT beta {lindt:+.3f} > 0', lindt > 0))
    if fedavg is not None:
      result.append(
          (f'{setting}: LINDT beta {lindt:+.3f} > FedAvg beta {fedavg:+.3f}', lindt > fedavg)
      )
  for setting in CALIBRATION_SETTINGS:
    per_seed = table.get((setting, 'fedavg'), {})
    if per_seed and all(r.flagged is not None for r in per_seed.values()):
      flags = sum(r.flagged for r in per_seed.values())
      result.append((
          f'{setting}: the detector flags {flags} of {len(per_seed)} seeds (should be 0)',
          flags == 0,
      ))
  matrix = confusion(table)
  if matrix.true_positive + matrix.false_negative:
    result.append((
        f'FedAvg cells in NFL: flagged in {matrix.true_positive} of'
        f' {matrix.true_positive + matrix.false_negative}',
        matrix.false_negative == 0,
    ))
  return result


# The clean, full-participation cells: the detector's calibration runs (seed
# 100) and cells it must not flag; iid_full_noise_moderate is iid_full under
# noise_moderate's DP (docs/results_nfl.md).
CALIBRATION_SETTINGS = ('iid_full', 'full', 'iid_full_noise_moderate')
CALIBRATION_MARGIN = 1.25


def largest_windowed_w_div(experiment_dir: str) -> Optional[float]:
  """The largest windowed w_div of a detector run over the rounds it may flag
  (after the warm-up, with a full window), or None if it ended before any:
  the threshold is calibrated as `CALIBRATION_MARGIN` x this on a clean,
  full-participation FedAvg run."""
  with open(os.path.join(experiment_dir, 'run_config.json')) as f:
    config = json.load(f)
  first = max(config['nfl_warmup_rounds'] + 1, config['nfl_window'])
  with open(os.path.join(experiment_dir, 'metrics.csv')) as f:
    values = [
        float(row['nfl/windowed_w_div']) for row in csv.DictReader(f)
        if int(row['round']) >= first and row.get('nfl/windowed_w_div')
    ]
  return max(values) if values else None


def report(
    experiment_dirs: Mapping[tuple[str, str, int], str], task: str
) -> str:
  """The table, the detector's confusion counts and the checks, in markdown."""
  table = collect(experiment_dirs)
  matrix = confusion(table)
  lines = [
      f'NFL table on {task}: central accuracy / mean local accuracy / beta'
      ' (benign clients; means over the seeds run, [each seed\'s beta]).',
      '',
      markdown(table),
      '',
      f'Detector on FedAvg runs (NFL = beta < 0): {matrix}.',
      'The same without the flag-when-blind rule (replayed from the logged windowed'
      f' w_div): {confusion(table, blind_rule=False)}.',
      'First flags (setting, seed, round): '
      + (', '.join(f'{s} {seed} r{r}' for s, seed, r in matrix.first_rounds) or 'none') + '.',
      '',
  ]
  for (setting, column, seed), path in sorted(experiment_dirs.items()):
    calibration_run = setting in CALIBRATION_SETTINGS and column == 'fedavg'
    if calibration_run and table[(setting, column)][seed].flagged is not None:
      largest = largest_windowed_w_div(path)
      lines.append(
          f'Calibration: {setting} seed {seed}: no rounds after the warm-up.' if largest is None
          else f'Calibration: {setting} seed {seed}: largest windowed w_div after the warm-up'
          f' {largest:.4f}; {CALIBRATION_MARGIN} x that = {CALIBRATION_MARGIN * largest:.4f}.'
      )
  lines.append('')
  lines += [f'- [{"x" if passed else " "}] {text}' for text, passed in checks(table)]
  return '\n'.join(lines)
