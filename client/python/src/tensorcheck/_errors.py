"""Exceptions: one `tensorcheck.Error` subclass per gRPC status code.

Inputs the client can judge on its own (unsupported dtype, wrong rank,
mismatched shapes, unknown option names) raise the built-in `TypeError` or
`ValueError` before any RPC is made. Everything the server or the transport
answers with a non-OK status raises a subclass of `Error`:

    try:
        report = client.verify_linear(x, w, configs=["cublaslt:bf16:fused"])
    except tensorcheck.FailedPreconditionError as e:  # no GPU on that host
        print(e.code, e.message)
"""

from __future__ import annotations

from typing import Optional

import grpc

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
]


class Error(Exception):
    """A call to the tensorcheck service failed.

    Attributes:
      code: the `grpc.StatusCode` the server (or the transport) answered.
      message: the status message: for INVALID_ARGUMENT it names the field,
        what was expected and what came.
      method: the RPC that failed, e.g. "Verify".
    """

    code: grpc.StatusCode = grpc.StatusCode.UNKNOWN

    def __init__(
        self, message: str, *, code: Optional[grpc.StatusCode] = None, method: str = ""
    ) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code
        self.message = message
        self.method = method

    def __str__(self) -> str:
        where = f" ({self.method})" if self.method else ""
        return f"{self.code.name}{where}: {self.message}"


class CancelledError(Error):
    """CANCELLED: the call was cancelled, usually by the caller."""

    code = grpc.StatusCode.CANCELLED


class UnknownError(Error):
    """UNKNOWN: an error the server did not classify."""

    code = grpc.StatusCode.UNKNOWN


class InvalidArgumentError(Error):
    """INVALID_ARGUMENT: a malformed request (unknown dtype or enum,
    rank/shape mismatch, data length != numel * itemsize, K mismatch, bias
    length != N, malformed configuration string)."""

    code = grpc.StatusCode.INVALID_ARGUMENT


class DeadlineExceededError(Error):
    """DEADLINE_EXCEEDED: the client's `timeout` expired."""

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
    """RESOURCE_EXHAUSTED: a tensor or request over the server's limits
    (see `Client.capabilities().limits`), a message over the gRPC limit, GPU
    out of memory, tensor store over budget."""

    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class FailedPreconditionError(Error):
    """FAILED_PRECONDITION: the backend exists but cannot run here (no GPU),
    the precision is unsupported on this device, or a tensor digest is not in
    the server's store."""

    code = grpc.StatusCode.FAILED_PRECONDITION


class AbortedError(Error):
    """ABORTED."""

    code = grpc.StatusCode.ABORTED


class OutOfRangeError(Error):
    """OUT_OF_RANGE."""

    code = grpc.StatusCode.OUT_OF_RANGE


class UnimplementedError(Error):
    """UNIMPLEMENTED: the server does not offer this RPC or feature."""

    code = grpc.StatusCode.UNIMPLEMENTED


class InternalError(Error):
    """INTERNAL: a server-side failure such as a sticky CUDA error; the
    server restarts itself."""

    code = grpc.StatusCode.INTERNAL


class UnavailableError(Error):
    """UNAVAILABLE: the server cannot be reached, or its queue is full, or it
    is draining/shutting down. Safe to retry later."""

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


def error_for(code: grpc.StatusCode, message: str, method: str = "") -> Error:
    """The Error subclass instance for a status code."""
    cls = _BY_CODE.get(code, Error)
    return cls(message, code=code, method=method)


def from_rpc_error(e: grpc.RpcError, method: str = "") -> Error:
    """Converts what a grpc call raised into a tensorcheck.Error."""
    code = e.code() if hasattr(e, "code") else grpc.StatusCode.UNKNOWN
    details = e.details() if hasattr(e, "details") else str(e)
    return error_for(code or grpc.StatusCode.UNKNOWN, details or "", method)
