"""A results table as a picture: `table.png` beside its runs.

One group of bars per setting (row), one bar per column, its height the
cell's benign mean accuracy; a cell over several seeds has an error bar of
its 95% interval over seeds (`results_table.SeedsCell.interval95`). Cells
that did not run (notes) are left out. bin/run_table.py writes it with
table.md and table.csv.
"""

import os
import textwrap
from typing import Any, Mapping, Optional, Sequence

import matplotlib

matplotlib.use('Agg')  # Files only: no display is needed.
import matplotlib.figure  # pylint: disable=g-import-not-at-top,wrong-import-position
from matplotlib import pyplot  # pylint: disable=g-import-not-at-top,wrong-import-position
import numpy as np  # pylint: disable=g-import-not-at-top,wrong-import-position

from tff_personal.reports import results_table  # pylint: disable=g-import-not-at-top,wrong-import-position

PNG_FILE = 'table.png'
_TITLE_CHARACTERS_PER_INCH = 11  # At the title's font size 10: lines fit the figure.


def bars(
    results: Mapping[tuple[str, str], Any], settings: Sequence[str], columns: Sequence[str]
) -> dict[str, tuple[list[float], list[float]]]:
  """Per column: (mean per setting, 95% half-width per setting); NaN where not run."""
  drawn = {}
  for column in columns:
    means, intervals = [], []
    for setting in settings:
      cell = results.get((setting, column))
      numeric = isinstance(cell, (results_table.Cell, results_table.SeedsCell))
      means.append(cell.mean if numeric else np.nan)
      seeds = isinstance(cell, results_table.SeedsCell)
      intervals.append(cell.interval95 if seeds else 0.0)
    drawn[column] = (means, intervals)
  return drawn


def figure_of(
    results: Mapping[tuple[str, str], Any], settings: Sequence[str], columns: Sequence[str],
    title: str,
) -> Optional[matplotlib.figure.Figure]:
  """The bar chart of the table, or None if no cell ran (close it after use)."""
  drawn = bars(results, settings, columns)
  if all(np.isnan(m).all() for m, _ in drawn.values()):
    return None
  width = 0.8 / max(len(columns), 1)
  figure_width = max(6.0, 1.2 * len(settings) * len(columns) / 4)
  figure, axes = pyplot.subplots(figsize=(figure_width, 4.5))
  x = np.arange(len(settings))
  for i, column in enumerate(columns):
    means, intervals = drawn[column]
    axes.bar(x + (i - (len(columns) - 1) / 2) * width, means, width, yerr=intervals,
             capsize=2, label=results_table.COLUMNS.get(column, column))
  axes.set_xticks(x, [results_table.SETTINGS.get(s, s) for s in settings], rotation=20,
                  ha='right', fontsize=8)
  axes.set_ylabel("benign clients' mean test accuracy")
  axes.set_ylim(0.0, 1.0)
  axes.set_title(
      textwrap.fill(title, int(figure_width * _TITLE_CHARACTERS_PER_INCH)), fontsize=10
  )
  axes.legend(fontsize=7, ncol=min(len(columns), 4))
  figure.tight_layout()
  return figure


def write(
    directory: str, results: Mapping[tuple[str, str], Any], settings: Sequence[str],
    columns: Sequence[str], title: str,
) -> Optional[str]:
  """Writes <directory>/table.png; returns its path, or None if no cell ran."""
  figure = figure_of(results, settings, columns, title)
  if figure is None:
    return None
  os.makedirs(directory, exist_ok=True)
  path = os.path.join(directory, PNG_FILE)
  figure.savefig(path, dpi=120)
  pyplot.close(figure)
  return path
