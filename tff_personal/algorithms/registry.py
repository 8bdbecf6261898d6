"""Algorithm names and the options their builders take."""

import dataclasses
from typing import TYPE_CHECKING, Optional

if TYPE_CHECKING:  # The registry itself imports no TensorFlow (fast flag checks).
  from tff_personal.personal import process as process_lib
  from tff_personal.tasks import base

ALGORITHM_NAMES = ('fedavg', 'local', 'fedper', 'ditto', 'fedprox', 'apfl', 'lindt')
# Algorithms whose client computation takes an attack role (update attacks).
ROLE_ALGORITHMS = ('fedavg', 'fedper', 'ditto', 'apfl', 'lindt')
# Algorithms that can run under update attacks: the above, and Local, whose
# clients send nothing (its adversaries are only left out of benign metrics).
UPDATE_ATTACK_ALGORITHMS = ROLE_ALGORITHMS + ('local',)
# Algorithms whose server can run the NFL detector (`nfl.detector`).
DETECTOR_ALGORITHMS = ROLE_ALGORITHMS
# Algorithms whose shared update goes through `--aggregator`.
AGGREGATING_ALGORITHMS = ('fedavg', 'fedper', 'ditto', 'fedprox', 'apfl', 'lindt')


@dataclasses.dataclass(frozen=True)
class AlgorithmOptions:
  """Hyperparameters of the algorithms.

  Attributes:
    client_learning_rate: learning rate of the clients' SGD.
    server_learning_rate: learning rate of the server's SGD on the averaged
      update (algorithms with a global model).
    seed: seeds the initial model weights (and FedPer's personal layers).
    fedper_personal_layers: FedPer's K_P, blocks kept personal counted from
      the top (the classifier is block 1); None: the task's default.
    fedper_finetune_epochs: FedPer's personal-only passes over the round data
      before each round's training.
    fedper_linear_base: FedPer's ablation, the base replaced by one linear
      layer.
    ditto_lambda: Ditto's lambda, the pull of personal models to the global.
    ditto_lambda_grid: candidates of Ditto's per-client lambda (empty: every
      client uses `ditto_lambda`).
    ditto_personal_learning_rate: Ditto's personal SGD rate (None: the
      client's).
    ditto_personal_steps: Ditto's personal SGD steps a round (0: passes).
    ditto_personal_epochs: Ditto's personal passes over the round data when
      `ditto_personal_steps` is 0.
    fedprox_mu: FedProx's proximal strength mu.
    lindt_mode: LINDT's 'always' or 'on_detection'.
    lindt_stop: LINDT's stopping strategy on detection ('persist' or
      'after_one_round').
    lindt_attach_logits: LINDT attaches G's logits to L's too (off: the paper).
    lindt_learn_gates: LINDT's gates get a learned personal offset each.
    lindt_own_global: LINDT's clients predict with the G they last trained with.
    lindt_match_scale: LINDT rescales the attached G^m to L^m's norm.
    lindt_detach_global: LINDT's local loss does not train the global model.
    lindt_detach_when_blind: the same when DP noise would blind the NFL detector.
    apfl_alpha: APFL's initial mixing weight of a new client.
    apfl_adaptive_alpha: APFL learns each client's alpha.
    apfl_alpha_learning_rate: APFL's alpha SGD rate (None: the client's).
    aggregator: the shared update's aggregator (`aggregators.names`).
    clients_per_round: the aggregators' fixed capacity.
    aggregator_num_adversaries: f of Krum / multi-Krum.
    aggregator_trim_fraction: the trimmed mean's fraction per side.
    aggregator_num_selected: multi-Krum's m (None: n - f).
    aggregator_k: k-norm's k.
    aggregator_clip_norm: norm clipping's C (None: adaptive).
    aggregator_target_quantile: adaptive clipping's target quantile.
    attack_boost: model-replacement attackers' factor (None: clients per
      round).
    dp_clip_norm: user-level DP with this fixed clip norm C (None: no fixed
      clipping).
    dp_adaptive_clipping: user-level DP with adaptive clipping.
    dp_initial_clip_norm: adaptive clipping's initial C.
    dp_target_quantile: adaptive clipping's target quantile of update norms.
    dp_noise_multiplier: DP's noise multiplier z (0: clipping only).
    dp_noise_seed: draw DP's noise from this seed (None: TFF's unseeded
      noise).
    nfl_detection: adds the NFL detector to the server (`nfl.detector`).
    nfl_warmup_rounds: the detector's warm-up rounds r'.
    nfl_window: the detector's moving window (rounds).
    nfl_threshold: the detector's threshold epsilon on windowed w_div.
    nfl_cohort_correction: the detector corrects w_div for the cohort size.
    nfl_flag_when_blind: the detector flags when DP noise hides any divergence.
  """

  client_learning_rate: float = 0.02
  server_learning_rate: float = 1.0
  seed: int = 0
  fedper_personal_layers: Optional[int] = None
  fedper_finetune_epochs: int = 0
  fedper_linear_base: bool = False
  ditto_lambda: float = 0.1
  ditto_lambda_grid: tuple[float, ...] = ()
  ditto_personal_learning_rate: Optional[float] = None
  ditto_personal_steps: int = 0
  ditto_personal_epochs: int = 1
  fedprox_mu: float = 0.01
  lindt_mode: str = 'always'
  lindt_stop: str = 'persist'
  lindt_attach_logits: bool = True
  lindt_learn_gates: bool = False
  lindt_own_global: bool = False
  lindt_match_scale: bool = False
  lindt_detach_global: bool = False
  lindt_detach_when_blind: bool = True
  apfl_alpha: float = 0.5
  apfl_adaptive_alpha: bool = True
  apfl_alpha_learning_rate: Optional[float] = None
  aggregator: str = 'mean'
  clients_per_round: int = 10
  aggregator_num_adversaries: int = 0
  aggregator_trim_fraction: float = 0.1
  aggregator_num_selected: Optional[int] = None
  aggregator_k: int = 1
  aggregator_clip_norm: Optional[float] = None
  aggregator_target_quantile: float = 0.5
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

  @property
  def differentially_private(self) -> bool:
    return self.dp_clip_norm is not None or self.dp_adaptive_clipping


def build_algorithm(
    name: str, task: 'base.Task', options: AlgorithmOptions
) -> 'process_lib.PersonalizedProcess':
  """Builds the algorithm `name` for `task`'s model."""
  # Imported here so that importing the registry stays cheap.
  from tff_personal.aggregators import dp  # pylint: disable=g-import-not-at-top
  from tff_personal.aggregators import robust  # pylint: disable=g-import-not-at-top
  from tff_personal.algorithms import apfl  # pylint: disable=g-import-not-at-top
  from tff_personal.algorithms import ditto  # pylint: disable=g-import-not-at-top
  from tff_personal.algorithms import fedavg  # pylint: disable=g-import-not-at-top
  from tff_personal.algorithms import fedper  # pylint: disable=g-import-not-at-top
  from tff_personal.algorithms import fedprox  # pylint: disable=g-import-not-at-top
  from tff_personal.algorithms import lindt  # pylint: disable=g-import-not-at-top
  from tff_personal.algorithms import local  # pylint: disable=g-import-not-at-top
  from tff_personal.algorithms import shared_model  # pylint: disable=g-import-not-at-top
  from tff_personal.models import split  # pylint: disable=g-import-not-at-top
  from tff_personal.nfl import detector  # pylint: disable=g-import-not-at-top

  attack_boost = options.attack_boost
  if attack_boost is None:
    attack_boost = float(options.clients_per_round)
  model_aggregator = None
  if options.differentially_private:
    if name not in AGGREGATING_ALGORITHMS:
      raise ValueError(f'{name} sends no update: differential privacy has nothing to protect.')
    if options.aggregator != 'mean':
      raise ValueError(
          f'DP cannot follow the {options.aggregator} aggregator: a robust rule'
          ' reads individual updates, so its output carries no DP guarantee; DP'
          ' clips and averages itself (use the mean).'
      )
    model_aggregator = dp.build_dp_aggregator(
        noise_multiplier=options.dp_noise_multiplier,
        clients_per_round=options.clients_per_round,
        clip_norm=options.dp_clip_norm,
        adaptive=options.dp_adaptive_clipping,
        initial_clip_norm=options.dp_initial_clip_norm,
        target_quantile=options.dp_target_quantile,
        noise_seed=options.dp_noise_seed,
    )
  elif options.aggregator != 'mean':
    model_aggregator = robust.build_aggregator(
        options.aggregator,
        clients_per_round=options.clients_per_round,
        num_adversaries=options.aggregator_num_adversaries,
        trim_fraction=options.aggregator_trim_fraction,
        num_selected=options.aggregator_num_selected,
        k=options.aggregator_k,
        clip_norm=options.aggregator_clip_norm,
        target_quantile=options.aggregator_target_quantile,
    )
  server_extras = {}
  if options.dp_clip_norm is not None:
    server_extras['dp_setting'] = dp.DpSetting(
        options.dp_noise_multiplier, options.dp_clip_norm, options.clients_per_round,
        options.dp_noise_seed,
    )
  if options.nfl_detection:
    if name not in DETECTOR_ALGORITHMS:
      raise ValueError(
          f'{name} cannot take the NFL detector; allowed: {", ".join(DETECTOR_ALGORITHMS)}.'
      )
    server_extras['nfl_detector'] = detector.DetectorConfig(
        warmup_rounds=options.nfl_warmup_rounds,
        window=options.nfl_window,
        threshold=options.nfl_threshold,
        cohort_correction=options.nfl_cohort_correction,
        flag_when_blind=options.nfl_flag_when_blind,
    )
    if options.dp_adaptive_clipping:
      raise ValueError(
          "The NFL detector's noise correction needs a fixed DP clip norm, not"
          ' adaptive clipping.'
      )
  server = shared_model.ServerOptions(
      learning_rate=options.server_learning_rate,
      seed=options.seed,
      model_aggregator=model_aggregator,
      attack_boost=attack_boost,
      **server_extras,
  )
  if name == 'fedavg':
    return fedavg.build_fedavg(
        task.model,
        client_learning_rate=options.client_learning_rate,
        server=server,
    )
  if name == 'fedprox':
    return fedprox.build_fedprox(
        task.model,
        mu=options.fedprox_mu,
        client_learning_rate=options.client_learning_rate,
        server_learning_rate=options.server_learning_rate,
        seed=options.seed,
        model_aggregator=model_aggregator,
    )
  if name == 'ditto':
    return ditto.build_ditto(
        task.model,
        ditto_lambda=options.ditto_lambda,
        client_learning_rate=options.client_learning_rate,
        personal_learning_rate=options.ditto_personal_learning_rate,
        personal_steps=options.ditto_personal_steps,
        personal_passes=options.ditto_personal_epochs,
        server=server,
        lambda_grid=options.ditto_lambda_grid,
    )
  if name == 'apfl':
    return apfl.build_apfl(
        task.model,
        client_learning_rate=options.client_learning_rate,
        alpha=options.apfl_alpha,
        adaptive_alpha=options.apfl_adaptive_alpha,
        alpha_learning_rate=options.apfl_alpha_learning_rate,
        server=server,
    )
  if name == 'lindt':
    return lindt.build_lindt(
        task.model,
        mode=options.lindt_mode,
        stop=options.lindt_stop,
        attach_logits=options.lindt_attach_logits,
        learn_gates=options.lindt_learn_gates,
        own_global=options.lindt_own_global,
        match_scale=options.lindt_match_scale,
        detach_global=options.lindt_detach_global,
        detach_when_blind=options.lindt_detach_when_blind,
        client_learning_rate=options.client_learning_rate,
        server=server,
    )
  if name == 'local':
    return local.build_local(
        task.model, client_learning_rate=options.client_learning_rate, seed=options.seed
    )
  if name == 'fedper':
    personal_blocks = options.fedper_personal_layers
    if personal_blocks is None:
      personal_blocks = task.default_personal_blocks
    model = task.model
    if options.fedper_linear_base:
      model = split.with_linear_base(model, personal_blocks)
    return fedper.build_fedper(
        model,
        personal_blocks=personal_blocks,
        client_learning_rate=options.client_learning_rate,
        finetune_passes=options.fedper_finetune_epochs,
        server=server,
    )
  raise ValueError(
      f'Unknown algorithm {name!r}; allowed: {", ".join(ALGORITHM_NAMES)}.'
  )
