"""The table's picture: bar heights and error bars, and a title that fits."""

import math

from matplotlib import pyplot
import pytest

from tff_personal.reports import results_table
from tff_personal.reports import table_plot


def seeds_cell(*means):
  return results_table.SeedsCell(tuple(results_table.Cell(m, 0.1, m - 0.2) for m in means))


RESULTS = {
    ('classes_4', 'fedavg'): seeds_cell(0.8, 0.9, 0.7),
    ('classes_4', 'fedper_kp1'): results_table.Cell(0.95, 0.05, 0.9),
    ('classes_8', 'fedavg'): 'diverged (round 3)',  # A note: no bar.
}


def test_bars_are_the_cells_means_with_their_intervals_over_seeds():
  drawn = table_plot.bars(RESULTS, ['classes_4', 'classes_8'], ['fedavg', 'fedper_kp1'])
  means, intervals = drawn['fedavg']
  assert means[0] == pytest.approx(0.8)
  # t(0.975, 2) = 4.3027 x std 0.1 / sqrt(3).
  assert intervals[0] == pytest.approx(4.302653 * 0.1 / math.sqrt(3), rel=1e-5)
  assert math.isnan(means[1]) and intervals[1] == 0.0
  assert drawn['fedper_kp1'][0][0] == 0.95 and drawn['fedper_kp1'][1][0] == 0.0
  assert math.isnan(drawn['fedper_kp1'][0][1])


def test_a_long_title_is_wrapped_inside_the_figure():
  title = ("Benign clients' test accuracy on fmnist: mean over seeds ± its 95% interval"
           " (worst-10% mean). Seeds 0,1,2; [each seed's mean].")
  figure = table_plot.figure_of(RESULTS, ['classes_4', 'classes_8'], ['fedavg', 'fedper_kp1'],
                                title)
  try:
    figure.canvas.draw()
    text = figure.axes[0].title
    box = text.get_window_extent(figure.canvas.get_renderer())
    assert '\n' in text.get_text()
    assert 0 <= box.x0 and box.x1 <= figure.bbox.width
  finally:
    pyplot.close(figure)


def test_no_picture_when_no_cell_ran(tmp_path):
  assert table_plot.write(str(tmp_path), {('a', 'b'): 'not run'}, ['a'], ['b'], 't') is None
  assert not (tmp_path / table_plot.PNG_FILE).exists()
