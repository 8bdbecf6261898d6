"""Writes Ditto's Fashion-MNIST table at its scripts' protocol, as two folders of flagfiles.

  .venv/bin/python tools/ditto_protocol_configs.py          # (re)write the flagfiles
  .venv/bin/python tools/ditto_protocol_configs.py --check  # exit 1 if any is stale

Ditto's scripts (Li, Hu, Beirami, Smith, ICML 2021; run_fashion_*_lam1.sh)
train 10 devices a round for 2 local steps of batch 16 at rate 0.05, with
lambda = 1 and 2 personal steps, for 5,000 rounds. The two folders:

* configs/ditto_protocol: the 500 devices its data script builds
  (`--partition=ditto_code`: overlapping windows of 5 classes, log-normal
  sizes and class shares, the partition fixed by the script's seed); 1,000
  rounds instead of 5,000, so each device trains about 20 times.
* configs/ditto_protocol_100_devices: 100 devices of our `ditto` partition
  (5 classes each from a seeded order, which with 10 classes gives only two
  class sets), 300 rounds (each device about 30 times).

One flagfile per (setting, column): `fmnist__<setting>__<column>.flags`, run
by `bin/run_table.py --configs_dir=<folder> --task=fmnist`.

Under A2 and A3 the adversaries also train on random labels
(`--attack_poison_labels`): Ditto's code gives its corrupted devices random
labels under every attack, so the update an A2 adversary replaces with noise
of its spread, or an A3 adversary boosts, is a poisoned one.

The robust aggregators assume, as Ditto's code does, the expected number of
adversaries in a round, int(10 * fraction); Krum and multi-Krum need
10 > 2 f + 2, so f is capped at 3 (Ditto's code does not check).
"""

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CLIENTS_PER_ROUND = 10
TRAINING = """--task=fmnist
--clients_per_round=10
--client_epochs=1
--client_steps=2
--client_batch_size=16
--client_learning_rate=0.05
--server_learning_rate=1.0
--ditto_lambda=1
--ditto_personal_steps=2
--rounds_per_checkpoint=100
--seed=0
"""
# Folder -> (its devices, rounds and comment lines; its number of devices).
TABLES = {
    'ditto_protocol': ("""# Ditto's Fashion-MNIST table at its scripts' protocol, fewer rounds
# (written by tools/ditto_protocol_configs.py; docs/results_ditto.md).
# The 500 devices of Ditto's data script (overlapping windows of 5 classes,
# log-normal sizes and class shares), 10 a round, 1,000 rounds of 2 local
# steps of batch 16 at rate 0.05; Ditto's lambda 1 with 2 personal steps.
# Run from the repository root.
--partition=ditto_code
--num_clients=500
--classes_per_client=5
--total_rounds=1000
--rounds_per_eval=500
""", 500),
    'ditto_protocol_100_devices': ("""# Ditto's Fashion-MNIST table at its scripts' protocol on 100 devices of
# our `ditto` partition (written by tools/ditto_protocol_configs.py;
# docs/results_ditto.md). 5 classes a device from a seeded class order (two
# class sets with 10 classes), log-normal sizes; 10 a round, 300 rounds of 2
# local steps of batch 16 at rate 0.05; Ditto's lambda 1 with 2 personal
# steps. Run from the repository root.
--partition=ditto
--num_clients=100
--classes_per_client=5
--total_rounds=300
--rounds_per_eval=150
""", 100),
}
SETTINGS = {
    'clean': ('none', 0.0),
    'a1_20': ('label_poison', 0.2), 'a1_50': ('label_poison', 0.5), 'a1_80': ('label_poison', 0.8),
    'a2_20': ('random_update', 0.2), 'a2_50': ('random_update', 0.5),
    'a2_80': ('random_update', 0.8),
    'a3_10': ('model_replacement', 0.1), 'a3_20': ('model_replacement', 0.2),
    'a3_50': ('model_replacement', 0.5),
}


def column_flags(column: str, fraction: float, num_devices: int) -> list[str]:
  """The flags of one column in a setting whose adversaries are `fraction` of devices."""
  expected = int(CLIENTS_PER_ROUND * fraction + 1e-9)
  krum_f = min(expected, (CLIENTS_PER_ROUND - 3) // 2)
  return {
      'fedavg': ['--algorithm=fedavg', '--finetune_epochs=1'],  # Also the Fine-tuning column.
      # Every device, every round; 100 rounds a call: the same models, a
      # hundredth of TFF's per-call and per-client costs.
      'local': ['--algorithm=local', f'--clients_per_round={num_devices}',
                '--rounds_per_call=100'],
      'qffl': ['--algorithm=qffl', '--qffl_q=1'],
      'term': ['--algorithm=term', '--term_t=-1'],
      'fedavg_median': ['--algorithm=fedavg', '--aggregator=median'],
      'fedavg_krum': ['--algorithm=fedavg', '--aggregator=krum',
                      f'--aggregator_num_adversaries={krum_f}'],
      'fedavg_multi_krum': ['--algorithm=fedavg', '--aggregator=multi_krum',
                            f'--aggregator_num_adversaries={krum_f}'],
      'fedavg_k_norm': ['--algorithm=fedavg', '--aggregator=k_norm', f'--aggregator_k={expected}'],
      'fedavg_clipping': ['--algorithm=fedavg', '--aggregator=norm_clip'],
      'ditto': ['--algorithm=ditto'],
      'ditto_clipping': ['--algorithm=ditto', '--aggregator=norm_clip'],
  }[column]


COLUMNS = ('fedavg', 'local', 'qffl', 'term', 'fedavg_median', 'fedavg_krum',
           'fedavg_multi_krum', 'fedavg_k_norm', 'fedavg_clipping', 'ditto', 'ditto_clipping')


def files() -> dict[str, str]:
  """Path under configs/ -> text of every flagfile of both tables."""
  written = {}
  for folder, (devices, num_devices) in TABLES.items():
    written[f'{folder}/fmnist.flags'] = devices + TRAINING + f'--root_output_dir=output/{folder}\n'
    for setting, (attack, fraction) in SETTINGS.items():
      for column in COLUMNS:
        name = f'fmnist__{setting}__{column}'
        lines = ["# One cell group of Ditto's table at its protocol (tools/ditto_protocol_configs.py).",
                 f'--flagfile=configs/{folder}/fmnist.flags', f'--attack={attack}']
        if fraction:
          lines.append(f'--attack_fraction={fraction}')
        if attack in ('random_update', 'model_replacement'):
          lines.append('--attack_poison_labels=true')
        lines += column_flags(column, fraction, num_devices) + [f'--experiment_name={name}']
        written[f'{folder}/{name}.flags'] = '\n'.join(lines) + '\n'
  return written


def main(argv) -> int:
  stale = []
  for name, text in files().items():
    path = os.path.join(ROOT, 'configs', name)
    current = open(path).read() if os.path.exists(path) else None
    if current != text:
      stale.append(name)
      if '--check' not in argv:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, 'w') as f:
          f.write(text)
  if stale and '--check' in argv:
    print(f'{len(stale)} stale flagfiles in configs/ditto_protocol*; run {argv[0]}')
    return 1
  return 0


if __name__ == '__main__':
  sys.exit(main(sys.argv))
