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

With --dropout_passes=N it also evaluates both models with their dropout
active, as Ditto's code evaluates (its CNN drops units in every forward
pass): each example counts the share of N mask draws under which the model
predicts it right, an estimate of the expectation over masks. It prints a
second table and writes <run>/class_coverage_round_<R>_dropout.csv.
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
from tff_personal.models import seeded_dropout  # pylint: disable=g-import-not-at-top

PERSONAL_MODEL_ALGORITHMS = ('ditto', 'local')
COVERAGE_ROUND = flags.DEFINE_integer(
    'coverage_round', None,
    'The checkpointed round to analyse; default: the newest kept checkpoint.', lower_bound=1,
)
DROPOUT_PASSES = flags.DEFINE_integer(
    'dropout_passes', 0,
    'Also evaluate with dropout active (as Ditto\'s code does), averaging over this many'
    ' mask draws; 0: only the usual evaluation, dropout off.',
    lower_bound=0, upper_bound=seeded_dropout.MAX_DRAW,
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


def _predict(keras_model, weights, dataset, training=False) -> np.ndarray:
  _weights(weights).assign_weights_to(keras_model)
  outputs = [keras_model(x, training=training).numpy() for x, _ in dataset]
  if outputs and outputs[0].ndim != 2:
    raise ef.UsageError(
        f'--task={ef.TASK.value}: bin/class_coverage.py applies to classification tasks'
        ' with one label per example.'
    )
  return np.concatenate([np.argmax(o, -1) for o in outputs] or [np.zeros(0, int)])


def check_dropout_model(keras_model) -> None:
  """UsageError unless training=True changes only the model's SeededDropout layers."""
  if not seeded_dropout.dropout_layers(keras_model):
    raise ef.UsageError(
        '--dropout_passes: the model has no dropout layer to activate (--cnn=ditto has two).'
    )
  if any(isinstance(m, tf.keras.layers.BatchNormalization) for m in keras_model.submodules):
    raise ef.UsageError(
        '--dropout_passes: the model has batch normalization, which evaluating in training'
        ' mode would change too.'
    )


def _correct_with_dropout(keras_model, weights, dataset, labels, passes) -> np.ndarray:
  """Per test example, the share of `passes` dropout mask draws predicting it right."""
  right = np.zeros(len(labels))
  for draw in range(1, passes + 1):  # Draw 0 would repeat the training masks of these batches.
    with seeded_dropout.mask_draw(keras_model, draw):
      right += _predict(keras_model, weights, dataset, training=True) == labels
  return right / passes


def analyse(task, process, experiment, config, round_num, dropout_passes=0):
  """The round analysed and [ClientPredictions] of the evaluation clients.

  Returns (round, predictions with dropout off, predictions with dropout
  active over `dropout_passes` mask draws or None when it is 0).
  """
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
  keras_model = task.model.build()
  if dropout_passes:
    check_dropout_model(keras_model)
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
  results, dropout_results = [], []
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
    train_classes = frozenset(int(y) for y in _labels(train))
    results.append(class_coverage.ClientPredictions(
        client_id, train_classes, labels,
        _predict(keras_model, global_weights, test) == labels,
        _predict(keras_model, model, test) == labels,
    ))
    if dropout_passes:
      dropout_results.append(class_coverage.ClientPredictions(
          client_id, train_classes, labels,
          _correct_with_dropout(keras_model, global_weights, test, labels, dropout_passes),
          _correct_with_dropout(keras_model, model, test, labels, dropout_passes),
      ))
  return round_num, results, dropout_results if dropout_passes else None


def write_csv(path, clients) -> None:
  """Per-client counts; with dropout active, expected counts over the mask draws."""
  number = lambda x: int(x) if float(x).is_integer() else f'{x:.4f}'
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
          number(c.global_correct[seen].sum()), number(c.global_correct[~seen].sum()),
          number(c.personal_correct[seen].sum()), number(c.personal_correct[~seen].sum()),
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
    round_num, clients, dropout_clients = analyse(
        task, algorithm.process, experiment, ef.training_config(algorithm.dp),
        COVERAGE_ROUND.value, DROPOUT_PASSES.value,
    )
    result = class_coverage.coverage(clients)
  path = os.path.join(experiment.path, f'class_coverage_round_{round_num}.csv')
  write_csv(path, clients)
  print(f'{experiment.path}, round {round_num}: the personal models against the global model')
  print(class_coverage.markdown(result))
  print(f'Per-client counts: {path}')
  if dropout_clients is not None:
    path = os.path.join(experiment.path, f'class_coverage_round_{round_num}_dropout.csv')
    write_csv(path, dropout_clients)
    print(f'\nWith dropout active, as Ditto\'s code evaluates (mean over {DROPOUT_PASSES.value}'
          ' mask draws):')
    print(class_coverage.markdown(class_coverage.coverage(dropout_clients)))
    print(f'Per-client expected counts: {path}')


if __name__ == '__main__':
  app.run(main, flags_parser=ef.parse_flags_or_exit)
