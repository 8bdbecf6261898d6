"""bin/demo.py: trains both algorithms and prints the comparison table."""

import re

from tests.bin import binaries
from tests.bin.train_test import run_main

demo = binaries.load('demo')


def test_demo_prints_the_table_and_where_the_outputs_are(capsys, cache_dir, tmp_path):
  run_main(
      [f'--flagfile={binaries.REPO_ROOT}/configs/demo_shakespeare.flags', f'--cache_dir={cache_dir}',
       f'--root_output_dir={tmp_path}', '--population=4', '--clients_per_round=2',
       '--total_rounds=1', '--eval_batch_size=256'],
      binary=demo,
  )
  out = capsys.readouterr().out
  assert 'Mean per-client test accuracy on shakespeare after 1 rounds' in out
  for algorithm in ('fedavg', 'local'):
    row = re.search(rf'^{algorithm} +([0-9.]+) .* +4 +(\S+)$', out, re.MULTILINE)
    assert row, out
    assert 0.0 <= float(row.group(1)) <= 1.0
    assert row.group(2) == f'{tmp_path}/shakespeare_{algorithm}_seed0'
