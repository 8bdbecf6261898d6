"""Round time of each algorithm against its compute floor, measured in one run.

  bin/benchmark.py                         # FEMNIST CNN, 10 writers a round, 1 epoch, batch 20
  bin/benchmark.py --algorithms=fedavg,ditto --rounds=5
  bin/benchmark.py --task=fmnist --partition=ditto_code --num_clients=500 \
      --classes_per_client=5 --client_batch_size=16 --client_steps=2  # Ditto's table's round

Prints, on the same clients' data and the same model:

* the compute floor: plain TensorFlow running exactly the round's SGD steps
  (each client from the global weights, one pass over its batches, the
  example-weighted mean of the updates) in a process that never imported
  TFF (`reports/compute_floor.py` says why); the fastest of: one
  `tf.function` with the clients one after the other on one model, or with a
  model each; a `tf.function` per client called from a thread per core (the
  clients really side by side, as in TFF's runtime); each with TensorFlow's
  default thread pools and with one thread an op;
* stock `tff.learning` FedAvg (`build_weighted_fed_avg`), with its default
  client loop (`DATASET_REDUCE`) and with `DATASET_ITERATOR`, the loop our
  algorithms use (`client_training.reduce_batches` says why); and once more
  with tf.data's autotuning back on (TF's default; the tasks' datasets turn
  it off, `runtime.client_datasets.without_autotuning` says why);
* our algorithms (the program's `next` call, personal states matched by key),
  each as a ratio to its own floor: the floor's passes times the passes the
  algorithm makes over a client's data (Ditto: global and personal model;
  LINDT always-mode: the dual model's two networks, one backward pass);
* stock FedAvg and ours fed two ways: the clients' batches serialized into
  every call (the program's way), and client ids + seeds with the dataset
  computation composed in front of the round
  (`Task.train_dataset_computation`), the clients reading their examples
  where they run;
* the time to move the round's personal states into TFF's runtime and back
  (an identity over {P}@CLIENTS), the transport part of a round;
* the round as the program runs it, with the personal state store in the
  loop (read the clients' states, written 5 rounds before and read ahead
  during the round before, `next`, write them back behind the next round,
  checkpoint the store every 5 rounds as bin/train.py does), its
  ratio to the round without the store (blocks of 3 rounds of each,
  alternating, a store block timed until its writes are done), the
  share of that round spent in store calls, and the store's own CPU (its
  calls, its writer and prefetch threads) as a share of the round's CPU;
* the store part of a round (read and write of the round's clients, and the
  checkpoint's compaction and fingerprint) with --stored_clients states
  already stored (e.g. 100 vs 100,000): whether a round grows with the
  population, and the process's peak memory after each;
* start-up: importing TensorFlow and TFF, and the first trace and call of
  our FedAvg round.

Every time is the median over --rounds rounds after one warm-up round on the
same clients. The main ratios are paired: the fastest floor variant stays up
in its own process, and each timed round of stock FedAvg or of ours follows
one floor round, so a ratio is the median of round / the floor round just
before it (this shared VM's speed drifts by up to 2x within minutes, which
made ratios of medians taken minutes apart swing). CPU-seconds (this process
and its TFF worker against the floor process, the same pairs) are steadier
still. Times, not assertions: no test depends on them.
"""

from tff_personal.runtime import allocator  # pylint: disable=g-import-not-at-top

if __name__ == '__main__':  # Not when tests load this file as a module.
  allocator.reexec_with_program_settings()  # Before TensorFlow's import (its docstring).

import time  # pylint: disable=g-import-not-at-top

_STARTED = time.monotonic()

import collections  # pylint: disable=g-import-not-at-top
import dataclasses  # pylint: disable=g-import-not-at-top
import os  # pylint: disable=g-import-not-at-top
import json  # pylint: disable=g-import-not-at-top
import statistics  # pylint: disable=g-import-not-at-top
import subprocess  # pylint: disable=g-import-not-at-top
import sys  # pylint: disable=g-import-not-at-top
import tempfile  # pylint: disable=g-import-not-at-top
from typing import Optional  # pylint: disable=g-import-not-at-top

from tff_personal.runtime import log_levels  # pylint: disable=g-import-not-at-top

log_levels.quiet_native_logs(sys.argv)  # Before TensorFlow's import; --verbosity shows all.

from absl import app  # pylint: disable=g-import-not-at-top
from absl import flags  # pylint: disable=g-import-not-at-top
import device_flags  # pylint: disable=g-import-not-at-top  # bin/device_flags.py
import numpy as np  # pylint: disable=g-import-not-at-top
import tensorflow as tf  # pylint: disable=g-import-not-at-top
import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top

_IMPORTED = time.monotonic()
_REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

from tff_personal.algorithms import registry as algorithm_registry  # pylint: disable=g-import-not-at-top
from tff_personal.personal import personal_states as personal_states_lib  # pylint: disable=g-import-not-at-top
from tff_personal.personal import store as store_lib  # pylint: disable=g-import-not-at-top
from tff_personal.program import sampling  # pylint: disable=g-import-not-at-top
from tff_personal.reports import compute_floor  # pylint: disable=g-import-not-at-top
from tff_personal.runtime import client_datasets  # pylint: disable=g-import-not-at-top
from tff_personal.runtime import client_keys  # pylint: disable=g-import-not-at-top
from tff_personal.runtime import context  # pylint: disable=g-import-not-at-top
from tff_personal.runtime import devices  # pylint: disable=g-import-not-at-top
from tff_personal.tasks import options as task_options_lib
from tff_personal.tasks import registry as task_registry  # pylint: disable=g-import-not-at-top

TASK = flags.DEFINE_enum('task', 'femnist', task_registry.TASK_NAMES, 'Task (data and model).')
FEMNIST_PATH = flags.DEFINE_string(
    'femnist_path', task_options_lib.DEFAULT_FEMNIST_PATH, 'The FEMNIST sample (femnist105.npz).'
)
CACHE_DIR = flags.DEFINE_string(
    'cache_dir', task_options_lib.DEFAULT_CACHE_DIR, "TFF's dataset cache."
)
ALGORITHMS = flags.DEFINE_list(
    'algorithms', ['fedavg', 'fedper', 'ditto', 'lindt'], 'Our algorithms to time.'
)
CLIENTS_PER_ROUND = flags.DEFINE_integer('clients_per_round', 10, 'Clients a round.', lower_bound=1)
BATCH_SIZE = flags.DEFINE_integer('client_batch_size', 20, 'Local batch size.', lower_bound=1)
CLIENT_STEPS = flags.DEFINE_integer(
    'client_steps', 0, "A client's local SGD steps a round (0: one epoch).", lower_bound=0
)
PARTITION = flags.DEFINE_enum(
    'partition', task_options_lib.TaskOptions.partition, task_options_lib.PARTITIONS,
    'Synthetic partition of fmnist/mnist (as bin/train.py).',
)
NUM_CLIENTS = flags.DEFINE_integer(
    'num_clients', task_options_lib.TaskOptions.num_clients,
    'Clients of a synthetic partition.', lower_bound=1,
)
CLASSES_PER_CLIENT = flags.DEFINE_integer(
    'classes_per_client', task_options_lib.TaskOptions.classes_per_client,
    'Classes per client of the k_classes and ditto_code partitions.', lower_bound=1,
)
LEARNING_RATE = flags.DEFINE_float('client_learning_rate', 0.05, "Clients' SGD rate.")
ROUNDS = flags.DEFINE_integer('rounds', 3, 'Timed rounds (after one warm-up).', lower_bound=1)
SEED = flags.DEFINE_integer('seed', 0, 'Picks the clients.')
MAX_CONCURRENT_CALLS = flags.DEFINE_integer(
    'max_concurrent_calls', -1,
    "TFF worker's limit on TensorFlow computations running at once (-1: none).",
)
DEVICE, WORKER_BINARY = device_flags.define_device_flags(
    ' The floor runs on the same kind of device.'
)
STORED_CLIENTS = flags.DEFINE_list(
    'stored_clients', ['100', '100000'],
    'Populations of stored personal states (the first timed algorithm with'
    ' personal state) at which to time the store part of a round; empty: skip.',
)

# Passes over a client's data per round, relative to FedAvg's one.
_PASSES = {'fedavg': 1, 'fedper': 1, 'fedprox': 1, 'local': 1, 'ditto': 2, 'apfl': 2, 'lindt': 2}


# Rounds in a row of each kind when the store's rounds are timed against plain ones.
_STORE_BLOCK_ROUNDS = 3
# The store's rounds checkpoint it as often as bin/train.py does by default
# (--rounds_per_checkpoint): a checkpoint drops old versions, whose files
# later writes reuse.
_ROUNDS_PER_CHECKPOINT = 5
# The store's rounds rotate over this many cohorts of stored clients (the
# same datasets under other ids): a round reads states written this many
# rounds before, committed to their files, as when a sampled client returns
# after some rounds, not states still waiting in the writer's queue.
_STORED_COHORTS = 5


def _in_blocks(plain_fn, store_fn, store_done_fn, store_cpu_fn, blocks: int,
               worker_pid: Optional[int]) -> tuple[float, float, float, float]:
  """Seconds a round of `store_fn`, its ratios to `plain_fn`'s in wall
  time and in CPU time (this process and its TFF worker), timed in
  alternating blocks of `_STORE_BLOCK_ROUNDS` rounds in a row, and the
  store's own share of its CPU time (`store_cpu_fn`: the store's CPU so far).

  The store writes behind the round, during the next one: a store block is
  timed until its writes are done (`store_done_fn`), so no plain round pays
  for them and the store's rounds pay for their own. Medians over `blocks`
  pairs of blocks.
  """
  plain_fn()
  store_fn()
  store_done_fn()
  seconds, ratios, cpu_ratios, store_shares = [], [], [], []

  def block(fn, done_fn=lambda: None):
    started, cpu_started, store_started = (
        time.monotonic(), _cpu_seconds(worker_pid), store_cpu_fn()
    )
    for _ in range(_STORE_BLOCK_ROUNDS):
      fn()
    done_fn()
    return (time.monotonic() - started, _cpu_seconds(worker_pid) - cpu_started,
            store_cpu_fn() - store_started)

  for _ in range(blocks):
    plain, plain_cpu, _ = block(plain_fn)
    store, store_cpu, store_own_cpu = block(store_fn, store_done_fn)
    seconds.append(store / _STORE_BLOCK_ROUNDS)
    ratios.append(store / plain)
    cpu_ratios.append(store_cpu / plain_cpu)
    store_shares.append(store_own_cpu / store_cpu)
  median = statistics.median
  return median(seconds), median(ratios), median(cpu_ratios), median(store_shares)


def _median_seconds(fn, rounds: int) -> float:
  fn()  # Warm-up: traces and caches.
  times = []
  for _ in range(rounds):
    started = time.monotonic()
    fn()
    times.append(time.monotonic() - started)
  return statistics.median(times)


@dataclasses.dataclass(frozen=True)
class _Paired:
  """Medians over rounds each timed right after a floor round (module docstring)."""

  seconds: float
  cpu_seconds: float
  floor_seconds: float  # median of the paired floor rounds (one pass)
  ratio: float  # median of seconds / (passes x the floor round before it)
  cpu_ratio: float  # median of CPU-seconds / (passes x that floor round's)


def _cpu_seconds(worker_pid: Optional[int]) -> float:
  """CPU time of this process (all threads) and of its TFF worker so far."""
  seconds = time.process_time()
  if worker_pid is not None:
    with open(f'/proc/{worker_pid}/stat') as f:
      fields = f.read().rsplit(')', 1)[1].split()
    seconds += (int(fields[11]) + int(fields[12])) / os.sysconf('SC_CLK_TCK')  # utime, stime
  return seconds


_FLOOR_ON_GPU = False  # Set by `main`: whether the TFF worker found a GPU.


def _floor_environment() -> dict:
  """The environment of a compute-floor process: plain TensorFlow, without the
  program's allocator settings (`runtime/allocator.py`), on the kind of device
  the TFF worker trains on (GPUs hidden unless the worker found one)."""
  env = dict(allocator.child_environment(), PYTHONPATH=_REPO_ROOT, TF_CPP_MIN_LOG_LEVEL='2')
  return env if _FLOOR_ON_GPU else devices.worker_environment(env, 'cpu')


class _FloorServer:
  """The fastest floor variant in its own process, a round per request."""

  def __init__(self, folder: str, args: list):
    env = _floor_environment()
    self._process = subprocess.Popen(
        [sys.executable, '-m', 'tff_personal.reports.compute_floor', folder, '--serve', *args],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env,
    )
    self._read()  # {"ready": true}, after its warm-up round.

  def _read(self) -> dict:
    line = self._process.stdout.readline()
    if not line:
      sys.exit('benchmark.py: error: the compute floor process exited early.')
    return json.loads(line)

  def round(self) -> dict:
    """One floor round: {"seconds", "cpu_seconds"}."""
    self._process.stdin.write('round\n')
    self._process.stdin.flush()
    return self._read()

  def close(self) -> None:
    self._process.stdin.close()
    self._process.stdout.read()
    self._process.wait()


def _paired(fn, floor: _FloorServer, passes: int, worker_pid: Optional[int]) -> _Paired:
  """Times `fn` after a warm-up, each round right after a floor round."""
  fn()
  seconds, cpu_seconds, floor_seconds, ratios, cpu_ratios = [], [], [], [], []
  for _ in range(ROUNDS.value):
    floor_round = floor.round()
    floor_seconds.append(floor_round['seconds'])
    started, cpu_started = time.monotonic(), _cpu_seconds(worker_pid)
    fn()
    seconds.append(time.monotonic() - started)
    cpu_seconds.append(_cpu_seconds(worker_pid) - cpu_started)
    ratios.append(seconds[-1] / (passes * floor_round['seconds']))
    cpu_ratios.append(cpu_seconds[-1] / (passes * floor_round['cpu_seconds']))
  median = statistics.median
  return _Paired(median(seconds), median(cpu_seconds), median(floor_seconds), median(ratios),
                 median(cpu_ratios))


# (mode, intra-op threads, inter-op threads; 0: TensorFlow's default).
_FLOOR_VARIANTS = (
    ('sequential', 0, 0), ('parallel', 0, 0), ('parallel', 1, os.cpu_count() or 1),
    ('threads', 0, 0), ('threads', 1, os.cpu_count() or 1),
)


def _compute_floor(task, datasets, learning_rate, folder):
  """The round's SGD steps in plain TensorFlow, in a process without TFF.

  See `reports/compute_floor.py` (why apart); returns the fastest variant's
  seconds, the steps, every variant's seconds by name, and the fastest
  variant's command-line arguments (for `_FloorServer`).
  """
  client_examples = []
  for dataset in datasets:
    batches = [(x.numpy(), y.numpy()) for x, y in dataset]
    client_examples.append((np.concatenate([x for x, _ in batches]),
                            np.concatenate([y for _, y in batches])))
  compute_floor.write_round(folder, task.model.build(), task.model.loss(), learning_rate,
                            BATCH_SIZE.value, ROUNDS.value, client_examples)
  env = _floor_environment()
  seconds, steps = {}, set()
  for mode, intra, inter in _FLOOR_VARIANTS:
    run = subprocess.run(
        [sys.executable, '-m', 'tff_personal.reports.compute_floor', folder, f'--mode={mode}',
         f'--intra_op_threads={intra}', f'--inter_op_threads={inter}'],
        capture_output=True, text=True, env=env, check=False,
    )
    if run.returncode:
      sys.exit(f'benchmark.py: error: the compute floor failed: {run.stderr.strip()[-2000:]}')
    result = json.loads(run.stdout.strip().splitlines()[-1])
    threads = 'default threads' if not intra else f'{intra} thread an op, {inter} ops at once'
    seconds[f'{mode}, {threads}'] = result['seconds']
    steps.add(result['steps'])
  if len(steps) != 1:
    sys.exit(f'benchmark.py: error: the floor variants ran different steps: {sorted(steps)}')
  fastest = min(seconds, key=seconds.get)
  mode, intra, inter = _FLOOR_VARIANTS[list(seconds).index(fastest)]
  server_args = [f'--mode={mode}', f'--intra_op_threads={intra}', f'--inter_op_threads={inter}']
  return seconds[fastest], steps.pop(), seconds, server_args


def _with_autotuning(dataset):
  """`dataset` with tf.data's autotuning back on, TensorFlow's default."""
  options = tf.data.Options()
  options.autotune.enabled = True
  return dataset.with_options(options)


def _stock_fedavg_round(task, client_data, learning_rate, dataset_computation=None,
                        loop=tff.learning.LoopImplementation.DATASET_REDUCE, paired_with=None):
  """Median seconds of stock FedAvg's round, composed with `dataset_computation` if given;
  `_Paired` times instead with `paired_with=(floor server, worker pid)`."""
  process = tff.learning.algorithms.build_weighted_fed_avg(
      task.model.tff_model_fn,
      client_optimizer_fn=tff.learning.optimizers.build_sgdm(learning_rate),
      server_optimizer_fn=tff.learning.optimizers.build_sgdm(1.0),
      loop_implementation=loop,
  )
  if dataset_computation is not None:
    process = tff.simulation.compose_dataset_computation_with_learning_process(
        dataset_computation, process
    )
  state = [process.initialize()]

  def one_round():
    state[0] = process.next(state[0], client_data).state

  if paired_with is not None:
    return _paired(one_round, paired_with[0], 1, paired_with[1])
  return _median_seconds(one_round, ROUNDS.value)


def _our_round(name, task, clients, datasets, learning_rate, store_dir, client_ids,
               dataset_computation, paired_with):
  """Median seconds of `next` (datasets serialized, and composed from ids), of
  a round with the personal state store in the loop (read, `next`, write, as
  the program does), and of that round's store calls."""
  process = algorithm_registry.build_algorithm(
      name, task,
      setup=algorithm_registry.Setup(
          client_learning_rate=learning_rate, clients_per_round=len(clients), seed=SEED.value,
          client_steps=CLIENT_STEPS.value,
      ),
  )
  state = process.initialize()
  weights = process.get_model_weights(state)
  holder = {
      'state': state,
      'personal': [process.initial_personal_state(c, weights) for c in clients],
  }
  keys = list(range(len(clients)))

  def round_fn(next_fn, client_data, states=None, store_seconds=None, store_cpu=None):
    keyed = client_keys.with_client_keys(next_fn)
    round_num = [0]

    def stored_ids(round_offset=0):
      return [f'{c}@{(round_num[0] + round_offset) % _STORED_COHORTS}' for c in clients]

    def one_round():
      if states is not None:  # The program's round: states from the store, back to it.
        round_num[0] += 1
        started, cpu_started = time.monotonic(), time.thread_time()
        holder['personal'] = states.read(
            stored_ids(), before_round=round_num[0], model_weights_fn=lambda: weights
        )
        # Read ahead while this round trains, as bin/train.py does.
        states.prefetch(stored_ids(round_offset=1), before_round=round_num[0] + 1)
        store_seconds.append(time.monotonic() - started)
        store_cpu[0] += time.thread_time() - cpu_started
      output = client_keys.call_in_key_order(
          keyed, (holder['state'], client_data, holder['personal']), keys
      )
      holder['state'], holder['personal'] = output.state, output.personal_states
      if states is not None:
        started, cpu_started = time.monotonic(), time.thread_time()
        states.write(round_num[0], stored_ids(), holder['personal'])
        if round_num[0] % _ROUNDS_PER_CHECKPOINT == 0:
          states.after_checkpoint(round_num[0])
        store_seconds[-1] += time.monotonic() - started
        store_cpu[0] += time.thread_time() - cpu_started

    return one_round

  client_data = [process.client_input(d) if process.takes_client_roles else d for d in datasets]
  one_round = round_fn(process.next, client_data)
  started = time.monotonic()
  one_round()
  first_call = time.monotonic() - started
  paired = _paired(one_round, paired_with[0], _PASSES[name], paired_with[1])
  composed_next = client_datasets.compose_client_datasets(dataset_computation, process.next)
  composed_seconds = _median_seconds(round_fn(composed_next, [
      process.client_input(k) if process.takes_client_roles else k for k in client_ids
  ]), ROUNDS.value)

  with_store = None
  if process.has_personal_state:
    states = personal_states_lib.PersonalStates(
        process, os.path.join(store_dir, f'{name}.sqlite'), resuming=False
    )
    stored = [f'{c}@{cohort}' for cohort in range(_STORED_COHORTS) for c in clients]
    states.write(0, stored, holder['personal'] * _STORED_COHORTS)
    calls, calls_cpu = [], [0.0]
    # Next to plain rounds: this VM's speed drifts more than the store costs.
    seconds, ratio, cpu_ratio, cpu_share = _in_blocks(
        one_round, round_fn(process.next, client_data, states, calls, calls_cpu),
        states.store.flush, lambda: calls_cpu[0] + states.store.threads_cpu_seconds(),
        ROUNDS.value, paired_with[1],
    )
    states.close()
    # After the warm-up.
    with_store = _StoreRound(seconds, ratio, cpu_ratio, statistics.median(calls[1:]), cpu_share)
  flat = personal_states_lib.flatten(holder['personal'][0])
  personal_flat = flat if process.has_personal_state else None
  transport_seconds = (
      _transport_seconds(process, holder['personal']) if process.has_personal_state else 0.0
  )
  return _OurTimes(paired, composed_seconds, with_store, first_call, personal_flat,
                   transport_seconds)


def _transport_seconds(process, personal_states) -> float:
  """Median seconds to move the round's personal states into TFF's runtime and
  back out (`next`'s {P}@CLIENTS through an identity, nothing else)."""
  personal_type = process.next.type_signature.parameter[2].member

  @tff.tensorflow.computation(personal_type)
  def identity(state):
    return state

  @tff.federated_computation(tff.FederatedType(personal_type, tff.CLIENTS))
  def round_trip(states):
    return tff.federated_map(identity, states)

  return _median_seconds(lambda: round_trip(personal_states), ROUNDS.value)


@dataclasses.dataclass(frozen=True)
class _StoreRound:
  """The program's round: store read + `next` + store write (write-behind)."""

  seconds: float  # median
  ratio: float  # median of seconds / the plain rounds timed next to them (`_in_blocks`)
  cpu_ratio: float  # the same in CPU-seconds (this process and its TFF worker)
  store_seconds: float  # median of the round's store calls
  cpu_share: float  # median of the store's own CPU (calls, writer, prefetcher) / the round's


@dataclasses.dataclass(frozen=True)
class _OurTimes:
  paired: _Paired  # `next` alone, the clients' datasets serialized into the call.
  composed_seconds: float  # `next` composed with the dataset computation (ids in).
  with_store: Optional[_StoreRound]  # None without personal state.
  first_call: float  # Trace + first round.
  personal_flat: Optional[list]  # A client's personal state, flat; None without one.
  transport_seconds: float  # The round's personal states into the runtime and back.


def _client_ids_and_seeds(clients):
  """The composed round's client input: what `datasets` in `main` were built from."""
  return [
      collections.OrderedDict(client_id=c, seed=SEED.value + i) for i, c in enumerate(clients)
  ]


def _memory_mib(field: str) -> float:
  """`VmRSS` (resident now) or `VmHWM` (peak since the last reset) of this process."""
  with open('/proc/self/status') as f:
    for line in f:
      if line.startswith(field + ':'):
        return int(line.split()[1]) / 1024
  raise RuntimeError(f'/proc/self/status has no {field}.')


def _round_memory_mib(fn) -> tuple[float, float]:
  """(resident before, peak while `fn` ran) in MiB: Linux resets the peak
  (`VmHWM`) on writing 5 to /proc/self/clear_refs."""
  with open('/proc/self/clear_refs', 'w') as f:
    f.write('5')
  before = _memory_mib('VmRSS')
  fn()
  return before, _memory_mib('VmHWM')


def _disk_bytes(store_path: str) -> int:
  """The store's bytes: its SQLite file and its states' files."""
  total = os.path.getsize(store_path)
  for root, _, names in os.walk(store_path + '-states'):
    total += sum(os.path.getsize(os.path.join(root, name)) for name in names)
  return total


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
    before, peak = _round_memory_mib(lambda: (store_round(), checkpoint()))  # pylint: disable=cell-var-from-loop
    store.close()
    size_mib = _disk_bytes(path) / 2**20
    os.remove(path)
    rows.append((population, round_seconds, checkpoint_seconds, size_mib, peak - before))
    print(
        f'store with {population} clients ({size_mib:.0f} MiB): read+write of {cohort}'
        f' clients {round_seconds * 1000:.1f} ms, checkpoint+fingerprint'
        f' {checkpoint_seconds * 1000:.1f} ms; a round + checkpoint raised resident memory'
        f' from {before:.0f} to at most {peak:.0f} MiB',
        flush=True,
    )
  return rows


def _timed_rounds(task, clients, datasets, lr, paired_with):
  """Stock FedAvg's rounds and ours, each paired with floor rounds; returns the
  table's rows (label, `_Paired`, (composed s, ratio) or None, with-store s or
  None, store share %), the store scaling rows and (the first algorithm, its
  first call's seconds)."""
  rows = []
  client_ids = _client_ids_and_seeds(clients)
  stock = _stock_fedavg_round(task, datasets, lr, paired_with=paired_with)
  # Built (traced) once, composed in front of every round below.
  dataset_computation = task.train_dataset_computation(
      epochs=1, batch_size=BATCH_SIZE.value, steps=CLIENT_STEPS.value
  )
  stock_composed = _stock_fedavg_round(task, client_ids, lr, dataset_computation)
  stock_iterator = _stock_fedavg_round(
      task, datasets, lr, loop=tff.learning.LoopImplementation.DATASET_ITERATOR,
      paired_with=paired_with,
  )
  stock_autotuned = _stock_fedavg_round(
      task, [_with_autotuning(d) for d in datasets], lr, paired_with=paired_with
  )
  print(f'stock tff.learning FedAvg: {stock.seconds:.3f} s a round = {stock.ratio:.2f}x the'
        f' floor (CPU {stock.cpu_ratio:.2f}x); composed from client ids {stock_composed:.3f} s;'
        f' with DATASET_ITERATOR loops {stock_iterator.seconds:.3f} s ='
        f' {stock_iterator.ratio:.2f}x (CPU {stock_iterator.cpu_ratio:.2f}x); with tf.data'
        f" autotuning on {stock_autotuned.seconds:.3f} s = {stock_autotuned.ratio:.2f}x"
        f' (CPU {stock_autotuned.cpu_ratio:.2f}x)', flush=True)
  rows.append(('stock tff.learning FedAvg', stock,
               (stock_composed, stock_composed / stock.floor_seconds), None))
  rows.append(('stock, DATASET_ITERATOR loops', stock_iterator, None, None))
  rows.append(('stock, tf.data autotuning on', stock_autotuned, None, None))
  scaling_state, scaling, first_call = None, [], None
  with tempfile.TemporaryDirectory() as store_dir:
    for name in ALGORITHMS.value:
      times = _our_round(name, task, clients, datasets, lr, store_dir, client_ids,
                         dataset_computation, paired_with)
      if times.personal_flat is not None and scaling_state is None:
        scaling_state = (name, times.personal_flat)
      paired = times.paired
      own_floor = _PASSES[name] * paired.floor_seconds
      rows.append((f'ours: {name}', paired,
                   (times.composed_seconds, times.composed_seconds / own_floor),
                   times.with_store))
      store_text = ''
      if times.with_store is not None:
        with_store = times.with_store
        store_text = (
            f' with the personal state store in the loop {with_store.seconds:.3f} s'
            f' ({with_store.ratio:.3f}x the rounds without it timed next to them, CPU'
            f' {with_store.cpu_ratio:.3f}x), of which store'
            f' calls {with_store.store_seconds * 1000:.1f} ms'
            f' ({100 * with_store.store_seconds / with_store.seconds:.1f}%), the store\'s own'
            f' CPU {100 * with_store.cpu_share:.1f}% of that round\'s;'
        )
      print(
          f'{name}: {paired.seconds:.3f} s a round = {paired.ratio:.2f}x its floor'
          f' ({_PASSES[name]} floor passes; CPU {paired.cpu_seconds:.2f} s ='
          f' {paired.cpu_ratio:.2f}x); composed from client ids {times.composed_seconds:.3f} s;'
          f'{store_text} personal states into the runtime and back {times.transport_seconds:.3f} s'
          f' ({100 * times.transport_seconds / paired.seconds:.1f}% of the round);'
          f' first call (trace + run) {times.first_call:.1f} s',
          flush=True,
      )
      if first_call is None:
        first_call = (name, times.first_call)
    if scaling_state is not None and STORED_CLIENTS.value:
      print(f'personal state of {scaling_state[0]}:'
            f' {sum(a.nbytes for a in scaling_state[1]) / 1024:.0f} KiB a client', flush=True)
      scaling = _store_scaling(
          scaling_state[1], len(clients), [int(n) for n in STORED_CLIENTS.value], store_dir
      )
  return rows, scaling, first_call


def main(argv):
  log_levels.quiet_python_logs(verbosity_set=flags.FLAGS['verbosity'].present > 0)
  if len(argv) > 1:
    sys.exit(f'benchmark.py: error: unexpected arguments: {" ".join(argv[1:])}')
  global _FLOOR_ON_GPU
  # First: it also retires TFF's import-time context.
  try:
    worker = context.install_local_context(
        MAX_CONCURRENT_CALLS.value, device=DEVICE.value, binary=WORKER_BINARY.value
    )
  except ValueError as e:
    print(f'benchmark.py: error: --worker_binary={WORKER_BINARY.value}: {e}.', file=sys.stderr)
    sys.exit(2)
  except devices.DeviceError as e:
    print(f'benchmark.py: error: {e}', file=sys.stderr)
    sys.exit(2)
  _FLOOR_ON_GPU = bool(devices.gpus(worker.devices))
  unknown = [a for a in ALGORITHMS.value if a not in _PASSES]
  if unknown:
    sys.exit(f'benchmark.py: error: --algorithms: unknown {", ".join(unknown)}')
  task = task_registry.build_task(
      TASK.value,
      task_options_lib.TaskOptions(
          seed=SEED.value, femnist_path=FEMNIST_PATH.value, cache_dir=CACHE_DIR.value,
          partition=PARTITION.value, num_clients=NUM_CLIENTS.value,
          classes_per_client=CLASSES_PER_CLIENT.value,
      ),
  )
  clients = sampling.sample_clients(
      sorted(task.client_ids), CLIENTS_PER_ROUND.value, seed=SEED.value, round_num=1
  )
  datasets = [
      task.train_dataset(c, epochs=1, batch_size=BATCH_SIZE.value, seed=SEED.value + i)
      for i, c in enumerate(clients)
  ]
  datasets = [client_datasets.first_steps(d, CLIENT_STEPS.value) for d in datasets]
  local_work = f'{CLIENT_STEPS.value} steps' if CLIENT_STEPS.value else '1 epoch'
  lr = LEARNING_RATE.value
  print(
      f'{TASK.value}: {len(clients)} clients a round, {local_work}, batch {BATCH_SIZE.value};'
      f' median of {ROUNDS.value} rounds after a warm-up; {os.cpu_count()} CPUs; the TFF'
      f' worker and the floor train on: {devices.describe(worker.devices)}.',
      flush=True,
  )
  with tempfile.TemporaryDirectory() as folder:
    floor, steps, variants, server_args = _compute_floor(task, datasets, lr, folder)
    print(
        f'compute floor (plain TF, a process without TFF, fastest variant): {floor:.3f} s a'
        f' round, {steps} SGD steps ('
        + '; '.join(f'{name} {sec:.3f} s' for name, sec in variants.items()) + ')',
        flush=True,
    )
    floor_server = _FloorServer(folder, server_args)
    try:
      rows, scaling, first_call = _timed_rounds(
          task, clients, datasets, lr, (floor_server, worker.pid)
      )
    finally:
      floor_server.close()
  print()
  print('| | s a round | ratio to its floor | CPU-s a round | CPU ratio | composed from ids: s'
        ' | ratio | with the store in the loop: s | ratio to the rounds without it | CPU ratio'
        " | store calls: share of that round | the store's CPU: share of that round's |")
  print('|---|---|---|---|---|---|---|---|---|---|---|---|')
  print(f'| compute floor (before the pairs) | {floor:.3f} | 1.00 | | 1.00 | | | | | | | |')
  for label, paired, composed, with_store in rows:
    composed_cells = f' {composed[0]:.3f} | {composed[1]:.2f} |' if composed else ' | |'
    store_cells = ' | | | | |'
    if with_store is not None:
      store_cells = (f' {with_store.seconds:.3f} | {with_store.ratio:.3f} |'
                     f' {with_store.cpu_ratio:.3f} |'
                     f' {100 * with_store.store_seconds / with_store.seconds:.1f}% |'
                     f' {100 * with_store.cpu_share:.1f}% |')
    print(f'| {label} | {paired.seconds:.3f} | {paired.ratio:.2f} | {paired.cpu_seconds:.2f} |'
          f' {paired.cpu_ratio:.2f} |' + composed_cells + store_cells)
  if scaling:
    print('\n| stored clients | store MiB | read+write (ms) | checkpoint+fingerprint (ms) |'
          ' memory a round adds (MiB) |')
    print('|---|---|---|---|---|')
    for population, round_seconds, checkpoint_seconds, size_mib, added in scaling:
      print(f'| {population} | {size_mib:.0f} | {round_seconds * 1000:.1f} |'
            f' {checkpoint_seconds * 1000:.1f} | {added:.1f} |')
  first = f'; first {first_call[0]} round (trace + run) {first_call[1]:.1f} s' if first_call else ''
  print(f'\nstart-up: importing TensorFlow and TFF {_IMPORTED - _STARTED:.1f} s{first}')

if __name__ == '__main__':
  app.run(main)
