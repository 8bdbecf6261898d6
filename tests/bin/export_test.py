"""bin/export.py: a smoke run on femnist writes loadable computations."""

import json
import os

from tests.bin import binaries
from tests.bin.train_test import run_main
from tff_personal.reports import export

export_binary = binaries.load('export')


def test_exports_every_computation_with_its_type_signature(capsys, cache_dir, tmp_path):
  export_dir = str(tmp_path / 'local_femnist')
  run_main(
      ['--task=femnist', '--algorithm=local', f'--cache_dir={cache_dir}',
       f'--export_dir={export_dir}'],
      binary=export_binary,
  )
  assert f'Exported to {export_dir}' in capsys.readouterr().out
  with open(os.path.join(export_dir, export.MANIFEST)) as f:
    manifest = json.load(f)
  assert manifest['description']['algorithm'] == 'local'
  assert manifest['personal_state_type'].startswith(
      '{<trainable=<float32[5,5,1,32],float32[32],float32[5,5,32,64]'
  )
  computations = export.load_exported(export_dir)
  assert set(computations) == set(export.COMPUTATION_NAMES)
  assert str(computations['next'].type_signature) == (
      manifest['computations']['next']['type_signature']
  )
