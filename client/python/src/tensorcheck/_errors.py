"""Exceptions: one `tensorcheck.Error` subclass per gRPC status code.

Inputs the client can judge on its own (unsupported dtype, wrong rank,
mismatched shapes, unknown option names) raise the built-in `TypeError` or
`ValueError` before any RPC is made. Everything the server or the transport
answers with a non-OK status raises a subclass of `Error`:

    try:
        report = client.verify_linear(x, w, configs=["cublaslt:bf16:fused"])
    except tensorcheck.FailedPreconditionError as e:  # no GPU on that host
        print(e.code, e.message)

A refusal that is worth retrying carries the server's retry hint, the
`grpc-retry-pushback-ms` trailing metadata, as `Error.retry_after` (seconds):
UNAVAILABLE when the server's queue is full or it is draining,
RESOURCE_EXHAUSTED when its in-flight byte budget is momentarily full. The
`Client` retries those itself (see its `max_retries`); an error that reaches
the caller with `retry_after` set was refused on every attempt. A refusal
without the hint is permanent for that request (a tensor, the work or the
response over a server limit): sending it again cannot help.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable
from typing import Any, NamedTuple, Optional

import grpc
from google.protobuf import any_pb2, descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import DecodeError, Message

from ._pb import pb

__all__ = [
    "Error",
    "CancelledError",
    "UnknownError",
    "InvalidArgumentError",
    "DeadlineExceededError",
    "NotFoundError",
    "AlreadyExistsError",
    "PermissionDeniedError",
    "ResourceExhaustedError",
    "FailedPreconditionError",
    "AbortedError",
    "OutOfRangeError",
    "UnimplementedError",
    "InternalError",
    "UnavailableError",
    "DataLossError",
    "UnauthenticatedError",
    "MissingTensor",
]

# The trailing metadata key of gRPC's retry design (gRFC A6) by which a server
# says how long to wait before trying again: decimal milliseconds.
RETRY_PUSHBACK_KEY = "grpc-retry-pushback-ms"
_MILLISECONDS = re.compile(r"[0-9]{1,12}")
# The trailing metadata key of gRPC's rich error model: a serialized
# google.rpc.Status whose `details` say more than the message.
STATUS_DETAILS_KEY = "grpc-status-details-bin"
_MISSING_TYPE = "tensorcheck.v1.MissingTensors"


class MissingTensor(NamedTuple):
    """A tensor a request named by digest that the server's store lacks
    (`Error.missing_tensors`): the request field ("op.weight"), the digest
    and its size."""

    field: str
    digest: str
    size_bytes: int


# --- the status detail ---------------------------------------------------------


def _status_class() -> type[Message]:
    """google.rpc.Status with `details` read as raw bytes.

    {int32 code = 1; string message = 2; repeated google.protobuf.Any
    details = 3;}: an embedded message and `bytes` share the wire type, so
    each detail parses afterwards as a google.protobuf.Any. Defined in a
    private descriptor pool under a private name, so it never conflicts
    with googleapis-common-protos' google/rpc/status.proto.
    """
    f = descriptor_pb2.FieldDescriptorProto
    fd = descriptor_pb2.FileDescriptorProto(
        name="tensorcheck/_client/rpc_status.proto",
        package="tensorcheck._client",
        syntax="proto3",
    )
    msg = fd.message_type.add(name="Status")
    msg.field.add(name="code", number=1, type=f.TYPE_INT32, label=f.LABEL_OPTIONAL)
    msg.field.add(name="message", number=2, type=f.TYPE_STRING, label=f.LABEL_OPTIONAL)
    msg.field.add(name="details", number=3, type=f.TYPE_BYTES, label=f.LABEL_REPEATED)
    pool = descriptor_pool.DescriptorPool()
    pool.AddSerializedFile(fd.SerializeToString())
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("tensorcheck._client.Status"))


_Status = _status_class()


def status_details(metadata: Optional[Iterable[Any]]) -> list[any_pb2.Any]:
    """The `details` of the google.rpc.Status in trailing metadata; [] when
    there is none or it does not parse."""
    for item in metadata or ():
        key, value = item[0], item[1]
        if key != STATUS_DETAILS_KEY or not isinstance(value, bytes):
            continue
        try:
            status = _Status.FromString(value)
            out = []
            for raw in getattr(status, "details"):  # noqa: B009 - dynamic message
                out.append(any_pb2.Any.FromString(raw))
            return out
        except DecodeError:
            return []
    return []


def missing_tensors(metadata: Optional[Iterable[Any]]) -> list[MissingTensor]:
    """The tensors a FAILED_PRECONDITION's MissingTensors detail names."""
    out: list[MissingTensor] = []
    for detail in status_details(metadata):
        if detail.type_url.rsplit("/", 1)[-1] != _MISSING_TYPE:
            continue
        try:
            m = pb.MissingTensors.FromString(detail.value)
        except DecodeError:
            continue
        fields = list(m.fields)
        for i, d in enumerate(m.digests):
            digest = d.hash if d.hash.startswith("sha256:") else "sha256:" + d.hash
            out.append(MissingTensor(fields[i] if i < len(fields) else "", digest, d.size_bytes))
    return out


class Error(Exception):
    """A call to the tensorcheck service failed.

    Attributes:
      code: the `grpc.StatusCode` the server (or the transport) answered.
      message: the status message: for INVALID_ARGUMENT it names the field,
        what was expected and what came.
      method: the RPC that failed, e.g. "Verify".
      retry_after: the server's retry hint in seconds (its
        `grpc-retry-pushback-ms` trailing metadata), or None when it sent
        none. Set on transient refusals (UNAVAILABLE: queue full or
        draining; RESOURCE_EXHAUSTED: in-flight bytes momentarily over
        budget); None means retrying the same request cannot help.
      missing_tensors: for a FAILED_PRECONDITION naming tensors by digest
        that the server's store lacks (never uploaded, or evicted), a list
        of `MissingTensor(field, digest, size_bytes)` read from the status
        detail (a `tensorcheck.v1.MissingTensors`); [] otherwise. The
        client uploads those it has the bytes of and retries once by
        itself, so this reaches the caller for a `TensorRef` whose tensor
        was evicted (upload it again) or a second miss in a row.
    """

    code: grpc.StatusCode = grpc.StatusCode.UNKNOWN

    def __init__(
        self,
        message: str,
        *,
        code: Optional[grpc.StatusCode] = None,
        method: str = "",
        retry_after: Optional[float] = None,
        missing_tensors: Optional[list[MissingTensor]] = None,
    ) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code
        self.message = message
        self.method = method
        self.retry_after = retry_after
        self.missing_tensors: list[MissingTensor] = list(missing_tensors or ())

    def __str__(self) -> str:
        where = f" ({self.method})" if self.method else ""
        return f"{self.code.name}{where}: {self.message}"


class CancelledError(Error):
    """CANCELLED: the call was cancelled, usually by the caller (or the
    channel was closed while it was in flight)."""

    code = grpc.StatusCode.CANCELLED


class UnknownError(Error):
    """UNKNOWN: an error the server did not classify."""

    code = grpc.StatusCode.UNKNOWN


class InvalidArgumentError(Error):
    """INVALID_ARGUMENT: a malformed request (unknown dtype or enum,
    rank/shape mismatch, data length != numel * itemsize, K mismatch, bias
    length != N, malformed configuration string, bytes that do not parse as
    the request message). The message names the field."""

    code = grpc.StatusCode.INVALID_ARGUMENT


class DeadlineExceededError(Error):
    """DEADLINE_EXCEEDED: the call's `timeout` expired, or, for a call sent
    without one, the server's own cap on a request's time
    (`--max-request-seconds`)."""

    code = grpc.StatusCode.DEADLINE_EXCEEDED


class NotFoundError(Error):
    """NOT_FOUND: an unknown backend in a configuration."""

    code = grpc.StatusCode.NOT_FOUND


class AlreadyExistsError(Error):
    """ALREADY_EXISTS."""

    code = grpc.StatusCode.ALREADY_EXISTS


class PermissionDeniedError(Error):
    """PERMISSION_DENIED: the credentials are valid but this tenant may not
    make the call."""

    code = grpc.StatusCode.PERMISSION_DENIED


class ResourceExhaustedError(Error):
    """RESOURCE_EXHAUSTED: with `retry_after` set, the server's budget of
    bytes in flight is momentarily full (transient; the client retries it).
    Without it, permanent for this request: a tensor over the server's
    limits (see `Client.capabilities().limits`), a request whose work or
    response is over a limit, a message over the gRPC limit, GPU out of
    memory, tensor store over budget."""

    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class FailedPreconditionError(Error):
    """FAILED_PRECONDITION: the backend exists but cannot run here (no GPU),
    the precision is unsupported on this device, or a tensor digest is not in
    the server's store (`missing_tensors` then names them)."""

    code = grpc.StatusCode.FAILED_PRECONDITION


class AbortedError(Error):
    """ABORTED."""

    code = grpc.StatusCode.ABORTED


class OutOfRangeError(Error):
    """OUT_OF_RANGE."""

    code = grpc.StatusCode.OUT_OF_RANGE


class UnimplementedError(Error):
    """UNIMPLEMENTED: the server does not offer this RPC or feature (an
    older server, or a method of a newer API). A malformed request is
    INVALID_ARGUMENT, not this."""

    code = grpc.StatusCode.UNIMPLEMENTED


class InternalError(Error):
    """INTERNAL: a server-side failure such as a sticky CUDA error; the
    server restarts itself."""

    code = grpc.StatusCode.INTERNAL


class UnavailableError(Error):
    """UNAVAILABLE: with `retry_after` set, the server's queue is full or it
    is draining (the client retries it). Without it, the server could not be
    reached. Either way the request did not run: safe to send again later."""

    code = grpc.StatusCode.UNAVAILABLE


class DataLossError(Error):
    """DATA_LOSS."""

    code = grpc.StatusCode.DATA_LOSS


class UnauthenticatedError(Error):
    """UNAUTHENTICATED: missing or invalid credentials (see `token=`)."""

    code = grpc.StatusCode.UNAUTHENTICATED


_BY_CODE: dict[grpc.StatusCode, type[Error]] = {
    cls.code: cls
    for cls in (
        CancelledError,
        UnknownError,
        InvalidArgumentError,
        DeadlineExceededError,
        NotFoundError,
        AlreadyExistsError,
        PermissionDeniedError,
        ResourceExhaustedError,
        FailedPreconditionError,
        AbortedError,
        OutOfRangeError,
        UnimplementedError,
        InternalError,
        UnavailableError,
        DataLossError,
        UnauthenticatedError,
    )
}


def error_for(
    code: grpc.StatusCode,
    message: str,
    method: str = "",
    *,
    retry_after: Optional[float] = None,
    missing_tensors: Optional[list[MissingTensor]] = None,
) -> Error:
    """The Error subclass instance for a status code."""
    cls = _BY_CODE.get(code, Error)
    return cls(
        message,
        code=code,
        method=method,
        retry_after=retry_after,
        missing_tensors=missing_tensors,
    )


def retry_after_from_metadata(metadata: Optional[Iterable[Any]]) -> Optional[float]:
    """The retry hint in trailing metadata, in seconds: the value of
    `grpc-retry-pushback-ms` as a non-negative decimal integer, else None
    (absent, or not a number: treated as no hint, so not retried)."""
    for item in metadata or ():
        key, value = item[0], item[1]
        if key != RETRY_PUSHBACK_KEY:
            continue
        if isinstance(value, bytes):
            value = value.decode("ascii", "replace")
        text = str(value).strip()
        if not _MILLISECONDS.fullmatch(text):
            return None
        return int(text) / 1000.0
    return None


def from_rpc_error(e: grpc.RpcError, method: str = "") -> Error:
    """Converts what a grpc call raised into a tensorcheck.Error."""
    code = e.code() if hasattr(e, "code") else grpc.StatusCode.UNKNOWN
    details = e.details() if hasattr(e, "details") else str(e)
    trailing = e.trailing_metadata() if hasattr(e, "trailing_metadata") else None
    code = code or grpc.StatusCode.UNKNOWN
    return error_for(
        code,
        details or "",
        method,
        retry_after=retry_after_from_metadata(trailing),
        missing_tensors=(
            missing_tensors(trailing) if code == grpc.StatusCode.FAILED_PRECONDITION else None
        ),
    )


def time_left(deadline: Optional[float], method: str = "") -> Optional[float]:
    """Seconds left before `deadline` (a time.monotonic() value; None: no
    deadline) for the next call. An expired deadline raises
    DeadlineExceededError here, before any call: grpcio does not always
    enforce a timeout of zero, and would let such a call through."""
    if deadline is None:
        return None
    left = deadline - time.monotonic()
    if left <= 0:
        raise error_for(
            grpc.StatusCode.DEADLINE_EXCEEDED, "the deadline passed before the call", method
        )
    return left
