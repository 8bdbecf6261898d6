"""Round time of each algorithm against its compute floor, measured in one run.

  bin/benchmark.py                         # FEMNIST CNN, 10 writers a round, 1 epoch, batch 20
  bin/benchmark.py --algorithms=fedavg,ditto --rounds=5

Prints, on the same clients' data and the same model:

* the compute floor: plain TensorFlow running exactly the round's SGD steps
  (each client from the global weights, one pass over its batches, the
  example-weighted mean of the updates) in one `tf.function`, the faster of
  the clients one after the other on one model and side by side on a model
  each;
* stock `tff.learning` FedAvg (`build_weighted_fed_avg`);
* our algorithms (the program's `next` call, personal states matched by key),
  each as a ratio to its own floor: the floor's passes times the passes the
  algorithm makes over a client's data (Ditto: global and personal model;
  LINDT always-mode: the dual model's two networks, one backward pass);
* the personal state store's read + write of the round's clients, as a share
  of the round;
* the store part of a round (read and write of the round's clients, and the
  checkpoint's compaction and fingerprint) with --stored_clients states
  already stored (e.g. 100 vs 100,000): whether a round grows with the
  population, and the process's peak memory after each;
* start-up: importing TensorFlow and TFF, and the first trace and call of
  our FedAvg round.

Every time is the median over --rounds rounds after one warm-up round on the
same clients. Times, not assertions: no test depends on them.
"""

import time

_STARTED = time.monotonic()

import os  # pylint: disable=g-import-not-at-top
import statistics  # pylint: disable=g-import-not-at-top
import sys  # pylint: disable=g-import-not-at-top
import tempfile  # pylint: disable=g-import-not-at-top

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

from absl import app  # pylint: disable=g-import-not-at-top
from absl import flags  # pylint: disable=g-import-not-at-top
import numpy as np  # pylint: disable=g-import-not-at-top
import tensorflow as tf  # pylint: disable=g-import-not-at-top
import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top

_IMPORTED = time.monotonic()

from tff_personal.algorithms import registry as algorithm_registry  # pylint: disable=g-import-not-at-top
from tff_personal.personal import store as store_lib  # pylint: disable=g-import-not-at-top
from tff_personal.program import sampling  # pylint: disable=g-import-not-at-top
from tff_personal.runtime import client_keys  # pylint: disable=g-import-not-at-top
from tff_personal.runtime import context  # pylint: disable=g-import-not-at-top
from tff_personal.tasks import registry as task_registry  # pylint: disable=g-import-not-at-top

TASK = flags.DEFINE_enum('task', 'femnist', task_registry.TASK_NAMES, 'Task (data and model).')
FEMNIST_PATH = flags.DEFINE_string(
    'femnist_path', task_registry.DEFAULT_FEMNIST_PATH, 'The FEMNIST sample (femnist105.npz).'
)
CACHE_DIR = flags.DEFINE_string(
    'cache_dir', task_registry.DEFAULT_CACHE_DIR, "TFF's dataset cache."
)
ALGORITHMS = flags.DEFINE_list(
    'algorithms', ['fedavg', 'fedper', 'ditto', 'lindt'], 'Our algorithms to time.'
)
CLIENTS_PER_ROUND = flags.DEFINE_integer('clients_per_round', 10, 'Clients a round.', lower_bound=1)
BATCH_SIZE = flags.DEFINE_integer('client_batch_size', 20, 'Local batch size.', lower_bound=1)
LEARNING_RATE = flags.DEFINE_float('client_learning_rate', 0.05, "Clients' SGD rate.")
ROUNDS = flags.DEFINE_integer('rounds', 3, 'Timed rounds (after one warm-up).', lower_bound=1)
SEED = flags.DEFINE_integer('seed', 0, 'Picks the clients.')
STORED_CLIENTS = flags.DEFINE_list(
    'stored_clients', ['100', '100000'],
    'Populations of stored personal states (the first timed algorithm with'
    ' personal state) at which to time the store part of a round; empty: skip.',
)

# Passes over a client's data per round, relative to FedAvg's one.
_PASSES = {'fedavg': 1, 'fedper': 1, 'fedprox': 1, 'local': 1, 'ditto': 2, 'apfl': 2, 'lindt': 2}


def _median_seconds(fn, rounds: int) -> float:
  fn()  # Warm-up: traces and caches.
  times = []
  for _ in range(rounds):
    started = time.monotonic()
    fn()
    times.append(time.monotonic() - started)
  return statistics.median(times)


def _floor_round(task, datasets, learning_rate, parallel: bool):
  """The round's SGD steps in plain TensorFlow, in one `tf.function`.

  Sequential: one model, the clients one after the other (each op may use
  every core). Parallel: one model per client, so TensorFlow's executor may
  run the clients' loops at the same time, as TFF's runtime runs clients.
  """
  models = [task.model.build() for _ in (datasets if parallel else datasets[:1])]
  loss_fn = task.model.loss()
  global_weights = [tf.Variable(v) for v in models[0].trainable_variables]
  for model in models[1:]:
    for variable, start in zip(model.trainable_variables, global_weights):
      variable.assign(start)

  @tf.function
  def round_fn(datasets):
    updates = [tf.zeros_like(v) for v in global_weights]
    total = tf.constant(0.0)
    steps = tf.constant(0)
    for i, dataset in enumerate(datasets):
      model = models[i % len(models)]
      for variable, start in zip(model.trainable_variables, global_weights):
        variable.assign(start)
      examples = tf.constant(0.0)
      for x, y in dataset:
        with tf.GradientTape() as tape:
          loss = loss_fn(y, model(x, training=True))
        gradients = tape.gradient(loss, model.trainable_variables)
        for variable, gradient in zip(model.trainable_variables, gradients):
          variable.assign_sub(learning_rate * gradient)
        examples += tf.cast(tf.shape(y)[0], tf.float32)
        steps += 1
      updates = [
          u + examples * (v - s)
          for u, v, s in zip(updates, model.trainable_variables, global_weights)
      ]
      total += examples
    for update, start in zip(updates, global_weights):
      start.assign_add(update / total)
    return steps

  steps = []
  seconds = _median_seconds(lambda: steps.append(int(round_fn(tuple(datasets)))), ROUNDS.value)
  return seconds, steps[-1]


def _stock_fedavg_round(task, datasets, learning_rate):
  process = tff.learning.algorithms.build_weighted_fed_avg(
      task.model.tff_model_fn,
      client_optimizer_fn=tff.learning.optimizers.build_sgdm(learning_rate),
      server_optimizer_fn=tff.learning.optimizers.build_sgdm(1.0),
  )
  state = [process.initialize()]

  def one_round():
    state[0] = process.next(state[0], datasets).state

  return _median_seconds(one_round, ROUNDS.value)


def _our_round(name, task, clients, datasets, learning_rate, store_dir):
  """Median seconds of `next` and of the store's read + write of the round."""
  process = algorithm_registry.build_algorithm(
      name, task,
      algorithm_registry.AlgorithmOptions(
          client_learning_rate=learning_rate, clients_per_round=len(clients), seed=SEED.value
      ),
  )
  keyed = client_keys.with_client_keys(process.next)
  state = process.initialize()
  weights = process.get_model_weights(state)
  holder = {
      'state': state,
      'personal': [process.initial_personal_state(c, weights) for c in clients],
  }
  client_data = [
      process.client_input(d) if process.takes_client_roles else d for d in datasets
  ]
  keys = list(range(len(clients)))

  def one_round():
    output = client_keys.call_in_key_order(
        keyed, (holder['state'], client_data, holder['personal']), keys
    )
    holder['state'], holder['personal'] = output.state, output.personal_states

  started = time.monotonic()
  one_round()
  first_call = time.monotonic() - started
  round_seconds = _median_seconds(one_round, ROUNDS.value)

  store_seconds = 0.0
  if process.has_personal_state:
    store = store_lib.ClientStateStore(os.path.join(store_dir, f'{name}.sqlite'), create=True)
    template = holder['personal'][0]
    round_num = [0]

    def store_round():
      round_num[0] += 1
      flat = {c: [np.asarray(v) for v in tf.nest.flatten(s)]
              for c, s in zip(clients, holder['personal'])}
      store.write(round_num[0], flat)
      read = store.read(clients, before_round=round_num[0] + 1)
      [tf.nest.pack_sequence_as(template, f) for f in read]  # pylint: disable=expression-not-assigned

    store_seconds = _median_seconds(store_round, ROUNDS.value)
    store.close()
  flat = [np.asarray(v) for v in tf.nest.flatten(holder['personal'][0])]
  return round_seconds, store_seconds, first_call, flat if process.has_personal_state else None


def _peak_memory_mib() -> float:
  import resource  # pylint: disable=g-import-not-at-top

  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _store_scaling(flat_state, cohort: int, populations, store_dir):
  """Store seconds of a round and of a checkpoint with `population` states stored."""
  rows = []
  rng = np.random.default_rng(SEED.value)
  for population in populations:
    path = os.path.join(store_dir, f'population_{population}.sqlite')
    store = store_lib.ClientStateStore(path, create=True)
    chunk = 1000
    for start in range(0, population, chunk):
      store.write(0, {f'client_{i}': flat_state for i in range(start, min(start + chunk, population))})
    store.checkpoint(0)
    round_num = [0]

    def store_round():
      round_num[0] += 1
      clients = [f'client_{i}' for i in rng.choice(population, cohort, replace=False)]
      store.read(clients, before_round=round_num[0])
      store.write(round_num[0], {c: flat_state for c in clients})

    def checkpoint():
      store.checkpoint(round_num[0])
      store.fingerprint(round_num[0])

    round_seconds = _median_seconds(store_round, ROUNDS.value)
    checkpoint_seconds = _median_seconds(checkpoint, 1)
    store.close()
    size_mib = os.path.getsize(path) / 2**20
    os.remove(path)
    rows.append((population, round_seconds, checkpoint_seconds, size_mib, _peak_memory_mib()))
    print(
        f'store with {population} clients ({size_mib:.0f} MiB): read+write of {cohort}'
        f' clients {round_seconds * 1000:.1f} ms, checkpoint+fingerprint'
        f' {checkpoint_seconds * 1000:.1f} ms; peak memory {rows[-1][4]:.0f} MiB',
        flush=True,
    )
  return rows


def main(argv):
  if len(argv) > 1:
    sys.exit(f'benchmark.py: error: unexpected arguments: {" ".join(argv[1:])}')
  context.install_local_context()  # First: it also retires TFF's import-time context.
  unknown = [a for a in ALGORITHMS.value if a not in _PASSES]
  if unknown:
    sys.exit(f'benchmark.py: error: --algorithms: unknown {", ".join(unknown)}')
  task = task_registry.build_task(
      TASK.value,
      task_registry.TaskOptions(femnist_path=FEMNIST_PATH.value, cache_dir=CACHE_DIR.value),
  )
  clients = sampling.sample_clients(
      sorted(task.client_ids), CLIENTS_PER_ROUND.value, seed=SEED.value, round_num=1
  )
  datasets = [
      task.train_dataset(c, epochs=1, batch_size=BATCH_SIZE.value, seed=SEED.value + i)
      for i, c in enumerate(clients)
  ]
  lr = LEARNING_RATE.value
  print(
      f'{TASK.value}: {len(clients)} clients a round, 1 epoch, batch {BATCH_SIZE.value};'
      f' median of {ROUNDS.value} rounds after a warm-up; {os.cpu_count()} CPUs.',
      flush=True,
  )
  sequential, steps = _floor_round(task, datasets, lr, parallel=False)
  parallel, _ = _floor_round(task, datasets, lr, parallel=True)
  floor = min(sequential, parallel)
  print(
      f'compute floor (plain TF, one tf.function): {floor:.3f} s a round, {steps} SGD steps'
      f' (clients one after the other {sequential:.3f} s, side by side {parallel:.3f} s)',
      flush=True,
  )
  stock = _stock_fedavg_round(task, datasets, lr)
  print(f'stock tff.learning FedAvg: {stock:.3f} s a round = {stock / floor:.2f}x the floor',
        flush=True)
  rows, scaling_state, scaling = [], None, []
  with tempfile.TemporaryDirectory() as store_dir:
    for name in ALGORITHMS.value:
      seconds, store_seconds, first_call, flat = _our_round(
          name, task, clients, datasets, lr, store_dir
      )
      if flat is not None and scaling_state is None:
        scaling_state = (name, flat)
      own_floor = floor * _PASSES[name]
      rows.append((name, seconds, own_floor, store_seconds, first_call))
      print(
          f'{name}: {seconds:.3f} s a round = {seconds / own_floor:.2f}x its floor'
          f' ({_PASSES[name]} x {floor:.3f} s); personal store read+write'
          f' {store_seconds * 1000:.1f} ms = {100 * store_seconds / seconds:.1f}% of the round;'
          f' first call (trace + run) {first_call:.1f} s',
          flush=True,
      )
    if scaling_state is not None and STORED_CLIENTS.value:
      print(f'personal state of {scaling_state[0]}:'
            f' {sum(a.nbytes for a in scaling_state[1]) / 1024:.0f} KiB a client', flush=True)
      scaling = _store_scaling(
          scaling_state[1], len(clients), [int(n) for n in STORED_CLIENTS.value], store_dir
      )
  print()
  print('| | s a round | floor (s) | ratio | store share |')
  print('|---|---|---|---|---|')
  print(f'| compute floor | {floor:.3f} | {floor:.3f} | 1.00 | |')
  print(f'| stock tff.learning FedAvg | {stock:.3f} | {floor:.3f} | {stock / floor:.2f} | |')
  for name, seconds, own_floor, store_seconds, _ in rows:
    print(
        f'| ours: {name} | {seconds:.3f} | {own_floor:.3f} | {seconds / own_floor:.2f} |'
        f' {100 * store_seconds / seconds:.1f}% |'
    )
  if scaling:
    print('\n| stored clients | store MiB | read+write (ms) | checkpoint+fingerprint (ms) | peak MiB |')
    print('|---|---|---|---|---|')
    for population, round_seconds, checkpoint_seconds, size_mib, peak in scaling:
      print(f'| {population} | {size_mib:.0f} | {round_seconds * 1000:.1f} |'
            f' {checkpoint_seconds * 1000:.1f} | {peak:.0f} |')
  first = f'; first {rows[0][0]} round (trace + run) {rows[0][4]:.1f} s' if rows else ''
  print(f'\nstart-up: importing TensorFlow and TFF {_IMPORTED - _STARTED:.1f} s{first}')

if __name__ == '__main__':
  app.run(main)
