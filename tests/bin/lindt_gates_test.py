"""bin/lindt_gates.py: a row per attaching module of a finished LINDT run, bad input."""

import re

import pytest

from tests.bin import binaries
from tests.bin.train_test import SMALL_RUN, run_main

train = binaries.load('train')
lindt_gates = binaries.load('lindt_gates')


@pytest.fixture(scope='module')
def lindt_run(tmp_path_factory):
  root = tmp_path_factory.mktemp('runs')
  run_main(SMALL_RUN + ['--algorithm=lindt', '--lindt_learn_gates', '--lindt_own_global',
                        '--lindt_match_scale',
                        '--total_rounds=2',
                        f'--root_output_dir={root}', '--experiment_name=small_lindt'])
  return root / 'small_lindt'


def test_a_row_per_attaching_module(lindt_run, capsys):
  capsys.readouterr()
  run_main([f'--flagfile={lindt_run}/flags.txt', '--gate_examples=30'], binary=lindt_gates)
  lines = capsys.readouterr().out.strip().splitlines()
  # 3 clients a round for 2 rounds: 3 to 6 clients have trained an L.
  clients = int(lines[0].split(': ')[1].split()[0])
  assert 3 <= clients <= 6, lines[0]
  rows = [line.split(' | ') for line in lines[3:]]
  # FEMNIST's CNN: 4 blocks, a module after each (logits attached by default).
  assert [r[0] for r in rows] == ['| attach_1', '| attach_2', '| attach_3', '| attach_4']
  assert rows[3][1] == 'logits'
  for row in rows:
    gate_mean, gate_min, gate_max = (float(v) for v in re.findall(r'\d+\.\d+', row[2]))
    assert 0.0 < gate_min <= gate_mean <= gate_max < 1.0, row
    ratio_mean, ratio_min, ratio_max = (float(v) for v in re.findall(r'\d+\.\d+', row[3]))
    assert 0.0 < ratio_min <= ratio_mean <= ratio_max, row


@pytest.mark.parametrize('extra, message', [
    (['--algorithm=fedavg'], '--algorithm=fedavg: not a LINDT run (pass its flags.txt).'),
    (['--experiment_name=never_ran'], 'has no checkpoint (not a finished run?).'),
])
def test_bad_input_is_one_line_and_exit_2(lindt_run, capsys, extra, message):
  capsys.readouterr()
  with pytest.raises(SystemExit) as excinfo:
    run_main([f'--flagfile={lindt_run}/flags.txt'] + extra, binary=lindt_gates)
  assert excinfo.value.code == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and err[0].startswith('lindt_gates.py: error: ') and message in err[0], err
