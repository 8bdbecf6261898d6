"""Output files: metric flattening and round CSVs that survive resumes."""

import collections

import numpy as np
import tensorflow_federated as tff

from tff_personal.program import outputs


def test_flatten_metrics_nested_names_and_drops_empties():
  metrics = collections.OrderedDict(
      distributor=(),
      client_work=collections.OrderedDict(
          train=collections.OrderedDict(loss=np.float32(0.5), num_examples=np.int64(9))
      ),
      weights=tff.learning.models.ModelWeights(trainable=[np.float32(1.0)], non_trainable=[]),
  )
  assert outputs.flatten_metrics(metrics) == {
      'client_work/train/loss': 0.5,
      'client_work/train/num_examples': 9,
      'weights/trainable/0': 1.0,
  }


def test_round_csv_grows_columns_and_truncates(tmp_path):
  path = str(tmp_path / 'm.csv')
  csv = outputs.RoundCsv(path)
  csv.append([{'round': 1, 'loss': 0.5}])
  csv.append([{'round': 2, 'loss': 0.4, 'eval/accuracy_mean': 0.7}])
  csv.append([{'round': 3, 'loss': 0.3}])
  assert [r['loss'] for r in csv.read()] == ['0.5', '0.4', '0.3']
  assert csv.read()[1]['eval/accuracy_mean'] == '0.7'
  assert csv.read()[0]['eval/accuracy_mean'] == ''

  reopened = outputs.RoundCsv(path)  # As a resumed run does.
  reopened.truncate_after(2)
  reopened.append([{'round': 3, 'loss': 0.25}])
  assert [(r['round'], r['loss']) for r in reopened.read()] == [
      ('1', '0.5'), ('2', '0.4'), ('3', '0.25')
  ]


def test_json_round_trip_with_numpy(tmp_path):
  path = str(tmp_path / 'x.json')
  outputs.write_json(path, {'a': np.float32(0.5), 'b': np.arange(2)})
  assert outputs.read_json(path) == {'a': 0.5, 'b': [0, 1]}
