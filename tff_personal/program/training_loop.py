"""The federated training program shared by every algorithm and task.

Each round r = 1..R:
  1. sample `clients_per_round` clients (seeded, `sampling.sample_clients`:
     uniformly, or in proportion to their training examples);
  2. build their training datasets (seeded shuffles) and read their personal
     states from the store (new clients get `initial_personal_state`);
     start reading the next round's clients' states in the background (those
     this round does not train; `ClientStateStore.prefetch`);
  3. run `process.next`; write the returned personal states to the store;
  4. every `rounds_per_eval` rounds (and at the end) evaluate every
     evaluation client's own model on its own test split (with
     `finetune_epochs`, after fine-tuning it on its own training data, the
     model as trained being reported as `before_finetune/...`), write the
     per-client rows and add the summaries over benign clients and over
     adversaries to the round metrics;
  5. every `rounds_per_checkpoint` rounds (and at the end) checkpoint.

Where every client trains every round and clients train independently
(Local), `rounds_per_call` consecutive rounds may run as one call of `next`,
each client on its batches of those rounds in sequence: the same models,
TFF's per-call costs paid once.

A run restarted with the same configuration resumes from its last checkpoint
and, everything being seeded, reproduces the uninterrupted run's metrics.
"""

import collections
import dataclasses
import datetime
import time
from typing import Any, Mapping, Optional, TextIO

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_personal.attacks import label_poison
from tff_personal.attacks import roles
from tff_personal.evaluation import per_client
from tff_personal.evaluation import summary as summary_lib
from tff_personal.personal import personal_states as personal_states_lib
from tff_personal.personal import process as process_lib
from tff_personal.personal import store as store_lib
from tff_personal.program import checkpoints as checkpoints_lib
from tff_personal.program import outputs
from tff_personal.program import sampling
from tff_personal.runtime import client_datasets
from tff_personal.runtime import client_keys
from tff_personal.runtime import context
from tff_personal.tasks import base


@dataclasses.dataclass(frozen=True)
class TrainingConfig:
  """How long and on what a process is trained and evaluated.

  Attributes:
    total_rounds: rounds to run.
    clients_per_round: clients sampled per round (without replacement).
    client_sampling: 'uniform', or 'examples': each draw in proportion to a
      client's training examples (Ditto's and FedProx's code). The DP
      accounting assumes uniform sampling (`privacy.accounting`).
    client_epochs: local epochs per round.
    client_steps: at most this many batches of those epochs a round (local
      SGD steps; Ditto's scripts train 2 a round); 0: all of them.
    client_batch_size: local batch size.
    rounds_per_eval: evaluate every this many rounds (and after the last).
    rounds_per_checkpoint: checkpoint every this many rounds (and at the end).
    rounds_per_call: where every client trains every round and clients train
      independently (Local), up to this many consecutive rounds run as one
      call of `next` on each client's batches of those rounds in sequence:
      the same SGD steps, so the same models, with TFF's per-call and
      per-client costs paid once (calls end at evaluation and checkpoint
      rounds; the call's metrics row is written at its last round). 1: a
      call a round.
    population: train and evaluate only a fixed seeded subset of this many
      clients (quick experiments); 0 = every client of the task.
    eval_clients: number of clients evaluated (a fixed seeded subset of the
      population); 0 = all.
    eval_batch_size: batch size of evaluation.
    eval_clients_per_call: clients per TFF evaluation call.
    seed: seeds sampling, data order and the evaluation subset.
    attack: one of `attacks.roles.ATTACK_NAMES`.
    attack_fraction: share of the population that is malicious (chosen once
      per run with the seed).
    attack_poison_labels: the adversaries of an update attack (A2, A3) train
      on uniformly random labels, so the update they replace with noise or
      boost is a poisoned one, as in Ditto's code (its corrupted devices train
      on random labels under every attack, `flearn/trainers_MTL/ditto.py`);
      False: they attack their honest update.
    finetune_epochs: epochs of SGD on a client's own training data before it
      is evaluated (the fine-tuning baseline); 0: none.
    finetune_learning_rate: the fine-tuning SGD's learning rate.
    dp_noise_multiplier: the DP noise multiplier of the aggregator (None: no
      DP); each round then reports the epsilon spent (`privacy/...`).
    dp_delta: delta of that epsilon.
    dp_with_detector: the NFL detector releases its DP-noised squared-norm
      sum each round too; the accountant counts it.
  """

  total_rounds: int
  clients_per_round: int
  client_sampling: str = 'uniform'
  client_epochs: int = 1
  client_steps: int = 0
  client_batch_size: int = 20
  rounds_per_eval: int = 10
  rounds_per_checkpoint: int = 10
  rounds_per_call: int = 1
  population: int = 0
  eval_clients: int = 0
  eval_batch_size: int = 64
  eval_clients_per_call: int = 50
  seed: int = 0
  attack: str = 'none'
  attack_fraction: float = 0.0
  attack_poison_labels: bool = False
  finetune_epochs: int = 0
  finetune_learning_rate: float = 0.0
  dp_noise_multiplier: Optional[float] = None
  dp_delta: Optional[float] = None
  dp_with_detector: bool = False


class ResumeError(Exception):
  """The output directory holds a run this one cannot resume."""


class UnsupportedConfigError(ValueError):
  """The configuration asks for something this process or task cannot do."""


class NonFiniteRoundError(Exception):
  """A round produced non-finite metrics or a rejected non-finite update.

  Raised before the round's personal states, metrics or checkpoint are
  written, so the last checkpoint stays the run's consistent state.
  """


def _check_finite(round_num: int, metrics: Mapping[str, Any]) -> None:
  bad = sorted(
      name
      for name, value in metrics.items()
      # epsilon is inf without noise: a budget, not a diverged value.
      if isinstance(value, float) and not np.isfinite(value)
      and not name.startswith('privacy/')
  )
  if metrics.get('finalizer/update_non_finite', 0):
    bad.append('finalizer/update_non_finite=1 (the aggregated update was rejected)')
  if metrics.get('non_finite_clients', 0):
    bad.append(f'updates of {metrics["non_finite_clients"]} clients')
  if bad:
    raise NonFiniteRoundError(
        f'Round {round_num} diverged: non-finite {", ".join(bad)}. Lower'
        ' --client_learning_rate (or --server_learning_rate); the last'
        ' checkpoint is intact.'
    )


def _format_duration(seconds: float) -> str:
  return str(datetime.timedelta(seconds=int(round(seconds))))


def run_training(
    task: base.Task,
    process: process_lib.PersonalizedProcess,
    config: TrainingConfig,
    experiment: outputs.ExperimentDir,
    *,
    run_config: Mapping[str, Any],
    run_config_defaults: Optional[Mapping[str, Any]] = None,
    progress_stream: Optional[TextIO] = None,
    split_rounds: bool = True,
) -> dict[str, Any]:
  """Trains `process` on `task`, resuming from `experiment` when possible.

  Args:
    task: the task (data and model).
    process: the algorithm.
    config: rounds, sampling and evaluation settings.
    experiment: the output directory.
    run_config: everything that defines the run (flags); a run resumes only
      into a directory written with the same `run_config` (except
      `total_rounds`, which may grow, and the output/evaluation cadence).
    run_config_defaults: the default of each `run_config` entry; a setting
      added to the program after the directory was written counts there as
      its default (so older runs resume when it is left at its default).
    progress_stream: where the per-round progress lines go (e.g. sys.stdout);
      None prints nothing.
    split_rounds: on several workers, run a round as `process.split_round`'s
      two calls where the process offers them, the second on this machine's
      worker (each client trains once; its update returns to the program)
      instead of `process.next` (which TFF 0.87's mergeable context runs
      with every client trained twice).

  Returns:
    The run summary (also written to `summary.json`).
  """
  experiment.make()
  _check_resumable(experiment, run_config, run_config_defaults or {})
  population, eval_population = populations(task, config)
  rounds_per_call = _checked_rounds_per_call(process, config, population)
  client_index = {c: i for i, c in enumerate(population)}
  round_clients = _client_sampler(task, population, config)
  accuracy_name = task.model.metrics()[0].name
  threat = _Threat(task, process, config, population)

  metrics_csv = outputs.RoundCsv(experiment.metrics_path)
  eval_csv = outputs.RoundCsv(experiment.eval_path)
  tensorboard = outputs.TensorBoardWriter(experiment.tensorboard_dir)
  checkpoints = checkpoints_lib.CheckpointManager(experiment.checkpoint_dir)
  state, personal, start_round, elapsed = _start_or_resume(
      process, experiment, checkpoints, progress_stream
  )
  metrics_csv.truncate_after(start_round)
  eval_csv.truncate_after(start_round)
  outputs.write_json(experiment.config_path, dict(run_config))

  keyed = _KeyedComputations(task, process, config, split_rounds)
  central_key = _central_accuracy_key(process, keyed, config, accuracy_name)
  last_eval_summary = _last_eval_summary(metrics_csv)
  round_times = []
  round_num = start_round
  while round_num < config.total_rounds:
    context.raise_if_terminated()  # A signal whose SystemExit was swallowed.
    started = time.monotonic()
    first_round = round_num + 1
    round_num = _last_round_of_call(first_round, config, rounds_per_call)
    if rounds_per_call == 1:
      state, row = _train_round(
          task, process, keyed.next, state, personal, round_clients, client_index, threat,
          round_num, config,
      )
    else:
      state, row = _train_rounds_in_one_call(
          task, process, keyed.next, state, personal, population, client_index, threat,
          first_round, round_num, config,
      )
    context.raise_if_terminated()
    rounds_run = round_num - first_round + 1
    row['round_seconds'] = (time.monotonic() - started) / rounds_run
    row.update(_privacy_metrics(config, len(population), round_num))
    if round_num % config.rounds_per_eval == 0 or round_num == config.total_rounds:
      eval_rows = _evaluate_clients(
          task, process, keyed.evaluate, keyed.central, state, personal, eval_population,
          client_index, threat, round_num, config,
      )
      eval_csv.append(eval_rows)
      last_eval_summary = _summarize_eval(eval_rows, accuracy_name, central_key)
      row.update(last_eval_summary)
    metrics_csv.append([row])
    tensorboard.write(round_num, row)

    elapsed += time.monotonic() - started
    if round_num % config.rounds_per_checkpoint == 0 or round_num == config.total_rounds:
      checkpoints.save(checkpoints_lib.program_state(
          round_num, state, personal.fingerprint(round_num), elapsed
      ))
      personal.after_checkpoint(round_num)
    round_times.extend([(time.monotonic() - started) / rounds_run] * rounds_run)
    _log(
        progress_stream,
        _progress_line(round_num, config.total_rounds, round_times, row, accuracy_name),
    )

  tensorboard.close()
  personal.close()
  summary = collections.OrderedDict(
      experiment_dir=experiment.path, task=task.name, rounds_completed=config.total_rounds,
      num_clients=len(population), num_eval_clients=len(eval_population),
      accuracy_metric=accuracy_name, num_adversaries=len(threat.adversaries),
      privacy=_privacy_metrics(config, len(population), config.total_rounds),
      nfl=_last_nfl_metrics(metrics_csv), elapsed_seconds=elapsed,
      final_eval=last_eval_summary, run_config=dict(run_config),
  )
  outputs.write_json(experiment.summary_path, summary)
  return summary


def populations(task: base.Task, config: TrainingConfig) -> tuple[list[str], list[str]]:
  """The run's clients and its evaluation clients (fixed seeded subsets)."""
  population = sampling.fixed_subset(sorted(task.client_ids), config.population, seed=config.seed)
  if config.clients_per_round > len(population):
    raise ValueError(
        f'clients_per_round={config.clients_per_round} exceeds the'
        f' {len(population)} clients of task {task.name}.'
    )
  return population, sampling.fixed_subset(population, config.eval_clients, seed=config.seed)


def _start_or_resume(process, experiment, checkpoints, progress_stream):
  """(server state, personal states, last round done, elapsed seconds): fresh,
  or from the latest checkpoint with the store rolled back to it."""
  state = process.initialize()
  no_store = store_lib.StoreFingerprint(0, 0, 0).as_array()
  loaded = checkpoints.load_latest(checkpoints_lib.program_state(0, state, no_store, 0.0))
  personal = personal_states_lib.PersonalStates(
      process, experiment.store_path, resuming=loaded is not None
  )
  if loaded is None:
    personal.restore(no_store)  # Drops rows of a start that saved no checkpoint.
    return state, personal, 0, 0.0
  start_round = int(loaded['round_num'])
  personal.restore(loaded['store_fingerprint'])
  _log(progress_stream, f'Resuming {experiment.path} after round {start_round}.')
  return loaded['server_state'], personal, start_round, float(loaded['elapsed_seconds'])


def _last_nfl_metrics(metrics_csv: outputs.RoundCsv) -> dict[str, float]:
  """The NFL detector's flag and round flagged after the last round ({} if none)."""
  rows = metrics_csv.read()
  if not rows or 'nfl/flagged' not in rows[-1]:
    return {}
  return {k: float(rows[-1][k]) for k in ('nfl/flagged', 'nfl/round_flagged')}


def _privacy_metrics(config: TrainingConfig, population: int, rounds: int) -> dict[str, float]:
  """epsilon spent after `rounds` rounds (`privacy.accounting`); {} without DP."""
  if config.dp_noise_multiplier is None:
    return {}
  from tff_personal.privacy import accounting  # pylint: disable=g-import-not-at-top

  return collections.OrderedDict([
      ('privacy/epsilon', accounting.epsilon(
          config.dp_noise_multiplier, population, config.clients_per_round, rounds,
          config.dp_delta, config.dp_with_detector,
      )),
      ('privacy/delta', config.dp_delta),
      ('privacy/noise_multiplier', config.dp_noise_multiplier),
  ])


class _Threat:
  """The run's adversaries and what they do to their data or their updates."""

  def __init__(self, task, process, config: TrainingConfig, population):
    self._attack = config.attack
    self.adversaries = frozenset()
    if config.attack_poison_labels and config.attack not in roles.UPDATE_ATTACKS:
      raise ValueError(
          f'attack_poison_labels applies to the update attacks ({", ".join(roles.UPDATE_ATTACKS)});'
          f' the attack is {config.attack}.'
      )
    self._poisons_labels = config.attack == 'label_poison' or config.attack_poison_labels
    if config.attack == 'none':
      return
    if (
        config.attack in roles.UPDATE_ATTACKS
        and process.sends_updates
        and not process.takes_client_roles
    ):
      raise ValueError(f'This algorithm cannot simulate the {config.attack} attack.')
    self.adversaries = roles.choose_adversaries(
        population, config.attack_fraction, seed=config.seed
    )
    if self._poisons_labels:
      with tf.Graph().as_default():
        self._num_classes = int(task.model.build().output_shape[-1])

  def training_data(self, client_id, dataset, seed):
    """The client's training data: poisoned if it is an adversary that poisons labels."""
    if client_id in self.adversaries and self._poisons_labels:
      return label_poison.poison_labels(dataset, self._num_classes, seed)
    return dataset

  def client_input(self, process, client_id, dataset, seed):
    """The client's `next` input: poisoned data and/or its attack role."""
    return self.with_role(process, client_id, self.training_data(client_id, dataset, seed), seed)

  def with_role(self, process, client_id, training_data, seed):
    """The `next` input of the client's `training_data`: with its attack role
    where the process takes roles."""
    if not process.takes_client_roles:
      return training_data
    role = roles.update_role(self._attack) if client_id in self.adversaries else roles.HONEST
    return process.client_input(training_data, role, seed)


class _KeyedComputations:
  """`next` and the evaluation, each client's results matched to it by key.

  See `runtime.client_keys`: with several workers, client-placed results
  come back in the order the workers finish.
  """

  def __init__(self, task, process, config: TrainingConfig, split_rounds: bool = True):
    self._next = client_keys.with_client_keys(process.next)
    # On several workers a round is two calls (`process.SplitRound` says why).
    self._split = None
    if split_rounds and process.split_round is not None and context.runs_on_several_workers():
      self._split = process.split_round._replace(
          client_phase=client_keys.with_client_keys(process.split_round.client_phase)
      )
    if config.finetune_epochs:
      evaluate = process.finetuned_evaluation(config.finetune_learning_rate)
    else:
      evaluate = process.evaluate
    self.evaluate = client_keys.with_client_keys(evaluate)
    # The global model alone, where the clients' models are not it (APFL,
    # LINDT, Ditto) and the shared weights are a whole model (not FedPer's).
    self.central = None
    if process.has_personal_state and process.sends_updates and _is_whole_model(task, process):
      self.central = client_keys.with_client_keys(
          per_client.build_global_model_evaluation(task.model.tff_model_fn)
      )

  def next(self, state, client_data, personal_states, keys):
    """`process.next` (or its split round) with the clients' `keys`."""
    if self._split is None:
      return client_keys.call_in_key_order(self._next, (state, client_data, personal_states), keys)
    return process_lib.run_split_round(
        self._split, state, client_data, personal_states,
        lambda client_phase, arg: client_keys.call_in_key_order(client_phase, arg, keys),
        lambda server_phase, arg: context.call_on_local_worker(server_phase, *arg),
    )


def _is_whole_model(task, process) -> bool:
  """Whether the process's shared weights W are a whole model of the task."""
  with tf.Graph().as_default():
    whole = tff.learning.models.weights_type_from_model(task.model.tff_model_fn)
  return process.get_model_weights.type_signature.result.is_equivalent_to(whole)


def _client_sampler(task, population, config):
  """round_num -> that round's clients, by `config.client_sampling`."""
  if config.client_sampling not in sampling.CLIENT_SAMPLINGS:
    raise ValueError(
        f'client_sampling must be one of {sampling.CLIENT_SAMPLINGS},'
        f' got {config.client_sampling!r}.'
    )
  if config.client_sampling == 'examples' and config.dp_noise_multiplier is not None:
    raise ValueError(
        "client_sampling='examples' with DP: the privacy accounting assumes"
        ' uniform sampling of clients.'
    )
  weights = None
  if config.client_sampling == 'examples':
    weights = [_num_train_examples(task, c) for c in population]
  return lambda round_num: sampling.sample_clients(
      population, config.clients_per_round, seed=config.seed, round_num=round_num,
      weights=weights,
  )


def _num_train_examples(task, client_id: str) -> int:
  dataset = task.train_data.create_tf_dataset_for_client(client_id)
  return int(dataset.reduce(np.int64(0), lambda count, _: count + 1))


def _train_round(
    task, process, keyed_next, state, personal, round_clients, client_index, threat,
    round_num, config,
):
  """Samples, trains and stores one round; returns the new state and metrics."""
  clients = round_clients(round_num)
  client_data = []
  for c in clients:
    seed = sampling.data_seed(config.seed, round_num, client_index[c])
    dataset = task.train_dataset(
        c, epochs=config.client_epochs, batch_size=config.client_batch_size, seed=seed
    )
    if not process.takes_whole_client_data:
      dataset = client_datasets.first_steps(dataset, config.client_steps)
    client_data.append(threat.client_input(process, c, dataset, seed))
  personal_states = personal.read(
      clients, round_num, lambda: process.get_model_weights(state)
  )
  if round_num < config.total_rounds:  # The next round's clients this round leaves alone.
    upcoming = round_clients(round_num + 1)
    personal.prefetch([c for c in upcoming if c not in clients], round_num + 1)
  output = keyed_next(state, client_data, personal_states, [client_index[c] for c in clients])
  return output.state, _checked_row_then_states_written(
      output, personal, clients, collections.OrderedDict(round=round_num)
  )


def _checked_row_then_states_written(output, personal, clients, row):
  """`row` with the call's metrics, checked finite before the clients' new
  personal states are written (at `row['round']`)."""
  row.update(outputs.flatten_metrics(output.metrics))
  _check_finite(row['round'], row)  # Before anything of the call is written.
  personal.write(row['round'], clients, output.personal_states)
  return row


def _checked_rounds_per_call(process, config: TrainingConfig, population) -> int:
  """`config.rounds_per_call`, once checked that the run's rounds allow it."""
  if config.rounds_per_call < 1:
    raise UnsupportedConfigError(f'rounds_per_call must be >= 1, got {config.rounds_per_call}.')
  if config.rounds_per_call == 1:
    return 1
  if not process.clients_train_independently:
    raise UnsupportedConfigError(
        'rounds_per_call > 1 needs clients that train independently of each other and of'
        ' the server (--algorithm=local without --nfl_detection); run it with 1.'
    )
  if config.clients_per_round != len(population):
    raise UnsupportedConfigError(
        f'rounds_per_call > 1 needs every client to train every round: clients_per_round is'
        f' {config.clients_per_round}, the population {len(population)}.'
    )
  return config.rounds_per_call


def _last_round_of_call(first_round: int, config: TrainingConfig, rounds_per_call: int) -> int:
  """The last round of the call starting at `first_round`: it ends by the
  evaluation and checkpoint rounds, so they see the same state as round by round."""
  last = min(first_round + rounds_per_call - 1, config.total_rounds)
  for every in (config.rounds_per_eval, config.rounds_per_checkpoint):
    last = min(last, -(-first_round // every) * every)  # The first multiple >= first_round.
  return last


def _train_rounds_in_one_call(
    task, process, keyed_next, state, personal, population, client_index, threat,
    first_round, last_round, config,
):
  """Rounds first..last as one `next`, every client on its batches of those
  rounds in sequence (`TrainingConfig.rounds_per_call`); returns the state and
  the call's metrics row (at `last_round`)."""
  steps = 0 if process.takes_whole_client_data else config.client_steps
  client_data = []
  for c in population:
    seeds = [
        sampling.data_seed(config.seed, r, client_index[c])
        for r in range(first_round, last_round + 1)
    ]
    dataset = task.train_dataset_of_rounds(
        c, epochs=config.client_epochs, batch_size=config.client_batch_size, seeds=seeds,
        steps=steps, transform=lambda data, seed, c=c: threat.training_data(c, data, seed),
    )
    client_data.append(threat.with_role(process, c, dataset, seeds[-1]))
  personal_states = personal.read(
      population, first_round, lambda: process.get_model_weights(state)
  )
  output = keyed_next(state, client_data, personal_states, [client_index[c] for c in population])
  return output.state, _checked_row_then_states_written(
      output, personal, population,
      collections.OrderedDict(round=last_round, rounds_in_call=last_round - first_round + 1),
  )


def _check_resumable(experiment: outputs.ExperimentDir, run_config: Mapping[str, Any],
                     defaults: Mapping[str, Any]) -> None:
  try:
    previous = outputs.read_json(experiment.config_path)
  except FileNotFoundError:
    return
  # Settings added since the directory was written: it ran with their defaults.
  previous = {**{k: v for k, v in defaults.items() if k not in previous}, **previous}
  mutable = {'total_rounds', 'rounds_per_eval', 'rounds_per_checkpoint', 'rounds_per_call'}
  current = dict(run_config)
  differences = sorted(
      k
      for k in set(previous) | set(current)
      if k not in mutable and previous.get(k) != current.get(k)
  )
  if differences:
    details = ', '.join(
        f'--{k}={previous.get(k)!r} there vs {current.get(k)!r} now' for k in differences
    )
    raise ResumeError(
        f'{experiment.path} holds a run with other settings ({details}); use'
        ' another --experiment_name or the same flags.'
    )


def _evaluate_clients(
    task, process, keyed_evaluate, keyed_central, state, personal, eval_population,
    client_index, threat, round_num, config,
):
  model_weights = process.get_model_weights(state)
  rows = []
  step = config.eval_clients_per_call
  for start in range(0, len(eval_population), step):
    chunk = eval_population[start : start + step]
    client_data = [task.test_dataset(c, batch_size=config.eval_batch_size) for c in chunk]
    if config.finetune_epochs:
      client_data = [
          collections.OrderedDict(
              train=_finetuning_data(task, threat, c, client_index[c], round_num, config),
              test=test,
          )
          for c, test in zip(chunk, client_data)
      ]
    states = personal.read(chunk, round_num + 1, lambda: model_weights)
    results = client_keys.call_in_key_order(
        keyed_evaluate, (model_weights, client_data, states), [client_index[c] for c in chunk]
    )
    central = [None] * len(chunk)
    if keyed_central is not None:
      test_data = [d['test'] for d in client_data] if config.finetune_epochs else client_data
      central = client_keys.call_in_key_order(
          keyed_central, (model_weights, test_data, [collections.OrderedDict()] * len(chunk)),
          [client_index[c] for c in chunk],
      )
    for client_id, metrics, central_metrics in zip(chunk, results, central):
      row = collections.OrderedDict(round=round_num, client_id=client_id)
      row.update(outputs.flatten_metrics(metrics))
      if central_metrics is not None:
        row.update(outputs.flatten_metrics({'global_model': central_metrics}))
      row['adversary'] = int(client_id in threat.adversaries)
      rows.append(row)
  return rows


def _finetuning_data(task, threat, client_id, index, round_num, config):
  """A client's own training data for `finetune_epochs` (seeded apart from training)."""
  seed = sampling.data_seed(config.seed, round_num, index, stream=1)
  dataset = task.train_dataset(
      client_id, epochs=config.finetune_epochs, batch_size=config.client_batch_size, seed=seed
  )
  return threat.training_data(client_id, dataset, seed)


def _central_accuracy_key(process, keyed, config, accuracy_name) -> Optional[str]:
  """The eval row column holding the global model's accuracy; None: no global model."""
  if keyed.central is not None:
    return f'global_model/{accuracy_name}'
  if process.has_personal_state or not process.sends_updates:
    # FedPer's base, Local's unused model: no whole global model.
    return None
  return f'before_finetune/{accuracy_name}' if config.finetune_epochs else accuracy_name


def _summarize_eval(
    eval_rows, accuracy_name: str, central_key: Optional[str] = None
) -> collections.OrderedDict:
  """Summaries over benign clients (`eval/...`) and adversaries (`eval/adversary_...`).

  With fine-tuning, the models as trained are summarized too
  (`eval/before_finetune_...`). `eval/central_accuracy` is the global model's
  accuracy on the clients' test sets pooled (weighted by their sizes), read
  from the `central_key` column of the rows.
  """
  evaluated = [r for r in eval_rows if r['num_examples'] > 0]
  result = collections.OrderedDict()
  for prefix, adversary in (('eval/', 0), ('eval/adversary_', 1)):
    rows = [r for r in evaluated if r['adversary'] == adversary]
    if adversary and not rows:
      continue
    for model_prefix, key_prefix in (('', ''), ('before_finetune_', 'before_finetune/')):
      if not rows or f'{key_prefix}{accuracy_name}' not in rows[0]:
        continue
      for metric, key in (('accuracy', accuracy_name), ('loss', 'loss')):
        result.update(
            summary_lib.summarize(
                [r[f'{key_prefix}{key}'] for r in rows], f'{prefix}{model_prefix}{metric}',
                higher_is_better=metric == 'accuracy',
            )
        )
    if rows and central_key is not None:
      examples = sum(r['num_examples'] for r in rows)
      result[f'{prefix}central_accuracy'] = (
          sum(r[central_key] * r['num_examples'] for r in rows) / examples
      )
    result[f'{prefix}num_clients'] = len(rows)
  return result


def _last_eval_summary(metrics_csv: outputs.RoundCsv):
  for row in reversed(metrics_csv.read()):
    if row.get('eval/accuracy_mean'):
      return collections.OrderedDict(
          (k, float(v)) for k, v in row.items() if k.startswith('eval/') and v
      )
  return collections.OrderedDict()


def _progress_line(round_num, total_rounds, round_times, row, accuracy_name) -> str:
  recent = round_times[-10:]
  seconds_per_round = sum(recent) / len(recent)
  eta = seconds_per_round * (total_rounds - round_num)
  parts = [
      f'round {round_num}/{total_rounds}',
      f'{seconds_per_round:.2f} s/round',
      f'ETA {_format_duration(eta)}',
  ]
  train_loss = row.get('client_work/train/loss')
  train_accuracy = row.get(f'client_work/train/{accuracy_name}')
  if train_loss is not None:
    parts.append(f'train loss {train_loss:.4f}')
  if train_accuracy is not None:
    parts.append(f'train acc {train_accuracy:.4f}')
  if 'eval/accuracy_mean' in row:
    parts.append(
        f'eval acc mean {row["eval/accuracy_mean"]:.4f} (p10'
        f' {row["eval/accuracy_p10"]:.4f}, {row["eval/num_clients"]} clients)'
    )
  return ' | '.join(parts)


def _log(stream: Optional[TextIO], line: str) -> None:
  if stream is not None:
    print(line, file=stream, flush=True)
