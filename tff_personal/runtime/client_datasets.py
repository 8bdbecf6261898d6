"""Clients that build their own datasets inside the TFF runtime.

A round normally receives each client's batches as a serialized
`tf.data.Dataset` in every call. Composing a dataset computation
`(K -> D*)` in front of `next` (TFF's "dataset computation", e.g.
`Task.train_dataset_computation` with K = `<client_id, seed>`) makes the
round take keys instead, and each client reads its examples where it runs:

  next: (<S@SERVER, {D*}@CLIENTS, {P}@CLIENTS> -> R)
    becomes (<S@SERVER, {K}@CLIENTS, {P}@CLIENTS> -> R)
  next: (<S@SERVER, {<data=D*,role=int32,seed=int64>}@CLIENTS, {P}@CLIENTS> -> R)
    becomes (<S@SERVER, {<data=K,role=int32,seed=int64>}@CLIENTS, {P}@CLIENTS> -> R)

The first form is what `tff.simulation.compose_dataset_computation_with_computation`
does; the second keeps the attack roles of `personal.compose` beside
the data. Same keys, same batches, same results (tested).

`without_autotuning` turns tf.data's autotuning off for the datasets that
clients iterate in TFF's worker (its docstring says why).
"""

import tensorflow as tf
import tensorflow_federated as tff


def without_autotuning(dataset: tf.data.Dataset) -> tf.data.Dataset:
  """`dataset` with tf.data's autotuning off.

  Every client pass iterates this: our client loops apply it
  (`training.client_training`, `evaluation.per_client`), and the tasks'
  datasets carry it (`tasks.base.Task`) for TFF's own client work (Local,
  FedProx).

  With autotuning on (tf.data's default), each iterator starts a thread that
  re-tunes the pipeline on a timer whose period grows, and destroying the
  iterator at the end of a client's pass waits for that thread to wake up.
  In TFF's worker (TF 2.14) both cores then sat idle for 0.3-0.9 s in most
  FEMNIST rounds: gdb in such a gap showed the clients' `DirectSession::Run`
  calls waiting in `~RootDataset::Iterator` on the thread in
  `Model::OptimizeLoop`. Our pipelines set no AUTOTUNE parameter, so turning
  it off changes no batch; FedAvg's rounds went from 1.2-2.9 s to 1.0-1.25 s
  (docs/results_scale.md).
  """
  options = tf.data.Options()
  options.autotune.enabled = False
  return dataset.with_options(options)


def first_steps(dataset: tf.data.Dataset, steps: int) -> tf.data.Dataset:
  """A round's client data cut to its first `steps` batches (0: all of them)."""
  return dataset.take(steps) if steps else dataset


def _client_input_type(next_fn: tff.Computation) -> tff.FederatedType:
  parameter = next_fn.type_signature.parameter
  if not isinstance(parameter, tff.StructType) or len(parameter) != 3:
    raise TypeError(f'Expected next(state, client_data, personal_states); got {parameter}.')
  return parameter[1]


def compose_client_datasets(
    dataset_computation: tff.Computation, next_fn: tff.Computation
) -> tff.Computation:
  """`next_fn` with each client's dataset built from a key by `dataset_computation`."""
  client_input = _client_input_type(next_fn)
  dataset_type = dataset_computation.type_signature.result
  member = client_input.member
  if isinstance(member, tff.SequenceType):
    if not member.is_assignable_from(dataset_type):
      raise TypeError(f'The dataset computation returns {dataset_type}; next takes {member}.')
    return tff.simulation.compose_dataset_computation_with_computation(
        dataset_computation, next_fn
    )
  names = [name for name, _ in tff.structure.iter_elements(member)]
  if not isinstance(member, tff.StructType) or 'data' not in names:
    raise TypeError(f'Clients take neither a dataset nor <data=...,...>: {client_input}.')
  if not member.data.is_assignable_from(dataset_type):
    raise TypeError(f'The dataset computation returns {dataset_type}; next takes {member.data}.')
  key_input = tff.FederatedType(
      tff.StructType([
          (name, dataset_computation.type_signature.parameter if name == 'data' else t)
          for name, t in tff.structure.iter_elements(member)
      ]),
      tff.CLIENTS,
  )
  parameter = next_fn.type_signature.parameter

  @tff.federated_computation(parameter[0], key_input, parameter[2])
  def composed_next(state, client_keys, personal_states):
    client_data = tff.federated_zip(
        tff.structure.Struct([
            (name, tff.federated_map(dataset_computation, client_keys.data)
             if name == 'data' else getattr(client_keys, name))
            for name in names
        ])
    )
    return next_fn(state, client_data, personal_states)

  return composed_next
