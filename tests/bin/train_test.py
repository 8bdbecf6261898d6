"""bin/train.py: a smoke run, bad input (one line, exit code 2), kill and resume."""

import os
import re
import signal
import subprocess
import sys
from unittest import mock

from absl import flags
from absl.testing import flagsaver
import pytest

from tests.bin import binaries
from tff_personal.program import outputs
import experiment_flags as ef  # bin/experiment_flags.py (pytest.ini puts bin/ on the path)

train = binaries.load('train')
FLAGS = flags.FLAGS
SMALL_RUN = [
    '--task=femnist',
    '--clients_per_round=3',
    '--eval_clients=6',
    '--client_batch_size=20',
    '--client_learning_rate=0.05',
    '--rounds_per_eval=2',
    '--rounds_per_checkpoint=2',
]


def run_main(argv, binary=train):
  """Runs a binary's main in-process with `argv` parsed; restores flags after.

  sys.argv[0] is the binary's name while it runs, as errors print it.
  """
  program = f'{binary.__name__[4:]}.py'
  with flagsaver.flagsaver(), mock.patch.object(sys, 'argv', [program]):
    rest = ef.parse_flags_or_exit([program] + argv)
    binary.main(rest)


@pytest.fixture(autouse=True)
def program_name(monkeypatch):
  """Errors name the program as sys.argv[0] does when bin/train.py runs."""
  monkeypatch.setattr(sys, 'argv', ['train.py'])


def one_line_error(capsys, excinfo):
  assert excinfo.value.code == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1, err
  assert err[0].startswith('train.py: error: ')
  return err[0]


@pytest.mark.parametrize(
    'argv, expected',
    [
        (['--task=cifar10'], r'--task=cifar10: value should be one of <femnist\|shakespeare'),
        (['--algorithm=fedprox2'],
         r'--algorithm=fedprox2: value should be one of <fedavg\|local\|fedper\|ditto\|fedprox'),
        (['--total_rounds=0'], '--total_rounds=0'),
        (['--clients_per_round=-3'], '--clients_per_round=-3'),
        (['--client_batch_size=0'], '--client_batch_size=0'),
        (['--partition=iid'], '--partition=iid: value should be one of <k_classes'),
        (['--fedper_finetune_epochs=-1'], '--fedper_finetune_epochs=-1'),
        (['--ditto_lambda=-0.5'], '--ditto_lambda=-0.5'),
        (['--aggregator=bulyan'], '--aggregator=bulyan: value should be one of <mean\\|median'),
        (['--attack_fraction=1.0'], r'--attack_fraction must be in \[0, 1\)'),
        (['--attack=backdoor'], '--attack=backdoor: value should be one of <none'),
        (['--attack=label_poison', '--attack_poison_labels'],
         '--attack_poison_labels applies to --attack=random_update or model_replacement'),
        (['--rounds_per_call=0'], '--rounds_per_call=0'),
        (['--rounds_per_call=2'], '--rounds_per_call > 1 needs --algorithm=local without'),
        (['--algorithm=local', '--nfl_detection', '--rounds_per_call=2'],
         '--rounds_per_call > 1 needs --algorithm=local without --nfl_detection'),
        (['--finetune_epochs=-1'], '--finetune_epochs=-1'),
        (['--dp_noise_multiplier=-1'], '--dp_noise_multiplier=-1'),
        (['--dp_clip_norm=0'], '--dp_clip_norm must be > 0'),
        (['--dp_target_epsilon=0'], '--dp_target_epsilon must be > 0'),
        (['--dp_delta=1.5'], r'--dp_delta must be in \(0, 1\)'),
        (['--nfl_threshold=-1'], '--nfl_threshold=-1'),
        (['--apfl_alpha=1.5'], '--apfl_alpha=1.5'),
        (['--lindt_mode=sometimes'], '--lindt_mode=sometimes: value should be one of'),
        (['--ditto_lambda_grid=0.1,-1'], '--ditto_lambda_grid must be a comma-separated list'),
        (['--ditto_lambda_grid=0.1,x'], '--ditto_lambda_grid must be a comma-separated list'),
        (['--finetune_learning_rate=0'], '--finetune_learning_rate must be > 0'),
    ],
)
def test_bad_flags(argv, expected, capsys):
  with flagsaver.flagsaver():
    with pytest.raises(SystemExit) as excinfo:
      ef.parse_flags_or_exit(['train.py'] + argv)
  assert re.search(expected, one_line_error(capsys, excinfo))


def test_too_many_clients_per_round(capsys, cache_dir, tmp_path):
  with pytest.raises(SystemExit) as excinfo:
    run_main(SMALL_RUN + [
        f'--cache_dir={cache_dir}', f'--root_output_dir={tmp_path}',
        '--clients_per_round=106', '--total_rounds=1',
    ])
  assert '--clients_per_round=106 exceeds the 105 clients of the run' in one_line_error(
      capsys, excinfo)


def test_rounds_per_call_with_a_subset_of_clients_a_round(capsys, cache_dir, tmp_path):
  with pytest.raises(SystemExit) as excinfo:
    run_main(SMALL_RUN + [
        f'--cache_dir={cache_dir}', f'--root_output_dir={tmp_path}', '--algorithm=local',
        '--rounds_per_call=5', '--total_rounds=1',
    ])
  assert 'needs every client to train every round: clients_per_round is' in one_line_error(
      capsys, excinfo)


def test_cnn_on_a_task_with_its_own_model(capsys, tmp_path):
  with pytest.raises(SystemExit) as excinfo:
    run_main(['--task=shakespeare', '--cnn=ditto', f'--root_output_dir={tmp_path}'])
  assert '--cnn=ditto applies to the tasks emnist, femnist; task shakespeare has its own' in (
      one_line_error(capsys, excinfo))


def test_ditto_cnn_run_reproduces_itself(cache_dir, tmp_path):
  """Dropout inside the TFF computation: two runs of the same flags agree exactly."""
  for name in ('a', 'b'):
    run_main(SMALL_RUN + [
        f'--cache_dir={cache_dir}', f'--root_output_dir={tmp_path}', f'--experiment_name={name}',
        '--cnn=ditto', '--total_rounds=2', '--algorithm=ditto', '--client_steps=2',
    ])
  rows = {
      name: outputs.RoundCsv(outputs.ExperimentDir(str(tmp_path), name).metrics_path).read()
      for name in ('a', 'b')
  }
  losses = [[row['client_work/train/loss'] for row in rows[name]] for name in ('a', 'b')]
  assert losses[0] == losses[1] and len(losses[0]) == 2


def test_missing_data(capsys, tmp_path):
  with pytest.raises(SystemExit) as excinfo:
    run_main([f'--femnist_path={tmp_path}/absent.npz', f'--root_output_dir={tmp_path}'])
  message = one_line_error(capsys, excinfo)
  assert f'{tmp_path}/absent.npz' in message and '--femnist_path' in message


def test_unwritable_output_dir(capsys, tmp_path):
  blocker = tmp_path / 'a_file'
  blocker.write_text('not a directory')
  with pytest.raises(SystemExit) as excinfo:
    run_main([f'--root_output_dir={blocker}/out'])
  assert f'--root_output_dir={blocker}/out: cannot write' in one_line_error(capsys, excinfo)


def test_smoke_run_writes_every_output(capsys, cache_dir, tmp_path):
  run_main(SMALL_RUN + [
      f'--cache_dir={cache_dir}', f'--root_output_dir={tmp_path}',
      '--experiment_name=smoke', '--total_rounds=2', '--algorithm=local',
  ])
  out = capsys.readouterr().out
  assert 'TFF worker trains on: CPU only' in out  # The pip wheel's worker (runtime/devices.py).
  assert 'round 2/2' in out and 'ETA' in out
  assert 'local on femnist: mean per-client test sparse_categorical_accuracy' in out
  experiment = outputs.ExperimentDir(str(tmp_path), 'smoke')
  with open(experiment.flags_path) as f:
    assert '--algorithm=local\n' in f.read()
  summary = outputs.read_json(experiment.summary_path)
  assert summary['rounds_completed'] == 2 and summary['num_eval_clients'] == 6
  assert len(outputs.RoundCsv(experiment.eval_path).read()) == 6


def test_target_epsilon_run_calibrates_and_reports_its_budget(capsys, cache_dir, tmp_path):
  from tff_personal.privacy import accounting  # pylint: disable=g-import-not-at-top

  # The clip norm sets the noise's scale, not the multiplier or epsilon: a
  # small one keeps the unseeded noise from making round 2 diverge (CI saw
  # it once with 0.5), which is not what this test is about.
  run_main(SMALL_RUN + [
      f'--cache_dir={cache_dir}', f'--root_output_dir={tmp_path}', '--experiment_name=dp',
      '--total_rounds=2', '--algorithm=fedavg', '--dp_clip_norm=0.01',
      '--dp_target_epsilon=5', '--dp_noise_seed=0',
  ])
  summary = outputs.read_json(outputs.ExperimentDir(str(tmp_path), 'dp').summary_path)
  assert summary['run_config']['dp_noise_seed'] == 0
  population = summary['num_clients']
  delta = accounting.default_delta(population)
  noise = summary['run_config']['dp_resolved_noise_multiplier']
  assert summary['run_config']['dp_resolved_delta'] == delta
  assert summary['privacy']['privacy/noise_multiplier'] == noise
  assert summary['privacy']['privacy/epsilon'] == pytest.approx(
      accounting.epsilon(noise, population, 3, 2, delta), rel=1e-12
  )
  assert 4.99 < summary['privacy']['privacy/epsilon'] <= 5.0

  # More rounds would need more noise from round 1: resuming is refused.
  with pytest.raises(SystemExit) as excinfo:
    run_main(SMALL_RUN + [
        f'--cache_dir={cache_dir}', f'--root_output_dir={tmp_path}', '--experiment_name=dp',
        '--total_rounds=4', '--algorithm=fedavg', '--dp_clip_norm=0.01',
        '--dp_target_epsilon=5', '--dp_noise_seed=0',
    ])
  assert '--dp_resolved_noise_multiplier=' in one_line_error(capsys, excinfo)


def test_killed_run_resumes_to_the_uninterrupted_results(cache_dir, tmp_path):
  common = SMALL_RUN + [
      f'--cache_dir={cache_dir}', f'--root_output_dir={tmp_path}',
      '--algorithm=fedper', '--fedper_personal_layers=2', '--total_rounds=5',
  ]
  command = [sys.executable, os.path.join(binaries.REPO_ROOT, 'bin', 'train.py')]
  env = dict(os.environ, PYTHONPATH=binaries.REPO_ROOT)

  killed = subprocess.Popen(
      command + common + ['--experiment_name=run'],
      stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env,
  )
  for line in killed.stdout:
    if line.startswith('round 3/5'):  # Checkpointed after round 2, not 3.
      killed.send_signal(signal.SIGKILL)
      break
  killed.wait(timeout=60)
  assert killed.returncode == -signal.SIGKILL
  resumed = subprocess.run(
      command + common + ['--experiment_name=run'],
      capture_output=True, text=True, env=env, timeout=600, check=True,
  )
  assert 'Resuming' in resumed.stdout and 'after round 2' in resumed.stdout
  # Checkpoints and TFF's tracing log at INFO; without --verbosity none shows.
  assert not re.search(r'^(I\d{4} |INFO:)', resumed.stderr, re.MULTILINE), resumed.stderr

  run_main(common + ['--experiment_name=uninterrupted'])
  timing = 'round_seconds'
  for name in ('metrics_path', 'eval_path'):
    results = [
        outputs.RoundCsv(getattr(outputs.ExperimentDir(str(tmp_path), e), name)).read()
        for e in ('run', 'uninterrupted')
    ]
    for row in results[0] + results[1]:
      row.pop(timing, None)
    assert results[0] == results[1], name
  assert len(results[0]) == 3 * 6  # Evaluation rounds 2, 4 and 5, 6 clients each.


@pytest.mark.parametrize(
    'task, filename',
    [
        ('emnist', 'emnist_all.sqlite'),
        ('stackoverflow', 'stackoverflow.sqlite'),
        ('cifar100', 'cifar100.sqlite'),
    ],
)
def test_tff_loader_tasks_without_cached_files_exit_at_once(task, filename, capsys, tmp_path):
  empty_cache = tmp_path / 'cache'
  empty_cache.mkdir()
  with pytest.raises(SystemExit) as excinfo:
    run_main([f'--task={task}', f'--cache_dir={empty_cache}', f'--root_output_dir={tmp_path}'])
  message = one_line_error(capsys, excinfo)
  assert f'{empty_cache}/{filename}' in message and '--cache_dir' in message
  assert sorted(os.listdir(empty_cache)) == []  # Nothing was downloaded.


@pytest.mark.parametrize(
    'argv, expected',
    [
        (['--fedper_personal_layers=5'],
         '--fedper_personal_layers=5: the femnist model has 4 blocks; allowed: 0..4.'),
        (['--fedper_linear_base', '--fedper_personal_layers=4'],
         '--fedper_linear_base needs 1 <= --fedper_personal_layers < 4'),
    ],
)
def test_bad_fedper_flags(argv, expected, capsys, cache_dir, tmp_path):
  with pytest.raises(SystemExit) as excinfo:
    run_main(['--algorithm=fedper', f'--cache_dir={cache_dir}',
              f'--root_output_dir={tmp_path}'] + argv)
  assert expected in one_line_error(capsys, excinfo)


@pytest.mark.parametrize(
    'argv, expected',
    [
        (['--algorithm=ditto', '--aggregator=krum', '--clients_per_round=4',
          '--aggregator_num_adversaries=1'],
         '--aggregator=krum needs --clients_per_round > 2 * --aggregator_num_adversaries + 2'
         ' = 4, got --clients_per_round=4.'),
        (['--algorithm=local', '--aggregator=median'],
         '--aggregator=median: --algorithm=local aggregates no update'),
        (['--algorithm=fedavg', '--aggregator=k_norm', '--aggregator_k=10'],
         '--aggregator_k=10 must be below --clients_per_round=10'),
        (['--algorithm=fedavg', '--attack=label_poison'],
         '--attack=label_poison needs --attack_fraction in (0, 1), got 0.'),
        (['--algorithm=fedavg', '--dp_noise_multiplier=1'],
         '--dp_noise_multiplier needs DP: give --dp_clip_norm or --dp_adaptive_clipping.'),
        (['--algorithm=fedavg', '--dp_noise_seed=3'],
         '--dp_noise_seed needs DP: give --dp_clip_norm or --dp_adaptive_clipping.'),
        (['--algorithm=local', '--dp_clip_norm=1'],
         '--algorithm=local sends no update: DP has nothing to protect.'),
        (['--algorithm=fedavg', '--dp_clip_norm=1', '--aggregator=median'],
         '--aggregator=median cannot be combined with DP'),
        (['--algorithm=fedavg', '--dp_clip_norm=1', '--dp_noise_multiplier=1',
          '--dp_target_epsilon=3'],
         'Give --dp_noise_multiplier or --dp_target_epsilon, not both.'),
        (['--algorithm=fedavg', '--dp_clip_norm=1', '--client_sampling=examples'],
         '--client_sampling=examples with DP: the privacy accounting assumes uniform'),
        (['--algorithm=fedavg', '--dp_clip_norm=1', '--dp_target_epsilon=0.00001'],
         '--dp_target_epsilon=1e-05: epsilon=1e-05 is unreachable in'),
        (['--algorithm=lindt', '--lindt_mode=on_detection'],
         '--lindt_mode=on_detection needs the NFL detector: add --nfl_detection.'),
        (['--algorithm=fedavg', '--nfl_detection', '--nfl_window=20', '--total_rounds=5'],
         '--nfl_window=20 exceeds --total_rounds=5: the window would never fill.'),
        (['--algorithm=fedavg', '--dp_adaptive_clipping', '--dp_noise_multiplier=1',
          '--clients_per_round=4'],
         '--dp_adaptive_clipping with noise multiplier 1 needs --clients_per_round > 10'),
    ],
)
def test_bad_aggregator_flags(argv, expected, capsys, cache_dir, tmp_path):
  with pytest.raises(SystemExit) as excinfo:
    run_main([f'--cache_dir={cache_dir}', f'--root_output_dir={tmp_path}'] + argv)
  assert expected in one_line_error(capsys, excinfo)


def test_flags_txt_reruns_the_same_run(tmp_path):
  """flags.txt parses back to the same run: lists, bools, unset (None) flags,
  and every setting of DP, the NFL detector, LINDT, APFL and fine-tuning."""
  argv = [
      '--task=fmnist', '--algorithm=lindt', '--lindt_mode=on_detection',
      '--lindt_stop=after_one_round', '--nfl_detection', '--nfl_threshold=0.0271',
      '--nfl_window=4', '--dp_clip_norm=0.5', '--dp_noise_multiplier=0.1',
      '--ditto_lambda_grid=0.1,1.0', '--apfl_alpha=0.25', '--noapfl_adaptive_alpha',
      '--finetune_epochs=2', '--lindt_attach_logits', '--nonfl_cohort_correction',
      '--lindt_learn_gates', '--lindt_own_global', '--lindt_match_scale', '--lindt_detach_global',
      '--nonfl_flag_when_blind',
  ]
  with flagsaver.flagsaver():
    ef.parse_flags_or_exit(['train.py'] + argv)
    config, flagfile = ef.run_config(), ef.resolved_flagfile()
  for name, value in [('nfl_threshold', 0.0271), ('lindt_stop', 'after_one_round'),
                      ('dp_noise_multiplier', 0.1), ('ditto_lambda_grid', ['0.1', '1.0']),
                      ('apfl_adaptive_alpha', False), ('finetune_epochs', 2),
                      ('nfl_detection', True), ('dp_delta', None),
                      ('lindt_attach_logits', True), ('nfl_cohort_correction', False),
                      ('lindt_learn_gates', True), ('lindt_own_global', True),
                      ('lindt_match_scale', True), ('nfl_flag_when_blind', False),
                      ('lindt_detach_global', True)]:
    assert config[name] == value, name
  path = tmp_path / 'flags.txt'
  path.write_text(flagfile)
  with flagsaver.flagsaver():
    ef.parse_flags_or_exit(['train.py', f'--flagfile={path}'])
    assert ef.run_config() == config


@pytest.mark.parametrize(
    'argv, expected',
    [
        (['--device=gpu'], '--device=gpu: the TFF worker (.*) found no GPU, only'
                           r' \[/physical_device:CPU:0\]\. .*--config=cuda'),
        (['--worker_binary=/absent/worker'],
         '--worker_binary=/absent/worker: no TFF worker binary at /absent/worker'),
        (['--device=gpu', '--workers=localhost:1'],
         '--device chooses the local worker; with --workers, pass it to each bin/worker.py'),
        (['--device=tpu'], '--device=tpu: value should be one of <auto|cpu|gpu>'),
        (['--nosplit_rounds'], '--nosplit_rounds applies to runs on two or more --workers'),
        (['--split_rounds', '--workers=localhost:1'],
         '--split_rounds applies to runs on two or more --workers'),
    ],
)
def test_bad_worker_and_device_flags(argv, expected, capsys, cache_dir, tmp_path):
  with pytest.raises(SystemExit) as excinfo:
    run_main(SMALL_RUN + [f'--cache_dir={cache_dir}', f'--root_output_dir={tmp_path}'] + argv)
  assert re.search(expected, one_line_error(capsys, excinfo))
  assert not list(tmp_path.rglob('*.*'))  # Before any output file.


def test_task_cache_dir_is_absolute(tmp_path, monkeypatch):
  """TFF's workers open the SQLite files the datasets' graphs name from their
  own working directories, so the task gets an absolute --cache_dir."""
  monkeypatch.chdir(tmp_path)
  with flagsaver.flagsaver():
    ef.parse_flags_or_exit(['train.py', '--cache_dir=cache'])
    assert ef.task_options().cache_dir == str(tmp_path / 'cache')
    ef.parse_flags_or_exit(['train.py', '--cache_dir=~/x'])
    assert ef.task_options().cache_dir == os.path.join(os.path.expanduser('~'), 'x')


@pytest.mark.parametrize(
    'argv, expected',
    [
        (['--task=femnist', '--population=1000'],
         'train.py: error: --population=1000 exceeds the 105 clients'),
        # Refused by absl's parser, before main() runs.
        (['--algorithm=bogus'], 'train.py: error: flag --algorithm=bogus: value should be one of'),
    ],
    ids=['refused_in_main', 'refused_by_the_flag_parser'],
)
def test_bad_input_in_a_process_of_its_own_ends_at_its_error_line(argv, expected, tmp_path):
  """TFF's import-time context, never used when the input is refused, is
  dropped before Python tears down (its clean-up printed a traceback after
  the error line)."""
  run = subprocess.run(
      [sys.executable, os.path.join(binaries.REPO_ROOT, 'bin', 'train.py'),
       *argv, f'--root_output_dir={tmp_path}'],
      capture_output=True, text=True, timeout=300,
      env=dict(os.environ, PYTHONPATH=binaries.REPO_ROOT),
  )
  assert run.returncode == 2
  assert expected in run.stderr
  assert 'Traceback' not in run.stderr and 'Exception ignored' not in run.stderr, run.stderr
