"""Where personal models lose to the global one: test classes a client never trained on.

  bin/class_coverage.py --flagfile=output/<run>/flags.txt [--coverage_round=1000]

Takes a run's flags (its flags.txt reruns it) and, at one of its kept
checkpoints, predicts every evaluation client's test examples with the
global model of that checkpoint and with the client's personal model of the
same round. It applies to the algorithms whose personal model is a whole
model predicting on its own (`PERSONAL_MODEL_ALGORITHMS`); APFL and LINDT
predict with a mixture of their personal and global models, which this
does not rebuild.
Prints, as a markdown table, accuracy on the test examples whose class the
client's training split holds and on those whose class it lacks, and how
much of the mean per-client gap each part makes
(tff_personal/evaluation/class_coverage.py); writes the per-client counts
to <run>/class_coverage_round_<R>.csv. Its per-client accuracies are the
run's eval_per_client.csv rows of that round.
"""

import csv
import os
import sys

from tff_personal.runtime import log_levels  # pylint: disable=g-import-not-at-top

log_levels.quiet_native_logs(sys.argv)  # Before TensorFlow's import; --verbosity shows all.
from tff_personal.runtime import allocator  # pylint: disable=g-import-not-at-top

if __name__ == '__main__':  # Not when tests load this file as a module.
  allocator.reexec_with_program_settings()  # Before TensorFlow's import (its docstring).

from absl import app  # pylint: disable=g-import-not-at-top
# Imported before app.run, as bin/train.py does (Keras builds models wrongly otherwise).
import numpy as np  # pylint: disable=g-import-not-at-top
import tensorflow as tf  # pylint: disable=g-import-not-at-top
from absl import flags  # pylint: disable=g-import-not-at-top

import experiment_flags as ef  # pylint: disable=g-import-not-at-top  # bin/experiment_flags.py

PERSONAL_MODEL_ALGORITHMS = ('ditto', 'local')
COVERAGE_ROUND = flags.DEFINE_integer(
    'coverage_round', None,
    'The checkpointed round to analyse; default: the newest kept checkpoint.', lower_bound=1,
)


def personal_model(personal_state, global_weights):
  """The model inside a personal state (Ditto's `model`, Local's state), or None."""
  candidate = personal_state
  if isinstance(personal_state, dict) and 'model' in personal_state:
    candidate = personal_state['model']
  shapes = lambda s: [np.shape(a) for a in tf.nest.flatten(s)]
  if shapes(candidate) != shapes(global_weights):
    return None
  return candidate


def _weights(structure):
  """ModelWeights(trainable, non_trainable) of a personal or global model."""
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top

  if isinstance(structure, dict):
    return tff.learning.models.ModelWeights(structure['trainable'], structure['non_trainable'])
  return tff.learning.models.ModelWeights(structure.trainable, structure.non_trainable)


def _labels(dataset) -> np.ndarray:
  return np.concatenate([np.reshape(y.numpy(), [-1]) for _, y in dataset] or [np.zeros(0, int)])


def _predict(keras_model, weights, dataset) -> np.ndarray:
  _weights(weights).assign_weights_to(keras_model)
  outputs = [keras_model(x, training=False).numpy() for x, _ in dataset]
  if outputs and outputs[0].ndim != 2:
    raise ef.UsageError(
        f'--task={ef.TASK.value}: bin/class_coverage.py applies to classification tasks'
        ' with one label per example.'
    )
  return np.concatenate([np.argmax(o, -1) for o in outputs] or [np.zeros(0, int)])


def analyse(task, process, experiment, config, round_num):
  """([ClientPredictions] of the evaluation clients, the round analysed)."""
  from tff_personal.evaluation import class_coverage  # pylint: disable=g-import-not-at-top
  from tff_personal.personal import store as store_lib  # pylint: disable=g-import-not-at-top
  from tff_personal.program import checkpoints  # pylint: disable=g-import-not-at-top
  from tff_personal.program import training_loop  # pylint: disable=g-import-not-at-top

  if ef.ALGORITHM.value not in PERSONAL_MODEL_ALGORITHMS:
    raise ef.UsageError(
        f'--algorithm={ef.ALGORITHM.value}: bin/class_coverage.py compares the personal models'
        f' of {", ".join(PERSONAL_MODEL_ALGORITHMS)} with their global model.'
    )
  if not os.path.isfile(experiment.store_path):
    raise ef.UsageError(f'{experiment.path} has no personal states: run bin/train.py first.')
  manager = checkpoints.CheckpointManager(experiment.checkpoint_dir)
  round_num = round_num or manager.latest_round()
  if round_num is None:
    raise ef.UsageError(f'{experiment.path} has no checkpoint: run bin/train.py first.')
  no_store = store_lib.StoreFingerprint(0, 0, 0).as_array()
  try:
    loaded = manager.load(round_num, checkpoints.program_state(0, process.initialize(), no_store, 0.0))
  except ValueError as e:  # Includes CheckpointMismatchError's causes.
    raise ef.UsageError(f'--coverage_round={round_num}: {e}') from None
  store = store_lib.ClientStateStore(experiment.store_path, create=False, write_behind=False)
  try:
    expected = store_lib.StoreFingerprint.from_array(loaded['store_fingerprint'])
    if store.fingerprint(round_num) != expected:
      raise ef.UsageError(
          f'--coverage_round={round_num}: a later checkpoint has compacted the personal'
          f' states of that round; analyse round {manager.latest_round()}.'
      )
    global_weights = process.get_model_weights(loaded['server_state'])
    _, eval_clients = training_loop.populations(task, config)
    flat_states = store.read(eval_clients, before_round=round_num + 1)
  finally:
    store.close()
  keras_model = task.model.build()
  results = []
  template = None
  for client_id, flat in zip(eval_clients, flat_states):
    state = process.initial_personal_state(client_id, global_weights)
    if flat is not None:
      template = template or state
      state = tf.nest.pack_sequence_as(template, flat)
    model = personal_model(state, global_weights)
    if model is None:
      raise ef.UsageError(f'{experiment.path}: a personal state does not hold a whole model.')
    test = task.test_dataset(client_id, batch_size=config.eval_batch_size)
    train = task.train_dataset(client_id, epochs=1, batch_size=config.eval_batch_size, seed=0)
    labels = _labels(test)
    results.append(class_coverage.ClientPredictions(
        client_id,
        frozenset(int(y) for y in _labels(train)),
        labels,
        _predict(keras_model, global_weights, test) == labels,
        _predict(keras_model, model, test) == labels,
    ))
  return results, round_num


def write_csv(path, clients) -> None:
  with open(path, 'w', newline='') as f:
    writer = csv.writer(f)
    writer.writerow([
        'client_id', 'test_examples', 'unseen_class_examples', 'global_correct_seen',
        'global_correct_unseen', 'personal_correct_seen', 'personal_correct_unseen',
    ])
    for c in clients:
      seen = c.seen
      writer.writerow([
          c.client_id, len(c.labels), int((~seen).sum()),
          int(c.global_correct[seen].sum()), int(c.global_correct[~seen].sum()),
          int(c.personal_correct[seen].sum()), int(c.personal_correct[~seen].sum()),
      ])


def main(argv):
  if len(argv) > 1:
    ef.exit_with_error(f'unexpected arguments: {" ".join(argv[1:])}')
  from tff_personal.evaluation import class_coverage  # pylint: disable=g-import-not-at-top
  from tff_personal.runtime import context  # pylint: disable=g-import-not-at-top

  with ef.exit_on_errors():
    experiment = ef.experiment_dir()
    if not os.path.isdir(experiment.path):
      raise ef.UsageError(f'{experiment.path} does not exist: run bin/train.py with these flags first.')
    task = ef.build_task()
    context.install_local_context()
    algorithm = ef.build_algorithm(task)
    clients, round_num = analyse(
        task, algorithm.process, experiment, ef.training_config(algorithm.dp),
        COVERAGE_ROUND.value,
    )
    result = class_coverage.coverage(clients)
  path = os.path.join(experiment.path, f'class_coverage_round_{round_num}.csv')
  write_csv(path, clients)
  print(f'{experiment.path}, round {round_num}: the personal models against the global model')
  print(class_coverage.markdown(result))
  print(f'Per-client counts: {path}')


if __name__ == '__main__':
  app.run(main, flags_parser=ef.parse_flags_or_exit)
