"""Every `flax.linen.Dense` of a Flax model checked in one call.

    import tensorcheck.flax

    report = tensorcheck.flax.check_denses(model, variables, tokens,
                                           server="gpu-host:50051")
    print(report.summary())

`flax.linen.intercept_methods` sees every Dense call of one
`module.apply(variables, *args, **kwargs)`: its path in the module tree
(joined with ".", e.g. "blocks_0.mlp.up") and call index, input, kernel
(IN_OUT layout, [K, N]), bias and output. Each call is then checked on the
server like `tensorcheck.torch.check_linears` does (docs/model-checks.md).
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any, Callable, Optional, Union

import flax.linen as nn
import numpy as np

from ._client import Client
from ._model import (
    DEFAULT_JOBS,
    Captures,
    ModelReport,
    check_captures,
    model_check_overrides,
)
from ._options import VerifyOptions
from ._tensors import as_array

__all__ = ["check_denses", "capture_denses"]


def _host(value: Any, name: str, dtype: Any = None) -> np.ndarray:
    arr = np.asarray(value)
    if dtype is not None and arr.dtype != dtype:
        arr = arr.astype(dtype)  # what Dense's promote_dtype computed in
    return as_array(arr, name).copy()


def capture_denses(
    module: nn.Module,
    variables: Any,
    *args: Any,
    method: Union[None, str, Callable[..., Any]] = None,
    **kwargs: Any,
) -> Captures:
    """Runs `module.apply(variables, *args, method=method, **kwargs)` once,
    intercepting every flax.linen.Dense call, and returns what they saw in
    execution order."""
    if not isinstance(module, nn.Module):
        raise TypeError(f"module: expected a flax.linen.Module, got {type(module).__name__}")
    captures = Captures()
    params: dict[tuple[Any, ...], np.ndarray] = {}

    def param(path: tuple[str, ...], what: str, value: Any, dtype: Any) -> np.ndarray:
        key = (path, what, str(dtype))
        arr = params.get(key)
        if arr is None:
            arr = _host(value, ".".join(path) + "." + what, dtype)
            params[key] = arr
        return arr

    def interceptor(next_fun: Callable[..., Any], args: Any, kwargs: Any, context: Any) -> Any:
        out = next_fun(*args, **kwargs)
        mod = context.module
        if not isinstance(mod, nn.Dense) or context.method_name != "__call__":
            return out
        path = tuple(str(p) for p in mod.path)
        name = ".".join(path) or type(module).__name__
        if not args:
            warnings.warn(
                f"tensorcheck: {name}: no positional input; call not checked", stacklevel=2
            )
            return out
        p = mod.variables.get("params", {})
        if "kernel" not in p:
            warnings.warn(
                f"tensorcheck: {name}: no 'kernel' parameter; call not checked", stacklevel=2
            )
            return out
        y = np.asarray(out)
        dtype = y.dtype
        kernel = p["kernel"]
        bias = p.get("bias") if mod.use_bias else None
        captures.add(
            name,
            _host(args[0], f"{name}.input", dtype),
            param(path, "kernel", kernel, dtype),
            None if bias is None else param(path, "bias", bias, dtype),
            _host(y, f"{name}.output"),
            weight_layout="in_out",
        )
        return out

    with nn.intercept_methods(interceptor):
        module.apply(variables, *args, method=method, **kwargs)
    return captures


def check_denses(
    module: nn.Module,
    variables: Any,
    *args: Any,
    client: Optional[Client] = None,
    server: Optional[str] = None,
    configs: Union[None, str, list[str]] = None,
    diagnose: bool = True,
    tolerance: Optional[str] = None,
    jobs: int = DEFAULT_JOBS,
    progress: Optional[bool] = None,
    bound_threshold: Optional[float] = None,
    timeout: Optional[float] = None,
    method: Union[None, str, Callable[..., Any]] = None,
    verify_options: Optional[Mapping[str, Any]] = None,
    options: Optional[VerifyOptions] = None,
    **kwargs: Any,
) -> ModelReport:
    """Checks every flax.linen.Dense call of one
    `module.apply(variables, *args, method=method, **kwargs)`; the other
    arguments are those of `tensorcheck.torch.check_linears` (`options` a
    tensorcheck.VerifyOptions for every layer call). Layer names are
    module paths joined with "." ("blocks_0.mlp.up")."""
    overrides = model_check_overrides(
        "check_denses",
        verify_options,
        configs=configs,
        tolerance=tolerance,
        timeout=timeout,
        bound_threshold=bound_threshold,
    )
    captures = capture_denses(module, variables, *args, method=method, **kwargs)
    if not captures.items:
        warnings.warn(
            f"tensorcheck: {type(module).__name__} ran no flax.linen.Dense; nothing to check",
            stacklevel=2,
        )
    return check_captures(
        captures.items,
        client=client,
        server=server,
        diagnose=diagnose,
        jobs=jobs,
        progress=progress,
        framework="flax",
        model=type(module).__name__,
        options=options,
        **overrides,
    )
