"""`Client`: the tensorcheck service from Python.

    import tensorcheck

    with tensorcheck.Client("localhost:50051") as client:
        report = client.verify_linear(x, w, b, observed=y,
                                      configs=["cpu:fp32", "cpu:tf32"])
        print(report)              # the server's answer first, then the numbers
        for r in report.results:
            print(r.config, r.vs_observed.max_ulp)

Arguments are checked on the client first (dtype, rank, shapes, option
names: TypeError / ValueError naming the argument), so a malformed call
never uploads a tensor. Everything the server rejects raises a
`tensorcheck.Error` subclass.

Tensors above 1 MiB go through the server's tensor store (docs/api.md):
hashed here (SHA-256 of the buffer, no copy; a tensor whose exact bytes
were hashed by a recent call is recognised by comparing them, see
`DigestMemo`), `FindMissingTensors` asked
once per request, the missing ones uploaded in 4 MiB chunks (several at
once), and the request names them by digest. A FAILED_PRECONDITION naming
tensors the store lacks (evicted in between, or another replica behind a
load balancer) is retried after uploading them again, and a second one
with the tensors inline; a server without a store (UNIMPLEMENTED) gets
them inline. Outputs returned by digest are read back with `ReadTensor`.
`Client.upload` and `Client.read_tensor` use the store explicitly.

A server that cannot be reached raises UnavailableError naming its address
and how to point the client elsewhere (`server=`, $TENSORCHECK_SERVER).

A call the server refuses with a retry hint (UNAVAILABLE or
RESOURCE_EXHAUSTED carrying `grpc-retry-pushback-ms`: queue full, draining,
in-flight bytes over budget) is sent again after the hinted wait, up to
`max_retries` times and never past the call's timeout; see `Client`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import random
import re
import threading
import time
import uuid
import warnings
from collections.abc import Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Literal, Optional, TypeVar, Union, overload

import grpc
import numpy as np
from google.protobuf.message import Message

from ._capabilities import Capabilities
from ._compare import CompareResult
from ._errors import (
    Error,
    FailedPreconditionError,
    UnimplementedError,
    error_for,
    from_rpc_error,
    time_left,
)
from ._format import format_parity_failure
from ._options import (
    COMPARE_OPTION_NAMES,
    VerifyOptions,
    accept_list,
    config_list,
    fold_options,
    non_negative,
)
from ._pb import pb, pb_grpc
from ._progress import Progress, make_progress, size_text
from ._report import Report
from ._store import CHUNK_BYTES, INLINE_MAX_BYTES, DigestMemo, TensorRef, Uploader
from ._tensors import FP8_DTYPES, as_array, from_wire, wire_nbytes
from ._wire import encode_request, named_path

__all__ = [
    "Client",
    "DEFAULT_SERVER",
    "DEFAULT_TARGET",
    "MAX_MESSAGE_BYTES",
    "DEFAULT_MAX_RETRIES",
    "SERVER_ENV",
    "TOKEN_ENV",
    "resolve_server",
    "tls_credentials",
]

DEFAULT_SERVER = "localhost:50051"
# The old name of DEFAULT_SERVER, kept for existing code.
DEFAULT_TARGET = DEFAULT_SERVER
# What Client reads when it is given no server / no token (an empty value
# counts as unset); the CLI and the Go client read the same.
SERVER_ENV = "TENSORCHECK_SERVER"
TOKEN_ENV = "TENSORCHECK_TOKEN"
# The old name of SERVER_ENV: read (with a DeprecationWarning) when
# SERVER_ENV is unset.
TARGET_ENV = "TENSORCHECK_TARGET"
# Far above gRPC's 4 MiB default: a 1921x4096 bf16 input is 15.7 MB and a
# request carries several tensors. The server enforces its own limit.
MAX_MESSAGE_BYTES = 1 << 30
# Retries of a refusal that carries the server's retry hint.
DEFAULT_MAX_RETRIES = 3
# The longest the client waits on one hint: a server (or a proxy) that asks
# for minutes gets the error back instead of a silently hung call.
_MAX_RETRY_WAIT_S = 30.0
# Up to this fraction is added to each wait, so that the clients a busy
# server refused together do not all come back at the same instant.
_RETRY_JITTER = 0.1
# With progress=, how often the client asks the server how far a call got.
_PROGRESS_POLL_S = 0.5

# The metadata by which Verify, Diagnose and Compare declare their request's
# serialized size; the server admits the request for that much before it
# receives it (docs/api.md, "Request size").
REQUEST_BYTES_KEY = "tensorcheck-request-bytes"
_SIZE_DECLARED = frozenset({"Verify", "Diagnose", "Compare"})
# The codes whose refusals are transient when the server says so; anything
# else is never retried, hint or not.
_RETRYABLE = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED})
# Uploads (and hashes) running at once, per client.
_STORE_THREADS = 4
# How the message of an unreachable server begins (then its address).
_UNREACHABLE = "no answer from a tensorcheck server at"

ArrayLike = Any  # numpy array, torch.Tensor, jax.Array, TensorRef
TlsArg = Union[None, bool, grpc.ChannelCredentials]
# A PEM file's path, or its contents.
PemArg = Union[None, str, bytes, os.PathLike[str]]
# A checked tensor argument: an array from as_array, or a stored tensor.
Operand = Union[np.ndarray, TensorRef]

# The gRPC service, "tensorcheck.v1.TensorCheck".
_SERVICE = pb.DESCRIPTOR.services_by_name["TensorCheck"].full_name

_M = TypeVar("_M", bound=Message)


def resolve_server(
    server: Optional[str], target: Optional[str] = None, *, stacklevel: int = 3
) -> str:
    """The address to connect to: `server`, else the deprecated `target`
    (with a DeprecationWarning), else $TENSORCHECK_SERVER, else the
    deprecated $TENSORCHECK_TARGET (with a DeprecationWarning), else
    DEFAULT_SERVER. TypeError when both server and target are given."""
    return _resolve_server(server, target, stacklevel=stacklevel + 1)[0]


def take_target(
    server: Optional[str], target: Optional[str], *, stacklevel: int = 3
) -> Optional[str]:
    """`server`, or the deprecated `target=` in its place (with a
    DeprecationWarning); TypeError when both are given."""
    if target is None:
        return server
    warnings.warn(
        "target= is deprecated: use server= (the same address)",
        DeprecationWarning,
        stacklevel=stacklevel,
    )
    if server is not None:
        raise TypeError("server: give server= or the deprecated target=, not both")
    return target


# Where a Client's address came from, as its unreachable message says.
_FROM_ARGUMENT = "given as server="
_FROM_TARGET = "given as target="
_FROM_ENV = f"from {SERVER_ENV}"
_FROM_OLD_ENV = f"from {TARGET_ENV}"
_FROM_DEFAULT = f"the default: {SERVER_ENV} is unset"


def _resolve_server(
    server: Optional[str], target: Optional[str] = None, *, stacklevel: int = 3
) -> tuple[str, str]:
    """resolve_server's address, and where it came from."""
    if target is not None:
        taken = take_target(server, target, stacklevel=stacklevel + 1)
        assert taken is not None
        return taken, _FROM_TARGET
    if server is not None:
        return server, _FROM_ARGUMENT
    if os.environ.get(SERVER_ENV):
        return os.environ[SERVER_ENV], _FROM_ENV
    if os.environ.get(TARGET_ENV):
        warnings.warn(
            f"${TARGET_ENV} is deprecated: set ${SERVER_ENV} instead",
            DeprecationWarning,
            stacklevel=stacklevel,
        )
        return os.environ[TARGET_ENV], _FROM_OLD_ENV
    return DEFAULT_SERVER, _FROM_DEFAULT


# CompareRequest's output names (NamedTensor.name).
_OUTPUT_NAME = re.compile(r"[A-Za-z0-9_.\-]{1,64}")


def _named_outputs(outputs: object) -> list[tuple[str, Any]]:
    """compare_outputs' `outputs`: exactly two (name, array) pairs, named
    as the server takes them (letters, digits, '_', '-', '.'; at most 64
    characters)."""
    if not isinstance(outputs, Mapping):
        raise TypeError(
            "outputs: expected a dict of two named outputs, e.g. "
            f'{{"torch": y1, "flax": y2}}, got {type(outputs).__name__}'
        )
    items = list(outputs.items())
    if len(items) != 2:
        names = [k for k, _ in items]
        raise ValueError(
            "outputs: expected exactly two outputs to compare, e.g. "
            f'{{"torch": y1, "flax": y2}}; got {len(items)}: {names}'
        )
    for key, value in items:
        if not isinstance(key, str) or not _OUTPUT_NAME.fullmatch(key):
            raise ValueError(
                f"outputs: the name {key!r} is not 1 to 64 letters, digits, '_', '-' or '.'"
            )
        if value is None:
            raise ValueError(f"outputs[{key!r}]: expected an array, got None")
    return items


def _rpc_phase(method: str, request: Any) -> tuple[str, str]:
    """The progress phase of an RPC and what it says of it: the number of
    configurations or candidates only when the call lists them (otherwise
    the server picks them)."""
    n = len(request.configs)
    if method == "Verify":
        if request.accept:  # the server adds the accepted ones: a count unknown here
            return "diagnosing", ""
        return "verifying", f"{n} configuration{'s' if n != 1 else ''}" if n else ""
    parts = ["2 outputs"] if method == "Compare" else []
    if n:
        parts.append(f"{n} candidate{'s' if n != 1 else ''}")
    return "diagnosing", ", ".join(parts)


def _shape(a: Operand) -> list[int]:
    return list(a.shape)


def _dtype(a: Operand) -> str:
    """ "float32", "bfloat16", ... (numpy prints its dtypes so)."""
    return a.dtype if isinstance(a, TensorRef) else str(a.dtype)


def _same_dtype(a: Operand, b: Operand) -> bool:
    if isinstance(a, np.ndarray) and isinstance(b, np.ndarray):
        return a.dtype == b.dtype  # no str(dtype): numpy builds it in Python
    return _dtype(a) == _dtype(b)


def _weight_dtype_fits(w: Operand, x: Operand) -> bool:
    """The weight's storage dtype is the input's, or both are FP8: the
    mixed fp8 precisions take one format for each (which pairs a
    configuration accepts is the server's to say)."""
    return _same_dtype(w, x) or (_dtype(w) in FP8_DTYPES and _dtype(x) in FP8_DTYPES)


def _operand(value: Any, name: str) -> Operand:
    return value if isinstance(value, TensorRef) else as_array(value, name)


@dataclasses.dataclass
class _Call:
    """A checked Verify/Diagnose/Compare request before its tensors are
    placed: the request without them, each tensor by its field, and what
    hashing learnt (kept, so that a second request with the same tensors,
    the Diagnose of assert_linear_parity, does not hash again)."""

    request: Any  # pb.VerifyRequest, or pb.CompareRequest
    tensors: list[tuple[str, Operand]]
    # field -> reference of an array above INLINE_MAX_BYTES, once hashed
    hashed: dict[str, TensorRef] = dataclasses.field(default_factory=dict)
    # digest -> the array with those bytes, for (re-)uploads
    sources: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)

    def with_request(self, request: pb.VerifyRequest) -> _Call:
        return _Call(request, self.tensors, self.hashed, self.sources)


@dataclasses.dataclass
class _Transfer:
    """What one call moved through the store: bytes uploaded, and the
    digests the request named (digest -> size)."""

    uploaded_bytes: int = 0
    uploaded: set[str] = dataclasses.field(default_factory=set)
    referenced: dict[str, int] = dataclasses.field(default_factory=dict)
    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)

    def stored(self, ref: TensorRef) -> None:
        with self.lock:
            self.uploaded_bytes += ref.size_bytes
            self.uploaded.add(ref.digest)

    @property
    def reused_bytes(self) -> int:
        return sum(n for d, n in self.referenced.items() if d not in self.uploaded)


def _read_pem(value: PemArg, name: str) -> Optional[bytes]:
    if value is None:
        return None
    if isinstance(value, (bytes, bytearray)):
        data = bytes(value)
    elif isinstance(value, (str, os.PathLike)):
        try:
            with open(value, "rb") as f:
                data = f.read()
        except OSError as e:
            raise ValueError(f"{name}: cannot read {os.fspath(value)!r}: {e.strerror}") from e
    else:
        raise TypeError(f"{name}: expected a path or PEM bytes, got {type(value).__name__}")
    # Without this check a wrong file fails only at the handshake, as an
    # unreachable server.
    if b"-----BEGIN " not in data:
        raise ValueError(f"{name}: no PEM data (expected '-----BEGIN ...')")
    return data


def tls_credentials(
    ca: PemArg = None, cert: PemArg = None, key: PemArg = None
) -> grpc.ChannelCredentials:
    """TLS credentials for `Client(tls=...)` from PEM files (paths) or PEM
    bytes.

    Args:
      ca: the root certificates the server's certificate must chain to
        (None: the system's roots).
      cert, key: the client certificate (chain) and its private key, for a
        server that requires mutual TLS; both or neither.

    Raises ValueError naming the argument when only one of cert and key is
    given, a file cannot be read or holds no PEM data.

        client = tensorcheck.Client("tc.example:443", tls=tensorcheck.tls_credentials(
            ca="ca.pem", cert="client.pem", key="client.key"))
    """
    if (cert is None) != (key is None):
        raise ValueError(
            "cert: needs key (the certificate's private key)"
            if key is None
            else "key: needs cert (the client certificate)"
        )
    return grpc.ssl_channel_credentials(
        root_certificates=_read_pem(ca, "ca"),
        private_key=_read_pem(key, "key"),
        certificate_chain=_read_pem(cert, "cert"),
    )


class Client:
    """A connection to a tensorcheck server.

    Args:
      server: "host:port" (any gRPC target, e.g. "dns:///tensorcheck:50051");
        None: the TENSORCHECK_SERVER environment variable when set, else
        DEFAULT_SERVER ("localhost:50051"). `target=` and
        $TENSORCHECK_TARGET, the old names, still work and warn
        (DeprecationWarning).
      timeout: default deadline of each call, in seconds (None: no deadline).
      tls: None or False for a plaintext channel, True for TLS with the
        system's root certificates, or a `grpc.ChannelCredentials`, e.g.
        `tensorcheck.tls_credentials(ca="ca.pem")` (add cert= and key= for
        a server that requires mutual TLS).
      token: sent as `authorization: Bearer <token>` on every call, over TLS
        or plaintext alike; None: the TENSORCHECK_TOKEN environment variable
        when set, else no token. A server that requires one answers
        UnauthenticatedError without it (or with one it does not know), and
        PermissionDeniedError for a call the token has no right to.
      options: extra gRPC channel options, e.g. [("grpc.lb_policy_name",
        "round_robin")].
      max_retries: how many times a call is sent again after a refusal that
        carries the server's retry hint (UNAVAILABLE or RESOURCE_EXHAUSTED
        with `grpc-retry-pushback-ms`). The client waits the hinted time
        (at most 30 s, plus up to 10% jitter) and never past the call's
        timeout: when the wait would end after it, the refusal is raised at
        once. 0 disables retries. Refusals without the hint, and every
        other error, are raised at the first attempt.

    The tensor store: tensors above 1 MiB travel by digest through the
    server's store (see the module docstring and docs/api.md); a server
    without one (FindMissingTensors UNIMPLEMENTED, and its capabilities
    saying `tensor_store` false) is remembered, and this client sends it
    everything inline from then on. A call's `timeout`
    covers its hashing, uploads, the request and the reads of returned
    outputs together.

    A server that cannot be reached raises UnavailableError (retry_after
    None) from any call, naming the address and how to point the client
    elsewhere.

    Thread-safe; use one client for many calls. Close it (or use it as a
    context manager) to release the channel and the upload threads.
    """

    def __init__(
        self,
        server: Optional[str] = None,
        *,
        timeout: Optional[float] = None,
        tls: TlsArg = None,
        token: Optional[str] = None,
        options: Optional[Sequence[tuple[str, Any]]] = None,
        max_retries: int = DEFAULT_MAX_RETRIES,
        target: Optional[str] = None,
    ) -> None:
        target, self._server_from = _resolve_server(server, target)
        token_name = "token"
        if token is None:
            token = os.environ.get(TOKEN_ENV) or None
            token_name = TOKEN_ENV
        if not isinstance(target, str) or not target:
            raise ValueError(f"server: expected 'host:port', got {target!r}")
        if timeout is not None:
            timeout = non_negative(timeout, "timeout")
            if timeout == 0:
                raise ValueError("timeout: expected a positive number of seconds, got 0")
        if token is not None and (
            not isinstance(token, str) or not token or any(c in token for c in "\r\n")
        ):
            raise ValueError(f"{token_name}: expected a non-empty single-line string")
        max_retries = non_negative(max_retries, "max_retries", integer=True)
        channel_options = [
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
        ] + list(options or [])
        if tls is None or tls is False:
            channel = grpc.insecure_channel(target, options=channel_options)
        elif tls is True:
            channel = grpc.secure_channel(
                target, grpc.ssl_channel_credentials(), options=channel_options
            )
        elif isinstance(tls, grpc.ChannelCredentials):
            channel = grpc.secure_channel(target, tls, options=channel_options)
        else:
            raise TypeError(
                f"tls: expected None, a bool or grpc.ChannelCredentials, got {type(tls).__name__}"
            )
        self._target = target
        self._timeout = timeout
        self._max_retries = max_retries
        self._metadata = (("authorization", f"Bearer {token}"),) if token else None
        self._channel = channel
        self._stub = pb_grpc.TensorCheckStub(channel)
        # Verify and Diagnose taking requests serialized by `_prepare`.
        self._serialized = {
            m: channel.unary_unary(
                f"/{_SERVICE}/{m}",
                request_serializer=None,
                response_deserializer=pb.VerifyResponse.FromString,
            )
            for m in ("Verify", "Diagnose")
        }
        self._serialized["Compare"] = channel.unary_unary(
            f"/{_SERVICE}/Compare",
            request_serializer=None,
            response_deserializer=pb.CompareResponse.FromString,
        )
        self._uploader = Uploader(self._stub, self._metadata)
        # Digests of the large tensors hashed lately (a weight sent on every
        # call is compared, not hashed again).
        self._digests = DigestMemo()
        self._pool: Optional[ThreadPoolExecutor] = None
        self._pool_lock = threading.Lock()
        # The server's capabilities said it has no store: send inline.
        self._store_absent = False
        # StoreInfo.chunk_bytes once known (capabilities()).
        self._chunk_bytes: Optional[int] = None

    @property
    def server(self) -> str:
        """The address this client connects to."""
        return self._target

    @property
    def target(self) -> str:
        """The old name of `server` (DeprecationWarning)."""
        warnings.warn(
            "Client.target is deprecated: use Client.server", DeprecationWarning, stacklevel=2
        )
        return self._target

    def close(self) -> None:
        self._channel.close()
        self._digests.clear()
        with self._pool_lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"tensorcheck.Client(server={self._target!r})"

    # --- RPCs ---------------------------------------------------------------

    def capabilities(self, *, timeout: Optional[float] = None) -> Capabilities:
        """What the server runs: backends and their configurations, device,
        limits, tolerance presets, whether it has a tensor store."""
        with self._calling("GetCapabilities"):
            resp = self._rpc("GetCapabilities", pb.GetCapabilitiesRequest(), timeout)
        self._learn_store(resp)
        return Capabilities.from_proto(resp)

    def upload(self, array: ArrayLike, *, timeout: Optional[float] = None) -> TensorRef:
        """Puts a tensor in the server's store and returns its TensorRef.

        For explicit reuse: pass the ref wherever a tensor goes
        (`verify_linear(x, ref, ...)`) and the request names the stored
        tensor without hashing or sending it again. Any size, including
        tensors at or below 1 MiB that verify_linear would send inline.
        Only uploads when the store lacks the tensor (FindMissingTensors
        first); the upload goes in chunks of at most 4 MiB and resumes
        after a broken connection.

        Raises UnimplementedError against a server without a store, and
        ResourceExhaustedError for a tensor over its `max_tensor_bytes`.
        A stored tensor may be evicted later (least recently used first);
        a request naming it then raises FailedPreconditionError with
        `missing_tensors`: upload it again.
        """
        if isinstance(array, TensorRef):
            return array
        arr = as_array(array, "array")
        deadline = self._deadline(timeout)
        with self._calling("UploadTensor"):
            ref = self._digests.ref(arr)
            missing = self._find_missing([ref], deadline)
            if missing:
                self._upload_refs([ref], {ref.digest: arr}, deadline, _Transfer())
        return ref

    def read_tensor(self, ref: TensorRef, *, timeout: Optional[float] = None) -> np.ndarray:
        """A stored tensor as a writable numpy array of the ref's dtype and
        shape (bfloat16 as `ml_dtypes.bfloat16`, the FP8 formats as
        `ml_dtypes.float8_e4m3fn` / `ml_dtypes.float8_e5m2`). The bytes
        are checked against the digest (DataLossError otherwise);
        NotFoundError when the store does not hold it (never uploaded, or
        evicted)."""
        if not isinstance(ref, TensorRef):
            raise TypeError(f"ref: expected a tensorcheck.TensorRef, got {type(ref).__name__}")
        with self._calling("ReadTensor"):
            return self._read(ref, self._deadline(timeout))

    def verify_linear(
        self,
        x: ArrayLike,
        weight: ArrayLike,
        bias: Optional[ArrayLike] = None,
        *,
        observed: Optional[ArrayLike] = None,
        options: Optional[VerifyOptions] = None,
        **overrides: Any,
    ) -> Report:
        """Runs y = act(x W^T + b) under each configuration and compares.

        Args:
          x: input [..., K] (float64/32/16, bfloat16, float8_e4m3fn or
            float8_e5m2; numpy with ml_dtypes, torch or JAX).
          weight: [N, K] with weight_layout="out_in" (torch, candle) or
            [K, N] with "in_out" (a flax kernel); same dtype as x, or the
            other FP8 format (the mixed fp8 precisions). FP8 is for x and
            weight only: bias, observed and output_dtype stay
            float64/32/16 or bfloat16 (the server answers
            InvalidArgumentError naming the field otherwise).
          bias: optional [N].
          observed: the output your framework produced, [..., N]. With it
            the verdict is "observed is within tolerance of the reference";
            without it, "every configuration is".
          options: a tensorcheck.VerifyOptions: the configurations, the
            reference, the tolerance, accept, the FP8 scales, the output
            and run options, timeout and progress (its fields say each).
          **overrides: any field of VerifyOptions as a keyword argument
            (`configs=["cpu:tf32"]`, `tolerance="bound"`, `timeout=30`),
            applied over `options`; TypeError naming a keyword that is
            none.

        Any tensor may also be a `TensorRef` (from `Client.upload`).

        Returns: a Report; `report.passed` is the verdict, str(report) the
        server's answer first, `report.uploaded_bytes` /
        `report.reused_bytes` what went through the tensor store.
        """
        opts = fold_options(options, overrides, "verify_linear")
        prog = make_progress(opts.progress)
        call = self._request(x, weight, bias, observed=observed, options=opts)
        with self._calling("Verify"), contextlib.closing(prog):
            return self._run("Verify", call, opts.timeout, prog)

    def diagnose_linear(
        self,
        x: ArrayLike,
        weight: ArrayLike,
        bias: Optional[ArrayLike] = None,
        *,
        observed: Optional[ArrayLike] = None,
        candidates: Union[None, str, Sequence[str]] = None,
        options: Optional[VerifyOptions] = None,
        **overrides: Any,
    ) -> Report:
        """Which configuration produced `observed`? (the Diagnose RPC)

        Same arguments as verify_linear; `observed` is required, and
        `candidates` (the options' `configs` under another name; not both)
        lists the configurations to rank (None: every precision x bias
        mode the server's host supports). The answer is in
        `report.diagnosis`: `headline` (the answer in one sentence),
        `advice` (what to change), `best`, `confidence`, `ranking`,
        `framework_hint`, `localization`, `explanation`; with `accept=`,
        `accepted` and `accepted_as`, and the report's verdict is the
        acceptance. `progress=True` shows the phases (hashing, uploading,
        diagnosing) and their times.
        """
        opts = fold_options(options, overrides, "diagnose_linear")
        prog = make_progress(opts.progress)
        if candidates is not None and opts.configs is not None:
            raise TypeError("candidates: give either candidates= or configs=, not both")
        if observed is None:
            raise ValueError(
                "observed: diagnose_linear needs the observed output "
                "(the output your framework produced)"
            )
        if candidates is not None:
            opts = dataclasses.replace(opts, configs=config_list(candidates, "candidates"))
        call = self._request(x, weight, bias, observed=observed, options=opts)
        with self._calling("Diagnose"), contextlib.closing(prog):
            return self._run("Diagnose", call, opts.timeout, prog)

    def assert_linear_parity(
        self,
        x: ArrayLike,
        weight: ArrayLike,
        bias: Optional[ArrayLike] = None,
        *,
        observed: ArrayLike,
        candidates: Union[None, str, Sequence[str]] = None,
        diagnose: bool = True,
        options: Optional[VerifyOptions] = None,
        **overrides: Any,
    ) -> Report:
        """Asserts that `observed` is within tolerance of the reference,
        or, with `accept=`, that it is rounding of an accepted
        configuration (the server's acceptance; see VerifyOptions.accept).

        On failure raises AssertionError, at most 25 lines: the server's
        answer first (`Diagnosis.headline`, then its advice), then a
        torch-style summary ("Tensor-likes are not close! ... Mismatched
        elements: N / M ...") or, with accept=, the verdict and the
        statistics, then the diagnosis (without accept=: the Diagnose RPC
        over `candidates`, default all; diagnose=False skips it). pytest
        shows the test's own line, not this library's. `options` and
        the keyword arguments are those of verify_linear (FP8 layers:
        x_scale= and w_scale=, sent with both RPCs; `configs` are the
        Verify's). Returns the Report on success.
        """
        __tracebackhide__ = True  # pytest: the failure is the test's line
        if observed is None:
            raise ValueError("observed: assert_linear_parity needs the observed output")
        opts = fold_options(options, overrides, "assert_linear_parity")
        prog = make_progress(opts.progress)
        cands = config_list(candidates, "candidates")
        call = self._request(x, weight, bias, observed=observed, options=opts)
        with self._calling("Verify"), contextlib.closing(prog):
            report = self._run("Verify", call, opts.timeout, prog)
            if report.passed:
                return report
            # With accept= the Verify answer carries a diagnosis among
            # `configs` and the accepted configurations only; the Diagnose
            # over `candidates` (default all) can say what the output is
            # instead ("... Not accepted: it is not fp32.") and how to get
            # an accepted one. Its answer is shown unless it accepts the
            # output after all (a candidate tied to an accepted one):
            # the verdict is Verify's.
            diagnosis, unavailable = report.diagnosis, None
            if diagnose:
                dreq = pb.VerifyRequest()
                dreq.CopyFrom(call.request)
                del dreq.configs[:]
                dreq.configs.extend(cands)
                dreq.output.return_outputs = False
                try:
                    wider = self._run(
                        "Diagnose", call.with_request(dreq), opts.timeout, prog
                    ).diagnosis
                except Error as e:
                    if diagnosis is None:
                        unavailable = str(self._reachable(e, "Diagnose"))
                else:
                    if wider is not None and not wider.accepted:
                        diagnosis = wider
        raise AssertionError(format_parity_failure(report, diagnosis, unavailable))

    def compare_outputs(
        self,
        x: ArrayLike,
        weight: ArrayLike,
        bias: Optional[ArrayLike],
        outputs: Mapping[str, ArrayLike],
        *,
        candidates: Union[None, str, Sequence[str]] = None,
        options: Optional[VerifyOptions] = None,
        **overrides: Any,
    ) -> CompareResult:
        """Two outputs of one layer, e.g. PyTorch's and Flax's, each
        diagnosed against the same candidates, and their difference
        explained (the Compare RPC):

            result = client.compare_outputs(x, w, b, {"torch": y1, "flax": y2})
            print(result)                # the server's headline first
            result.headline              # "torch is cpu:fp32:fused (...), flax is ..."
            result["flax"].diagnosis     # each output's Diagnosis
            result.pair.rounding, result.pair.expected_max_abs, result.pair.stats

        `outputs` maps a name (letters, digits, '_', '-', '.'; at most 64
        characters) to an output [..., N]; exactly two. The other
        arguments are diagnose_linear's (`candidates`, alias `configs`:
        None for the server's default set; `accept=`: the verdict is then
        whether both outputs are accepted). Of `options`, the fields the
        Compare RPC has no place for (the tolerance's, the output and run
        options) are not used, and are TypeErrors as keyword arguments.
        Tensors above 1 MiB go through the tensor store, as in
        verify_linear. ValueError for anything but two well-named outputs
        of the layer's shape, before any call.
        """
        opts = fold_options(options, overrides, "compare_outputs", taken=COMPARE_OPTION_NAMES)
        prog = make_progress(opts.progress)
        if candidates is not None and opts.configs is not None:
            raise TypeError("candidates: give either candidates= or configs=, not both")
        named = _named_outputs(outputs)
        if candidates is not None:
            opts = dataclasses.replace(opts, configs=config_list(candidates, "candidates"))
        vcall = self._request(x, weight, bias, observed=None, options=opts, accept=None)
        placed = dict(vcall.tensors)
        xa, wa = placed["op.input"], placed["op.weight"]
        out_in = vcall.request.op.weight_layout == pb.WEIGHT_LAYOUT_OUT_IN
        n = wa.shape[0] if out_in else wa.shape[1]
        tensors = list(vcall.tensors)
        for out_name, value in named:
            ya = _operand(value, f"outputs[{out_name!r}]")
            want = list(xa.shape[:-1]) + [n]
            if _shape(ya) != want:
                raise ValueError(
                    f"outputs[{out_name!r}]: expected shape {want} (x's leading dims and N), "
                    f"got {_shape(ya)}"
                )
            tensors.append((named_path(out_name), ya))
        v = vcall.request
        req = pb.CompareRequest(
            op=v.op,
            configs=v.configs,
            reference=v.reference,
            output=pb.OutputOptions(top_k=v.output.top_k, top_groups=v.output.top_groups),
            accept=accept_list(opts.accept),
        )
        call = _Call(req, tensors)
        with self._calling("Compare"), contextlib.closing(prog):
            deadline = self._deadline(opts.timeout)
            transfer = _Transfer()
            resp = self._send("Compare", call, deadline, transfer, pb.CompareResponse, prog)
        return CompareResult._of_response(
            resp,
            uploaded_bytes=transfer.uploaded_bytes,
            reused_bytes=transfer.reused_bytes,
            accept=tuple(req.accept),
        )

    # --- internals ------------------------------------------------------------

    @overload
    def _rpc(
        self,
        method: Literal["GetCapabilities"],
        request: pb.GetCapabilitiesRequest,
        timeout: Optional[float],
    ) -> pb.GetCapabilitiesResponse: ...
    @overload
    def _rpc(
        self,
        method: Literal["Verify", "Diagnose"],
        request: pb.VerifyRequest,
        timeout: Optional[float],
    ) -> pb.VerifyResponse: ...
    def _rpc(self, method: str, request: Message, timeout: Optional[float]) -> Message:
        return self._unary(method, request, self._deadline(timeout), Message)

    def _deadline(self, timeout: Optional[float]) -> Optional[float]:
        """One deadline for a call, retries, uploads and reads included:
        each attempt gets what is left of it."""
        if timeout is not None:
            timeout = non_negative(timeout, "timeout")
        else:
            timeout = self._timeout
        return None if timeout is None else time.monotonic() + timeout

    def _unary(
        self,
        method: str,
        request: Union[Message, bytes],
        deadline: Optional[float],
        response_type: type[_M],
        request_id: Optional[str] = None,
    ) -> _M:
        """A unary call, retried after refusals that carry the retry hint.
        `request` is a message, or for Verify/Diagnose the bytes of one;
        `request_id` is sent as its x-request-id."""
        # The generated stub (tensorcheck_pb2_grpc) has no type stubs;
        # `response_type` states what the method returns.
        if isinstance(request, bytes):
            stub_method: Any = self._serialized[method]
        else:
            stub_method = getattr(self._stub, method)
        metadata = self._metadata
        if request_id is not None:
            metadata = (*(metadata or ()), ("x-request-id", request_id))
        if method in _SIZE_DECLARED:
            # So that the server admits it for its size before receiving it
            # (docs/api.md, "Request size").
            size = len(request) if isinstance(request, bytes) else request.ByteSize()
            metadata = (*(metadata or ()), (REQUEST_BYTES_KEY, str(size)))
        retries = 0
        while True:
            left = time_left(deadline, method)
            try:
                response: _M = stub_method(request, timeout=left, metadata=metadata)
                return response
            except grpc.RpcError as e:
                error = from_rpc_error(e, method)
            wait = self._retry_wait(error, retries, deadline)
            if wait is None:
                raise error
            time.sleep(wait)
            retries += 1

    def _retry_wait(self, error: Error, retries: int, deadline: Optional[float]) -> Optional[float]:
        """Seconds to wait before sending a refused call again, or None when
        `error` is to be raised: no retry hint, a code that is never
        retried, retries used up, or a wait that would end past the
        deadline (the server would only see an expired call)."""
        if error.retry_after is None or error.code not in _RETRYABLE:
            return None
        if retries >= self._max_retries:
            return None
        wait = min(error.retry_after, _MAX_RETRY_WAIT_S)
        wait *= 1.0 + random.uniform(0.0, _RETRY_JITTER)
        if deadline is not None and time.monotonic() + wait >= deadline:
            return None
        return wait

    # --- the tensor store -----------------------------------------------------

    def _run(
        self,
        method: Literal["Verify", "Diagnose"],
        call: _Call,
        timeout: Optional[float],
        progress: Optional[Progress] = None,
    ) -> Report:
        """`_send` with a deadline of its own, its response as a Report (the
        outputs returned by digest read within the deadline). UNIMPLEMENTED
        for a Verify with accept= that came back without a diagnosis: a
        server that predates acceptance ignored it, and its verdict would
        be the tolerance's."""
        deadline = self._deadline(timeout)
        transfer = _Transfer()
        resp = self._send(method, call, deadline, transfer, pb.VerifyResponse, progress)
        accept = tuple(call.request.accept)
        if accept and method == "Verify" and not resp.HasField("diagnosis"):
            raise error_for(
                grpc.StatusCode.UNIMPLEMENTED,
                f"the server at {self._target} predates accept= (it answered without a "
                "diagnosis, so its verdict is the tolerance's): upgrade it, or leave accept out",
                method,
            )
        return Report._of_response(
            resp,
            lambda t, name: self._read_output(t, name, deadline),
            uploaded_bytes=transfer.uploaded_bytes,
            reused_bytes=transfer.reused_bytes,
            accept=accept,
        )

    def _send(
        self,
        method: Literal["Verify", "Diagnose", "Compare"],
        call: _Call,
        deadline: Optional[float],
        transfer: _Transfer,
        response_type: type[_M],
        progress: Optional[Progress] = None,
    ) -> _M:
        """Places the call's tensors (inline or by digest, uploading what
        the store lacks) and sends the request.

        A FAILED_PRECONDITION naming tensors the store lacks is answered by
        uploading them and resending. Behind a load balancer (round_robin
        over replicas, each with its own store) every RPC may reach another
        replica, so the resend can miss again on one that never saw them:
        the second miss is answered by resending with every tensor this
        call has the bytes of inline, when that request fits in the
        server's messages (any replica takes it); otherwise it is raised."""
        prog = progress if progress is not None else Progress()
        req = self._prepare(call, deadline, transfer, prog)
        phase, detail = _rpc_phase(method, call.request)
        misses = 0
        while True:
            prog.start(phase, 1, detail)
            # While it runs, the server says how far it got (GetProgress).
            request_id = uuid.uuid4().hex if prog.wants_server_progress else None
            try:
                with self._watching_progress(request_id, prog):
                    resp = self._unary(method, req, deadline, response_type, request_id)
                break
            except FailedPreconditionError as e:
                if not e.missing_tensors or misses >= 2:
                    raise
                misses += 1
                if misses == 1:
                    self._upload_missing(call, e, deadline, transfer, prog)
                    continue
                inline = self._inline_request(call, e, deadline, transfer)
                if inline is None:
                    raise
                req = inline
        prog.finish()
        return resp

    @contextlib.contextmanager
    def _watching_progress(self, request_id: Optional[str], prog: Progress) -> Iterator[None]:
        """While the block runs, asks the server every half second how far
        the call sent with `request_id` has come (GetProgress) and hands its
        answer to `prog.server`. Nothing without an id; stops asking when
        the server does not know the RPC (an older one)."""
        if request_id is None:
            yield
            return
        done = threading.Event()

        def poll() -> None:
            req = pb.GetProgressRequest(request_id=request_id)
            while not done.wait(_PROGRESS_POLL_S):
                try:
                    p = self._stub.GetProgress(req, timeout=5.0, metadata=self._metadata)
                except grpc.RpcError as e:
                    if e.code() == grpc.StatusCode.UNIMPLEMENTED:
                        return
                    continue  # not started yet, or finished: ask again or stop
                if not done.is_set():
                    prog.server(p.phase, p.done, p.total)

        watcher = threading.Thread(target=poll, name="tensorcheck-progress", daemon=True)
        watcher.start()
        try:
            yield
        finally:
            done.set()
            watcher.join()

    @contextlib.contextmanager
    def _calling(self, method: str) -> Iterator[None]:
        """The public call `method` (the RPC the user's call stands for):
        an unreachable server raises from it, not from whichever RPC of the
        tensor store met it first (`_reachable`)."""
        try:
            yield
        except Error as e:
            reachable = self._reachable(e, method)
            if reachable is e:
                raise
            raise reachable from None

    def _reachable(self, error: Error, method: str) -> Error:
        """`error` itself, unless it is UNAVAILABLE without a retry hint (no
        server answers at this address, or the connection broke): then an
        UnavailableError for `method` that names the address and how to
        point the client at another one."""
        if error.code != grpc.StatusCode.UNAVAILABLE or error.retry_after is not None:
            return error
        if error.message.startswith(_UNREACHABLE):
            return error if error.method == method else error_for(error.code, error.message, method)
        return error_for(
            error.code,
            f"{_UNREACHABLE} {self._target} ({self._server_from}; {error.message}). Start one "
            'there, or point the client at yours: server="host:port" '
            f'(tensorcheck.Client("host:port")), or {SERVER_ENV}=host:port in the environment',
            method,
        )

    def _inline_request(
        self,
        call: _Call,
        error: FailedPreconditionError,
        deadline: Optional[float],
        transfer: _Transfer,
    ) -> Optional[bytes]:
        """The request with every array of the call inline (TensorRefs
        given by the caller stay by digest), or None when a missing tensor
        is such a TensorRef or the request would exceed the server's
        max_message_bytes (asked with GetCapabilities; None too when that
        fails)."""
        if any(m.digest not in call.sources for m in error.missing_tensors):
            return None
        size = sum(wire_nbytes(t) for _, t in call.tensors if isinstance(t, np.ndarray))
        try:
            caps = self._unary(
                "GetCapabilities", pb.GetCapabilitiesRequest(), deadline, pb.GetCapabilitiesResponse
            )
        except Error:
            return None
        limit = min(caps.limits.max_message_bytes, MAX_MESSAGE_BYTES)
        # Room for the options and the tensors' dtypes and shapes.
        if size + (1 << 16) > limit:
            return None
        for ref in call.hashed.values():
            transfer.referenced.pop(ref.digest, None)
        return encode_request(call.request, call.tensors)

    def _prepare(
        self,
        call: _Call,
        deadline: Optional[float],
        transfer: _Transfer,
        progress: Optional[Progress] = None,
    ) -> bytes:
        """The serialized request to send: call.request (the options) and
        each tensor in its field, inline (its bytes copied once, straight
        into the message: `encode_request`) or by digest."""
        large = [
            (f, t)
            for f, t in call.tensors
            if isinstance(t, np.ndarray) and wire_nbytes(t) > INLINE_MAX_BYTES
        ]
        by_digest: dict[str, TensorRef] = {
            f: t for f, t in call.tensors if isinstance(t, TensorRef)
        }
        if large and not self._store_absent:
            self._hash(call, large, progress)
            unique = {call.hashed[f].digest: call.hashed[f] for f, _ in large}
            try:
                missing = self._find_missing(list(unique.values()), deadline)
            except UnimplementedError:
                # Only the server's own word, its capabilities, says it has
                # no store: then inline, now and from now on. Any other
                # UNIMPLEMENTED (a proxy, a broken request) is raised.
                caps = self._unary(
                    "GetCapabilities",
                    pb.GetCapabilitiesRequest(),
                    deadline,
                    pb.GetCapabilitiesResponse,
                )
                if caps.tensor_store:
                    raise
                self._store_absent = True
            else:
                self._upload_refs(
                    [unique[d] for d in missing if d in unique],
                    call.sources,
                    deadline,
                    transfer,
                    progress,
                )
                by_digest.update((f, call.hashed[f]) for f, _ in large)
        placed: list[tuple[str, Operand]] = []
        for f, t in call.tensors:
            if f in by_digest:
                ref = by_digest[f]
                placed.append((f, ref))
                transfer.referenced[ref.digest] = ref.size_bytes
            else:
                placed.append((f, t))
        return encode_request(call.request, placed)

    def _hash(
        self,
        call: _Call,
        large: list[tuple[str, np.ndarray]],
        progress: Optional[Progress] = None,
    ) -> None:
        """Fills call.hashed for the large arrays not hashed yet (by this
        call or, with the same bytes, a recent one: `DigestMemo`), several
        at once (hashlib releases the GIL over a buffer); a single one on
        this thread."""
        todo = [(f, a) for f, a in large if f not in call.hashed]
        if not todo:
            return
        prog = progress if progress is not None else Progress()
        total = sum(wire_nbytes(a) for _, a in todo)
        prog.start("hashing", total, size_text(total, len(todo)))
        if len(todo) == 1:
            refs: Iterable[TensorRef] = [self._digests.ref(todo[0][1])]
        else:
            refs = self._executor().map(self._digests.ref, [a for _, a in todo])
        for (f, a), ref in zip(todo, refs):  # in order, as each is hashed
            call.hashed[f] = ref
            call.sources[ref.digest] = a
            prog.advance(wire_nbytes(a))
        prog.finish()

    def _find_missing(self, refs: list[TensorRef], deadline: Optional[float]) -> list[str]:
        """The digests (with the "sha256:" prefix) the store lacks."""
        resp = self._unary(
            "FindMissingTensors",
            pb.FindMissingTensorsRequest(digests=[r.tensor_digest() for r in refs]),
            deadline,
            pb.FindMissingTensorsResponse,
        )
        return [
            d.hash if d.hash.startswith("sha256:") else "sha256:" + d.hash
            for d in resp.missing_digests
        ]

    def _upload_missing(
        self,
        call: _Call,
        error: FailedPreconditionError,
        deadline: Optional[float],
        transfer: _Transfer,
        progress: Optional[Progress] = None,
    ) -> None:
        """Uploads again what a FAILED_PRECONDITION named as missing, or
        raises it when a missing tensor is a TensorRef (no bytes here)."""
        lost = {m.digest for m in error.missing_tensors}
        foreign = [m for m in error.missing_tensors if m.digest not in call.sources]
        if foreign:
            names = ", ".join(f"{m.field or '?'} ({m.digest})" for m in foreign)
            raise error_for(
                error.code,
                f"{error.message} [the server's store no longer holds {names}; "
                "upload it again with Client.upload]",
                error.method,
                missing_tensors=error.missing_tensors,
            ) from None
        refs = {ref.digest: ref for ref in call.hashed.values() if ref.digest in lost}
        self._upload_refs(list(refs.values()), call.sources, deadline, transfer, progress)

    def _upload_refs(
        self,
        refs: list[TensorRef],
        sources: Mapping[str, np.ndarray],
        deadline: Optional[float],
        transfer: _Transfer,
        progress: Optional[Progress] = None,
    ) -> None:
        """Uploads these tensors, several at once; raises the first error
        after every upload ended."""
        if not refs:
            return
        chunk = self._chunk_size(deadline)
        prog = progress if progress is not None else Progress()
        total = sum(r.size_bytes for r in refs)
        prog.start("uploading", total, size_text(total, len(refs)))

        def one(ref: TensorRef) -> None:
            try:
                stored = self._uploader.upload(
                    sources[ref.digest],
                    ref.tensor_digest(),
                    chunk_bytes=chunk,
                    deadline=deadline,
                    on_bytes=prog.advance,
                )
            except grpc.RpcError as e:
                raise from_rpc_error(e, "UploadTensor") from None
            if stored:
                transfer.stored(ref)

        if len(refs) == 1:
            one(refs[0])
        else:
            futures: list[Future[None]] = [self._executor().submit(one, r) for r in refs]
            errors = [f.exception() for f in futures]
            for err in errors:
                if err is not None:
                    raise err
        prog.finish()

    def _chunk_size(self, deadline: Optional[float]) -> int:
        """UploadTensor's chunk: StoreInfo.chunk_bytes (asked once) when
        smaller than 4 MiB, else 4 MiB."""
        if self._chunk_bytes is None:
            try:
                self._learn_store(
                    self._unary(
                        "GetCapabilities",
                        pb.GetCapabilitiesRequest(),
                        deadline,
                        pb.GetCapabilitiesResponse,
                    )
                )
            except Error:
                pass
            if self._chunk_bytes is None:
                self._chunk_bytes = CHUNK_BYTES
        return min(self._chunk_bytes, CHUNK_BYTES)

    def _learn_store(self, caps: pb.GetCapabilitiesResponse) -> None:
        if caps.HasField("store") and caps.store.chunk_bytes > 0:
            self._chunk_bytes = int(caps.store.chunk_bytes)

    def _read_output(self, t: pb.Tensor, name: str, deadline: Optional[float]) -> np.ndarray:
        try:
            ref = TensorRef.from_proto(t, name)
        except ValueError as e:
            raise error_for(grpc.StatusCode.DATA_LOSS, str(e), "ReadTensor") from None
        return self._read(ref, deadline)

    def _read(self, ref: TensorRef, deadline: Optional[float]) -> np.ndarray:
        try:
            buf = self._uploader.read(ref, deadline=deadline)
        except grpc.RpcError as e:
            raise from_rpc_error(e, "ReadTensor") from None
        return from_wire(buf, ref.dtype, ref.shape)

    def _executor(self) -> ThreadPoolExecutor:
        with self._pool_lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(
                    max_workers=_STORE_THREADS, thread_name_prefix="tensorcheck-store"
                )
            return self._pool

    def _request(
        self,
        x: ArrayLike,
        weight: ArrayLike,
        bias: Optional[ArrayLike],
        *,
        observed: Optional[ArrayLike],
        options: Optional[VerifyOptions] = None,
        **overrides: Any,
    ) -> _Call:
        """The checked Verify/Diagnose request of one layer: the options'
        part (`overrides`, VerifyOptions fields, applied over `options`)
        and the tensors, each checked against the others."""
        # Options first (made, so checked): a typo should not cost a
        # device-to-host copy of the tensors.
        opts = fold_options(options, overrides, "_request")
        req = opts._proto()
        if req.accept and observed is None:
            raise ValueError(
                "accept: needs observed= (the output whose configuration is to be accepted)"
            )
        layout = req.op.weight_layout
        weight_layout = opts.weight_layout

        xa = _operand(x, "x")
        wa = _operand(weight, "weight")
        ba = None if bias is None else _operand(bias, "bias")
        ya = None if observed is None else _operand(observed, "observed")

        if xa.ndim < 1:
            raise ValueError(
                f"x: expected shape [..., K] (at least one dimension), got shape {_shape(xa)}"
            )
        if wa.ndim != 2:
            dims = "[N, K]" if layout == pb.WEIGHT_LAYOUT_OUT_IN else "[K, N]"
            raise ValueError(f"weight: expected a 2-D {dims} matrix, got shape {_shape(wa)}")
        if not _weight_dtype_fits(wa, xa):
            raise TypeError(
                f"weight: dtype {_dtype(wa)} differs from x's {_dtype(xa)}; "
                "the layer takes both in one storage dtype (or both in FP8 formats)"
            )
        k = xa.shape[-1]
        if layout == pb.WEIGHT_LAYOUT_OUT_IN:
            n, wk, dims = wa.shape[0], wa.shape[1], "[N, K]"
        else:
            wk, n, dims = wa.shape[0], wa.shape[1], "[K, N]"
        if wk != k:
            raise ValueError(
                f"weight: shape {_shape(wa)} read as {dims} "
                f"(weight_layout={weight_layout!r}) has K={wk}, "
                f"but x has K={k} (shape {_shape(xa)})"
            )
        if ba is not None and (ba.ndim != 1 or ba.shape[0] != n):
            raise ValueError(f"bias: expected shape [{n}] (N), got {_shape(ba)}")
        if ya is not None:
            want = list(xa.shape[:-1]) + [n]
            if _shape(ya) != want:
                raise ValueError(
                    f"observed: expected shape {want} (x's leading dims and N), got {_shape(ya)}"
                )

        tensors: list[tuple[str, Operand]] = [("op.input", xa), ("op.weight", wa)]
        if ba is not None:
            tensors.append(("op.bias", ba))
        if ya is not None:
            tensors.append(("observed", ya))
        return _Call(req, tensors)
