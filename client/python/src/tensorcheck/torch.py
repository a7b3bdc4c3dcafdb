"""Every `torch.nn.Linear` of a PyTorch model checked in one call.

    import tensorcheck.torch

    report = tensorcheck.torch.check_linears(model, tokens, server="gpu-host:50051")
    print(report.summary())
    report.first_divergence()     # None, or the first layer no
                                  # configuration explains

A forward hook on every `torch.nn.Linear` (subclasses included) captures,
per call, the module's qualified name and call index, its input, weight,
bias and output, as the model ran them (fp32, bf16, fp16; CUDA tensors are
copied to the host once). The model runs once under `torch.no_grad()`; the
hooks are removed afterwards, also when it raises. Then every call is
checked on the server (`tensorcheck._model.check_captures`: weights
through the tensor store once, requests pipelined). docs/model-checks.md
has the rules and the report.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any, Optional, Union

import numpy as np
import torch

from ._client import Client
from ._model import (
    DEFAULT_JOBS,
    Captures,
    ModelReport,
    check_captures,
    check_weight_keys,
    model_check_overrides,
)
from ._options import VerifyOptions
from ._tensors import as_array, numpy_dtype, parse_dtype

__all__ = ["check_linears", "capture_linears"]


def _host(t: torch.Tensor, name: str) -> np.ndarray:
    """A host copy of a tensor that later in-place ops cannot change: the
    device-to-host copy for CUDA tensors, one copy for CPU ones."""
    arr = as_array(t, name)
    if t.device.type == "cpu":
        arr = arr.copy()
    return arr


def _override(
    weights: Mapping[Any, Any], name: str, prefix: str, w: Any, b: Any
) -> tuple[Any, Any]:
    """The (weight, bias) to check module `name` against: its own `w` and
    `b` unless the `weights=` mapping has them, as {name: {"weight": ...,
    "bias": ...}} (or {name: weight}), or as a state_dict's
    "{prefix}weight" (with "{prefix}bias", none when absent: a checkpoint
    of a layer without bias) or "{prefix}bias" alone (the bias only);
    `prefix` is the module's qualified name and "." ("" for the model
    itself)."""
    if name in weights:
        entry = weights[name]
        if isinstance(entry, Mapping):
            return entry.get("weight"), entry.get("bias")
        return entry, None
    if f"{prefix}weight" in weights:
        return weights[f"{prefix}weight"], weights.get(f"{prefix}bias")
    if f"{prefix}bias" in weights:
        return w, weights[f"{prefix}bias"]
    return w, b


def _check_weights(model: torch.nn.Module, weights: Any, linears: list[str]) -> None:
    """A `weights=` mapping whose keys all name something in `model`: a
    key of its state_dict(), a parameter or buffer under any of its names
    (tied ones, non-persistent buffers that older checkpoints hold), or,
    for {name: {"weight": ..., "bias": ...}}, a torch.nn.Linear's name.
    A key for a parameter that is not checked (a LayerNorm's, an
    embedding's) is fine; one that matches nothing is a ValueError."""
    if not isinstance(weights, Mapping):
        raise TypeError(
            f"weights: expected a state_dict or a mapping of module names, got "
            f"{type(weights).__name__}"
        )
    known = set(linears)
    known.update(model.state_dict().keys())
    known.update(n for n, _ in model.named_parameters(remove_duplicate=False))
    known.update(n for n, _ in model.named_buffers(remove_duplicate=False))
    check_weight_keys(
        weights,
        known,
        f"{type(model).__name__} (its state_dict() keys, or a torch.nn.Linear's name)",
    )


def capture_linears(
    model: torch.nn.Module, *args: Any, weights: Optional[Mapping[str, Any]] = None, **kwargs: Any
) -> Captures:
    """Runs `model(*args, **kwargs)` once under torch.no_grad() with a
    forward hook on every torch.nn.Linear and returns what they saw, in
    execution order. `weights` replaces modules' parameters in the
    captures (not in the run): the checkpoint a port should have used; a
    key of it that matches nothing in `model` is a ValueError (see
    check_linears)."""
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model: expected a torch.nn.Module, got {type(model).__name__}")
    captures = Captures()
    # One host copy per parameter per run, however many calls use it.
    params: dict[tuple[int, int, torch.dtype], np.ndarray] = {}

    def param(t: Any, what: str, dtype: torch.dtype) -> np.ndarray:
        if not isinstance(t, torch.Tensor):  # a `weights=` entry: numpy, JAX
            arr = as_array(t, what)
            if arr.dtype != _np_dtype(dtype):
                raise TypeError(f"{what}: dtype {arr.dtype} differs from the layer's {dtype}")
            return arr
        key = (id(t), int(t._version), dtype)
        cached = params.get(key)
        if cached is None:
            cached = params[key] = _host(t.detach().to(dtype), what)
        return cached

    def hook(name: str, prefix: str) -> Any:
        def capture(module: torch.nn.Linear, inputs: tuple[Any, ...], output: Any) -> None:
            if not inputs or not isinstance(inputs[0], torch.Tensor):
                warnings.warn(
                    f"tensorcheck: {name}: no tensor input; call not checked", stacklevel=2
                )
                return
            if not isinstance(output, torch.Tensor):
                warnings.warn(
                    f"tensorcheck: {name}: output is not a tensor; call not checked", stacklevel=2
                )
                return
            w, b = module.weight, module.bias
            if weights is not None:
                w, b = _override(weights, name, prefix, w, b)
            # Under autocast the layer computes in the output's dtype:
            # check it as it ran, with x, W and b in that dtype.
            dtype = output.dtype
            x = inputs[0].detach()
            if x.dtype != dtype:
                x = x.to(dtype)
            captures.add(
                name,
                _host(x, f"{name}.input"),
                param(w, f"{name}.weight", dtype),
                None if b is None else param(b, f"{name}.bias", dtype),
                _host(output.detach(), f"{name}.output"),
            )

        return capture

    # (display name, state_dict prefix, module): the model itself, when a
    # Linear, shows as its class name; its state_dict keys have no prefix.
    named = [
        (name or type(model).__name__, f"{name}." if name else "", m)
        for name, m in model.named_modules()
        if isinstance(m, torch.nn.Linear)
    ]
    if weights is not None:
        _check_weights(model, weights, [name for name, _, _ in named])
    handles = [m.register_forward_hook(hook(name, prefix)) for name, prefix, m in named]
    try:
        with torch.no_grad():
            model(*args, **kwargs)
    finally:
        for h in handles:
            h.remove()
    return captures


def _np_dtype(dtype: torch.dtype) -> Any:
    """The numpy dtype of a torch dtype the wire carries (bfloat16 and
    FP8 as ml_dtypes), None for others: the mapping `_tensors` keeps."""
    try:
        return numpy_dtype(parse_dtype(dtype, "dtype"))
    except (TypeError, ValueError):
        return None


def check_linears(
    model: torch.nn.Module,
    *args: Any,
    client: Optional[Client] = None,
    server: Optional[str] = None,
    configs: Union[None, str, list[str]] = None,
    diagnose: bool = True,
    tolerance: Optional[str] = None,
    weights: Optional[Mapping[str, Any]] = None,
    jobs: int = DEFAULT_JOBS,
    progress: Optional[bool] = None,
    bound_threshold: Optional[float] = None,
    timeout: Optional[float] = None,
    verify_options: Optional[Mapping[str, Any]] = None,
    options: Optional[VerifyOptions] = None,
    **kwargs: Any,
) -> ModelReport:
    """Checks every torch.nn.Linear call of one `model(*args, **kwargs)`.

    Args:
      model, *args, **kwargs: the model and what to call it with (the
        keyword arguments are the model's: the options of the checks are
        `options`, `verify_options` and the ones named here).
      client / server: a tensorcheck.Client, or "host:port" (default
        localhost:50051) for a connection of this call's own.
      configs: candidate configurations (diagnose) or configurations
        (verify) for every layer; None: the options', else every one the
        server offers.
      diagnose: rank candidates per layer (Diagnose); False: Verify only.
      tolerance: the tolerance preset of each layer's verdict; None: the
        options', else "bound" (every element within its output
        precision's error bound); "torch" for assert_close's.
      weights: check against these parameters instead of the modules' own
        (a state_dict, or {name: {"weight": w, "bias": b}}): "my port ran
        with its weights; are its outputs those of the checkpoint's?".
        Keys for parameters that are not checked (a LayerNorm's) are fine;
        a key that matches nothing in the model (not a key of its
        state_dict(), not a parameter's or buffer's name, not a Linear's
        name) raises ValueError before the model runs, with the prefix to
        strip when they all carry one ("model.", "module.").
      jobs: requests in flight at once.
      progress: a progress bar on stderr (None: when stderr is a terminal).
      bound_threshold: the bound_ratio threshold sent with each request
        (VerifyOptions.bound_threshold): a layer call whose bound_ratio is
        not at most it diverges, as the server decides; None: the
        options', else the server's default, 3.
      timeout: each request's deadline, seconds; None: the options'.
      verify_options: fields of VerifyOptions by name, applied over
        `options`, e.g. {"return_outputs": True} for heatmaps in
        report.to_html().
      options: a tensorcheck.VerifyOptions for every layer call (see
        tensorcheck._model.check_captures for how a model check uses it).

    Returns a ModelReport (one row per layer call, execution order). A
    model without linear layers gives an empty report and a warning.
    """
    overrides = model_check_overrides(
        "check_linears",
        verify_options,
        configs=configs,
        tolerance=tolerance,
        timeout=timeout,
        bound_threshold=bound_threshold,
    )
    captures = capture_linears(model, *args, weights=weights, **kwargs)
    if not captures.items:
        warnings.warn(
            f"tensorcheck: {type(model).__name__} ran no torch.nn.Linear; nothing to check",
            stacklevel=2,
        )
    return check_captures(
        captures.items,
        client=client,
        server=server,
        diagnose=diagnose,
        jobs=jobs,
        progress=progress,
        framework="torch",
        model=type(model).__name__,
        options=options,
        **overrides,
    )
