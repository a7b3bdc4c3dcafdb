"""tensorcheck: verify a linear layer's numerics on a remote tensorcheck server.

    import tensorcheck

    # In a pytest suite: one line; on failure the server's answer first
    # ("Rounding, not a bug: ...", "Not rounding: ... Look at ..."), then a
    # torch-style summary and the diagnosis.
    tensorcheck.assert_linear_parity(x, w, b, observed=y)
    # Or: pass when y is rounding of a configuration you accept.
    tensorcheck.assert_linear_parity(x, w, b, observed=y, accept=["tf32"])

    # Two frameworks' outputs of one layer: what each is, and whether their
    # difference is rounding.
    print(tensorcheck.compare_outputs(x, w, b, {"torch": y1, "flax": y2}))

    # Or the full report:
    with tensorcheck.Client("gpu-host:50051") as client:
        report = client.verify_linear(x, w, b, observed=y,
                                      configs=["cublaslt:tf32:fused"])
        print(report)             # the server's answer first
        report.passed, report.to_dict()

    # Options shared by many calls: one VerifyOptions, taken by every
    # entry point (keyword arguments still work, and win over it).
    opts = tensorcheck.VerifyOptions(tolerance="bound", accept=["tf32"], top_k=10)
    tensorcheck.assert_linear_parity(x, w, b, observed=y, options=opts)

The server's address is `server=` everywhere (`Client(server)`, the
module's functions, tensorcheck.torch.check_linears), default
$TENSORCHECK_SERVER, else localhost:50051.

Tensors may be numpy arrays (float64, float32, float16,
ml_dtypes.bfloat16, and for a layer's input and weight
ml_dtypes.float8_e4m3fn and float8_e5m2), torch tensors (any device,
including torch.bfloat16 and the torch.float8 formats) or JAX arrays. FP8
layers take their dequantisation scales as `x_scale=` and `w_scale=`
(those of torch._scaled_mm). Tensors above 1 MiB go through the server's
tensor store by themselves (uploaded once, then named by digest);
`client.upload(w)` returns a `TensorRef` to reuse explicitly,
`client.read_tensor(ref)` reads one back.

Whole models: `tensorcheck.torch.check_linears(model, *args)` and
`tensorcheck.flax.check_denses(module, variables, *args)` check every
linear layer call and return a `ModelReport` (docs/model-checks.md); its
JUnit XML and HTML page (`to_junit`, `to_html`) are drawn by the
tensorcheck CLI's `tensorcheck render` ($TENSORCHECK_CLI, else on PATH).

Files: `tensorcheck.save_safetensors(path, {name: array})` and
`tensorcheck.load_safetensors(path)` (bfloat16 and FP8 included).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Optional, Union

from ._client import (
    DEFAULT_SERVER,
    DEFAULT_TARGET,
    MAX_MESSAGE_BYTES,
    Client,
    TlsArg,
    take_target,
    tls_credentials,
)
from ._compare import ComparedOutput, CompareResult, OutputPair
from ._errors import (
    AbortedError,
    AlreadyExistsError,
    CancelledError,
    DataLossError,
    DeadlineExceededError,
    Error,
    FailedPreconditionError,
    InternalError,
    InvalidArgumentError,
    MissingTensor,
    NotFoundError,
    OutOfRangeError,
    PermissionDeniedError,
    ResourceExhaustedError,
    UnauthenticatedError,
    UnavailableError,
    UnimplementedError,
    UnknownError,
)
from ._model import LayerCheck, ModelComparison, ModelReport, compare_models
from ._model_parity import assert_model_parity
from ._options import VerifyOptions
from ._render import CliNotFoundError
from ._report import (
    BackendInfo,
    BatchInvariance,
    CallDecision,
    Capabilities,
    ConfigResult,
    Defect,
    DefectElement,
    DefectGroup,
    DeviceInfo,
    Diagnosis,
    Element,
    Group,
    Limits,
    Localization,
    NegligibleElements,
    RankedCandidate,
    Report,
    Stats,
    StoreInfo,
    SubBatch,
    Tolerance,
    UlpBucket,
)
from ._safetensors import load_safetensors, save_safetensors
from ._store import TensorRef

__version__ = "0.1.0"

__all__ = [
    "Client",
    "VerifyOptions",
    "tls_credentials",
    "assert_linear_parity",
    "assert_model_parity",
    "compare_outputs",
    "compare_models",
    "CompareResult",
    "ComparedOutput",
    "OutputPair",
    "save_safetensors",
    "load_safetensors",
    "ModelReport",
    "LayerCheck",
    "ModelComparison",
    "DEFAULT_SERVER",
    "DEFAULT_TARGET",
    "MAX_MESSAGE_BYTES",
    "Report",
    "Stats",
    "ConfigResult",
    "BatchInvariance",
    "SubBatch",
    "Tolerance",
    "Diagnosis",
    "RankedCandidate",
    "Localization",
    "Defect",
    "DefectGroup",
    "DefectElement",
    "Element",
    "Group",
    "UlpBucket",
    "NegligibleElements",
    "CallDecision",
    "Capabilities",
    "BackendInfo",
    "DeviceInfo",
    "Limits",
    "StoreInfo",
    "TensorRef",
    "MissingTensor",
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
    "CliNotFoundError",
]


def assert_linear_parity(
    x: Any,
    weight: Any,
    bias: Any = None,
    *,
    observed: Any,
    server: Optional[str] = None,
    timeout: Optional[float] = None,
    tls: TlsArg = None,
    token: Optional[str] = None,
    candidates: Union[None, str, Sequence[str]] = None,
    diagnose: bool = True,
    target: Optional[str] = None,
    options: Optional[VerifyOptions] = None,
    **overrides: Any,
) -> Report:
    """`Client(server, ...).assert_linear_parity(...)` on a one-off
    connection (server None: $TENSORCHECK_SERVER, else DEFAULT_SERVER;
    token None: $TENSORCHECK_TOKEN, else none; `timeout` is the
    connection's default deadline per call; `target=` is the deprecated
    name of `server=`).

    Raises AssertionError, at most 25 lines, the server's answer first
    (`Diagnosis.headline`, then its advice), then the mismatch statistics
    and the diagnosis, when `observed` is not within the tolerance of the
    reference, or with `accept=` (e.g. ["tf32"], ["cpu:bf16:unfused"]) when
    the server does not accept it as rounding of one of those
    configurations; returns the Report otherwise. `options` (a
    VerifyOptions) and the keyword arguments `overrides` (its fields,
    applied over it) are Client.verify_linear's, e.g. accept=, x_scale=
    and w_scale= (the dequantisation scales of an FP8 layer),
    progress=True.
    """
    __tracebackhide__ = True  # pytest: the failure is the test's line
    address = take_target(server, target)
    with Client(address, timeout=timeout, tls=tls, token=token) as client:
        return client.assert_linear_parity(
            x,
            weight,
            bias,
            observed=observed,
            candidates=candidates,
            diagnose=diagnose,
            options=options,
            **overrides,
        )


def compare_outputs(
    x: Any,
    weight: Any,
    bias: Any,
    outputs: Mapping[str, Any],
    *,
    server: Optional[str] = None,
    timeout: Optional[float] = None,
    tls: TlsArg = None,
    token: Optional[str] = None,
    candidates: Union[None, str, Sequence[str]] = None,
    options: Optional[VerifyOptions] = None,
    **overrides: Any,
) -> CompareResult:
    """`Client(server, ...).compare_outputs(x, weight, bias, outputs, ...)`
    on a one-off connection: two outputs of one layer ({"torch": y1,
    "flax": y2}), what each is and whether their difference is rounding.

        result = tensorcheck.compare_outputs(x, w, b, {"torch": y1, "flax": y2})
        print(result)      # the server's headline first, then a short summary

    `candidates`, `options` and the keyword arguments `overrides`
    (accept=, weight_layout=, progress=, ...) are Client.compare_outputs'.
    ValueError for anything but exactly two named outputs.
    """
    with Client(server, timeout=timeout, tls=tls, token=token) as client:
        return client.compare_outputs(
            x, weight, bias, outputs, candidates=candidates, options=options, **overrides
        )
