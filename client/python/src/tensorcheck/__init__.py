"""tensorcheck: verify a linear layer's numerics on a remote tensorcheck server.

    import tensorcheck

    # In a pytest suite: one line, a torch-style message and a diagnosis on
    # failure.
    tensorcheck.assert_linear_parity(x, w, b, observed=y)

    # Or the full report:
    with tensorcheck.Client("gpu-host:50051") as client:
        report = client.verify_linear(x, w, b, observed=y,
                                      configs=["cublaslt:tf32:fused"])
        report.passed, report.to_dict()

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
linear layer call and return a `ModelReport` (docs/model-checks.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Optional, Union

from ._client import DEFAULT_TARGET, MAX_MESSAGE_BYTES, Client, TlsArg, tls_credentials
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
from ._model import LayerCheck, ModelComparison, ModelReport, assert_model_parity, compare_models
from ._report import (
    BackendInfo,
    BatchInvariance,
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
    RankedCandidate,
    Report,
    Stats,
    StoreInfo,
    SubBatch,
    Tolerance,
    UlpBucket,
)
from ._store import TensorRef

__version__ = "0.1.0"

__all__ = [
    "Client",
    "tls_credentials",
    "assert_linear_parity",
    "assert_model_parity",
    "compare_models",
    "ModelReport",
    "LayerCheck",
    "ModelComparison",
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
]


def assert_linear_parity(
    x: Any,
    weight: Any,
    bias: Any = None,
    *,
    observed: Any,
    target: Optional[str] = None,
    timeout: Optional[float] = None,
    tls: TlsArg = None,
    token: Optional[str] = None,
    candidates: Union[None, str, Sequence[str]] = None,
    diagnose: bool = True,
    **verify_options: Any,
) -> Report:
    """`Client(target, ...).assert_linear_parity(...)` on a one-off connection
    (target None: $TENSORCHECK_SERVER, else DEFAULT_TARGET; token None:
    $TENSORCHECK_TOKEN, else none).

    Raises AssertionError ("Tensor-likes are not close!", the mismatch
    statistics, then the diagnosis) when `observed` is not within the
    tolerance of the reference; returns the Report otherwise.
    `verify_options` are Client.verify_linear's, e.g. x_scale= and
    w_scale= (the dequantisation scales of an FP8 layer).
    """
    with Client(target, timeout=timeout, tls=tls, token=token) as client:
        return client.assert_linear_parity(
            x,
            weight,
            bias,
            observed=observed,
            candidates=candidates,
            diagnose=diagnose,
            **verify_options,
        )
