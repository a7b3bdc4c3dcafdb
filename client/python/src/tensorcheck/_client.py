"""`Client`: the tensorcheck service from Python.

    import tensorcheck

    with tensorcheck.Client("localhost:50051") as client:
        report = client.verify_linear(x, w, b, observed=y,
                                      configs=["cpu:fp32", "cpu:tf32"])
        print(report.verdict, report.observed_vs_reference.max_abs)
        for r in report.results:
            print(r.config, r.vs_observed.max_ulp)

Arguments are checked on the client first (dtype, rank, shapes, option
names: TypeError / ValueError naming the argument), so a malformed call
never uploads a tensor. Everything the server rejects raises a
`tensorcheck.Error` subclass.

A call the server refuses with a retry hint (UNAVAILABLE or
RESOURCE_EXHAUSTED carrying `grpc-retry-pushback-ms`: queue full, draining,
in-flight bytes over budget) is sent again after the hinted wait, up to
`max_retries` times and never past the call's timeout; see `Client`.
"""

from __future__ import annotations

import math
import numbers
import random
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal, Optional, TypeVar, Union, overload

import grpc
import numpy as np
from google.protobuf.message import Message

from ._capabilities import Capabilities
from ._errors import Error, from_rpc_error
from ._format import format_diagnosis, format_mismatch
from ._pb import pb, pb_grpc
from ._report import Report
from ._tensors import as_array, parse_dtype, to_proto

__all__ = ["Client", "DEFAULT_TARGET", "MAX_MESSAGE_BYTES", "DEFAULT_MAX_RETRIES"]

DEFAULT_TARGET = "localhost:50051"
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
# The codes whose refusals are transient when the server says so; anything
# else is never retried, hint or not.
_RETRYABLE = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED})

_LAYOUTS: dict[str, pb.WeightLayout] = {
    "out_in": pb.WEIGHT_LAYOUT_OUT_IN,
    "in_out": pb.WEIGHT_LAYOUT_IN_OUT,
}
_ACTIVATIONS: dict[str, pb.Activation] = {
    "none": pb.ACTIVATION_NONE,
    "relu": pb.ACTIVATION_RELU,
    "gelu": pb.ACTIVATION_GELU_TANH,
    "gelu_tanh": pb.ACTIVATION_GELU_TANH,
}
_PRESETS: dict[str, pb.Tolerance.Preset] = {
    "torch": pb.Tolerance.PRESET_TORCH,
    "numpy": pb.Tolerance.PRESET_NUMPY,
    "polygraphy": pb.Tolerance.PRESET_POLYGRAPHY,
    "explicit": pb.Tolerance.PRESET_EXPLICIT,
    "ulp": pb.Tolerance.PRESET_ULP,
    "bound": pb.Tolerance.PRESET_BOUND,
}

ArrayLike = Any  # numpy array, torch.Tensor, jax.Array
TlsArg = Union[None, bool, grpc.ChannelCredentials]

_T = TypeVar("_T")


def _choice(value: object, table: Mapping[str, _T], name: str) -> _T:
    if not isinstance(value, str):
        raise TypeError(f"{name}: expected one of {sorted(table)}, got {type(value).__name__}")
    key = value.lower()
    if key not in table:
        raise ValueError(f"{name}: unknown value {value!r}; expected one of {sorted(table)}")
    return table[key]


def _config_list(value: Union[None, str, Iterable[str]], name: str) -> list[str]:
    if value is None:
        return []
    items = [value] if isinstance(value, str) else list(value)
    out: list[str] = []
    for i, spec in enumerate(items):
        where = name if isinstance(value, str) else f"{name}[{i}]"
        _check_spec(spec, where)
        out.append(spec)
    return out


def _check_spec(spec: object, name: str) -> None:
    """`backend:precision[:bias]` in form; the server judges the names."""
    if not isinstance(spec, str):
        raise TypeError(
            f"{name}: expected a string 'backend:precision[:bias]', got {type(spec).__name__}"
        )
    parts = spec.split(":")
    if len(parts) not in (2, 3) or not all(p.strip() for p in parts):
        raise ValueError(
            f"{name}: {spec!r} is not of the form 'backend:precision[:bias]' "
            "(e.g. 'cpu:fp32', 'cublaslt:bf16:fused')"
        )


@overload
def _non_negative(value: object, name: str, *, integer: Literal[True]) -> int: ...
@overload
def _non_negative(value: object, name: str, *, integer: Literal[False] = False) -> float: ...
def _non_negative(value: object, name: str, *, integer: bool = False) -> Union[int, float]:
    """`value` as a non-negative int (integer=True: an integral number, bool
    excluded) or a finite non-negative float (any real number)."""
    if integer:
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            raise TypeError(f"{name}: expected a non-negative integer, got {type(value).__name__}")
        if value < 0:
            raise ValueError(f"{name}: expected a non-negative value, got {value}")
        return int(value)
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name}: expected a number, got {type(value).__name__}")
    if not math.isfinite(value):
        raise ValueError(f"{name}: expected a finite number, got {value}")
    if value < 0:
        raise ValueError(f"{name}: expected a non-negative value, got {value}")
    return float(value)


def _shape(a: np.ndarray) -> list[int]:
    return list(a.shape)


class Client:
    """A connection to a tensorcheck server.

    Args:
      target: "host:port" (any gRPC target, e.g. "dns:///tensorcheck:50051").
      timeout: default deadline of each call, in seconds (None: no deadline).
      tls: None or False for a plaintext channel, True for TLS with the
        system's root certificates, or a `grpc.ChannelCredentials`.
      token: sent as `authorization: Bearer <token>` on every call.
      options: extra gRPC channel options, e.g. [("grpc.lb_policy_name",
        "round_robin")].
      max_retries: how many times a call is sent again after a refusal that
        carries the server's retry hint (UNAVAILABLE or RESOURCE_EXHAUSTED
        with `grpc-retry-pushback-ms`). The client waits the hinted time
        (at most 30 s, plus up to 10% jitter) and never past the call's
        timeout: when the wait would end after it, the refusal is raised at
        once. 0 disables retries. Refusals without the hint, and every
        other error, are raised at the first attempt.

    Thread-safe; use one client for many calls. Close it (or use it as a
    context manager) to release the channel.
    """

    def __init__(
        self,
        target: str = DEFAULT_TARGET,
        *,
        timeout: Optional[float] = None,
        tls: TlsArg = None,
        token: Optional[str] = None,
        options: Optional[Sequence[tuple[str, Any]]] = None,
        max_retries: int = DEFAULT_MAX_RETRIES,
    ) -> None:
        if not isinstance(target, str) or not target:
            raise ValueError(f"target: expected 'host:port', got {target!r}")
        if timeout is not None:
            timeout = _non_negative(timeout, "timeout")
            if timeout == 0:
                raise ValueError("timeout: expected a positive number of seconds, got 0")
        if token is not None and (
            not isinstance(token, str) or not token or any(c in token for c in "\r\n")
        ):
            raise ValueError("token: expected a non-empty single-line string")
        max_retries = _non_negative(max_retries, "max_retries", integer=True)
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

    @property
    def target(self) -> str:
        return self._target

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"tensorcheck.Client({self._target!r})"

    # --- RPCs ---------------------------------------------------------------

    def capabilities(self, *, timeout: Optional[float] = None) -> Capabilities:
        """What the server runs: backends and their configurations, device,
        limits, tolerance presets, whether it has a tensor store."""
        resp = self._rpc("GetCapabilities", pb.GetCapabilitiesRequest(), timeout)
        return Capabilities.from_proto(resp)

    def verify_linear(
        self,
        x: ArrayLike,
        weight: ArrayLike,
        bias: Optional[ArrayLike] = None,
        *,
        observed: Optional[ArrayLike] = None,
        weight_layout: str = "out_in",
        activation: str = "none",
        configs: Union[None, str, Sequence[str]] = None,
        reference: str = "cpu:fp64",
        tolerance: str = "torch",
        atol: Optional[float] = None,
        rtol: Optional[float] = None,
        return_outputs: bool = False,
        output_dtype: Any = None,
        max_ulp: Optional[int] = None,
        bound_factor: Optional[float] = None,
        bound_precision: Optional[str] = None,
        nan_equal: bool = False,
        top_k: int = 0,
        top_groups: int = 0,
        repeat: int = 0,
        disallow_reduced_precision_reduction: bool = False,
        timeout: Optional[float] = None,
    ) -> Report:
        """Runs y = act(x W^T + b) under each configuration and compares.

        Args:
          x: input [..., K] (float64/32/16 or bfloat16; numpy, torch or JAX).
          weight: [N, K] with weight_layout="out_in" (torch, candle) or
            [K, N] with "in_out" (a flax kernel); same dtype as x.
          bias: optional [N].
          observed: the output your framework produced, [..., N]. With it
            the verdict is "observed is within tolerance of the reference";
            without it, "every configuration is".
          weight_layout: "out_in" or "in_out".
          activation: "none", "relu" or "gelu" (tanh form).
          configs: "backend:precision[:bias]" strings, e.g. "cpu:tf32:fused".
          reference: the configuration everything is compared with.
          tolerance: "torch" (torch.testing.assert_close defaults for the
            dtype), "numpy", "polygraphy", "explicit" (needs atol and rtol),
            "ulp" (needs max_ulp) or "bound".
          atol, rtol: override the preset's values.
          return_outputs: fill `report.results[i].output` and
            `report.reference.output` with numpy arrays.
          output_dtype: dtype every configuration rounds its output to
            (default: the input's).
          max_ulp, bound_factor, bound_precision, nan_equal: tolerance details.
          top_k, top_groups: how many worst elements / columns / rows to list
            (0: the server's default).
          repeat: run each configuration this many times and report whether
            the bits were identical (`results[i].deterministic`).
          disallow_reduced_precision_reduction: cuBLAS flag for GPU backends.
          timeout: this call's deadline in seconds (default: the client's).

        Returns: a Report; `report.passed` is the verdict.
        """
        req = self._request(
            x,
            weight,
            bias,
            observed=observed,
            weight_layout=weight_layout,
            activation=activation,
            configs=_config_list(configs, "configs"),
            reference=reference,
            tolerance=tolerance,
            atol=atol,
            rtol=rtol,
            return_outputs=return_outputs,
            output_dtype=output_dtype,
            max_ulp=max_ulp,
            bound_factor=bound_factor,
            bound_precision=bound_precision,
            nan_equal=nan_equal,
            top_k=top_k,
            top_groups=top_groups,
            repeat=repeat,
            disallow_reduced_precision_reduction=disallow_reduced_precision_reduction,
        )
        return Report.from_proto(self._rpc("Verify", req, timeout))

    def diagnose_linear(
        self,
        x: ArrayLike,
        weight: ArrayLike,
        bias: Optional[ArrayLike] = None,
        *,
        observed: Optional[ArrayLike] = None,
        candidates: Union[None, str, Sequence[str]] = None,
        configs: Union[None, str, Sequence[str]] = None,
        weight_layout: str = "out_in",
        activation: str = "none",
        reference: str = "cpu:fp64",
        tolerance: str = "torch",
        atol: Optional[float] = None,
        rtol: Optional[float] = None,
        return_outputs: bool = False,
        output_dtype: Any = None,
        max_ulp: Optional[int] = None,
        bound_factor: Optional[float] = None,
        bound_precision: Optional[str] = None,
        nan_equal: bool = False,
        top_k: int = 0,
        top_groups: int = 0,
        repeat: int = 0,
        disallow_reduced_precision_reduction: bool = False,
        timeout: Optional[float] = None,
    ) -> Report:
        """Which configuration produced `observed`? (the Diagnose RPC)

        Same arguments as verify_linear; `observed` is required, and
        `candidates` (alias `configs`) lists the configurations to rank
        (None: every precision x bias mode the server's host supports).
        The answer is in `report.diagnosis`: `best`, `confidence`,
        `ranking`, `framework_hint`, `localization`, `explanation`.
        """
        if candidates is not None and configs is not None:
            raise TypeError("candidates: give either candidates= or configs=, not both")
        if observed is None:
            raise ValueError(
                "observed: diagnose_linear needs the observed output "
                "(the output your framework produced)"
            )
        name = "candidates" if configs is None else "configs"
        req = self._request(
            x,
            weight,
            bias,
            observed=observed,
            weight_layout=weight_layout,
            activation=activation,
            configs=_config_list(candidates if configs is None else configs, name),
            reference=reference,
            tolerance=tolerance,
            atol=atol,
            rtol=rtol,
            return_outputs=return_outputs,
            output_dtype=output_dtype,
            max_ulp=max_ulp,
            bound_factor=bound_factor,
            bound_precision=bound_precision,
            nan_equal=nan_equal,
            top_k=top_k,
            top_groups=top_groups,
            repeat=repeat,
            disallow_reduced_precision_reduction=disallow_reduced_precision_reduction,
        )
        return Report.from_proto(self._rpc("Diagnose", req, timeout))

    def assert_linear_parity(
        self,
        x: ArrayLike,
        weight: ArrayLike,
        bias: Optional[ArrayLike] = None,
        *,
        observed: ArrayLike,
        candidates: Union[None, str, Sequence[str]] = None,
        diagnose: bool = True,
        **verify_options: Any,
    ) -> Report:
        """Asserts that `observed` is within tolerance of the reference.

        On failure raises AssertionError with a torch-style message
        ("Tensor-likes are not close! ... Mismatched elements: N / M ...")
        followed by the server's diagnosis of which configuration `observed`
        matches (the Diagnose RPC over `candidates`, default: all). Keyword
        arguments are those of verify_linear. Returns the Report on success.
        """
        if observed is None:
            raise ValueError("observed: assert_linear_parity needs the observed output")
        unknown = set(verify_options) - _VERIFY_OPTIONS
        if unknown:
            raise TypeError(
                f"assert_linear_parity() got unexpected keyword arguments {sorted(unknown)}"
            )
        timeout = verify_options.pop("timeout", None)
        configs = _config_list(verify_options.pop("configs", None), "configs")
        cands = _config_list(candidates, "candidates")
        req = self._request(x, weight, bias, observed=observed, configs=configs, **verify_options)
        report = Report.from_proto(self._rpc("Verify", req, timeout))
        if report.passed:
            return report
        message = format_mismatch(report)
        if diagnose:
            dreq = pb.VerifyRequest()
            dreq.CopyFrom(req)
            del dreq.configs[:]
            dreq.configs.extend(cands)
            dreq.output.return_outputs = False
            try:
                diag = Report.from_proto(self._rpc("Diagnose", dreq, timeout))
            except Error as e:
                message += f"\n\nDiagnosis unavailable: {e}"
            else:
                if diag.diagnosis is not None:
                    message += "\n\n" + format_diagnosis(diag.diagnosis)
        raise AssertionError(message)

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
        if timeout is not None:
            timeout = _non_negative(timeout, "timeout")
        else:
            timeout = self._timeout
        # One deadline for the call, retries included: each attempt gets
        # what is left of it.
        deadline = None if timeout is None else time.monotonic() + timeout
        # The generated stub (tensorcheck_pb2_grpc) has no type stubs; the
        # overloads above state what each method takes and returns.
        stub_method = getattr(self._stub, method)
        retries = 0
        while True:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                response: Message = stub_method(request, timeout=left, metadata=self._metadata)
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

    def _tensor(self, arr: np.ndarray) -> pb.Tensor:
        """How a checked array goes on the wire. The tensor store slots in
        here: hash, FindMissingTensors, UploadTensor, then a digest Tensor."""
        return to_proto(arr)

    def _request(
        self,
        x: ArrayLike,
        weight: ArrayLike,
        bias: Optional[ArrayLike],
        *,
        observed: Optional[ArrayLike],
        configs: list[str],
        weight_layout: str = "out_in",
        activation: str = "none",
        reference: Optional[str] = "cpu:fp64",
        tolerance: Optional[str] = "torch",
        atol: Optional[float] = None,
        rtol: Optional[float] = None,
        return_outputs: bool = False,
        output_dtype: Any = None,
        max_ulp: Optional[int] = None,
        bound_factor: Optional[float] = None,
        bound_precision: Optional[str] = None,
        nan_equal: bool = False,
        top_k: int = 0,
        top_groups: int = 0,
        repeat: int = 0,
        disallow_reduced_precision_reduction: bool = False,
    ) -> pb.VerifyRequest:
        # Options first: they are cheap to check and a typo should not cost
        # a device-to-host copy of the tensors.
        layout = _choice(weight_layout, _LAYOUTS, "weight_layout")
        act = _choice(activation, _ACTIVATIONS, "activation")
        if reference is not None:
            _check_spec(reference, "reference")
        tol = self._tolerance(
            tolerance, atol, rtol, max_ulp, bound_factor, bound_precision, nan_equal
        )
        out_dtype: Optional[pb.DType] = (
            None if output_dtype is None else parse_dtype(output_dtype, "output_dtype")
        )
        top_k = _non_negative(top_k, "top_k", integer=True)
        top_groups = _non_negative(top_groups, "top_groups", integer=True)
        repeat = _non_negative(repeat, "repeat", integer=True)

        xa = as_array(x, "x")
        wa = as_array(weight, "weight")
        ba = None if bias is None else as_array(bias, "bias")
        ya = None if observed is None else as_array(observed, "observed")

        if xa.ndim < 1:
            raise ValueError(
                f"x: expected shape [..., K] (at least one dimension), got shape {_shape(xa)}"
            )
        if wa.ndim != 2:
            dims = "[N, K]" if layout == pb.WEIGHT_LAYOUT_OUT_IN else "[K, N]"
            raise ValueError(f"weight: expected a 2-D {dims} matrix, got shape {_shape(wa)}")
        if wa.dtype != xa.dtype:
            raise TypeError(
                f"weight: dtype {wa.dtype} differs from x's {xa.dtype}; "
                "the layer takes both in one storage dtype"
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

        op = pb.LinearOp(
            input=self._tensor(xa), weight=self._tensor(wa), weight_layout=layout, activation=act
        )
        if ba is not None:
            op.bias.CopyFrom(self._tensor(ba))
        if out_dtype is not None:
            op.output_dtype = out_dtype
        req = pb.VerifyRequest(
            op=op,
            configs=configs,
            reference=reference or "",
            tolerance=tol,
            repeat=repeat,
            disallow_reduced_precision_reduction=bool(disallow_reduced_precision_reduction),
        )
        if ya is not None:
            req.observed.CopyFrom(self._tensor(ya))
        req.output.return_outputs = bool(return_outputs)
        req.output.top_k = top_k
        req.output.top_groups = top_groups
        return req

    @staticmethod
    def _tolerance(
        preset: Optional[str],
        atol: Optional[float],
        rtol: Optional[float],
        max_ulp: Optional[int],
        bound_factor: Optional[float],
        bound_precision: Optional[str],
        nan_equal: bool,
    ) -> pb.Tolerance:
        t = pb.Tolerance(
            preset=_choice(preset or "torch", _PRESETS, "tolerance"), nan_equal=bool(nan_equal)
        )
        name = (preset or "torch").lower()
        if atol is not None:
            t.atol.value = _non_negative(atol, "atol")
        if rtol is not None:
            t.rtol.value = _non_negative(rtol, "rtol")
        if name == "explicit" and (atol is None or rtol is None):
            raise ValueError("atol: tolerance='explicit' needs both atol= and rtol=")
        if max_ulp is not None:
            t.max_ulp = _non_negative(max_ulp, "max_ulp", integer=True)
        elif name == "ulp":
            raise ValueError("max_ulp: tolerance='ulp' needs max_ulp= (0 means bitwise equal)")
        if bound_factor is not None:
            bf = _non_negative(bound_factor, "bound_factor")
            if bf == 0:
                raise ValueError("bound_factor: expected a positive number, got 0")
            t.bound_factor = bf
        if bound_precision is not None:
            if not isinstance(bound_precision, str):
                raise TypeError("bound_precision: expected a precision name such as 'tf32'")
            t.bound_precision = bound_precision
        return t


_VERIFY_OPTIONS = {
    "weight_layout",
    "activation",
    "configs",
    "reference",
    "tolerance",
    "atol",
    "rtol",
    "return_outputs",
    "output_dtype",
    "max_ulp",
    "bound_factor",
    "bound_precision",
    "nan_equal",
    "top_k",
    "top_groups",
    "repeat",
    "disallow_reduced_precision_reduction",
    "timeout",
}
