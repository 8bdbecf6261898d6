"""Client-placed results matched to their clients by a key, never by position.

A computation's CLIENTS-placed result (personal states, per-client metrics)
is a list that the program pairs with the clients it sent in. In TFF's local
runtime the list comes back in input order; in the mergeable computation
context that spreads a round over several workers
(`tff.backends.native.create_mergeable_comp_execution_context`) the clients'
results are concatenated in the order the workers *finish*, so with 3 clients
on 2 workers the second worker's clients may come back first.

`with_client_keys` wraps a computation so that each client's key travels with
its input and comes back beside its result, in the same position (both are
client-placed values of the same sub-round, concatenated together):

  (P -> R)  becomes  (<arg=P, keys={int64}@CLIENTS> -> <result=R, keys={int64}@CLIENTS>)

and `call_in_key_order` calls it and puts every CLIENTS-placed list of R in
the order of the keys sent, raising if the keys that came back are not
exactly those sent.
"""

from typing import Any, Sequence

import numpy as np
import tensorflow_federated as tff

KEYS_TYPE = tff.FederatedType(np.int64, tff.CLIENTS)


class ClientKeyMismatchError(RuntimeError):
  """The client keys returned by a computation are not the keys sent."""


def with_client_keys(computation: tff.Computation) -> tff.Computation:
  """`computation` with a client-placed key beside its argument and result."""

  @tff.federated_computation(computation.type_signature.parameter, KEYS_TYPE)
  def keyed(arg, keys):
    return computation(arg), keys

  return keyed


def _is_client_list(type_spec) -> bool:
  return (
      isinstance(type_spec, tff.FederatedType)
      and type_spec.placement is tff.CLIENTS
      and not type_spec.all_equal
  )


def _has_client_list(type_spec) -> bool:
  if isinstance(type_spec, tff.StructType):
    return any(_has_client_list(t) for _, t in tff.structure.iter_elements(type_spec))
  return _is_client_list(type_spec)


def _permute(value: Any, type_spec, order: Sequence[int]) -> Any:
  """`value` with every CLIENTS-placed list in `type_spec` taken in `order`."""
  if _is_client_list(type_spec):
    return [value[i] for i in order]
  if _has_client_list(type_spec):  # A struct of federated values.
    types = [t for _, t in tff.structure.iter_elements(type_spec)]
    if isinstance(value, dict):
      return type(value)(
          (name, _permute(v, t, order)) for (name, v), t in zip(value.items(), types)
      )
    if isinstance(value, tff.structure.Struct):
      return tff.structure.Struct([
          (name, _permute(v, t, order))
          for (name, v), t in zip(tff.structure.iter_elements(value), types)
      ])
    permuted = [_permute(value[i], t, order) for i, t in enumerate(types)]
    if isinstance(value, tuple) and hasattr(value, '_fields'):  # NamedTuple.
      return type(value)(*permuted)
    return type(value)(permuted)  # list or tuple: federated values sit only in these.
  return value


def in_key_order(result: Any, result_type, returned_keys, keys: Sequence[int]) -> Any:
  """`result` with its client lists reordered from `returned_keys` to `keys`."""
  returned = [int(k) for k in returned_keys]
  if sorted(returned) != sorted(int(k) for k in keys) or len(set(returned)) != len(returned):
    raise ClientKeyMismatchError(
        f'The runtime returned results for clients {returned}, not for the'
        f' clients sent, {list(keys)}.'
    )
  position = {k: i for i, k in enumerate(returned)}
  return _permute(result, result_type, [position[int(k)] for k in keys])


def call_in_key_order(keyed: tff.Computation, arg: Sequence[Any], keys: Sequence[int]) -> Any:
  """Calls a `with_client_keys` computation; client results in `keys` order."""
  result, returned_keys = keyed(tuple(arg), [np.int64(k) for k in keys])
  return in_key_order(result, keyed.type_signature.result[0], returned_keys, keys)

