"""How much of the global model enters each LINDT client's local model.

  bin/lindt_gates.py --flagfile=output/nfl_table/fmnist__default__lindt/flags.txt

Reads a LINDT run's last checkpoint (the global model G) and its stored
personal states (each client's L and, with --lindt_learn_gates, its gate
offsets; with --lindt_own_global, the G the client predicts with), and
prints per attaching module, over the clients that have trained their L and
their first --gate_examples test examples: the mean gate sigmoid(score (+ b))
and ||G^m|| / ||L^m|| (`models.dual.DualModel.intertwinement`; with
--lindt_match_scale, G's norm before it is rescaled to L's), the mean and the
range over clients.
Takes the run's flags (its flags.txt); exit code 2 with one line on bad input.
"""

import sys

from tff_personal.runtime import log_levels  # pylint: disable=g-import-not-at-top

log_levels.quiet_native_logs(sys.argv)  # Before TensorFlow's import; --verbosity shows all.

from absl import app  # pylint: disable=g-import-not-at-top
from absl import flags  # pylint: disable=g-import-not-at-top
# TensorFlow before app.run (bin/train.py says why).
import numpy as np  # pylint: disable=g-import-not-at-top
import tensorflow as tf  # pylint: disable=g-import-not-at-top
import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top

from tff_personal.models import dual  # pylint: disable=g-import-not-at-top
from tff_personal.personal import store as store_lib  # pylint: disable=g-import-not-at-top
from tff_personal.program import checkpoints as checkpoints_lib  # pylint: disable=g-import-not-at-top
import experiment_flags as ef  # pylint: disable=g-import-not-at-top  # bin/experiment_flags.py

GATE_EXAMPLES = flags.DEFINE_integer(
    'gate_examples', 200, "Test examples per client (the first ones).", lower_bound=1
)

ModelWeights = tff.learning.models.ModelWeights


def _load(task, process, experiment):
  """(G's weights, [(client id, personal state)]) of the run's last round."""
  checkpoints = checkpoints_lib.CheckpointManager(experiment.checkpoint_dir)
  no_store = store_lib.StoreFingerprint(0, 0, 0).as_array()
  loaded = checkpoints.load_latest(
      checkpoints_lib.program_state(0, process.initialize(), no_store, 0.0)
  )
  if loaded is None:
    raise ef.UsageError(f'{experiment.checkpoint_dir} has no checkpoint (not a finished run?).')
  weights = process.get_model_weights(loaded['server_state'])
  store = store_lib.ClientStateStore(experiment.store_path, create=False, write_behind=False)
  try:
    client_ids = store.client_ids()
    flat_states = store.read(client_ids)
  finally:
    store.close()
  template = process.initial_personal_state('', weights)
  return weights, [(c, tf.nest.pack_sequence_as(template, f))
                   for c, f in zip(client_ids, flat_states)]


def main(argv):
  if len(argv) > 1:
    ef.exit_with_error(f'unexpected arguments: {" ".join(argv[1:])}')
  with ef.exit_on_errors():
    if ef.ALGORITHM.value != 'lindt':
      raise ef.UsageError(
          f'--algorithm={ef.ALGORITHM.value}: not a LINDT run (pass its flags.txt).'
      )
    experiment = ef.experiment_dir()
    task = ef.build_task(check_sampling=False)
    ef.install_context()
    weights, states = _load(task, ef.build_algorithm(task).process, experiment)
  hparams = ef.hparams()
  models = dual.DualModel(task.model, dual.Intertwining(
      attach_logits=hparams.attach_logits, learn_gates=hparams.learn_gates,
      match_scale=hparams.match_scale, detach_global=hparams.detach_global,
  ))
  per_client = []
  for client_id, state in states:
    client_global = weights
    if isinstance(state, dict):  # <model, [dual_rounds,] [global_model]>.
      if 'dual_rounds' in state and int(state['dual_rounds']) == 0:
        continue  # This client predicts with G: no L to look at.
      client_global = state.get('global_model', weights)  # --lindt_own_global.
      state = state['model']
    client_global.assign_weights_to(models.global_model)
    # v: L's weights and gate offsets, in the order DualModel keeps them.
    tf.nest.map_structure(
        lambda variable, value: variable.assign(value), models.personal_weights,
        ModelWeights(trainable=list(state.trainable), non_trainable=list(state.non_trainable)),
    )
    x = np.concatenate([
        np.asarray(batch[0]) for batch in task.test_dataset(client_id, batch_size=GATE_EXAMPLES.value)
    ])[:GATE_EXAMPLES.value]
    per_client.append(models.intertwinement(x))
  if not per_client:
    ef.exit_with_error(f'no client of {experiment.path} has trained its local model.')
  stats = np.array(per_client)  # [clients, modules, (gate, norm ratio)]
  print(f'{experiment.path}: {len(per_client)} clients, up to {GATE_EXAMPLES.value} test'
        ' examples each; mean [min, max] over clients')
  print('| module | after block | gate | ||G|| / ||L|| |')
  print('|---|---|---|---|')
  for m, module in enumerate(models.attaching_modules):
    gate, ratio = stats[:, m, 0], stats[:, m, 1]
    print(f'| {module.name} | {", ".join(task.model.blocks[m])} |'
          f' {gate.mean():.3f} [{gate.min():.3f}, {gate.max():.3f}] |'
          f' {ratio.mean():.3f} [{ratio.min():.3f}, {ratio.max():.3f}] |')


if __name__ == '__main__':
  app.run(main, flags_parser=ef.parse_flags_or_exit)
