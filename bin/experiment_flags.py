"""The absl flags of an experiment and the driver steps built on them.

Shared by the binaries in bin/ (`import experiment_flags`); the library
takes plain values, and only this module and bin/device_flags.py define
flags. Importing it defines the flags: grouped by prefix (`client_`,
`server_`, `eval_`, `aggregator_`, `attack_`, `dp_`, `nfl_` and the tasks'
data flags) and, for each algorithm of the registry, one flag
`--<algorithm>_<field>` per field of its `Hparams`, whose type, default,
bounds and help (its `Attributes:` docstring) come from the dataclass. The
module imports TensorFlow only inside the driver steps. `exit_on_errors`
turns bad input into a one-line error and exit code 2.
"""

import contextlib
import dataclasses
import os
import re
import sys
import typing
from typing import Any, NamedTuple, NoReturn, Optional

from absl import flags

import device_flags  # bin/device_flags.py
from tff_personal.aggregators import names as aggregator_names
from tff_personal.algorithms import registry as algorithm_registry
from tff_personal.attacks import roles as attack_roles
from tff_personal.runtime import context  # pylint: disable=unused-import  # Its import: a quiet exit on bad flags.
from tff_personal.runtime import devices
from tff_personal.runtime import log_levels
from tff_personal.program import sampling
from tff_personal.tasks import options as task_options_lib
from tff_personal.tasks import registry as task_registry

# What is trained.
TASK = flags.DEFINE_enum('task', 'femnist', task_registry.TASK_NAMES, 'Task (data and model).')
ALGORITHM = flags.DEFINE_enum(
    'algorithm', 'fedavg', algorithm_registry.ALGORITHM_NAMES, 'Federated algorithm.'
)
SEED = flags.DEFINE_integer('seed', 0, 'Seeds model init, sampling, data order, partitions.')

# Rounds and clients.
TOTAL_ROUNDS = flags.DEFINE_integer('total_rounds', 10, 'Rounds to train.', lower_bound=1)
CLIENTS_PER_ROUND = flags.DEFINE_integer(
    'clients_per_round', 10, 'Clients sampled per round.', lower_bound=1
)
CLIENT_SAMPLING = flags.DEFINE_enum(
    'client_sampling', 'uniform', list(sampling.CLIENT_SAMPLINGS),
    "How a round's clients are drawn (without replacement): uniformly, or each"
    " in proportion to its training examples, as Ditto's and FedProx's code"
    ' (not with DP, whose accounting assumes uniform sampling).',
)
CLIENT_EPOCHS = flags.DEFINE_integer('client_epochs', 1, 'Local epochs per round.', lower_bound=1)
CLIENT_STEPS = flags.DEFINE_integer(
    'client_steps', 0,
    "Local SGD steps per round: at most this many batches of the round's epochs; 0: all.",
    lower_bound=0,
)
CLIENT_BATCH_SIZE = flags.DEFINE_integer('client_batch_size', 20, 'Local batch size.', lower_bound=1)
CLIENT_LEARNING_RATE = flags.DEFINE_float(
    'client_learning_rate', 0.02, 'Client SGD learning rate.', lower_bound=0.0
)
SERVER_LEARNING_RATE = flags.DEFINE_float(
    'server_learning_rate', 1.0, 'Server SGD learning rate.', lower_bound=0.0
)

POPULATION = flags.DEFINE_integer(
    'population', 0, 'Use only a fixed seeded subset of this many clients; 0 = all.',
    lower_bound=0,
)

AGGREGATOR = flags.DEFINE_enum(
    'aggregator', 'mean', aggregator_names.AGGREGATOR_NAMES,
    'Aggregator of the clients\' shared updates.',
)
AGGREGATOR_NUM_ADVERSARIES = flags.DEFINE_integer(
    'aggregator_num_adversaries', 0, 'Krum / multi-Krum: assumed adversaries f.',
    lower_bound=0,
)
AGGREGATOR_TRIM_FRACTION = flags.DEFINE_float(
    'aggregator_trim_fraction', 0.1, 'Trimmed mean: fraction dropped per side.',
    lower_bound=0.0, upper_bound=0.49,
)
AGGREGATOR_NUM_SELECTED = flags.DEFINE_integer(
    'aggregator_num_selected', None, 'Multi-Krum: updates averaged (default n - f).',
    lower_bound=1,
)
AGGREGATOR_K = flags.DEFINE_integer(
    'aggregator_k', 1, 'k-norm: largest-norm updates dropped.', lower_bound=0
)
AGGREGATOR_CLIP_NORM = flags.DEFINE_float(
    'aggregator_clip_norm', None, 'Norm clipping: C; default: adaptive.',
    lower_bound=0.0,
)
AGGREGATOR_TARGET_QUANTILE = flags.DEFINE_float(
    'aggregator_target_quantile', 0.5, 'Adaptive norm clipping: target quantile.',
    lower_bound=0.0, upper_bound=1.0,
)

# Simulated malicious clients (Ditto's threat model).
ATTACK = flags.DEFINE_enum(
    'attack', 'none', attack_roles.ATTACK_NAMES,
    'label_poison (A1), random_update (A2) or model_replacement (A3).',
)
ATTACK_FRACTION = flags.DEFINE_float(
    'attack_fraction', 0.0, 'Share of the population that is malicious, in [0, 1).'
)
flags.register_validator(
    'attack_fraction', lambda value: 0.0 <= value < 1.0,
    message='--attack_fraction must be in [0, 1)',
)
ATTACK_BOOST = flags.DEFINE_float(
    'attack_boost', None,
    'model_replacement: factor of the update; default: --clients_per_round.',
    lower_bound=0.0,
)
ATTACK_POISON_LABELS = flags.DEFINE_bool(
    'attack_poison_labels', False,
    'random_update, model_replacement: the adversaries train on uniformly random'
    ' labels, so the update they replace with noise or boost is a poisoned one'
    " (Ditto's code does so under every attack); default: their honest update.",
)
flags.register_multi_flags_validator(
    ['attack_poison_labels', 'attack'],
    lambda values: not values['attack_poison_labels'] or values['attack'] in attack_roles.UPDATE_ATTACKS,
    message='--attack_poison_labels applies to --attack=random_update or model_replacement'
    ' (label_poison poisons the labels already).',
)

# User-level differential privacy (McMahan et al. 2018), aggregators/dp.py.
DP_CLIP_NORM = flags.DEFINE_float(
    'dp_clip_norm', None, 'DP with fixed clipping of every update to this L2 norm.'
)
flags.register_validator(
    'dp_clip_norm', lambda value: value is None or value > 0,
    message='--dp_clip_norm must be > 0.',
)
DP_ADAPTIVE_CLIPPING = flags.DEFINE_bool(
    'dp_adaptive_clipping', False,
    'DP with adaptive clipping to --dp_target_quantile of the update norms.',
)
DP_INITIAL_CLIP_NORM = flags.DEFINE_float(
    'dp_initial_clip_norm', 0.1, 'Adaptive clipping: the initial clip norm.'
)
flags.register_validator(
    'dp_initial_clip_norm', lambda value: value > 0,
    message='--dp_initial_clip_norm must be > 0.',
)
DP_TARGET_QUANTILE = flags.DEFINE_float(
    'dp_target_quantile', 0.5, 'Adaptive clipping: target quantile of update norms.'
)
flags.register_validator(
    'dp_target_quantile', lambda value: 0 < value < 1,
    message='--dp_target_quantile must be in (0, 1).',
)
DP_NOISE_MULTIPLIER = flags.DEFINE_float(
    'dp_noise_multiplier', None,
    'DP: noise std / clip norm (default 0: clipping only, epsilon = inf).',
    lower_bound=0.0,
)
DP_TARGET_EPSILON = flags.DEFINE_float(
    'dp_target_epsilon', None,
    'DP: calibrate the noise multiplier so that epsilon after --total_rounds'
    ' is this (instead of --dp_noise_multiplier).',
)
flags.register_validator(
    'dp_target_epsilon', lambda value: value is None or value > 0,
    message='--dp_target_epsilon must be > 0.',
)
DP_NOISE_SEED = flags.DEFINE_integer(
    'dp_noise_seed', None,
    'DP: draw the noise (with adaptive clipping, that of the clip\'s estimate too)'
    ' from this seed, so that a run repeats and resumes with the same noise'
    ' (privacy/seeded_query.py). For simulations'
    " only: whoever knows the seed can remove the noise. Default: TFF's unseeded noise.",
)
DP_DELTA = flags.DEFINE_float(
    'dp_delta', None, 'DP: delta of the reported epsilon; default 1 / N^1.1 (N clients).'
)
flags.register_validator(
    'dp_delta', lambda value: value is None or 0 < value < 1,
    message='--dp_delta must be in (0, 1).',
)

# Negative Federated Learning detection (LINDT, Lin et al. 2020), nfl/detector.py.
NFL_DETECTION = flags.DEFINE_bool(
    'nfl_detection', False,
    'Run the NFL detector in the server update (any algorithm): w_div and the'
    ' flag are metrics every round.',
)
NFL_WARMUP_ROUNDS = flags.DEFINE_integer(
    'nfl_warmup_rounds', 5, 'NFL detector: rounds before any flag.', lower_bound=0
)
NFL_WINDOW = flags.DEFINE_integer(
    'nfl_window', 3, 'NFL detector: moving window of w_div (rounds).', lower_bound=1
)
NFL_COHORT_CORRECTION = flags.DEFINE_bool(
    'nfl_cohort_correction', True,
    'NFL detector: divide the cohort divergence by 1 - sum of squared'
    ' aggregation weights ((K-1)/K for K equal clients), so that w_div does not'
    " shrink with the clients a round (False: the plain cohort formula).",
)
NFL_FLAG_WHEN_BLIND = flags.DEFINE_bool(
    'nfl_flag_when_blind', True,
    'NFL detector under DP: when the noise in its windowed statistic exceeds the'
    ' largest possible divergence (nfl/detector.py, noise_to_signal > 1), flag NFL'
    ' at the first round it may (fails closed); False: only w_div flags.',
)
NFL_THRESHOLD = flags.DEFINE_float(
    'nfl_threshold', 0.05,
    'NFL detector: NFL when the windowed w_div is not below this after the'
    ' warm-up (calibrate on an IID, clean run of the task).',
    lower_bound=0.0,
)

# Evaluation, checkpoints and outputs.
FINETUNE_EPOCHS = flags.DEFINE_integer(
    'finetune_epochs', 0,
    "Fine-tuning baseline: epochs of SGD on a client's own training data before"
    ' it is evaluated (the model as trained is reported too, as'
    ' before_finetune); 0: none.',
    lower_bound=0,
)
FINETUNE_LEARNING_RATE = flags.DEFINE_float(
    'finetune_learning_rate', None,
    "The fine-tuning SGD's learning rate; default: --client_learning_rate.",
)
flags.register_validator(
    'finetune_learning_rate',
    lambda rate: rate is None or rate > 0,
    message='--finetune_learning_rate must be > 0.',
)
ROUNDS_PER_EVAL = flags.DEFINE_integer(
    'rounds_per_eval', 5, 'Per-client evaluation every this many rounds.', lower_bound=1
)
ROUNDS_PER_CHECKPOINT = flags.DEFINE_integer(
    'rounds_per_checkpoint', 5, 'Checkpoint every this many rounds.', lower_bound=1
)
ROUNDS_PER_CALL = flags.DEFINE_integer(
    'rounds_per_call', 1,
    'local, with every client in every round (--clients_per_round = the population):'
    ' up to this many rounds in one TFF call, each client on its batches of those rounds'
    ' in sequence; the same models, the per-call cost paid once (calls end at evaluation'
    ' and checkpoint rounds). 1: a call a round.',
    lower_bound=1,
)
flags.register_multi_flags_validator(
    ['rounds_per_call', 'algorithm', 'nfl_detection'],
    lambda values: values['rounds_per_call'] == 1
    or (values['algorithm'] == 'local' and not values['nfl_detection']),
    message='--rounds_per_call > 1 needs --algorithm=local without --nfl_detection (clients'
    ' that train independently of each other and of the server).',
)
EVAL_CLIENTS = flags.DEFINE_integer(
    'eval_clients', 0, 'Clients evaluated (fixed seeded subset); 0 = all.', lower_bound=0
)
EVAL_BATCH_SIZE = flags.DEFINE_integer('eval_batch_size', 64, 'Evaluation batch size.', lower_bound=1)
ROOT_OUTPUT_DIR = flags.DEFINE_string('root_output_dir', 'output', 'Root of all outputs.')
EXPERIMENT_NAME = flags.DEFINE_string(
    'experiment_name', None, 'Output subfolder; default <task>_<algorithm>_seed<seed>.'
)
WORKERS = flags.DEFINE_string(
    'workers', None,
    'Run on remote TFF workers (bin/worker.py) at host:port,host:port,...; each'
    " round's clients are spread over them. Default: a local worker. Not part of"
    ' the run: a run may resume on other workers or locally.',
)
SPLIT_ROUNDS = flags.DEFINE_boolean(
    'split_rounds', True,
    'With two or more --workers: run each round as two calls where the algorithm'
    ' offers it (README, "Remote TFF workers"), the clients\' work on the workers and'
    ' then the aggregation of their returned updates on this machine\'s TFF worker.'
    ' Each client trains once and its update crosses the network once;'
    ' --nosplit_rounds calls `next`, which TFF 0.87 runs on several workers with'
    ' every client trained twice and only aggregates returned. Not part of the run.',
)
DEVICE, WORKER_BINARY = device_flags.define_device_flags(
    ' Local runs only: with --workers, set it on each bin/worker.py. Not part of the run.'
)

# Data of the tasks.
CACHE_DIR = flags.DEFINE_string(
    'cache_dir', task_options_lib.DEFAULT_CACHE_DIR, "TFF's dataset cache (<cache_dir>/<name>.sqlite)."
)
DATA_DIR = flags.DEFINE_string(
    'data_dir', task_options_lib.DEFAULT_FMNIST_DIR, 'Folder of idx files (fmnist, mnist).'
)
FEMNIST_PATH = flags.DEFINE_string(
    'femnist_path', task_options_lib.DEFAULT_FEMNIST_PATH, 'The FEMNIST sample (femnist105.npz).'
)
PARTITION = flags.DEFINE_enum(
    'partition', 'k_classes', task_options_lib.PARTITIONS, 'Synthetic partition (fmnist, mnist).'
)
NUM_CLIENTS = flags.DEFINE_integer(
    'num_clients', 10, 'Clients of a synthetic partition.', lower_bound=1
)
CLASSES_PER_CLIENT = flags.DEFINE_integer(
    'classes_per_client', 2, 'Classes per client (k_classes, ditto).', lower_bound=1
)
DIRICHLET_ALPHA = flags.DEFINE_float(
    'dirichlet_alpha', 0.5, 'Concentration of the dirichlet partition.', lower_bound=0.0
)
TEST_FRACTION = flags.DEFINE_float(
    'test_fraction', 0.2, "Share of a client's examples in its own test split.",
    lower_bound=0.0, upper_bound=1.0,
)
STACKOVERFLOW_TASK = flags.DEFINE_enum(
    'stackoverflow_task', 'word', task_options_lib.STACKOVERFLOW_TASKS, 'StackOverflow task.'
)
STACKOVERFLOW_VOCAB_SOURCE = flags.DEFINE_enum(
    'stackoverflow_vocab_source', 'auto', task_options_lib.STACKOVERFLOW_VOCAB_SOURCES,
    "Vocabularies from TFF's count files, from the training clients, or auto.",
)
SEQUENCE_LENGTH = flags.DEFINE_integer(
    'sequence_length', 0, 'Tokens per example of text tasks; 0 = task default.', lower_bound=0
)
CNN = flags.DEFINE_enum(
    'cnn', 'fedavg', task_options_lib.CNNS,
    "CNN of emnist and femnist: fedavg (McMahan et al. 2017, 1.7M parameters) or ditto"
    " (Ditto's code's FEMNIST CNN: 16/32 channels, 128 units, dropout 0.25/0.5; 0.2M).",
)



def _attribute_help(docstring: str) -> dict[str, str]:
  """{attribute: its text} from a Google-style `Attributes:` section."""
  section = docstring.split('Attributes:', 1)[1] if 'Attributes:' in docstring else ''
  found, name = {}, None
  for line in section.splitlines():
    match = re.match(r'^\s{4}(\w+): (.*)$', line)
    if match:
      name = match.group(1)
      found[name] = match.group(2)
    elif name and line.strip():
      found[name] += ' ' + line.strip()
  return found


def _is_number_list(lower):
  def check(values):
    try:
      return all(lower is None or float(v) >= lower for v in values)
    except ValueError:
      return False
  return check


def _define_hparam_flag(flag_name: str, field: dataclasses.Field, text: str):
  """The absl flag of one `Hparams` field (module docstring)."""
  kind = field.type
  if typing.get_origin(kind) is typing.Union:  # Optional[X]
    kind = next(a for a in typing.get_args(kind) if a is not type(None))
  meta = field.metadata
  bounds = {'lower_bound': meta.get('lower'), 'upper_bound': meta.get('upper')}
  if meta.get('choices'):
    return flags.DEFINE_enum(flag_name, field.default, meta['choices'], text)
  if kind is bool:
    return flags.DEFINE_bool(flag_name, field.default, text)
  if kind is int:
    return flags.DEFINE_integer(flag_name, field.default, text, **bounds)
  if kind is float:
    return flags.DEFINE_float(flag_name, field.default, text, **bounds)
  if typing.get_origin(kind) is tuple:
    holder = flags.DEFINE_list(flag_name, list(map(str, field.default)), text)
    bound = f' >= {meta["lower"]}' if meta.get('lower') is not None else ''
    flags.register_validator(
        flag_name, _is_number_list(meta.get('lower')),
        message=f'--{flag_name} must be a comma-separated list of numbers{bound}.',
    )
    return holder
  raise TypeError(f'No flag type for {flag_name}: {field.type}')


def _define_algorithm_flags() -> dict[str, dict[str, flags.FlagHolder]]:
  """{algorithm: {Hparams field: its flag}} for every registered algorithm."""
  holders = {}
  for name in algorithm_registry.ALGORITHM_NAMES:
    hparams = algorithm_registry.module(name).Hparams
    texts = _attribute_help(hparams.__doc__ or '')
    holders[name] = {
        field.name: _define_hparam_flag(
            f'{name}_{field.name.rstrip("_")}', field, f'{name}: {texts.get(field.name, "")}'
        )
        for field in dataclasses.fields(hparams)
    }
  return holders


ALGORITHM_FLAGS = _define_algorithm_flags()


def hparams():
  """The `Hparams` of --algorithm from its flags."""
  module = algorithm_registry.module(ALGORITHM.value)
  values = {}
  for field in dataclasses.fields(module.Hparams):
    value = ALGORITHM_FLAGS[ALGORITHM.value][field.name].value
    if isinstance(value, list):
      value = tuple(float(v) for v in value)
    values[field.name] = value
  return module.Hparams(**values)


# The flags that define a run (a resumed run must agree on them, except the
# cadence of evaluation, checkpoints and calls, and the number of rounds).
_RUN_FLAGS = (
    TASK, ALGORITHM, SEED, TOTAL_ROUNDS, POPULATION, CLIENTS_PER_ROUND, CLIENT_SAMPLING,
    CLIENT_EPOCHS, CLIENT_STEPS, CLIENT_BATCH_SIZE, CLIENT_LEARNING_RATE, SERVER_LEARNING_RATE,
    ROUNDS_PER_EVAL, ROUNDS_PER_CHECKPOINT, ROUNDS_PER_CALL, EVAL_CLIENTS, EVAL_BATCH_SIZE,
    CACHE_DIR, DATA_DIR, FEMNIST_PATH, PARTITION, NUM_CLIENTS,
    CLASSES_PER_CLIENT, DIRICHLET_ALPHA, TEST_FRACTION, STACKOVERFLOW_TASK,
    STACKOVERFLOW_VOCAB_SOURCE, SEQUENCE_LENGTH, CNN,
    *(holder for by_field in ALGORITHM_FLAGS.values() for holder in by_field.values()),
    AGGREGATOR, AGGREGATOR_NUM_ADVERSARIES, AGGREGATOR_TRIM_FRACTION,
    AGGREGATOR_NUM_SELECTED, AGGREGATOR_K, AGGREGATOR_CLIP_NORM,
    AGGREGATOR_TARGET_QUANTILE, ATTACK, ATTACK_FRACTION, ATTACK_BOOST, ATTACK_POISON_LABELS,
    DP_CLIP_NORM, DP_ADAPTIVE_CLIPPING, DP_INITIAL_CLIP_NORM,
    DP_TARGET_QUANTILE, DP_NOISE_MULTIPLIER, DP_TARGET_EPSILON, DP_NOISE_SEED, DP_DELTA,
    NFL_DETECTION,
    NFL_WARMUP_ROUNDS, NFL_WINDOW, NFL_THRESHOLD, NFL_COHORT_CORRECTION, NFL_FLAG_WHEN_BLIND,
    FINETUNE_EPOCHS,
    FINETUNE_LEARNING_RATE,
)


class UsageError(Exception):
  """Bad input; the message names the flag and what is allowed."""


def exit_with_error(message: str, code: int = 2) -> NoReturn:
  """Prints `<program>: error: <message>` on one line and exits with `code`.

  Code 2 (the default) is bad input; a run that fails (diverges) uses 1.
  """
  print(
      f'{os.path.basename(sys.argv[0])}: error: {" ".join(str(message).split())}',
      file=sys.stderr,
      flush=True,
  )
  sys.exit(code)


def parse_flags_or_exit(argv: list[str]) -> list[str]:
  """An absl `flags_parser`: bad flags on one line with exit code 2, quiet logs.

  TensorFlow's and TFF's INFO lines stay hidden unless --verbosity is given
  (`runtime.log_levels`).
  """
  try:
    remaining = flags.FLAGS(argv)
  except flags.Error as e:
    exit_with_error(e)
  log_levels.quiet_python_logs(verbosity_set=flags.FLAGS['verbosity'].present > 0)
  return remaining


def task_options() -> task_options_lib.TaskOptions:
  return task_options_lib.TaskOptions(
      seed=SEED.value,
      # Absolute: the datasets' graphs name the SQLite files, and TFF's
      # workers open them from their own working directories.
      cache_dir=os.path.abspath(os.path.expanduser(CACHE_DIR.value)),
      data_dir=DATA_DIR.value,
      femnist_path=FEMNIST_PATH.value,
      partition=PARTITION.value,
      num_clients=NUM_CLIENTS.value,
      classes_per_client=CLASSES_PER_CLIENT.value,
      dirichlet_alpha=DIRICHLET_ALPHA.value,
      test_fraction=TEST_FRACTION.value,
      stackoverflow_task=STACKOVERFLOW_TASK.value,
      stackoverflow_vocab_source=STACKOVERFLOW_VOCAB_SOURCE.value,
      sequence_length=SEQUENCE_LENGTH.value,
      cnn=CNN.value,
  )


def setup(dp_noise_multiplier: float = 0.0) -> algorithm_registry.Setup:
  """The algorithm registry's `Setup` of the flags (DP's noise as resolved)."""
  return algorithm_registry.Setup(
      client_learning_rate=CLIENT_LEARNING_RATE.value,
      server_learning_rate=SERVER_LEARNING_RATE.value,
      seed=SEED.value,
      clients_per_round=CLIENTS_PER_ROUND.value,
      total_rounds=TOTAL_ROUNDS.value,
      aggregator=AGGREGATOR.value,
      aggregator_num_adversaries=AGGREGATOR_NUM_ADVERSARIES.value,
      aggregator_trim_fraction=AGGREGATOR_TRIM_FRACTION.value,
      aggregator_num_selected=AGGREGATOR_NUM_SELECTED.value,
      aggregator_k=AGGREGATOR_K.value,
      aggregator_clip_norm=AGGREGATOR_CLIP_NORM.value,
      aggregator_target_quantile=AGGREGATOR_TARGET_QUANTILE.value,
      attack=ATTACK.value,
      attack_fraction=ATTACK_FRACTION.value,
      attack_boost=ATTACK_BOOST.value,
      dp_clip_norm=DP_CLIP_NORM.value,
      dp_adaptive_clipping=DP_ADAPTIVE_CLIPPING.value,
      dp_initial_clip_norm=DP_INITIAL_CLIP_NORM.value,
      dp_target_quantile=DP_TARGET_QUANTILE.value,
      dp_noise_multiplier=dp_noise_multiplier,
      dp_noise_seed=DP_NOISE_SEED.value,
      nfl_detection=NFL_DETECTION.value,
      nfl_warmup_rounds=NFL_WARMUP_ROUNDS.value,
      nfl_window=NFL_WINDOW.value,
      nfl_threshold=NFL_THRESHOLD.value,
      nfl_cohort_correction=NFL_COHORT_CORRECTION.value,
      nfl_flag_when_blind=NFL_FLAG_WHEN_BLIND.value,
      client_steps=CLIENT_STEPS.value,
  )


class DpSettings(NamedTuple):
  """The noise multiplier and delta a DP run uses (resolved from the flags)."""

  noise_multiplier: float
  delta: float


class Algorithm(NamedTuple):
  """The process of the flags and the DP it was built with (None: no DP)."""

  process: Any
  dp: Optional[DpSettings]


def training_config(dp: Optional[DpSettings] = None):
  """The `training_loop.TrainingConfig` of the flags, with DP's resolved noise."""
  from tff_personal.program import training_loop  # pylint: disable=g-import-not-at-top

  return training_loop.TrainingConfig(
      total_rounds=TOTAL_ROUNDS.value,
      clients_per_round=CLIENTS_PER_ROUND.value,
      client_sampling=CLIENT_SAMPLING.value,
      client_epochs=CLIENT_EPOCHS.value,
      client_steps=CLIENT_STEPS.value,
      client_batch_size=CLIENT_BATCH_SIZE.value,
      rounds_per_eval=ROUNDS_PER_EVAL.value,
      rounds_per_checkpoint=ROUNDS_PER_CHECKPOINT.value,
      rounds_per_call=ROUNDS_PER_CALL.value,
      population=POPULATION.value,
      eval_clients=EVAL_CLIENTS.value,
      eval_batch_size=EVAL_BATCH_SIZE.value,
      seed=SEED.value,
      attack=ATTACK.value,
      attack_fraction=ATTACK_FRACTION.value,
      attack_poison_labels=ATTACK_POISON_LABELS.value,
      dp_noise_multiplier=dp.noise_multiplier if dp else None,
      dp_delta=dp.delta if dp else None,
      dp_with_detector=bool(dp) and NFL_DETECTION.value,
      finetune_epochs=FINETUNE_EPOCHS.value,
      finetune_learning_rate=(
          CLIENT_LEARNING_RATE.value
          if FINETUNE_LEARNING_RATE.value is None
          else FINETUNE_LEARNING_RATE.value
      ),
  )


def experiment_name() -> str:
  return EXPERIMENT_NAME.value or f'{TASK.value}_{ALGORITHM.value}_seed{SEED.value}'


def run_config(dp: Optional[DpSettings] = None) -> dict[str, Any]:
  """The flags that define the run, by name (and DP's resolved noise and delta)."""
  config = {holder.name: holder.value for holder in _RUN_FLAGS}
  if dp:
    config['dp_resolved_noise_multiplier'] = dp.noise_multiplier
    config['dp_resolved_delta'] = dp.delta
  return config


def run_config_defaults() -> dict[str, Any]:
  """Each `run_config` flag's default, by name."""
  return {holder.name: holder.default for holder in _RUN_FLAGS}


def _flag_line(holder) -> str:
  """`--name=value` as absl parses it back (bools `--[no]name`, lists joined)."""
  if isinstance(holder.value, bool):
    return f'--{"" if holder.value else "no"}{holder.name}'
  if isinstance(holder.value, (list, tuple)):
    return f'--{holder.name}={",".join(map(str, holder.value))}'
  return f'--{holder.name}={holder.value}'


def resolved_flagfile() -> str:
  """A flagfile of every experiment flag's value (reruns the same run)."""
  lines = [_flag_line(holder) for holder in _RUN_FLAGS if holder.value is not None]
  lines += [
      f'--root_output_dir={ROOT_OUTPUT_DIR.value}',
      f'--experiment_name={experiment_name()}',
  ]
  return '\n'.join(lines) + '\n'


def check_output_dir_writable(path: str, flag: Any = None) -> None:
  """Raises `UsageError` naming `flag` (--root_output_dir) if `path` is not writable."""
  flag = ROOT_OUTPUT_DIR if flag is None else flag
  try:
    os.makedirs(path, exist_ok=True)
    probe = os.path.join(path, '.write_test')
    with open(probe, 'w') as f:
      f.write('ok')
    os.remove(probe)
  except OSError as e:
    raise UsageError(
        f'--{flag.name}={flag.value}: cannot write {path} ({e.strerror or e}).'
    ) from e


@contextlib.contextmanager
def exit_on_errors():
  """Bad input -> one line and exit code 2; a diverged run or a failed store
  write -> exit code 1."""
  from tff_personal.personal import store  # pylint: disable=g-import-not-at-top
  from tff_personal.program import checkpoints  # pylint: disable=g-import-not-at-top
  from tff_personal.program import training_loop  # pylint: disable=g-import-not-at-top
  from tff_personal.tasks import base  # pylint: disable=g-import-not-at-top

  try:
    yield
  except (
      UsageError,
      base.DataUnavailableError,
      training_loop.ResumeError,
      training_loop.UnsupportedConfigError,
      checkpoints.CheckpointMismatchError,
      store.StoreMismatchError,
  ) as e:
    exit_with_error(e)
  except (training_loop.NonFiniteRoundError, store.StoreWriteError) as e:
    exit_with_error(e, code=1)


def install_context(task=None) -> Optional[str]:
  """The TFF execution context of --workers (default: a local worker, --device).

  With --workers and a `task`, every worker must read the first client's
  train and test data (README, "Data on the workers"), or
  `base.DataUnavailableError`. Returns what the local worker trains on
  (`devices.describe`); None with --workers.
  """
  from tff_personal.runtime import context  # pylint: disable=g-import-not-at-top

  if not WORKERS.value:
    _check_split_rounds(0)
    try:
      worker = context.install_local_context(device=DEVICE.value, binary=WORKER_BINARY.value)
    except ValueError as e:  # The binary.
      raise UsageError(f'--worker_binary={WORKER_BINARY.value}: {e}.') from None
    except devices.DeviceError as e:
      raise UsageError(str(e)) from None
    return devices.describe(worker.devices)
  for holder in (DEVICE, WORKER_BINARY):
    if flags.FLAGS[holder.name].present:
      raise UsageError(
          f'--{holder.name} chooses the local worker; with --workers, pass it to each'
          ' bin/worker.py instead.'
      )
  try:
    addresses = context.parse_worker_addresses(WORKERS.value)
  except ValueError as e:
    raise UsageError(f'--workers={WORKERS.value}: {e}.') from None
  _check_split_rounds(len(addresses))
  try:
    context.install_remote_context(addresses)
  except context.WorkerUnavailableError as e:
    raise UsageError(f'--workers={WORKERS.value}: {e}') from None
  if task is not None:
    from tff_personal.tasks import base  # pylint: disable=g-import-not-at-top

    client = task.client_ids[0]
    try:
      context.check_workers_read([
          task.train_dataset(client, epochs=1, batch_size=1, seed=0),
          task.test_dataset(client, batch_size=1),
      ])
    except context.WorkerDataError as e:
      raise base.DataUnavailableError(
          f'--workers={WORKERS.value}: {e} Every worker needs the task\'s files at the same'
          ' paths as this machine (README, "Data on the workers").'
      ) from None
  return None


def _check_split_rounds(num_workers: int) -> None:
  if flags.FLAGS['split_rounds'].present and num_workers < 2:
    raise UsageError(
        f'--{"" if SPLIT_ROUNDS.value else "no"}split_rounds applies to runs on two or more'
        ' --workers (one worker runs `next` once per round).'
    )


def build_task(check_sampling: bool = True):
  """The task of the flags, checked against --population/--clients_per_round."""
  if CNN.value != CNN.default and TASK.value not in task_options_lib.CNN_TASKS:
    raise UsageError(
        f'--cnn={CNN.value} applies to the tasks {", ".join(task_options_lib.CNN_TASKS)};'
        f' task {TASK.value} has its own model.'
    )
  task = task_registry.build_task(TASK.value, task_options())
  if not check_sampling:
    return task
  population = len(task.client_ids)
  if POPULATION.value > population:
    raise UsageError(
        f'--population={POPULATION.value} exceeds the {population} clients'
        f' of task {task.name}; allowed: 0 (all) or 1..{population}.'
    )
  population = POPULATION.value or population
  if CLIENTS_PER_ROUND.value > population:
    raise UsageError(
        f'--clients_per_round={CLIENTS_PER_ROUND.value} exceeds the'
        f' {population} clients of the run; allowed: 1..{population}.'
    )
  return task


def _resolve_dp_flags(task) -> Optional[DpSettings]:
  """Checks the DP flags; calibrates the noise to --dp_target_epsilon."""
  dp_on = DP_CLIP_NORM.value is not None or DP_ADAPTIVE_CLIPPING.value
  if not dp_on:
    for flag in (DP_NOISE_MULTIPLIER, DP_TARGET_EPSILON, DP_NOISE_SEED, DP_DELTA):
      if flag.value is not None:
        raise UsageError(
            f'--{flag.name} needs DP: give --dp_clip_norm or --dp_adaptive_clipping.'
        )
    return None
  if DP_NOISE_MULTIPLIER.value is not None and DP_TARGET_EPSILON.value is not None:
    raise UsageError('Give --dp_noise_multiplier or --dp_target_epsilon, not both.')
  if CLIENT_SAMPLING.value != 'uniform':
    raise UsageError(
        f'--client_sampling={CLIENT_SAMPLING.value} with DP: the privacy accounting'
        ' assumes uniform sampling of clients (--client_sampling=uniform).'
    )
  from tff_personal.privacy import accounting  # pylint: disable=g-import-not-at-top

  population = POPULATION.value or len(task.client_ids)
  delta = DP_DELTA.value or accounting.default_delta(population)
  noise = DP_NOISE_MULTIPLIER.value or 0.0
  if DP_TARGET_EPSILON.value is not None:
    try:
      noise = accounting.calibrate_noise_multiplier(
          DP_TARGET_EPSILON.value, population, CLIENTS_PER_ROUND.value,
          TOTAL_ROUNDS.value, delta, with_detector=NFL_DETECTION.value,
      )
    except accounting.UnreachableEpsilonError as e:
      raise UsageError(f'--dp_target_epsilon={DP_TARGET_EPSILON.value}: {e}') from e
  return DpSettings(noise, delta)


def build_algorithm(task) -> Algorithm:
  """The process of --algorithm for `task`; bad flags -> UsageError.

  What combines with what is checked once, by the algorithm registry.
  """
  dp = _resolve_dp_flags(task)
  try:
    process = algorithm_registry.build_algorithm(
        ALGORITHM.value, task, hparams(), setup(dp.noise_multiplier if dp else 0.0)
    )
  except ValueError as e:  # A combination or hyperparameter the library refuses.
    raise UsageError(str(e)) from e
  return Algorithm(process, dp)


def experiment_dir():
  from tff_personal.program import outputs  # pylint: disable=g-import-not-at-top

  return outputs.ExperimentDir(ROOT_OUTPUT_DIR.value, experiment_name())


def train(task, algorithm: Algorithm) -> dict[str, Any]:
  """Runs (or resumes) the training program of the flags; returns its summary.

  Writes the resolved flags to `flags.txt` and prints a progress line per
  round on stdout.
  """
  from tff_personal.program import training_loop  # pylint: disable=g-import-not-at-top

  experiment = experiment_dir()
  check_output_dir_writable(experiment.path)
  with open(experiment.flags_path, 'w') as f:
    f.write(resolved_flagfile())
  return training_loop.run_training(
      task,
      algorithm.process,
      training_config(algorithm.dp),
      experiment,
      run_config=run_config(algorithm.dp),
      run_config_defaults=run_config_defaults(),
      progress_stream=sys.stdout,
      split_rounds=SPLIT_ROUNDS.value,
  )
