"""Summaries of per-client metrics: the mean and the spread over clients.

Personalization is judged per client (Ditto, Li et al. 2021, reports the mean
and standard deviation of per-client test accuracy as its fairness measure;
LINDT compares clients one by one), so every summary is over clients with
equal weight, not over pooled examples.
"""

import collections
from typing import Sequence

import numpy as np


def summarize(
    values: Sequence[float], prefix: str, higher_is_better: bool = True
) -> collections.OrderedDict:
  """Mean, std, min, 10th percentile, worst-10% mean, median and max.

  The worst-10% mean averages the worst ceil(10% of n) values (Ditto's
  "worst 10%" fairness measure): the lowest with `higher_is_better` (an
  accuracy), else the highest (a loss).
  """
  values = np.asarray(values, dtype=np.float64)
  if values.size == 0:
    return collections.OrderedDict()
  worst_first = np.sort(values) if higher_is_better else -np.sort(-values)
  worst = worst_first[: int(np.ceil(0.1 * values.size))]
  return collections.OrderedDict([
      (f'{prefix}_mean', float(np.mean(values))),
      (f'{prefix}_std', float(np.std(values))),
      (f'{prefix}_min', float(np.min(values))),
      (f'{prefix}_p10', float(np.percentile(values, 10))),
      (f'{prefix}_worst10_mean', float(np.mean(worst))),
      (f'{prefix}_median', float(np.median(values))),
      (f'{prefix}_max', float(np.max(values))),
  ])
