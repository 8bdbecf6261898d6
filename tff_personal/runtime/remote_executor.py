"""TFF's `RemoteExecutor`, with struct and federated arguments serialized in place.

TFF 0.87's `value_serialization.serialize_value` builds a value's
`executor_pb2.Value` bottom-up: each struct element and each client's value
is a message built on its own and then passed to its parent's constructor,
and protobuf (upb) copies a message into its parent every time. A round's
argument, `<<state, {client input}@CLIENTS, {P}@CLIENTS>, keys>`, is nested
five levels deep above its tensors, so its personal states were copied five
or six times, and once more into the `CreateValueRequest`: 0.50-0.61 s for
Ditto's 10 FEMNIST CNN states (68 MB), against 0.06-0.07 s in place
(docs/results_scale.md).

`serialize_into(value, type_spec, message)` writes struct and federated
levels directly into `message` (`add()` on the repeated fields), and a
NumPy array of a tensor type with a fully known, non-scalar shape and the
type's dtype straight into `message.array` (`tobytes()`, then one copy into
the message; TFF's path copies its bytes three more times, into an `Array`,
a `Value` and by `MergeFrom`: 0.05-0.06 s against 0.01 s for 10 FEMNIST CNN
states, docs/results_scale.md). Everything else (scalars,
strings, other array types, sequences, computations) goes to TFF's
`serialize_value`. The result is the same proto (tested against TFF's
serializer). `RemoteExecutor.create_value` serializes
struct and federated values straight into the request it sends; anything
else goes through TFF's own `create_value`.

This subclasses TFF 0.87's `RemoteExecutor` and reads its `_executor_id` and
`_stub`; `requirements.txt` pins that version.
"""

import numpy as np
import tensorflow_federated as tff
from tensorflow_federated.proto.v0 import executor_pb2
from tensorflow_federated.python.core.impl.executors import remote_executor as tff_remote_executor
from tensorflow_federated.python.core.impl.executors import value_serialization
from tensorflow_federated.python.core.impl.types import array_shape
from tensorflow_federated.python.core.impl.types import dtype_utils
from tensorflow_federated.python.core.impl.types import type_serialization


def serialize_into(value, type_spec: tff.Type, message: executor_pb2.Value) -> None:
  """Serializes `value` of `type_spec` into the empty `message`, as
  `value_serialization.serialize_value` would, copying each leaf once."""
  if isinstance(type_spec, tff.FederatedType):
    values = [value] if type_spec.all_equal else value
    if not isinstance(values, list):
      raise TypeError(f'A value of {type_spec} must be a list, got {type(values)}.')
    for member_value in values:
      serialize_into(member_value, type_spec.member, message.federated.value.add())
    message.federated.type.CopyFrom(type_serialization.serialize_type(type_spec).federated)
  elif isinstance(type_spec, tff.StructType):
    elements = list(tff.structure.iter_elements(tff.structure.from_container(value)))
    if len(elements) != len(type_spec):
      raise TypeError(
          f'Cannot serialize a struct value of {len(elements)} elements to a struct type'
          f' of {len(type_spec)} elements: {type_spec}.'
      )
    message.struct.SetInParent()  # An empty struct is still a struct.
    for (name, element_type), (_, element_value) in zip(
        tff.structure.iter_elements(type_spec), elements
    ):
      element = message.struct.element.add()
      if name:
        element.name = name
      serialize_into(element_value, element_type, element.value)
  elif _is_dense_array(value, type_spec):
    message.array.dtype = dtype_utils.to_proto(type_spec.dtype.type)
    message.array.shape.CopyFrom(array_shape.to_proto(value.shape))
    message.array.content = value.tobytes()
  else:
    leaf, leaf_type = value_serialization.serialize_value(value, type_spec)
    type_spec.check_assignable_from(leaf_type)
    message.MergeFrom(leaf)


def _is_dense_array(value, type_spec: tff.Type) -> bool:
  """Whether TFF would serialize `value` as `type_spec`'s bytes (`content`) as
  they are: an array of the type's numeric dtype and its known, non-scalar
  shape (TFF writes scalars and strings as repeated fields)."""
  return (
      isinstance(type_spec, tff.TensorType)
      and isinstance(value, np.ndarray)
      and type_spec.dtype.type is not np.str_
      and value.dtype == type_spec.dtype
      and array_shape.is_shape_fully_defined(type_spec.shape)
      and not array_shape.is_shape_scalar(type_spec.shape)
      and value.shape == tuple(type_spec.shape)
  )


class RemoteExecutor(tff.framework.RemoteExecutor):
  """`tff.framework.RemoteExecutor` whose `create_value` serializes in place."""

  async def create_value(self, value, type_spec=None):
    if self._stream_structs or not isinstance(type_spec, (tff.StructType, tff.FederatedType)):
      return await super().create_value(value, type_spec)
    self._check_has_executor_id()
    request = executor_pb2.CreateValueRequest(executor=self._executor_id)
    serialize_into(value, type_spec, request.value)
    response = self._stub.create_value(request)
    return tff_remote_executor.RemoteValue(response.value_ref, type_spec, self)
