"""Runs (or resumes) a results table of one task and prints it in markdown.

  bin/run_table.py --task=fmnist      # Ditto's attack table (configs/ditto_table)
  bin/run_table.py --task=femnist
  bin/run_table.py --configs_dir=configs/dp_table --task=femnist   # DP table
  bin/run_table.py --task=fmnist --seeds=0,1,2 --columns=fedavg,ditto
  bin/run_table.py --configs_dir=configs/nfl_table --task=fmnist --report=nfl   # NFL table

  bin/run_table.py --task=fmnist --workers=10.0.0.5:8000,10.0.0.6:8000  # a run per worker
  bin/run_table.py --task=fmnist --parallel=4                            # 4 local runs at once

Each cell group is a flagfile `<configs_dir>/<task>__<setting>__<column>.flags`
that `bin/train.py --flagfile=...` runs alone; this program runs the ones
without a complete `summary.json` (a run interrupted is resumed from its
checkpoint), then prints the table of benign clients' test accuracy (mean ±
std (worst-10% mean); over seeds, mean ± 95% interval), the privacy spent by
DP runs, and the checks of the shape Ditto's paper reports where its
settings are in the table. Logs go to <root_output_dir>/<run>.log. A
finished run whose settings (its summary's `run_config`) differ from its
flagfile's, kept from before the flagfile changed, is left out of the table
with a note and not run over; so a table whose finished runs are kept in the
repository (results/README.md) stays the table of its flagfiles.

A Local run under an attack whose flags differ from the clean row's Local
run only in the attack is not run: Local shares nothing, so its cell is the
clean run's last evaluation over the clients benign under that attack
(`results_table.clean_twin`), one Local run for every row of a seed.

Runs go one after the other, or --parallel at once on this machine, or one
per TFF worker of --workers at once (`bin/worker.py`; each run gets
`--workers=<that worker>` and its program stays here, docs/guide/remote_workers.md).

The table is also written beside the runs, to <root_output_dir>/table.md (as
printed), <root_output_dir>/table.csv (tff_personal/reports/table_files.py):
one row per (setting, column) with the cell's mean, its 95% interval over
seeds, std, worst-10% mean, number of seeds and each seed's mean (or the note
of a failed or missing run), and <root_output_dir>/table.png (bars with the
intervals, tff_personal/reports/table_plot.py); with --report=nfl, one row
per (setting, column, seed) with central and local accuracy, beta and the
detector's flag.
"""

import collections
import concurrent.futures
import os
import queue
import subprocess
import sys
import threading

from absl import app
from absl import flags

from tff_personal.reports import nfl_table
from tff_personal.reports import results_table
from tff_personal.reports import table_files
from tff_personal.reports import table_plot

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

TASK = flags.DEFINE_string('task', 'fmnist', 'Which table: the task prefix of the flagfiles.')
CONFIGS_DIR = flags.DEFINE_string(
    'configs_dir', os.path.join(_REPO, 'configs', 'ditto_table'), 'Directory of the flagfiles.'
)
ROOT_OUTPUT_DIR = flags.DEFINE_string(
    'root_output_dir', None,
    "Overrides the flagfiles' --root_output_dir (default: output/<configs_dir name>).",
)
OUTPUT_MARKDOWN = flags.DEFINE_string(
    'output_markdown', None,
    'Also write the table to this file (it is always written to'
    ' <root_output_dir>/table.md and table.csv).',
)
SEEDS = flags.DEFINE_list(
    'seeds', [],
    "Run every cell with each of these seeds (--seed=s; experiment <name>__seed<s>,"
    " the flagfile's own seed keeps <name>) and show the mean over seeds."
    " Empty: the flagfiles' seed.",
)
SETTINGS = flags.DEFINE_list('settings', [], 'Only these settings (rows); empty: all.')
COLUMNS = flags.DEFINE_list(
    'columns', [], 'Only the runs of these columns (flagfile suffixes); empty: all.'
)
RUN = flags.DEFINE_bool('run', True, 'Run missing experiments (False: only read results).')
WORKERS = flags.DEFINE_list(
    'workers', [],
    'TFF workers (host:port, started by bin/worker.py): runs go at once, one per worker.',
)
PARALLEL = flags.DEFINE_integer(
    'parallel', 1, 'Without --workers: how many runs go at once on this machine.', lower_bound=1
)
REPORT = flags.DEFINE_enum(
    'report', 'accuracy', ['accuracy', 'nfl'],
    'accuracy: benign accuracy cells and Ditto\'s checks; nfl: central and local'
    ' accuracy, beta against the Local runs, the NFL detector\'s confusion counts'
    ' (tff_personal/reports/nfl_table.py; configs/nfl_table).',
)


def _root() -> str:
  return ROOT_OUTPUT_DIR.value or os.path.join(
      'output', os.path.basename(os.path.normpath(CONFIGS_DIR.value))
  )


def _flagfile_values(flagfile: str) -> dict[str, str]:
  """The `--name=value` of a flagfile and the flagfiles it includes, the last value of each."""
  values = {}
  with open(flagfile) as f:
    for line in f:
      line = line.strip()
      if line.startswith('--flagfile='):
        values.update(_flagfile_values(os.path.join(_REPO, line.split('=', 1)[1])))
      elif line.startswith('--') and '=' in line:
        name, value = line[2:].split('=', 1)
        values[name] = value
  return values


def _flag_value(flagfile: str, name: str) -> str:
  """The last value of --name in a flagfile and the flagfiles it includes."""
  return _flagfile_values(flagfile).get(name)


# Runs start from several threads: one lock keeps their lines whole.
_STDERR_LOCK = threading.Lock()


def _run(run: results_table.Run, name: str, seed, worker=None) -> int:
  os.makedirs(_root(), exist_ok=True)
  log_path = os.path.join(_root(), f'{name}.log')
  where = f' on {worker}' if worker else ''
  with _STDERR_LOCK:
    print(f'running {name}{where} (log: {log_path})', file=sys.stderr, flush=True)
  command = [
      sys.executable, os.path.join(_REPO, 'bin', 'train.py'),
      f'--flagfile={run.flagfile}', f'--root_output_dir={_root()}',
      f'--experiment_name={name}',
  ]
  if seed is not None:
    command.append(f'--seed={seed}')
  if worker:
    command.append(f'--workers={worker}')
  with open(log_path, 'a') as log:
    return subprocess.call(command, cwd=_REPO, stdout=log, stderr=subprocess.STDOUT)


def _run_all(jobs) -> dict:
  """Runs `jobs` ((run, name, seed) each): at once, one per worker or slot.

  Returns name -> exit code.
  """
  slots = queue.Queue()
  for slot in WORKERS.value or [None] * PARALLEL.value:
    slots.put(slot)

  def run_on_a_free_slot(job):
    slot = slots.get()
    try:
      return _run(*job, worker=slot)
    finally:
      slots.put(slot)

  with concurrent.futures.ThreadPoolExecutor(slots.qsize()) as pool:
    codes = pool.map(run_on_a_free_slot, jobs)
    return {name: code for (_, name, _), code in zip(jobs, codes)}


def _seeds() -> list:
  try:
    return [int(s) for s in SEEDS.value] or [None]
  except ValueError:
    sys.exit(f'run_table.py: error: --seeds={",".join(SEEDS.value)}: not integers')


def _failure_line(path: str) -> str:
  """The log's last `error:` line (the binaries' one-line errors), else its last line."""
  try:
    with open(path) as f:
      lines = [line.strip() for line in f if line.strip()]
  except FileNotFoundError:
    return ''
  errors = [line for line in lines if 'error: ' in line]
  return (errors or lines or [''])[-1]


def main(argv):
  del argv
  try:
    runs = results_table.find_runs(CONFIGS_DIR.value, TASK.value)
  except FileNotFoundError as e:
    sys.exit(f'run_table.py: error: --task={TASK.value}: {e}')
  runs = [
      r for r in runs
      if (not SETTINGS.value or r.setting in SETTINGS.value)
      and (not COLUMNS.value or r.column in COLUMNS.value)
  ]
  if not runs:
    sys.exit('run_table.py: error: --settings/--columns select no flagfile')
  seeds = _seeds()
  twins = {}  # An attacked Local run -> the clean run it is read from.
  if REPORT.value == 'accuracy':
    all_runs = results_table.find_runs(CONFIGS_DIR.value, TASK.value)
    for run in runs:
      twin = results_table.clean_twin(
          run, _flagfile_values(run.flagfile), all_runs,
          lambda other: _flagfile_values(other.flagfile),
      )
      if twin:
        twins[run] = twin
  cells = []  # (run, name, seed, total_rounds, the flagfile's seed, the run it is read from)
  for run in runs:
    source = twins.get(run, run)
    total_rounds = int(_flag_value(source.flagfile, 'total_rounds'))
    flagfile_seed = _flag_value(source.flagfile, 'seed')
    flagfile_seed = int(flagfile_seed) if flagfile_seed is not None else None
    for seed in seeds:
      name = source.name_for_seed(seed, flagfile_seed)
      cells.append((run, name, seed, total_rounds, flagfile_seed, source))
  summary_path = lambda name: os.path.join(_root(), name, 'summary.json')
  codes = {}  # A stale run (below) has its summary: it is not run over.
  if RUN.value:
    jobs = {
        name: (source, name, seed) for _, name, seed, total_rounds, _, source in cells
        if results_table.read_summary(summary_path(name), total_rounds) is None
    }
    codes = _run_all(list(jobs.values()))
  per_seed, privacy, finished, read_from_clean = collections.defaultdict(list), [], {}, []
  for run, name, seed, total_rounds, flagfile_seed, source in cells:
    summary = results_table.read_summary(summary_path(name), total_rounds)
    stale = summary is not None and results_table.stale_settings(
        _flagfile_values(source.flagfile), summary.get('run_config', {}), seed
    )
    if stale:
      print(
          f'run_table.py: {summary_path(name)} was run with other settings than'
          f' {source.flagfile} (flagfile vs run: {", ".join(stale)}); left out of the'
          ' table: remove its directory to run it again.',
          file=sys.stderr,
      )
      per_seed[(run.setting, run.column)].append(f'stale: {"; ".join(stale)}')
      continue
    if summary is None:
      if name in codes:
        note = _failure_line(os.path.join(_root(), f'{name}.log'))
        per_seed[(run.setting, run.column)].append(f'failed (exit {codes[name]}): {note[:80]}')
      else:
        per_seed[(run.setting, run.column)].append('not run')
      continue
    finished[(run.setting, run.column, seed if seed is not None else flagfile_seed)] = (
        os.path.join(_root(), name)
    )
    if REPORT.value == 'nfl':
      continue
    if source is not run:
      fraction = float(_flag_value(run.flagfile, 'attack_fraction') or 0)
      try:
        cell = results_table.benign_cell_of_clean_run(
            os.path.join(_root(), name), summary, fraction
        )
      except (OSError, ValueError, KeyError) as e:
        per_seed[(run.setting, run.column)].append(f'not read from {name}: {e}'[:100])
        continue
      per_seed[(run.setting, run.column)].append(cell)
      read_from_clean.append(run.name)
      continue
    for column, cell in results_table.cells_of_summary(run.column, summary).items():
      per_seed[(run.setting, column)].append(cell)
    if summary.get('privacy'):
      spent = summary['privacy']
      privacy.append(
          f'- {name}: noise multiplier {spent["privacy/noise_multiplier"]:.4g},'
          f' epsilon {spent["privacy/epsilon"]:.4g} at delta {spent["privacy/delta"]:.3g}'
      )
  if REPORT.value == 'nfl':
    try:
      text = nfl_table.report(finished, TASK.value)
      rows = table_files.nfl_rows(nfl_table.collect(finished))
    except (ValueError, KeyError) as e:
      sys.exit(f'run_table.py: error: cannot read the NFL table: {e}')
    _output(text, table_files.NFL_FIELDS, rows)
    return
  results = {
      key: results_table.over_seeds(cells)
      for key, cells in results_table.with_notes_of_derived_columns(per_seed).items()
  }
  settings = results_table.in_table_order({r.setting for r in runs}, results_table.SETTINGS)
  columns = results_table.in_table_order({c for _, c in results}, results_table.COLUMNS)
  seeds_note = (
      f' Seeds {",".join(map(str, seeds))}; [each seed\'s mean].' if len(seeds) > 1 else ''
  )
  cell_note = (
      'mean over seeds ± its 95% interval (worst-10% mean)' if len(seeds) > 1
      else 'mean ± std over clients (worst-10% mean)'
  )
  lines = [
      f'Benign clients\' test accuracy on {TASK.value}: {cell_note}.' + seeds_note,
      '',
      results_table.markdown(results, settings, columns),
      '',
  ] + privacy + _read_from_clean_note(read_from_clean) + [
      f'- [{"x" if passed else " "}] {text}'
      for text, passed in results_table.ditto_shape_checks(results)
  ]
  _output(
      '\n'.join(lines), table_files.CELL_FIELDS,
      table_files.cell_rows(results, settings, columns),
  )
  png = table_plot.write(_root(), results, settings, columns, lines[0])
  if png:
    print(f'wrote {png}', file=sys.stderr)


def _read_from_clean_note(names: list[str]) -> list[str]:
  if not names:
    return []
  return [
      f'- Read from the clean run (Local shares nothing; its clients benign under the'
      f' attack): {", ".join(sorted(set(names)))}.'
  ]


def _output(text: str, csv_fields: tuple[str, ...], csv_rows: list[dict]) -> None:
  """Prints the table; writes it to table.md and table.csv, and --output_markdown."""
  print(text)
  paths = table_files.write(_root(), text, csv_fields, csv_rows)
  print(f'wrote {" and ".join(paths)}', file=sys.stderr)
  if OUTPUT_MARKDOWN.value:
    with open(OUTPUT_MARKDOWN.value, 'w') as f:
      f.write(text + '\n')


if __name__ == '__main__':
  app.run(main)
