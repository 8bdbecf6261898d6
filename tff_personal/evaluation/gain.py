"""The performance gain of federation per client and its weighted mean beta.

LINDT (Lin et al. 2020) defines Negative Federated Learning through each
client's gain from federating, V_i^G - V_i^P: the test accuracy of the
client's model in the federated run minus that of its private model trained
only on its own data (our Local baseline, same architecture and data). The
weighted gain is

  beta = sum_i alpha_i (V_i^G - V_i^P),  alpha_i = 1/N ('uniform') or
                                         n_i / n ('examples'),

with n_i the client's test examples (its per-client split holds a fixed
share of its data, so n_i / n is its share of the data). A run is in NFL
when beta stays below 0. Both runs' `eval_per_client.csv` must hold the same
clients at the evaluated round. The same gain between two columns of one run
is a personal model's over its global model (`bin/personal_gap.py`). No
TensorFlow here.
"""

import csv
import dataclasses
from typing import Optional, Sequence

WEIGHTINGS = ('uniform', 'examples')


@dataclasses.dataclass(frozen=True)
class ClientGain:
  client_id: str
  federated: float
  private: float
  num_examples: int

  @property
  def gain(self) -> float:
    return self.federated - self.private


def read_rounds(path: str, accuracy: str) -> dict[int, dict[str, tuple[float, int]]]:
  """{round: {client: (accuracy, num_examples)}} of every round of an eval CSV."""
  with open(path, newline='') as f:
    rows = list(csv.DictReader(f))
  if not rows:
    raise ValueError(f'{path} has no evaluation rows.')
  if accuracy not in rows[0]:
    raise ValueError(f'{path} has no column {accuracy!r}.')
  by_round = {}
  for r in rows:
    by_round.setdefault(int(r['round']), {})[r['client_id']] = (
        float(r[accuracy]), int(float(r['num_examples']))
    )
  return by_round


def read_round(path: str, accuracy: str, round_num: Optional[int] = None) -> dict[str, tuple[float, int]]:
  """{client: (accuracy, num_examples)} at `round_num` (default: the last) of an eval CSV."""
  by_round = read_rounds(path, accuracy)
  rounds = sorted(by_round)
  round_num = rounds[-1] if round_num is None else round_num
  if round_num not in by_round:
    raise ValueError(f'{path} has no evaluation at round {round_num}; it has {rounds}.')
  return by_round[round_num]


def client_gains(federated: dict, private: dict) -> list[ClientGain]:
  """Per-client gains; both evaluations must cover the same clients."""
  if set(federated) != set(private):
    missing = sorted(set(federated) ^ set(private))
    raise ValueError(
        f'The runs evaluated different clients ({len(missing)} differ, e.g.'
        f' {missing[:3]}); compare runs over the same population.'
    )
  return [
      ClientGain(c, federated[c][0], private[c][0], federated[c][1]) for c in sorted(federated)
  ]


def beta(gains: Sequence[ClientGain], weighting: str = 'uniform') -> float:
  """The weighted gain beta (module docstring)."""
  if weighting not in WEIGHTINGS:
    raise ValueError(f'weighting must be one of {WEIGHTINGS}, got {weighting!r}.')
  if not gains:
    raise ValueError('No clients to compare.')
  if weighting == 'uniform':
    return sum(g.gain for g in gains) / len(gains)
  total = sum(g.num_examples for g in gains)
  return sum(g.num_examples * g.gain for g in gains) / total
