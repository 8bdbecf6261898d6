"""The algorithms by name, and the one place that checks what combines with what.

Each name maps to an algorithm module (`algorithms.common` says what one
exports); adding an algorithm adds one line to `_MODULES`. `Setup` holds,
as plain values, what a run sets besides the algorithm's own
hyperparameters (its names are the binaries' flags); `check` refuses the
combinations that cannot work, with a message naming the flags, and
`build_algorithm` checks, resolves the task's defaults and builds.

Importing this module imports no TensorFlow (the flags list the names);
the algorithm modules are imported when first asked for.
"""

import dataclasses
import importlib
from typing import Any, Optional

_MODULES = {
    'fedavg': 'tff_personal.algorithms.fedavg',
    'local': 'tff_personal.algorithms.local',
    'fedper': 'tff_personal.algorithms.fedper',
    'ditto': 'tff_personal.algorithms.ditto',
    'fedprox': 'tff_personal.algorithms.fedprox',
    'apfl': 'tff_personal.algorithms.apfl',
    'lindt': 'tff_personal.algorithms.lindt',
    'qffl': 'tff_personal.algorithms.qffl',
    'term': 'tff_personal.algorithms.term',
}
ALGORITHM_NAMES = tuple(_MODULES)


def module(name: str):
  """The module of algorithm `name` (`Hparams`, `CAPABILITIES`, `build`)."""
  if name not in _MODULES:
    raise ValueError(f'Unknown algorithm {name!r}; allowed: {", ".join(ALGORITHM_NAMES)}.')
  return importlib.import_module(_MODULES[name])


@dataclasses.dataclass(frozen=True)
class Setup:
  """What a run sets besides the algorithm's own hyperparameters.

  The names are the binaries' flags (`bin/train.py --helpfull` explains
  each); `None` means unset. `total_rounds` and `attack_fraction` only
  enter the checks.
  """

  client_learning_rate: float = 0.02
  server_learning_rate: float = 1.0
  seed: int = 0
  clients_per_round: int = 10
  total_rounds: Optional[int] = None
  aggregator: str = 'mean'
  aggregator_num_adversaries: int = 0
  aggregator_trim_fraction: float = 0.1
  aggregator_num_selected: Optional[int] = None
  aggregator_k: int = 1
  aggregator_clip_norm: Optional[float] = None
  aggregator_target_quantile: float = 0.5
  attack: str = 'none'
  attack_fraction: float = 0.0
  attack_boost: Optional[float] = None
  dp_clip_norm: Optional[float] = None
  dp_adaptive_clipping: bool = False
  dp_initial_clip_norm: float = 0.1
  dp_target_quantile: float = 0.5
  dp_noise_multiplier: float = 0.0
  dp_noise_seed: Optional[int] = None
  nfl_detection: bool = False
  nfl_warmup_rounds: int = 5
  nfl_window: int = 3
  nfl_threshold: float = 0.05
  nfl_cohort_correction: bool = True
  nfl_flag_when_blind: bool = True
  client_steps: int = 0

  @property
  def differentially_private(self) -> bool:
    return self.dp_clip_norm is not None or self.dp_adaptive_clipping


_DP_REFUSAL = {
    'norm_clip': 'DP already clips every update (--dp_clip_norm)',
    'tff_robust': "its adaptive zeroing estimates the clients' norms without noise, which"
                  ' the accountant does not cover',
}


def _aggregator_problem(name: str, setup: Setup, shares_model: bool) -> Optional[str]:
  aggregator, clients = setup.aggregator, setup.clients_per_round
  if aggregator == 'mean':
    return None
  if not shares_model:
    return f'--aggregator={aggregator}: --algorithm={name} aggregates no update.'
  needed = 2 * setup.aggregator_num_adversaries + 2
  if aggregator in ('krum', 'multi_krum') and clients <= needed:
    return (f'--aggregator={aggregator} needs --clients_per_round > 2 *'
            f' --aggregator_num_adversaries + 2 = {needed}, got --clients_per_round={clients}.')
  if aggregator == 'k_norm' and setup.aggregator_k >= clients:
    return (f'--aggregator_k={setup.aggregator_k} must be below --clients_per_round={clients}'
            ' (k-norm drops k updates).')
  if aggregator == 'norm_clip' and setup.aggregator_clip_norm == 0.0:
    return '--aggregator_clip_norm must be > 0 (or unset: adaptive).'
  return None


def _dp_problem(name: str, setup: Setup, shares_model: bool) -> Optional[str]:
  if not setup.differentially_private:
    return None
  if setup.dp_clip_norm is not None and setup.dp_adaptive_clipping:
    return '--dp_clip_norm and --dp_adaptive_clipping exclude each other.'
  if not shares_model:
    return f'--algorithm={name} sends no update: DP has nothing to protect.'
  if setup.aggregator != 'mean':
    reason = _DP_REFUSAL.get(
        setup.aggregator,
        'a server-side robust rule reads individual updates, so its output has no DP guarantee',
    )
    return (f'--aggregator={setup.aggregator} cannot be combined with DP: {reason}; DP clips'
            ' and averages by itself (use --aggregator=mean).')
  noise = setup.dp_noise_multiplier
  if setup.dp_adaptive_clipping and noise >= 0.1 * setup.clients_per_round:
    return (f'--dp_adaptive_clipping with noise multiplier {noise:.4g} needs'
            f' --clients_per_round > {noise / 0.1:.4g}: the clip estimate\'s own noise'
            ' (0.05 * clients per round) must stay below half the total.')
  return None


def _nfl_problem(name: str, setup: Setup, nfl_capable: bool) -> Optional[str]:
  if not setup.nfl_detection:
    return None
  if not nfl_capable:
    return f'--nfl_detection: --algorithm={name} cannot run the NFL detector.'
  if setup.total_rounds is not None and setup.nfl_window > setup.total_rounds:
    return (f'--nfl_window={setup.nfl_window} exceeds --total_rounds={setup.total_rounds}:'
            ' the window would never fill.')
  if setup.dp_adaptive_clipping:
    return ("--nfl_detection with --dp_adaptive_clipping: the detector's noise correction"
            ' needs a fixed --dp_clip_norm.')
  return None


def _weights_problem(name: str, setup: Setup, sets_update_weights: bool) -> Optional[str]:
  if not sets_update_weights or (setup.aggregator == 'mean' and not setup.differentially_private):
    return None
  what = '--dp_clip_norm/--dp_adaptive_clipping' if setup.differentially_private else (
      f'--aggregator={setup.aggregator}')
  return (f'{what}: --algorithm={name} weighs the updates by its own rule, which only the'
          ' weighted mean (--aggregator=mean, no DP) keeps.')


def _attack_problem(setup: Setup) -> Optional[str]:
  if setup.attack != 'none' and setup.attack_fraction == 0.0:
    return f'--attack={setup.attack} needs --attack_fraction in (0, 1), got 0.'
  return None


def check(name: str, setup: Setup) -> None:
  """Raises ValueError, naming the flags, if `setup` cannot run algorithm `name`."""
  capabilities = module(name).CAPABILITIES
  problem = (
      _weights_problem(name, setup, capabilities.sets_update_weights)
      or _aggregator_problem(name, setup, capabilities.shares_model)
      or _dp_problem(name, setup, capabilities.shares_model)
      or _nfl_problem(name, setup, capabilities.nfl_detection)
      or _attack_problem(setup)
  )
  if problem:
    raise ValueError(problem)


def common_options(setup: Setup):
  """The `algorithms.common.Common` of a checked `setup` (aggregators built)."""
  from tff_personal.aggregators import dp  # pylint: disable=g-import-not-at-top
  from tff_personal.aggregators import robust  # pylint: disable=g-import-not-at-top
  from tff_personal.algorithms import common  # pylint: disable=g-import-not-at-top
  from tff_personal.nfl import detector  # pylint: disable=g-import-not-at-top

  model_aggregator = None
  if setup.differentially_private:
    model_aggregator = dp.build_dp_aggregator(
        noise_multiplier=setup.dp_noise_multiplier,
        clients_per_round=setup.clients_per_round,
        clip_norm=setup.dp_clip_norm,
        adaptive=setup.dp_adaptive_clipping,
        initial_clip_norm=setup.dp_initial_clip_norm,
        target_quantile=setup.dp_target_quantile,
        noise_seed=setup.dp_noise_seed,
    )
  elif setup.aggregator != 'mean':
    model_aggregator = robust.build_aggregator(
        setup.aggregator,
        clients_per_round=setup.clients_per_round,
        num_adversaries=setup.aggregator_num_adversaries,
        trim_fraction=setup.aggregator_trim_fraction,
        num_selected=setup.aggregator_num_selected,
        k=setup.aggregator_k,
        clip_norm=setup.aggregator_clip_norm,
        target_quantile=setup.aggregator_target_quantile,
    )
  dp_setting = None
  if setup.dp_clip_norm is not None:
    dp_setting = dp.DpSetting(
        setup.dp_noise_multiplier, setup.dp_clip_norm, setup.clients_per_round,
        setup.dp_noise_seed,
    )
  nfl_detector = None
  if setup.nfl_detection:
    nfl_detector = detector.DetectorConfig(
        warmup_rounds=setup.nfl_warmup_rounds,
        window=setup.nfl_window,
        threshold=setup.nfl_threshold,
        cohort_correction=setup.nfl_cohort_correction,
        flag_when_blind=setup.nfl_flag_when_blind,
    )
  attack_boost = setup.attack_boost
  return common.Common(
      client_learning_rate=setup.client_learning_rate,
      server_learning_rate=setup.server_learning_rate,
      seed=setup.seed,
      model_aggregator=model_aggregator,
      attack_boost=float(setup.clients_per_round if attack_boost is None else attack_boost),
      nfl_detector=nfl_detector,
      dp_setting=dp_setting,
      client_steps=setup.client_steps,
  )


def build_algorithm(name: str, task, hparams: Any = None, setup: Setup = Setup()):
  """The `PersonalizedProcess` of algorithm `name` on `task`'s model.

  `hparams`: the algorithm's `Hparams` (None: its defaults), completed with
  the task's defaults (`for_task`). Raises ValueError for a combination
  `check` refuses or hyperparameters the algorithm refuses.
  """
  algorithm = module(name)
  check(name, setup)
  if hparams is None:
    hparams = algorithm.Hparams()
  if hasattr(algorithm, 'for_task'):
    hparams = algorithm.for_task(hparams, task)
  return algorithm.build(task.model, hparams, common_options(setup))
