"""A results table as files: `table.md` and `table.csv` beside its runs.

bin/run_table.py writes every table it prints twice: the markdown as printed,
and a CSV with one row per cell, so that a program (a plot, a paper's table)
reads the numbers without parsing markdown.

  * accuracy tables (`results_table`): one row per (setting, column); a
    cell's mean, std and worst-10% mean (over seeds: the mean of each, and
    the half-width of the mean's 95% interval over seeds), the number of
    seeds and each seed's mean, or a note (a run failed or not run);
  * NFL tables (`nfl_table`): one row per (setting, column, seed): central
    and local accuracy, beta, and the detector's flag.

No TensorFlow here.
"""

import csv
import os
from typing import Any, Mapping, Sequence

from tff_personal.reports import nfl_table
from tff_personal.reports import results_table

MARKDOWN_FILE = 'table.md'
CSV_FILE = 'table.csv'
CELL_FIELDS = (
    'setting', 'column', 'mean', 'interval95', 'std', 'worst10_mean', 'seeds',
    'per_seed_means', 'note',
)
NFL_FIELDS = (
    'setting', 'column', 'seed', 'central_accuracy', 'local_accuracy', 'beta', 'flagged',
    'round_flagged',
)


def cell_rows(
    results: Mapping[tuple[str, str], Any], settings: Sequence[str], columns: Sequence[str]
) -> list[dict[str, Any]]:
  """One row (`CELL_FIELDS`) per (setting, column), in table order.

  Args:
    results: (setting, column) -> a `results_table.Cell` (one seed), a
      `results_table.SeedsCell` (several) or a note (str); a missing key is
      'not run', as in `results_table.markdown`.
    settings: the table's rows, in order.
    columns: the table's columns, in order.
  """
  rows = []
  for setting in settings:
    for column in columns:
      cell = results.get((setting, column), 'not run')
      row = {'setting': setting, 'column': column}
      if isinstance(cell, (results_table.Cell, results_table.SeedsCell)):
        per_seed = cell.cells if isinstance(cell, results_table.SeedsCell) else (cell,)
        row.update(
            mean=cell.mean, std=cell.std, worst10_mean=cell.worst10, seeds=len(per_seed),
            per_seed_means=';'.join(repr(c.mean) for c in per_seed),
        )
        if isinstance(cell, results_table.SeedsCell):
          row['interval95'] = cell.interval95
      else:
        row['note'] = str(cell)
      rows.append(row)
  return rows


def nfl_rows(
    table: Mapping[tuple[str, str], Mapping[int, nfl_table.RunResult]]
) -> list[dict[str, Any]]:
  """One row (`NFL_FIELDS`) per (setting, column, seed) of `nfl_table.collect`'s table."""
  settings = results_table.in_table_order({s for s, _ in table}, nfl_table.SETTINGS)
  columns = results_table.in_table_order({c for _, c in table}, nfl_table.COLUMNS)
  rows = []
  for setting in settings:
    for column in columns:
      for seed, result in sorted(table.get((setting, column), {}).items()):
        rows.append({
            'setting': setting, 'column': column, 'seed': seed,
            'central_accuracy': result.central, 'local_accuracy': result.local,
            'beta': result.beta, 'flagged': result.flagged,
            'round_flagged': result.round_flagged,
        })
  return rows


def write(
    directory: str, text: str, fields: Sequence[str], rows: Sequence[Mapping[str, Any]]
) -> tuple[str, str]:
  """Writes `text` to <directory>/table.md and `rows` to <directory>/table.csv.

  Returns:
    The two paths. Empty fields (None, or absent from a row) are written empty.
  """
  os.makedirs(directory, exist_ok=True)
  markdown_path = os.path.join(directory, MARKDOWN_FILE)
  with open(markdown_path, 'w') as f:
    f.write(text + '\n')
  csv_path = os.path.join(directory, CSV_FILE)
  with open(csv_path, 'w', newline='') as f:
    writer = csv.DictWriter(f, fields)
    writer.writeheader()
    writer.writerows(rows)
  return markdown_path, csv_path
