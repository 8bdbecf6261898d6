"""Runs two rounds and an evaluation of computations; shared by export_test.

As a script (the fresh process of the round-trip test):
  export_child.py <export_dir> <inputs.pkl> <outputs.pkl>
loads the exported computations, runs `run_rounds` on the pickled inputs and
pickles the results.
"""

import collections
import os
import pickle
import sys

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

import numpy as np  # pylint: disable=g-import-not-at-top
import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top


def client_inputs(next_computation, datasets):
  """Honest client inputs for `next`: datasets, or <data, role=0, seed=0>."""
  input_type = next_computation.type_signature.parameter[1].member
  if isinstance(input_type, tff.StructType) and 'data' in tff.structure.name_list(input_type):
    return [
        collections.OrderedDict(data=d, role=np.int32(0), seed=np.int64(0))
        for d in datasets
    ]
  return datasets


def run_rounds(computations, train_data, test_data, initial_personal_states, rounds=2):
  """initialize, `rounds` x next, then evaluate; returns everything produced."""
  train_data = client_inputs(computations['next'], train_data)
  state = computations['initialize']()
  personal_states = initial_personal_states
  results = {'initial_weights': computations['get_model_weights'](state)}
  for round_num in range(1, rounds + 1):
    output = computations['next'](state, train_data, personal_states)
    # A deserialized `next` returns a plain structure, not the NamedTuple.
    state, personal_states, metrics = tff.structure.from_container(output)
    results[f'metrics_{round_num}'] = metrics
    results[f'personal_states_{round_num}'] = personal_states
  weights = computations['get_model_weights'](state)
  results['final_weights'] = weights
  results['evaluation'] = computations['evaluate'](weights, test_data, personal_states)
  return results


def main(export_dir, inputs_path, outputs_path):
  from tff_personal.reports import export  # pylint: disable=g-import-not-at-top
  from tff_personal.runtime import context  # pylint: disable=g-import-not-at-top
  from tests import test_utils  # pylint: disable=g-import-not-at-top

  context.install_local_context()
  with open(inputs_path, 'rb') as f:
    inputs = pickle.load(f)
  train_data, test_data = test_utils.tiny_datasets(**inputs['datasets'])
  results = run_rounds(
      export.load_exported(export_dir),
      train_data,
      test_data,
      inputs['initial_personal_states'],
  )
  with open(outputs_path, 'wb') as f:
    pickle.dump(results, f)


if __name__ == '__main__':
  main(*sys.argv[1:])
