"""Export of an algorithm's TFF computations for production runtimes.

`export_process` writes, for a `PersonalizedProcess`,

  initialize.pb, next.pb, evaluate.pb, get_model_weights.pb
      each a `tff.framework.serialize_computation` proto (TFF's portable
      computation format, runnable by any TFF runtime);
  manifest.json
      each computation's file and type signature, the personal state type,
      the TFF version, and what a new client's personal state is.

`load_exported` reads them back as `tff.Computation`s, in any process.
"""

import json
import os
from typing import Any, Mapping

import tensorflow_federated as tff
from tensorflow_federated.proto.v0 import computation_pb2

from tff_personal.personal import process as process_lib

COMPUTATION_NAMES = ('initialize', 'next', 'evaluate', 'get_model_weights')
MANIFEST = 'manifest.json'


def export_process(
    process: process_lib.PersonalizedProcess,
    directory: str,
    *,
    description: Mapping[str, Any],
) -> dict[str, Any]:
  """Serializes the computations of `process` into `directory`.

  Args:
    process: the algorithm.
    directory: created if needed; existing files of an export are replaced.
    description: recorded in the manifest (algorithm, task, hyperparameters).

  Returns:
    The manifest.
  """
  os.makedirs(directory, exist_ok=True)
  manifest = {
      'format': 'tff.framework.serialize_computation',
      'tff_version': tff.__version__,
      'description': dict(description),
      'personal_state_type': str(process.personal_state_type),
      'computations': {},
  }
  for name in COMPUTATION_NAMES:
    computation = getattr(process, name)
    filename = f'{name}.pb'
    proto = tff.framework.serialize_computation(computation)
    _write_atomically(os.path.join(directory, filename), proto.SerializeToString())
    manifest['computations'][name] = {
        'file': filename,
        'type_signature': str(computation.type_signature),
    }
  _write_atomically(
      os.path.join(directory, MANIFEST),
      (json.dumps(manifest, indent=2, sort_keys=True) + '\n').encode(),
  )
  return manifest


def load_exported(directory: str) -> dict[str, tff.Computation]:
  """The exported computations by name, deserialized."""
  with open(os.path.join(directory, MANIFEST)) as f:
    manifest = json.load(f)
  computations = {}
  for name, entry in manifest['computations'].items():
    proto = computation_pb2.Computation()
    with open(os.path.join(directory, entry['file']), 'rb') as f:
      proto.ParseFromString(f.read())
    computations[name] = tff.framework.deserialize_computation(proto)
  return computations


def _write_atomically(path: str, data: bytes) -> None:
  tmp = path + '.tmp'
  with open(tmp, 'wb') as f:
    f.write(data)
  os.replace(tmp, path)
