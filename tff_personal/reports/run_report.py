"""Reports of finished runs: figures (PNG) and a markdown page for a paper.

A run is the directory `bin/train.py` writes (tff_personal/program/outputs.py);
a report reads its metrics.csv (one row per round), eval_per_client.csv (one
row per evaluated client and round) and summary.json. The figures put runs
side by side: the mean per-client test accuracy and the training loss per
round, the distribution of the benign clients' final accuracies (a
personalized model is judged client by client), and, where a run has them,
the NFL detector's statistic and the privacy spent (epsilon).

No TensorFlow here: only the CSV and JSON files are read, so a report is
quick to make on any machine (bin/report.py, bin/demo.py).
"""

import csv
import dataclasses
import json
import os
from typing import Any, Optional, Sequence

import matplotlib

matplotlib.use('Agg')  # Files only: no display is needed.
from matplotlib import pyplot  # pylint: disable=g-import-not-at-top,wrong-import-position
from matplotlib import ticker  # pylint: disable=g-import-not-at-top,wrong-import-position
import numpy as np  # pylint: disable=g-import-not-at-top,wrong-import-position

METRICS_FILE = 'metrics.csv'
PER_CLIENT_FILE = 'eval_per_client.csv'
SUMMARY_FILE = 'summary.json'

# metrics.csv columns.
ACCURACY_MEAN = 'eval/accuracy_mean'
ACCURACY_P10 = 'eval/accuracy_p10'
TRAIN_LOSS = 'client_work/train/loss'
W_DIV = 'nfl/w_div'
WINDOWED_W_DIV = 'nfl/windowed_w_div'
FLAGGED = 'nfl/flagged'
EPSILON = 'privacy/epsilon'

# The figures of `markdown_report`.
ACCURACY_FIGURE = 'accuracy_per_round.png'
DISTRIBUTION_FIGURE = 'final_accuracy_distribution.png'
NFL_FIGURE = 'nfl.png'
EPSILON_FIGURE = 'epsilon.png'


@dataclasses.dataclass(frozen=True)
class Run:
  """A finished run's outputs and the name it has in reports."""

  label: str
  path: str
  metrics: list[dict[str, str]]  # metrics.csv: one row per round.
  per_client: list[dict[str, str]]  # eval_per_client.csv: one row per (round, client).
  summary: dict[str, Any]  # summary.json.

  @property
  def config(self) -> dict[str, Any]:
    """The run's flags (summary.json's copy of run_config.json)."""
    return self.summary.get('run_config') or {}

  @property
  def final_eval(self) -> dict[str, Any]:
    """The summary of the last evaluation (`eval/...`)."""
    return self.summary.get('final_eval') or {}

  def has(self, column: str) -> bool:
    """Whether any round has a value of `column` in metrics.csv."""
    return any(row.get(column) not in (None, '') for row in self.metrics)

  def series(self, column: str) -> tuple[np.ndarray, np.ndarray]:
    """(rounds, values) of the rounds with a value of `column`."""
    pairs = [
        (int(row['round']), float(row[column]))
        for row in self.metrics if row.get(column) not in (None, '')
    ]
    return np.array([r for r, _ in pairs], dtype=int), np.array([v for _, v in pairs])

  @property
  def train_loss_column(self) -> Optional[str]:
    """`client_work/train/loss`, else the first `.../train/loss` column (None if none)."""
    columns = list(self.metrics[0]) if self.metrics else []
    if TRAIN_LOSS in columns:
      return TRAIN_LOSS
    return next((c for c in columns if c.endswith('/train/loss')), None)

  def final_accuracies(self) -> np.ndarray:
    """The benign clients' test accuracies at the last evaluated round.

    Clients without test examples are left out, as in the run's summary
    (training_loop._summarize_eval).
    """
    if not self.per_client:
      return np.array([])
    last = max(int(row['round']) for row in self.per_client)
    metric = self.summary['accuracy_metric']
    return np.array([
        float(row[metric]) for row in self.per_client
        if int(row['round']) == last and int(float(row.get('adversary') or 0)) == 0
        and float(row['num_examples']) > 0
    ])

  @property
  def round_flagged(self) -> Optional[int]:
    """The first round the NFL detector flagged (None: never, or no detector)."""
    rounds, flagged = self.series(FLAGGED)
    return int(rounds[flagged > 0][0]) if np.any(flagged > 0) else None


def _read_csv(path: str, required_columns: Sequence[str]) -> list[dict[str, str]]:
  with open(path, newline='') as f:
    reader = csv.DictReader(f)
    rows = list(reader)
  missing = [c for c in required_columns if c not in (reader.fieldnames or [])]
  if missing:
    raise ValueError(f'{path} has no {", ".join(missing)} column.')
  return rows


def load_run(path: str, label: Optional[str] = None) -> Run:
  """The run written to `path` by bin/train.py, named `label` (default: the directory name).

  Raises:
    ValueError: `path` is not a finished run (the message names the missing
      or unreadable file).
  """
  if not os.path.isdir(path):
    raise ValueError(f'{path} is not a directory.')
  for name in (METRICS_FILE, PER_CLIENT_FILE, SUMMARY_FILE):
    if not os.path.isfile(os.path.join(path, name)):
      raise ValueError(
          f'{os.path.join(path, name)} does not exist: {path} is not a finished run'
          ' of bin/train.py.'
      )
  summary_path = os.path.join(path, SUMMARY_FILE)
  try:
    with open(summary_path) as f:
      summary = json.load(f)
  except json.JSONDecodeError as e:
    raise ValueError(f'{summary_path} is not JSON: {e}.') from e
  if not isinstance(summary, dict) or 'accuracy_metric' not in summary:
    raise ValueError(f'{summary_path} has no accuracy_metric.')
  metrics = _read_csv(os.path.join(path, METRICS_FILE), ['round'])
  if not metrics:
    raise ValueError(f'{os.path.join(path, METRICS_FILE)} has no rounds.')
  per_client = _read_csv(
      os.path.join(path, PER_CLIENT_FILE), ['round', summary['accuracy_metric'], 'num_examples']
  )
  return Run(
      label=label or os.path.basename(os.path.normpath(path)),
      path=path,
      metrics=metrics,
      per_client=per_client,
      summary=summary,
  )


def _color(index: int) -> str:
  """The color of the index-th run, the same in every panel."""
  return f'C{index % 10}'


def _draw_accuracy(axis, runs: Sequence[Run]) -> None:
  """Mean (solid) and 10th percentile (dashed) of per-client accuracy per evaluated round."""
  for i, run in enumerate(runs):
    axis.plot(*run.series(ACCURACY_MEAN), 'o-', color=_color(i), markersize=3, label=run.label)
    if run.has(ACCURACY_P10):
      axis.plot(*run.series(ACCURACY_P10), '--', color=_color(i), alpha=0.6)
  axis.set_ylabel('per-client test accuracy')
  axis.set_title('mean (solid) and 10th percentile (dashed)', fontsize='medium')


def _draw_loss(axis, runs: Sequence[Run]) -> None:
  for i, run in enumerate(runs):
    if run.train_loss_column:
      axis.plot(*run.series(run.train_loss_column), '-', color=_color(i), label=run.label)
  axis.set_ylabel('training loss')


def _draw_cdf(axis, runs: Sequence[Run]) -> None:
  """The empirical CDF of each run's final per-client accuracies."""
  for i, run in enumerate(runs):
    values = np.sort(run.final_accuracies())
    if values.size:
      fractions = np.arange(1, values.size + 1) / values.size
      axis.step(np.concatenate([[0.0], values, [1.0]]), np.concatenate([[0.0], fractions, [1.0]]),
                where='post', color=_color(i), label=f'{run.label} ({values.size} clients)')
  axis.set_xlim(0, 1)
  axis.set_ylim(0, 1.02)
  axis.set_xlabel('final test accuracy of a client')
  axis.set_ylabel('fraction of clients at or below')


def _draw_histogram(axis, runs: Sequence[Run]) -> None:
  bins = np.linspace(0, 1, 21)
  for i, run in enumerate(runs):
    values = run.final_accuracies()
    if values.size:
      axis.hist(values, bins=bins, histtype='step', linewidth=1.5, color=_color(i),
                label=run.label)
  axis.set_xlim(0, 1)
  axis.set_xlabel('final test accuracy of a client')
  axis.set_ylabel('clients')


def _finish(figure, axes, path: str, title: Optional[str] = None) -> None:
  """Legends, grids and the PNG at `path` (its directory made if missing)."""
  for axis in axes:
    if axis.get_legend_handles_labels()[0]:
      axis.legend(fontsize='small')
    axis.grid(alpha=0.3)
  if title:
    figure.suptitle(title)
  figure.tight_layout()
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  figure.savefig(path, dpi=120)
  pyplot.close(figure)


def _rounds_axis(axis) -> None:
  axis.set_xlabel('round')
  axis.xaxis.set_major_locator(ticker.MaxNLocator(integer=True))


def _check(runs: Sequence[Run], column: Optional[str] = None) -> None:
  if not runs:
    raise ValueError('No runs to plot.')
  if column and not any(run.has(column) for run in runs):
    raise ValueError(f'No run has {column} in its {METRICS_FILE}.')


def plot_accuracy_per_round(runs: Sequence[Run], path: str) -> None:
  """Top: per-client test accuracy per evaluated round; bottom: training loss per round."""
  _check(runs)
  figure, (top, bottom) = pyplot.subplots(2, 1, sharex=True, figsize=(7, 6.5))
  _draw_accuracy(top, runs)
  _draw_loss(bottom, runs)
  _rounds_axis(bottom)
  _finish(figure, (top, bottom), path)


def plot_final_accuracy_distribution(runs: Sequence[Run], path: str) -> None:
  """Histogram (left) and CDF (right) of the benign clients' final test accuracies."""
  _check(runs)
  figure, (left, right) = pyplot.subplots(1, 2, figsize=(11, 4.5))
  _draw_histogram(left, runs)
  _draw_cdf(right, runs)
  _finish(figure, (left, right), path)


def plot_nfl(runs: Sequence[Run], path: str) -> None:
  """The NFL detector's w_div per round (top) and its windowed mean (bottom).

  The bottom panel marks the rounds flagged (x), the first one (dotted line)
  and each run's threshold (dashed). Runs without the detector are left out.

  Raises:
    ValueError: no run has `nfl/w_div`.
  """
  _check(runs, W_DIV)
  figure, (top, bottom) = pyplot.subplots(2, 1, sharex=True, figsize=(7, 6.5))
  for i, run in enumerate(runs):
    if not run.has(W_DIV):
      continue
    top.plot(*run.series(W_DIV), 'o-', color=_color(i), markersize=3, label=run.label)
    rounds, windowed = run.series(WINDOWED_W_DIV)
    bottom.plot(rounds, windowed, '-', color=_color(i), label=run.label)
    flagged_rounds, flagged = run.series(FLAGGED)
    marked = np.isin(rounds, flagged_rounds[flagged > 0])
    bottom.plot(rounds[marked], windowed[marked], 'x', color=_color(i), markersize=7)
    if run.round_flagged is not None:
      bottom.axvline(run.round_flagged, color=_color(i), linestyle=':',
                     label=f'{run.label}: flagged at round {run.round_flagged}')
    if run.config.get('nfl_threshold') is not None:
      bottom.axhline(run.config['nfl_threshold'], color=_color(i), linestyle='--', alpha=0.6)
  top.set_ylabel('Delta (w_div)')
  bottom.set_ylabel('windowed mean of w_div')
  _rounds_axis(bottom)
  _finish(figure, (top, bottom), path)


def plot_epsilon(runs: Sequence[Run], path: str) -> None:
  """The privacy spent (epsilon at the run's delta) after each round.

  Raises:
    ValueError: no run has `privacy/epsilon`.
  """
  _check(runs, EPSILON)
  figure, axis = pyplot.subplots(figsize=(7, 4))
  for i, run in enumerate(runs):
    if run.has(EPSILON):
      delta = (run.summary.get('privacy') or {}).get('privacy/delta')
      label = f'{run.label} (delta {delta:.2g})' if delta is not None else run.label
      axis.plot(*run.series(EPSILON), 'o-', color=_color(i), markersize=3, label=label)
  axis.set_ylabel('epsilon')
  _rounds_axis(axis)
  _finish(figure, (axis,), path)


def comparison_figure(runs: Sequence[Run], path: str, title: Optional[str] = None) -> None:
  """One PNG comparing runs: accuracy per round (left), final per-client accuracies' CDF (right)."""
  _check(runs)
  figure, (left, right) = pyplot.subplots(1, 2, figsize=(11, 4.5))
  _draw_accuracy(left, runs)
  _rounds_axis(left)
  _draw_cdf(right, runs)
  _finish(figure, (left, right), path, title)


def _text(value: Any) -> str:
  """A markdown table cell: '-' for None, '|' escaped."""
  return '-' if value is None else str(value).replace('|', '\\|')


def _table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
  lines = ['| ' + ' | '.join(header) + ' |', '|' + '---|' * len(header)]
  lines += ['| ' + ' | '.join(_text(v) for v in row) + ' |' for row in rows]
  return lines


def _number(value: Optional[float], digits: int = 4) -> Optional[str]:
  return None if value is None else f'{value:.{digits}f}'


def _clients(run: Run) -> Optional[str]:
  population, per_round = run.summary.get('num_clients'), run.config.get('clients_per_round')
  if population is None or per_round is None:
    return population
  return f'{population} ({per_round} per round)'


def _epsilon(run: Run) -> Optional[float]:
  return (run.summary.get('privacy') or {}).get('privacy/epsilon')


def _has_detector(run: Run) -> bool:
  return run.has(FLAGGED) or bool(run.summary.get('nfl'))


def _nfl_text(run: Run) -> Optional[str]:
  if not _has_detector(run):
    return None
  return 'not flagged' if run.round_flagged is None else f'round {run.round_flagged}'


def final_results(runs: Sequence[Run]) -> list[str]:
  """The markdown lines of the final results: a sentence, then one table row per run.

  Central accuracy, epsilon and the NFL flag are columns only when a run has them.
  """
  columns = [
      ('clients', lambda r: r.final_eval.get('eval/num_clients')),
      ('mean', lambda r: _number(r.final_eval.get('eval/accuracy_mean'))),
      ('std', lambda r: _number(r.final_eval.get('eval/accuracy_std'))),
      ('p10', lambda r: _number(r.final_eval.get('eval/accuracy_p10'))),
      ('min', lambda r: _number(r.final_eval.get('eval/accuracy_min'))),
  ]
  text = (
      'Benign clients\' test accuracy at the last evaluated round, each client evaluating'
      ' the model it predicts with on its own test split: mean, standard deviation,'
      ' 10th percentile and minimum over the clients evaluated.'
  )
  if any('eval/central_accuracy' in r.final_eval for r in runs):
    columns.append(
        ('central', lambda r: _number(r.final_eval.get('eval/central_accuracy')))
    )
    text += ' Central: the global model on the clients\' test sets pooled.'
  if any(_epsilon(r) is not None for r in runs):
    columns.append(('epsilon', lambda r: _number(_epsilon(r), 2)))
    text += ' Epsilon: the privacy spent by the last round.'
  if any(_has_detector(r) for r in runs):
    columns.append(('NFL flagged', _nfl_text))
    text += ' NFL flagged: the first round the NFL detector flagged.'
  return [text, ''] + _table(
      ['run'] + [name for name, _ in columns],
      [[run.label] + [value(run) for _, value in columns] for run in runs],
  )


def markdown_report(runs: Sequence[Run], output_dir: str) -> str:
  """Writes the figures into `output_dir`; returns the markdown page that shows them.

  The page lists the runs, tabulates their final results and shows the
  figures (by file name: keep the page beside them), each with a caption.
  The NFL and epsilon figures appear only when a run has those columns.
  """
  _check(runs)
  os.makedirs(output_dir, exist_ok=True)
  figures = [
      (ACCURACY_FIGURE, plot_accuracy_per_round,
       'Top: mean (solid) and 10th percentile (dashed) of the benign clients\' test'
       ' accuracy at each evaluated round; bottom: training loss per round.'),
      (DISTRIBUTION_FIGURE, plot_final_accuracy_distribution,
       'The benign clients\' test accuracies at the last evaluated round: histogram'
       ' (left) and cumulative distribution (right).'),
  ]
  if any(run.has(W_DIV) for run in runs):
    figures.append((
        NFL_FIGURE, plot_nfl,
        'The NFL detector\'s statistic Delta (w_div) per round (top) and its windowed'
        ' mean (bottom) with the threshold (dashed) and the rounds flagged (x).',
    ))
  if any(run.has(EPSILON) for run in runs):
    figures.append((
        EPSILON_FIGURE, plot_epsilon, 'Privacy spent: epsilon after each round.',
    ))
  lines = [
      '# Run report',
      '',
      *_table(
          ['run', 'task', 'algorithm', 'rounds', 'clients', 'seed'],
          [[run.label, run.summary.get('task', run.config.get('task')),
            run.config.get('algorithm'), run.summary.get('rounds_completed'), _clients(run),
            run.config.get('seed')] for run in runs],
      ),
      '',
      '## Final results',
      '',
      *final_results(runs),
      '',
      '## Figures',
  ]
  for number, (filename, plot, caption) in enumerate(figures, start=1):
    plot(runs, os.path.join(output_dir, filename))
    lines += ['', f'![Figure {number}]({filename})', '', f'*Figure {number}.* {caption}']
  return '\n'.join(lines) + '\n'
