"""Writes configs/ditto_protocol/: Ditto's Fashion-MNIST table at its scripts' protocol.

  .venv/bin/python tools/ditto_protocol_configs.py          # (re)write the flagfiles
  .venv/bin/python tools/ditto_protocol_configs.py --check  # exit 1 if any is stale

Ditto's scripts (Li, Hu, Beirami, Smith, ICML 2021; run_fashion_*_lam1.sh)
train 10 devices a round for 2 local steps of batch 16 at rate 0.05, with
lambda = 1 and 2 personal steps; here 300 rounds instead of 5,000 (each of
the 100 devices trains about 30 times). One flagfile per (setting, column):
`fmnist__<setting>__<column>.flags`, run by `bin/run_table.py
--configs_dir=configs/ditto_protocol --task=fmnist`.

The robust aggregators assume, as Ditto's code does, the expected number of
adversaries in a round, int(10 * fraction); Krum and multi-Krum need
10 > 2 f + 2, so f is capped at 3 (Ditto's code does not check).
"""

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FOLDER = os.path.join(ROOT, 'configs', 'ditto_protocol')
CLIENTS_PER_ROUND = 10
SHARED = """# Ditto's Fashion-MNIST table at its scripts' protocol, fewer rounds
# (written by tools/ditto_protocol_configs.py; docs/results_ditto.md).
# 100 devices with 5 classes each and log-normal sizes (--partition=ditto),
# 10 a round, 300 rounds of 2 local steps of batch 16 at rate 0.05; Ditto's
# lambda 1 with 2 personal steps. Run from the repository root.
--task=fmnist
--partition=ditto
--num_clients=100
--classes_per_client=5
--clients_per_round=10
--total_rounds=300
--client_epochs=1
--client_steps=2
--client_batch_size=16
--client_learning_rate=0.05
--server_learning_rate=1.0
--ditto_lambda=1
--ditto_personal_steps=2
--rounds_per_eval=150
--rounds_per_checkpoint=100
--seed=0
--root_output_dir=output/ditto_protocol
"""
SETTINGS = {
    'clean': ('none', 0.0),
    'a1_20': ('label_poison', 0.2), 'a1_50': ('label_poison', 0.5), 'a1_80': ('label_poison', 0.8),
    'a2_20': ('random_update', 0.2), 'a2_50': ('random_update', 0.5),
    'a2_80': ('random_update', 0.8),
    'a3_10': ('model_replacement', 0.1), 'a3_20': ('model_replacement', 0.2),
    'a3_50': ('model_replacement', 0.5),
}


def column_flags(column: str, fraction: float) -> list[str]:
  """The flags of one column in a setting whose adversaries are `fraction` of devices."""
  expected = int(CLIENTS_PER_ROUND * fraction + 1e-9)
  krum_f = min(expected, (CLIENTS_PER_ROUND - 3) // 2)
  return {
      'fedavg': ['--algorithm=fedavg', '--finetune_epochs=1'],  # Also the Fine-tuning column.
      'local': ['--algorithm=local', '--clients_per_round=100'],  # Every device, every round.
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
  """File name -> text of every flagfile."""
  written = {'fmnist.flags': SHARED}
  for setting, (attack, fraction) in SETTINGS.items():
    for column in COLUMNS:
      name = f'fmnist__{setting}__{column}'
      lines = ['# One cell group of Ditto\'s table at its protocol (tools/ditto_protocol_configs.py).',
               '--flagfile=configs/ditto_protocol/fmnist.flags', f'--attack={attack}']
      if fraction:
        lines.append(f'--attack_fraction={fraction}')
      lines += column_flags(column, fraction) + [f'--experiment_name={name}']
      written[f'{name}.flags'] = '\n'.join(lines) + '\n'
  return written


def main(argv) -> int:
  stale = []
  for name, text in files().items():
    path = os.path.join(FOLDER, name)
    current = open(path).read() if os.path.exists(path) else None
    if current != text:
      stale.append(name)
      if '--check' not in argv:
        os.makedirs(FOLDER, exist_ok=True)
        with open(path, 'w') as f:
          f.write(text)
  if stale and '--check' in argv:
    print(f'{len(stale)} stale flagfiles in configs/ditto_protocol; run {argv[0]}')
    return 1
  return 0


if __name__ == '__main__':
  sys.exit(main(sys.argv))
