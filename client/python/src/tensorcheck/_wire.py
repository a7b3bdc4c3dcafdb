"""A Verify/Diagnose/Compare request serialized with its inline tensors
copied once.

Built through protobuf, an inline tensor's bytes are copied three times
before gRPC sees them: `tobytes()`, into the message (the upb runtime
takes `bytes` only and copies them into its arena), and again by
`SerializeToString()`. Here the request's small part (options, tensors
named by digest) is serialized by protobuf, and each inline tensor is
appended as the wire encoding of its field: the Tensor's dtype and shape
serialized by protobuf, then the data field's tag and length and the
array's own buffer, all joined into the request's bytes in one copy.

Tensors named by digest (a few dozen bytes) are appended the same way,
their Tensor serialized by protobuf whole.

This relies on a rule of the protobuf wire format: when a singular message
field occurs more than once, the parser merges the occurrences. So
`request.SerializeToString()` followed by `op { weight { ... } }` parses as
the request with its weight set (`tests/test_wire.py` checks that the bytes
parse to the message protobuf would have built).

    raw = encode_request(req, [("op.weight", w), ("observed", y)])
    channel.unary_unary(path, request_serializer=None, ...)(raw)

A CompareRequest's outputs are `observed[NAME]` (a NamedTensor of the
repeated `observed` field, appended in the order given: the parser adds
each occurrence of a repeated field as an element):

    raw = encode_request(creq, [("op.input", x), ("observed[torch]", y1),
                                ("observed[flax]", y2)])
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Union

import numpy as np
from google.protobuf.message import Message

from ._pb import pb
from ._store import TensorRef, byte_view
from ._tensors import dtype_enum

__all__ = ["encode_request", "named_path"]

_LEN = 2  # wire type of length-delimited fields (bytes, strings, messages)


def _varint(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _tag(number: int) -> bytes:
    return _varint((number << 3) | _LEN)


def _path_tags(path: str) -> tuple[bytes, ...]:
    """The tags of the message fields on the way from VerifyRequest to the
    Tensor at `path`."""
    desc: Any = pb.VerifyRequest.DESCRIPTOR
    tags = []
    for part in path.split("."):
        field = desc.fields_by_name[part]
        tags.append(_tag(field.number))
        desc = field.message_type
    return tuple(tags)


_PATHS = {p: _path_tags(p) for p in ("op.input", "op.weight", "op.bias", "observed")}
_DATA_TAG = _tag(pb.Tensor.DESCRIPTOR.fields_by_name["data"].number)
# CompareRequest.observed, a repeated NamedTensor {name, tensor}; `op`
# has VerifyRequest's number there too, so "op.*" paths serve both.
_NAMED_PREFIX, _NAMED_SUFFIX = "observed[", "]"
_COMPARE_OBSERVED_TAG = _tag(pb.CompareRequest.DESCRIPTOR.fields_by_name["observed"].number)
_NAME_TAG = _tag(pb.NamedTensor.DESCRIPTOR.fields_by_name["name"].number)
_NAMED_TENSOR_TAG = _tag(pb.NamedTensor.DESCRIPTOR.fields_by_name["tensor"].number)
assert pb.CompareRequest.DESCRIPTOR.fields_by_name["op"].number == (
    pb.VerifyRequest.DESCRIPTOR.fields_by_name["op"].number
)


def named_path(name: str) -> str:
    """The path of a CompareRequest output called `name`."""
    return f"{_NAMED_PREFIX}{name}{_NAMED_SUFFIX}"


Piece = Union[bytes, memoryview]


def _tensor_pieces(path: str, tensor: Union[np.ndarray, TensorRef]) -> list[Piece]:
    """The field at `path` (e.g. "op.weight") holding `tensor`, as pieces
    to join: the nested tags and lengths, then the Tensor. Inline, the
    Tensor is its dtype and shape, the data field's tag and length, and the
    array's own buffer; by digest, protobuf's serialization of it."""
    body: list[Piece]
    if isinstance(tensor, TensorRef):
        body = [tensor.to_proto().SerializeToString()]
        size = len(body[0])
    else:
        header = pb.Tensor(dtype=dtype_enum(tensor.dtype), shape=tensor.shape).SerializeToString()
        data = byte_view(tensor)
        length = _varint(data.nbytes)
        body = [header, _DATA_TAG, length, data]
        size = len(header) + len(_DATA_TAG) + len(length) + data.nbytes
    tags = _PATHS.get(path)
    if tags is None and path.startswith(_NAMED_PREFIX) and path.endswith(_NAMED_SUFFIX):
        # NamedTensor {name, tensor}: the name, then the Tensor in its field.
        name = path[len(_NAMED_PREFIX) : -len(_NAMED_SUFFIX)].encode()
        length = _varint(size)
        head = _NAME_TAG + _varint(len(name)) + name + _NAMED_TENSOR_TAG + length
        body[:0] = [head]
        size += len(head)
        tags = (_COMPARE_OBSERVED_TAG,)
    if tags is None:
        raise KeyError(path)
    # From the Tensor outwards: each enclosing field is its tag, the length
    # of what it encloses, then that.
    for tag in reversed(tags):
        length = _varint(size)
        body[:0] = [tag, length]
        size += len(tag) + len(length)
    return body


def encode_request(
    req: Message, tensors: Sequence[tuple[str, Union[np.ndarray, TensorRef]]]
) -> bytes:
    """`req` (without tensors) serialized with each (path, tensor) of
    `tensors` set: an array inline, its bytes (C-contiguous, little-endian,
    as from `as_array`) copied once, into the result; a TensorRef by
    digest."""
    pieces: list[Piece] = [req.SerializeToString()]
    for path, tensor in tensors:
        pieces.extend(_tensor_pieces(path, tensor))
    return b"".join(pieces)
