"""The training program on the tiny task: outputs, resume, refusals."""

import collections
import csv
import dataclasses
import os
import threading

import numpy as np

import pytest
import tensorflow_federated as tff

from tests import test_utils
from tff_personal.algorithms import registry as algorithm_registry
from tff_personal.attacks import roles
from tff_personal.personal import personal_states
from tff_personal.personal import process as process_lib
from tff_personal.personal import store as store_lib
from tff_personal.program import checkpoints
from tff_personal.program import outputs
from tff_personal.program import sampling
from tff_personal.program import training_loop
from tff_personal.runtime import context

TASK = test_utils.tiny_task(num_clients=6, hidden=3)
SETUP = algorithm_registry.Setup(client_learning_rate=0.1, seed=2)
CONFIG = training_loop.TrainingConfig(
    total_rounds=6,
    clients_per_round=3,
    client_batch_size=4,
    rounds_per_eval=2,
    rounds_per_checkpoint=2,
    eval_clients_per_call=4,
    seed=9,
)
_PROCESSES = {}


def process_for(algorithm):
  """The process of `algorithm`, of 'ditto_grid' (Ditto, per-client lambda),
  'fedper_nfl' (FedPer with the NFL detector), 'lindt_on_detection' or
  'fedavg_dp_seeded' (DP with seeded noise in the update and the detector)."""
  if algorithm not in _PROCESSES:
    build = algorithm_registry.build_algorithm
    hparams = algorithm_registry.module
    if algorithm == 'ditto_grid':
      _PROCESSES[algorithm] = build(
          'ditto', TASK, hparams('ditto').Hparams(lambda_grid=(0.0, 0.1, 1.0)), SETUP
      )
    elif algorithm == 'fedper_nfl':
      setup = dataclasses.replace(
          SETUP, nfl_detection=True, nfl_warmup_rounds=1, nfl_window=3, nfl_threshold=0.0
      )
      _PROCESSES[algorithm] = build('fedper', TASK, None, setup)
    elif algorithm == 'lindt_on_detection':
      setup = dataclasses.replace(
          SETUP, nfl_detection=True, nfl_warmup_rounds=1, nfl_window=2, nfl_threshold=0.0
      )
      lindt_hparams = hparams('lindt').Hparams(mode='on_detection', stop='after_one_round')
      _PROCESSES[algorithm] = build('lindt', TASK, lindt_hparams, setup)
    elif algorithm == 'fedavg_dp_seeded':  # Resumes bit for bit only if the noise repeats.
      setup = dataclasses.replace(
          SETUP, dp_clip_norm=1.0, dp_noise_multiplier=0.5, dp_noise_seed=4,
          nfl_detection=True, nfl_warmup_rounds=1, nfl_window=2, nfl_threshold=0.0,
      )
      _PROCESSES[algorithm] = build('fedavg', TASK, None, setup)
    elif algorithm == 'fedavg_dp_adaptive_seeded':  # The clip's estimate is noised too.
      setup = dataclasses.replace(
          SETUP, dp_adaptive_clipping=True, dp_noise_multiplier=0.05, dp_noise_seed=4,
      )
      _PROCESSES[algorithm] = build('fedavg', TASK, None, setup)
    else:
      _PROCESSES[algorithm] = build(algorithm, TASK, None, SETUP)
  return _PROCESSES[algorithm]


def train(algorithm, root, name, total_rounds=6, run_config=None, run_config_defaults=None,
          split_rounds=True):
  config = training_loop.TrainingConfig(
      **{**CONFIG.__dict__, 'total_rounds': total_rounds}
  )
  return training_loop.run_training(
      TASK,
      process_for(algorithm),
      config,
      outputs.ExperimentDir(str(root), name),
      run_config=run_config or {'algorithm': algorithm, 'total_rounds': total_rounds},
      run_config_defaults=run_config_defaults,
      progress_stream=None,
      split_rounds=split_rounds,
  )


def without_timing(rows):
  return [{k: v for k, v in r.items() if k != 'round_seconds'} for r in rows]


@pytest.mark.parametrize(
    'algorithm',
    algorithm_registry.ALGORITHM_NAMES
    + ('ditto_grid', 'fedper_nfl', 'lindt_on_detection', 'fedavg_dp_seeded',
       'fedavg_dp_adaptive_seeded'),
)
def test_outputs_and_resume_equal_an_uninterrupted_run(algorithm, tmp_path):
  summary = train(algorithm, tmp_path, 'full')
  full = outputs.ExperimentDir(str(tmp_path), 'full')
  rows = outputs.RoundCsv(full.metrics_path).read()
  assert [int(r['round']) for r in rows] == list(range(1, 7))
  assert rows[1]['eval/num_clients'] == '6' and rows[0]['eval/num_clients'] == ''
  eval_rows = outputs.RoundCsv(full.eval_path).read()
  assert len(eval_rows) == 3 * 6  # Rounds 2, 4, 6 x 6 clients.
  assert summary['final_eval']['eval/accuracy_mean'] == pytest.approx(
      sum(float(r['sparse_categorical_accuracy']) for r in eval_rows[-6:]) / 6
  )
  assert os.path.exists(full.summary_path)
  assert os.path.isdir(full.tensorboard_dir)
  assert os.path.exists(full.store_path) == process_for(algorithm).has_personal_state
  if algorithm == 'fedper_nfl':  # Flagged after the warm-up and a full window.
    assert [r['nfl/flagged'] for r in rows] == ['0', '0', '1', '1', '1', '1']
    assert summary['nfl'] == {'nfl/flagged': 1.0, 'nfl/round_flagged': 3.0}

  # A run of 4 rounds (the last one evaluates, as the uninterrupted run's
  # round 4 does), extended to 6 rounds: it resumes after round 4.
  train(algorithm, tmp_path, 'resumed', total_rounds=4,
        run_config={'algorithm': algorithm, 'total_rounds': 4})
  train(algorithm, tmp_path, 'resumed')
  resumed = outputs.ExperimentDir(str(tmp_path), 'resumed')
  assert without_timing(outputs.RoundCsv(resumed.metrics_path).read()) == without_timing(rows)
  assert outputs.RoundCsv(resumed.eval_path).read() == eval_rows


def test_states_read_ahead_of_their_round_change_nothing(tmp_path, monkeypatch):
  """The next round's states, prefetched while a round trains, are the ones
  the round would have read itself."""
  threads = []
  read_file = store_lib._read_file

  def recording(path):
    threads.append(threading.current_thread().name)
    return read_file(path)

  monkeypatch.setattr(store_lib, '_read_file', recording)
  train('local', tmp_path, 'ahead')
  assert any(t.startswith('personal-state-prefetch') for t in threads)
  monkeypatch.setattr(personal_states.PersonalStates, 'prefetch', lambda *args: None)
  threads.clear()
  train('local', tmp_path, 'not_ahead')
  assert threads and not any(t.startswith('personal-state-prefetch') for t in threads)
  ahead, not_ahead = (outputs.ExperimentDir(str(tmp_path), n) for n in ('ahead', 'not_ahead'))
  assert without_timing(outputs.RoundCsv(ahead.metrics_path).read()) == without_timing(
      outputs.RoundCsv(not_ahead.metrics_path).read()
  )
  assert outputs.RoundCsv(ahead.eval_path).read() == outputs.RoundCsv(not_ahead.eval_path).read()


def test_local_clients_never_sampled_keep_the_initial_model(tmp_path):
  train('local', tmp_path, 'one_round', total_rounds=1)
  experiment = outputs.ExperimentDir(str(tmp_path), 'one_round')
  store = store_lib.ClientStateStore(experiment.store_path, create=False)
  stored = [c for c, s in zip(TASK.client_ids, store.read(TASK.client_ids)) if s is not None]
  assert len(stored) == 3  # Only the round's clients have a state.


def test_sampling_by_examples_draws_the_clients_with_more_examples(tmp_path):
  """Clients 4 and 5 hold 20 times the others' examples: every draw picks them."""
  sizes = [2, 2, 2, 2, 40, 40]
  rng = np.random.default_rng(0)

  def examples(n):
    x = rng.normal(size=(n, 2)).astype(np.float32)
    return collections.OrderedDict(x=x, y=(x[:, 0] > 0).astype(np.int32))

  client_data = tff.simulation.datasets.TestClientData
  train_data = client_data({f'client_{i}': examples(n) for i, n in enumerate(sizes)})
  test_data = client_data({f'client_{i}': examples(4) for i in range(len(sizes))})
  task = dataclasses.replace(TASK, train_data=train_data, test_data=test_data)
  config = dataclasses.replace(CONFIG, total_rounds=1, client_sampling='examples')
  training_loop.run_training(
      task, process_for('local'), config, outputs.ExperimentDir(str(tmp_path), 'run'),
      run_config={'algorithm': 'local'}, progress_stream=None,
  )
  store = store_lib.ClientStateStore(str(tmp_path / 'run' / 'personal_states.sqlite'), create=False)
  trained = [c for c, s in zip(task.client_ids, store.read(task.client_ids)) if s is not None]
  expected = sampling.sample_clients(task.client_ids, 3, seed=9, round_num=1, weights=sizes)
  assert trained == expected
  assert {'client_4', 'client_5'} <= set(trained)


def test_sampling_by_examples_is_refused_with_dp(tmp_path):
  config = dataclasses.replace(CONFIG, client_sampling='examples', dp_noise_multiplier=0.5)
  with pytest.raises(ValueError, match='privacy accounting assumes uniform sampling'):
    training_loop.run_training(
        TASK, process_for('fedavg'), config, outputs.ExperimentDir(str(tmp_path), 'run'),
        run_config={}, progress_stream=None,
    )


def test_client_steps_cap_the_batches_a_client_trains(tmp_path):
  """One step of batch 4 a client: 3 clients train on 12 examples a round."""
  config = training_loop.TrainingConfig(**{**CONFIG.__dict__, 'total_rounds': 2})
  counts = {}
  for steps in (0, 1):
    name = f'steps_{steps}'
    training_loop.run_training(
        TASK, process_for('fedavg'), dataclasses.replace(config, client_steps=steps),
        outputs.ExperimentDir(str(tmp_path), name),
        run_config={'algorithm': 'fedavg', 'client_steps': steps}, progress_stream=None,
    )
    with open(tmp_path / name / 'metrics.csv') as f:
      counts[steps] = [
          (int(r['client_work/train/num_batches']), int(r['client_work/train/num_examples']))
          for r in csv.DictReader(f)
      ]
  assert counts[1] == [(3, 12), (3, 12)]
  assert all(batches > 3 for batches, _ in counts[0])  # Every client has more than 4 examples.


def test_refuses_to_resume_with_other_settings(tmp_path):
  train('fedavg', tmp_path, 'run', total_rounds=2)
  with pytest.raises(training_loop.ResumeError, match='--seed'):
    train('fedavg', tmp_path, 'run', run_config={'algorithm': 'fedavg', 'seed': 1})


def test_a_setting_added_since_the_run_was_written_counts_as_its_default(tmp_path):
  train('fedavg', tmp_path, 'run', total_rounds=2, run_config={'algorithm': 'fedavg'})
  new_setting = {'algorithm': 'fedavg', 'new_option': False}
  with pytest.raises(training_loop.ResumeError, match='--new_option=True there vs False now'):
    train('fedavg', tmp_path, 'run', run_config=new_setting,
          run_config_defaults={'new_option': True})
  train('fedavg', tmp_path, 'run', total_rounds=3, run_config=new_setting,
        run_config_defaults={'new_option': False})
  assert outputs.read_json(outputs.ExperimentDir(str(tmp_path), 'run').config_path) == new_setting


def test_refuses_a_checkpoint_of_another_algorithm(tmp_path):
  train('fedavg', tmp_path, 'run', total_rounds=2, run_config={'same': True})
  with pytest.raises(checkpoints.CheckpointMismatchError, match='round 2'):
    train('local', tmp_path, 'run', total_rounds=4, run_config={'same': True})


def test_replaced_personal_states_are_an_error(tmp_path):
  train('local', tmp_path, 'run', total_rounds=2, run_config={'same': True})
  experiment = outputs.ExperimentDir(str(tmp_path), 'run')
  store = store_lib.ClientStateStore(experiment.store_path)
  store.write(2, {'intruder': [1.0]})
  store.close()
  with pytest.raises(store_lib.StoreMismatchError, match='expects 5'):
    train('local', tmp_path, 'run', total_rounds=4, run_config={'same': True})


def test_missing_personal_states_are_an_error(tmp_path):
  train('local', tmp_path, 'run', total_rounds=2, run_config={'same': True})
  os.remove(outputs.ExperimentDir(str(tmp_path), 'run').store_path)
  with pytest.raises(store_lib.StoreMismatchError, match='is missing'):
    train('local', tmp_path, 'run', total_rounds=4, run_config={'same': True})


@pytest.mark.parametrize('algorithm', algorithm_registry.ALGORITHM_NAMES)
def test_diverging_round_is_an_error_and_keeps_the_checkpoint(algorithm, tmp_path):
  train(algorithm, tmp_path, 'run', total_rounds=2, run_config={'same': True})
  experiment = outputs.ExperimentDir(str(tmp_path), 'run')
  # From round 3 on, the clients' data hold infinities.
  poisoned = dataclasses.replace(
      TASK,
      preprocess_train=lambda *args: TASK.preprocess_train(*args).map(
          lambda x, y: (x * np.inf, y)
      ),
  )
  config = training_loop.TrainingConfig(**{**CONFIG.__dict__, 'total_rounds': 4})
  with pytest.raises(training_loop.NonFiniteRoundError, match='Round 3 diverged'):
    training_loop.run_training(
        poisoned, process_for(algorithm), config, experiment, run_config={'same': True}
    )
  assert checkpoints.CheckpointManager(experiment.checkpoint_dir).latest_round() == 2
  assert [r['round'] for r in outputs.RoundCsv(experiment.metrics_path).read()] == ['1', '2']


@pytest.mark.parametrize(
    'algorithm, attack', [('fedavg', 'model_replacement'), ('fedper', 'label_poison')]
)
def test_attacked_run_reports_benign_and_adversary_clients_apart(algorithm, attack, tmp_path):
  config = training_loop.TrainingConfig(
      **{**CONFIG.__dict__, 'total_rounds': 2, 'attack': attack, 'attack_fraction': 0.34}
  )
  summary = training_loop.run_training(
      TASK, process_for(algorithm), config, outputs.ExperimentDir(str(tmp_path), 'run'),
      run_config={'attack': attack},
  )
  assert summary['num_adversaries'] == 2  # round(0.34 * 6).
  final = summary['final_eval']
  assert final['eval/num_clients'] == 4 and final['eval/adversary_num_clients'] == 2
  rows = outputs.RoundCsv(outputs.ExperimentDir(str(tmp_path), 'run').eval_path).read()
  assert sorted(r['adversary'] for r in rows) == ['0'] * 4 + ['1'] * 2


def test_update_attacks_need_a_client_role(tmp_path):
  """A process that takes no attack role (here TFF's own FedAvg, wrapped) is refused."""
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
  from tff_personal.evaluation import per_client  # pylint: disable=g-import-not-at-top

  model_fn = TASK.model.tff_model_fn
  process = process_lib.from_learning_process(
      tff.learning.algorithms.build_weighted_fed_avg(
          model_fn, client_optimizer_fn=tff.learning.optimizers.build_sgdm(0.1)
      ),
      TASK.model.initial_weights(0),
      per_client.build_global_model_evaluation(model_fn),
  )
  assert not process.takes_client_roles
  config = training_loop.TrainingConfig(
      **{**CONFIG.__dict__, 'attack': 'random_update', 'attack_fraction': 0.5}
  )
  with pytest.raises(ValueError, match='cannot simulate the random_update attack'):
    training_loop.run_training(
        TASK, process, config, outputs.ExperimentDir(str(tmp_path), 'run'), run_config={},
    )


def _final_eval_rows(root, name):
  rows = outputs.RoundCsv(outputs.ExperimentDir(str(root), name).eval_path).read()
  last = max(int(r['round']) for r in rows)
  return {r['client_id']: r for r in rows if int(r['round']) == last}


@pytest.mark.parametrize('attack', roles.ATTACK_NAMES[1:])
def test_attacks_leave_local_benign_clients_as_in_the_clean_run(attack, tmp_path):
  """Local shares nothing: under any attack its benign clients end exactly as
  in the clean run (so `results_table.clean_twin` reads their cells from it);
  label poisoning changes only the adversaries' own models."""
  train('local', tmp_path, 'clean', total_rounds=2)
  config = training_loop.TrainingConfig(
      **{**CONFIG.__dict__, 'total_rounds': 2, 'attack': attack, 'attack_fraction': 0.34}
  )
  attacked = training_loop.run_training(
      TASK, process_for('local'), config, outputs.ExperimentDir(str(tmp_path), 'attacked'),
      run_config={},
  )
  assert attacked['num_adversaries'] == 2
  clean_rows = _final_eval_rows(tmp_path, 'clean')
  attacked_rows = _final_eval_rows(tmp_path, 'attacked')
  adversaries = roles.choose_adversaries(sorted(TASK.client_ids), 0.34, seed=CONFIG.seed)
  assert {c for c, r in attacked_rows.items() if r['adversary'] == '1'} == adversaries
  assert {c: r['loss'] for c, r in clean_rows.items() if c not in adversaries} == {
      c: r['loss'] for c, r in attacked_rows.items() if c not in adversaries
  }
  changed = {c for c in adversaries if clean_rows[c]['loss'] != attacked_rows[c]['loss']}
  assert bool(changed) == (attack == 'label_poison')  # Poisoned adversaries that trained.
  benign = [float(r['loss']) for r in attacked_rows.values() if r['adversary'] == '0']
  assert len(benign) == attacked['final_eval']['eval/num_clients'] == 4
  assert attacked['final_eval']['eval/loss_mean'] == pytest.approx(np.mean(benign))


def test_update_attacks_can_train_their_adversaries_on_poisoned_labels(tmp_path):
  """With attack_poison_labels an A3 adversary trains as an A1 adversary does
  (Local sends nothing, so its models show the training alone)."""
  runs = {}
  for name, attack, poison in (('a1', 'label_poison', False),
                               ('a3_poisoned', 'model_replacement', True)):
    config = training_loop.TrainingConfig(
        **{**CONFIG.__dict__, 'total_rounds': 2, 'attack': attack, 'attack_fraction': 0.34,
           'attack_poison_labels': poison}
    )
    training_loop.run_training(
        TASK, process_for('local'), config, outputs.ExperimentDir(str(tmp_path), name),
        run_config={},
    )
    runs[name] = {c: r['loss'] for c, r in _final_eval_rows(tmp_path, name).items()}
  assert runs['a3_poisoned'] == runs['a1']
  config = training_loop.TrainingConfig(
      **{**CONFIG.__dict__, 'attack': 'label_poison', 'attack_fraction': 0.34,
         'attack_poison_labels': True}
  )
  with pytest.raises(ValueError, match='attack_poison_labels applies to the update attacks'):
    training_loop.run_training(
        TASK, process_for('local'), config, outputs.ExperimentDir(str(tmp_path), 'bad'),
        run_config={},
    )


@pytest.mark.parametrize('attack', ['none', 'label_poison'])
def test_local_rounds_in_one_call_train_as_round_by_round(attack, tmp_path):
  """Every client in every round: calls of up to 3 rounds (cut at the
  checkpoint round 4 and the evaluation round 6) give every client the
  models of one call a round; a run stopped at round 4 resumes to the same."""
  config = training_loop.TrainingConfig(**{
      **CONFIG.__dict__, 'total_rounds': 7, 'clients_per_round': 6, 'rounds_per_eval': 6,
      'rounds_per_checkpoint': 4, 'attack': attack,
      'attack_fraction': 0.0 if attack == 'none' else 0.34,
  })
  runs = {}
  for name, rounds_per_call, total_rounds in (
      ('by_round', 1, 7), ('in_calls', 3, 7), ('resumed', 3, 4), ('resumed', 3, 7)):
    training_loop.run_training(
        TASK, process_for('local'),
        dataclasses.replace(config, rounds_per_call=rounds_per_call, total_rounds=total_rounds),
        outputs.ExperimentDir(str(tmp_path), name), run_config={'rounds_per_call': rounds_per_call},
    )
    rows = outputs.RoundCsv(outputs.ExperimentDir(str(tmp_path), name).eval_path).read()
    runs[name] = [(r['round'], r['client_id'], r['loss'], r['sparse_categorical_accuracy'])
                  for r in rows]
  assert [r[0] for r in runs['by_round']] == ['6'] * 6 + ['7'] * 6
  assert runs['in_calls'] == runs['by_round']
  assert [r for r in runs['resumed'] if r[0] != '4'] == runs['by_round']
  metrics = outputs.RoundCsv(outputs.ExperimentDir(str(tmp_path), 'in_calls').metrics_path).read()
  assert [(r['round'], r['rounds_in_call']) for r in metrics] == [
      ('3', '3'), ('4', '1'), ('6', '2'), ('7', '1')
  ]
  # A call trains every client on its batches of the call's rounds.
  by_round = outputs.RoundCsv(outputs.ExperimentDir(str(tmp_path), 'by_round').metrics_path).read()
  examples = [int(r['client_work/train/num_examples']) for r in by_round]
  assert [int(r['client_work/train/num_examples']) for r in metrics] == [
      sum(examples[:3]), examples[3], sum(examples[4:6]), examples[6]
  ]


def test_rounds_in_one_call_need_independent_clients_all_in_every_round(tmp_path):
  config = dataclasses.replace(CONFIG, rounds_per_call=2)
  with pytest.raises(training_loop.UnsupportedConfigError, match='train independently'):
    training_loop.run_training(
        TASK, process_for('fedavg'), dataclasses.replace(config, clients_per_round=6),
        outputs.ExperimentDir(str(tmp_path), 'fedavg'), run_config={},
    )
  with pytest.raises(training_loop.UnsupportedConfigError,
                     match='clients_per_round is 3, the population 6'):
    training_loop.run_training(
        TASK, process_for('local'), config, outputs.ExperimentDir(str(tmp_path), 'local'),
        run_config={},
    )


@pytest.mark.parametrize('algorithm', ['fedavg', 'ditto'])
def test_finetuning_reports_the_trained_model_and_its_finetuned_copy(algorithm, tmp_path):
  plain = train(algorithm, tmp_path, 'plain', total_rounds=2)
  config = training_loop.TrainingConfig(
      **{**CONFIG.__dict__, 'total_rounds': 2, 'finetune_epochs': 2,
         'finetune_learning_rate': 0.1}
  )
  tuned = training_loop.run_training(
      TASK, process_for(algorithm), config, outputs.ExperimentDir(str(tmp_path), 'tuned'),
      run_config={},
  )
  plain_eval, tuned_eval = plain['final_eval'], tuned['final_eval']
  # Fine-tuning happens at evaluation only: the trained models are the same.
  for name in ('accuracy_mean', 'loss_mean', 'loss_worst10_mean'):
    assert tuned_eval[f'eval/before_finetune_{name}'] == plain_eval[f'eval/{name}']
  assert tuned_eval['eval/loss_mean'] < plain_eval['eval/loss_mean']
  rows = _final_eval_rows(tmp_path, 'tuned')
  assert all('before_finetune/loss' in r for r in rows.values())


def test_dp_run_reports_epsilon_every_round_and_resume_keeps_the_ledger(tmp_path):
  from tff_personal.privacy import accounting  # pylint: disable=g-import-not-at-top

  setup = dataclasses.replace(
      SETUP, clients_per_round=3, dp_clip_norm=1.0, dp_noise_multiplier=1.2
  )
  process = algorithm_registry.build_algorithm('fedavg', TASK, None, setup)

  def run(name, rounds):
    config = training_loop.TrainingConfig(
        **{**CONFIG.__dict__, 'total_rounds': rounds, 'dp_noise_multiplier': 1.2,
           'dp_delta': 1e-3}
    )
    return training_loop.run_training(
        TASK, process, config, outputs.ExperimentDir(str(tmp_path), name),
        run_config={'dp': True},
    )

  summary = run('full', 4)
  run('resumed', 2)
  run('resumed', 4)
  expected = [accounting.epsilon(1.2, 6, 3, r, 1e-3) for r in range(1, 5)]
  for name in ('full', 'resumed'):
    rows = outputs.RoundCsv(outputs.ExperimentDir(str(tmp_path), name).metrics_path).read()
    assert [float(r['privacy/epsilon']) for r in rows] == pytest.approx(expected, rel=1e-12)
    assert {r['privacy/noise_multiplier'] for r in rows} == {'1.2'}
  assert summary['privacy']['privacy/epsilon'] == pytest.approx(expected[-1], rel=1e-12)
  assert summary['privacy']['privacy/delta'] == 1e-3


@pytest.mark.parametrize(
    'algorithm, central_column',
    [('fedavg', '{acc}'), ('apfl', 'global_model/{acc}'), ('lindt', 'global_model/{acc}'),
     ('fedper', None), ('local', None)],
)
def test_central_accuracy_is_the_global_model_on_the_pooled_test_sets(
    algorithm, central_column, tmp_path
):
  """FedAvg's clients evaluate the global model itself; APFL's and LINDT's
  evaluate their personal models, so the global model is evaluated apart;
  FedPer's shared part and Local have no whole global model."""
  summary = train(algorithm, tmp_path, 'run', total_rounds=2)
  rows = list(_final_eval_rows(tmp_path, 'run').values())
  acc = summary['accuracy_metric']
  if central_column is None:
    assert 'eval/central_accuracy' not in summary['final_eval']
    assert not any(k.startswith('global_model/') for k in rows[0])
    return
  column = central_column.format(acc=acc)
  pooled = sum(float(r[column]) * float(r['num_examples']) for r in rows) / sum(
      float(r['num_examples']) for r in rows
  )
  assert summary['final_eval']['eval/central_accuracy'] == pytest.approx(pooled)
  if algorithm != 'fedavg':
    # The personal models are not the global model.
    assert any(r['global_model/loss'] != r['loss'] for r in rows)


@pytest.mark.parametrize('algorithm', ['ditto', 'lindt_on_detection', 'local'])
def test_split_rounds_on_several_workers_equal_next(algorithm, tmp_path, monkeypatch):
  """On several workers the loop runs each round as the process's split
  round (`process.SplitRound`): the same outputs as with `next`."""
  assert process_for(algorithm).split_round is not None
  train(algorithm, tmp_path, 'next')
  calls = []
  monkeypatch.setattr(context, 'runs_on_several_workers', lambda: True)
  monkeypatch.setattr(process_lib, 'run_split_round', _counting(process_lib.run_split_round, calls))
  train(algorithm, tmp_path, 'split')
  assert len(calls) == 6  # Every round split.
  runs = {name: outputs.ExperimentDir(str(tmp_path), name) for name in ('next', 'split')}
  assert (without_timing(outputs.RoundCsv(runs['split'].metrics_path).read())
          == without_timing(outputs.RoundCsv(runs['next'].metrics_path).read()))
  assert outputs.RoundCsv(runs['split'].eval_path).read() == outputs.RoundCsv(runs['next'].eval_path).read()


def test_split_rounds_off_calls_next_on_several_workers(tmp_path, monkeypatch):
  """`split_rounds=False` (`--nosplit_rounds`) keeps `next` on several workers."""
  calls = []
  monkeypatch.setattr(context, 'runs_on_several_workers', lambda: True)
  monkeypatch.setattr(process_lib, 'run_split_round', _counting(process_lib.run_split_round, calls))
  train('local', tmp_path, 'next', total_rounds=2, split_rounds=False)
  assert not calls
  train('local', tmp_path, 'split', total_rounds=2)
  assert len(calls) == 2


def _counting(fn, calls):
  def counted(*args, **kwargs):
    calls.append(1)
    return fn(*args, **kwargs)
  return counted
