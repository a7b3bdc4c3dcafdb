"""`VerifyOptions`: the options of a request, in one type.

    opts = tensorcheck.VerifyOptions(configs=["cpu:fp32", "cpu:tf32"], top_k=10)
    client.verify_linear(x, w, b, observed=y, options=opts)
    client.diagnose_linear(x, w, b, observed=y, options=opts, top_k=3)  # a keyword wins
    tensorcheck.assert_linear_parity(x, w, b, observed=y, options=opts)
    tensorcheck.torch.check_linears(model, tokens, options=opts)

Every entry point that sends a layer (`Client.verify_linear`,
`diagnose_linear`, `assert_linear_parity`, `compare_outputs`, the module's
functions of those names, and the whole-model checks) takes
`options=VerifyOptions(...)`, and each field as a keyword argument too:
the keywords are applied over `options` (`dataclasses.replace`), so a
keyword wins. A keyword that is no field is a TypeError naming it. Each
field is checked when the options are made (`VerifyOptions(top_k=-1)`
raises), with TypeError or ValueError naming the field; a call's own
checks (the tensors, `accept` without `observed`) come after.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import numbers
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, ClassVar, Literal, Optional, TypeVar, Union, overload

from ._pb import pb
from ._progress import ProgressArg, check_progress
from ._tensors import as_scale, fill_proto, parse_dtype

__all__ = ["VerifyOptions", "fold_options", "LAYER_TOLERANCE"]

# The tolerance of a layer's verdict when the options name none (None):
# torch.testing.assert_close's defaults for the dtype. The whole-model
# checks have their own (tensorcheck._model.DEFAULT_TOLERANCE).
LAYER_TOLERANCE = "torch"

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

_T = TypeVar("_T")


# --- the checks of single values ------------------------------------------------


def choice(value: object, table: Mapping[str, _T], name: str) -> _T:
    """`value` looked up in `table`, case-insensitively."""
    if not isinstance(value, str):
        raise TypeError(f"{name}: expected one of {sorted(table)}, got {type(value).__name__}")
    key = value.lower()
    if key not in table:
        raise ValueError(f"{name}: unknown value {value!r}; expected one of {sorted(table)}")
    return table[key]


def check_spec(spec: object, name: str) -> None:
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


def config_list(value: Union[None, str, Iterable[str]], name: str) -> list[str]:
    """One configuration or several, each checked by check_spec; the
    errors name `name`, or `name[i]` for the i-th of several."""
    if value is None:
        return []
    items = [value] if isinstance(value, str) else list(value)
    out: list[str] = []
    for i, spec in enumerate(items):
        where = name if isinstance(value, str) else f"{name}[{i}]"
        check_spec(spec, where)
        out.append(spec)
    return out


def accept_list(value: Union[None, str, Iterable[str]]) -> list[str]:
    """`accept=`: configurations written `backend:precision[:bias]`,
    `precision[:bias]` or `backend:precision` (a part left out matches
    any), checked in form here; the server judges the names."""
    if value is None:
        return []
    items = [value] if isinstance(value, str) else list(value)
    for i, spec in enumerate(items):
        where = "accept" if isinstance(value, str) else f"accept[{i}]"
        if not isinstance(spec, str):
            raise TypeError(
                f"{where}: expected a configuration such as 'tf32' or 'cpu:bf16:unfused', "
                f"got {type(spec).__name__}"
            )
        parts = spec.split(":")
        if not 1 <= len(parts) <= 3 or not all(p.strip() for p in parts):
            raise ValueError(
                f"{where}: {spec!r} is not of the form 'backend:precision[:bias]', "
                "'precision[:bias]' or 'backend:precision' (e.g. 'tf32', 'cpu:bf16:unfused')"
            )
    return items


def gpu_name(value: object) -> str:
    """`gpu=`: a non-empty string, sent as given; the server judges the
    name."""
    if not isinstance(value, str):
        raise TypeError(
            f"gpu: expected a GPU name such as 'h100' or 'sm90', got {type(value).__name__}"
        )
    if not value.strip():
        raise ValueError(
            "gpu: expected a GPU (a100, h100, h200, gh200, b200, gb200) or a generation "
            "(sm80, sm90, sm100), got an empty string; None for no GPU"
        )
    return value


@overload
def non_negative(value: object, name: str, *, integer: Literal[True]) -> int: ...
@overload
def non_negative(value: object, name: str, *, integer: Literal[False] = False) -> float: ...
def non_negative(value: object, name: str, *, integer: bool = False) -> Union[int, float]:
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


def positive(value: object, name: str) -> float:
    """`value` as a finite positive float (any real number, bool excluded)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name}: expected a positive number, got {type(value).__name__}")
    if not math.isfinite(value):
        raise ValueError(f"{name}: expected a finite number, got {value}")
    if value <= 0:
        raise ValueError(f"{name}: expected a positive number, got {value}")
    return float(value)


def batch_size_list(value: object, enabled: bool) -> list[int]:
    """`batch_sizes` as a list of positive ints; refused without
    batch_invariance=True, where the server would ignore it. The server
    checks the upper bounds (each at most M, at most 8 sizes)."""
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        raise TypeError(
            f"batch_sizes: expected a sequence of positive integers, got {type(value).__name__}"
        )
    sizes = [non_negative(v, "batch_sizes", integer=True) for v in value]
    if 0 in sizes:
        raise ValueError(f"batch_sizes: expected positive sizes, got {sizes}")
    if sizes and not enabled:
        raise ValueError("batch_sizes: only with batch_invariance=True")
    return sizes


# --- the options ------------------------------------------------------------------

# Field metadata: the Compare RPC (compare_outputs) takes this option too.
_COMPARE: Mapping[str, Any] = {"compare": True}


@dataclasses.dataclass(frozen=True)
class VerifyOptions:
    """The options of a layer's request (Verify, Diagnose, Compare), given
    by keyword: `VerifyOptions(configs=["cpu:fp32"], tolerance="bound")`.

    Pass one as `options=` to any entry point (see the module docstring);
    keyword arguments of the call are applied over it. Each field is
    checked here, with TypeError or ValueError naming it. Frozen:
    `dataclasses.replace(opts, top_k=5)` makes a changed copy. The
    whole-model checks take each layer call's `weight_layout` from its
    capture and show their own progress (their `progress=`), so they use
    neither field; compare_outputs uses the fields the Compare RPC has a
    place for and ignores the others (the tolerance's, the output and run
    options).
    """

    configs: Union[None, str, Sequence[str]] = dataclasses.field(default=None, metadata=_COMPARE)
    """The configurations to run, "backend:precision[:bias]" strings such
    as "cpu:tf32:fused" (verify_linear), or the candidates to rank
    (diagnose_linear, where `candidates=` is its other name). None: the
    server's default set."""

    reference: Optional[str] = dataclasses.field(default=None, metadata=_COMPARE)
    """The configuration everything is compared with. None: the server's
    default reference (the fp64 configuration of its fastest backend:
    cublaslt:fp64 on a GPU host, cpu:fp64 elsewhere); the result names the
    one used (`report.reference.config`)."""

    accept: Union[None, str, Sequence[str]] = dataclasses.field(default=None, metadata=_COMPARE)
    """The configurations you accept, e.g. "tf32", ["cpu:bf16:unfused"]
    (`backend:precision[:bias]`, `precision[:bias]` or
    `backend:precision`; a part left out matches any). Needs `observed`.
    The server then also diagnoses the output (`report.diagnosis`), and
    the verdict is its acceptance: PASS when the output is rounding of an
    accepted configuration (`diagnosis.accepted`, `diagnosis.accepted_as`),
    instead of the tolerance's."""

    weight_layout: str = dataclasses.field(default="out_in", metadata=_COMPARE)
    """How the weight is laid out: "out_in" ([N, K]: torch, candle) or
    "in_out" ([K, N]: a flax kernel)."""

    activation: str = dataclasses.field(default="none", metadata=_COMPARE)
    """The layer's activation: "none", "relu" or "gelu" (tanh form;
    "gelu_tanh" too)."""

    output_dtype: Any = dataclasses.field(default=None, metadata=_COMPARE)
    """The dtype every configuration rounds its output to (a name such as
    "bfloat16", or a numpy, ml_dtypes or torch dtype). None: the input's;
    bfloat16 for FP8 inputs."""

    x_scale: Any = dataclasses.field(default=None, metadata=_COMPARE)
    """The dequantisation scale of an FP8 x, as torch._scaled_mm(x,
    weight.T, scale_a=x_scale, scale_b=w_scale) takes it: the layer
    computes act((x * x_scale) (weight * w_scale)^T + bias). A real number
    (a Python float, shape []) or an array-like of them (numpy, torch on
    any device, JAX, lists), sent as float32 in the shape given: [] or [1]
    per tensor, [M] or [M, 1] row-wise, [M, ceil(K/128)] block-wise
    (scaling=block128). Block scales of the MX formats travel in their own
    dtype, as given: float8_e8m0fnu [M, K/32] for MXFP8 (FP8 x and
    weight), float8_e4m3fn [M, K/16] for NVFP4 (float4_e2m1fn x and
    weight), or 1-D in cuBLASLt's swizzled layout (docs/numerics.md,
    "MXFP8 and NVFP4"). Required when x and weight are FP8 or FP4,
    refused otherwise; the server checks the dtypes and shapes. TypeError
    for what is not real numbers, ValueError for values beyond float32 and
    for an element of a float32 scale not finite and positive (the
    server's rule, in its words: "x_scale[17]: a finite, positive float32
    scale expected, got NaN")."""

    w_scale: Any = dataclasses.field(default=None, metadata=_COMPARE)
    """The dequantisation scale of an FP8 or FP4 weight, as x_scale: [] or
    [1] per tensor, row-wise [N] or [N, 1] (out_in) / [1, N] (in_out),
    [ceil(N/128), ceil(K/128)] block-wise (in_out: [ceil(K/128),
    ceil(N/128)]); float8_e8m0fnu [N, K/32] (MXFP8) or float8_e4m3fn
    [N, K/16] (NVFP4) block scales (in_out: [K/32, N], [K/16, N])."""

    x_global_scale: Any = dataclasses.field(default=None, metadata=_COMPARE)
    """NVFP4's per-tensor scale of a float4_e2m1fn x (TransformerEngine's
    1 / S_enc): the layer computes act(x_global_scale * w_global_scale *
    (x dequantised per block) (weight dequantised per block)^T + bias). A
    real number or an array-like of one ([] or [1]), sent as float32,
    checked as x_scale's float32 values are. Required with FP4 x and
    weight, refused otherwise (the server's rule)."""

    w_global_scale: Any = dataclasses.field(default=None, metadata=_COMPARE)
    """NVFP4's per-tensor scale of a float4_e2m1fn weight, as
    x_global_scale."""

    tolerance: Optional[str] = None
    """The tolerance preset of the verdict: "torch"
    (torch.testing.assert_close's defaults for the dtype), "numpy",
    "polygraphy", "explicit" (needs atol and rtol), "ulp" (needs max_ulp)
    or "bound" (every element within its output precision's error bound).
    None: "torch" for a layer (verify_linear, diagnose_linear,
    assert_linear_parity), "bound" for the whole-model checks."""

    atol: Optional[float] = None
    """The absolute tolerance, overriding the preset's."""

    rtol: Optional[float] = None
    """The relative tolerance, overriding the preset's."""

    max_ulp: Optional[int] = None
    """The most ULP an element may differ by (tolerance "ulp"; 0 means
    bitwise equal)."""

    bound_factor: Optional[float] = None
    """A positive factor on the error bound (tolerance "bound")."""

    bound_precision: Optional[str] = None
    """The precision whose error bound applies (tolerance "bound"), e.g.
    "tf32"."""

    bound_threshold: Optional[float] = None
    """The bound_ratio threshold of the server's decision about the call
    (`report.call.bound_exceeded`, docs/api.md, "Layer-call decisions"):
    a bound_ratio not at most this (NaN included) exceeds it. A positive,
    finite number; None: the server's default, 3. The whole-model checks'
    `bound_threshold=` is this field."""

    gpu: Optional[str] = None
    """A GPU the observed output may have come from: "a100", "h100",
    "h200", "gh200", "b200", "gb200", or a generation "sm80", "sm90",
    "sm100" (case-insensitive; the server judges the name and answers
    InvalidArgumentError naming `gpu` for one it does not know). A
    diagnosis over the default candidates (diagnose_linear without
    `configs`) then also ranks the CPU replays of that GPU's default
    kernels, e.g. "cpu:bf16:fused@mma=sm90" (docs/numerics.md, "Kernel K
    order"), and `report.notes` says which replays ran and where their
    kernel orders came from. None: no GPU."""

    nan_equal: bool = False
    """NaN against NaN counts as equal."""

    return_outputs: bool = False
    """Fill `report.results[i].output` and `report.reference.output` with
    numpy arrays."""

    max_inline_output_bytes: int = 0
    """Returned outputs larger than this come back by digest and are read
    from the server's store (0: the server's default, 4 MiB); the arrays
    are the same either way."""

    top_k: int = dataclasses.field(default=0, metadata=_COMPARE)
    """How many worst elements to list (0: the server's default)."""

    top_groups: int = dataclasses.field(default=0, metadata=_COMPARE)
    """How many worst columns and rows to list (0: the server's default)."""

    repeat: int = 0
    """Run each configuration this many times and report whether the bits
    were identical (`results[i].deterministic`)."""

    disallow_reduced_precision_reduction: bool = False
    """The cuBLAS flag, for the GPU backends."""

    algorithm_sweep: int = 0
    """Run each configuration that names no algorithm with each of the
    first N algorithms its backend offers (0..16; 0: no sweep), as
    "...@algo=i" configurations; a backend with one algorithm (cpu) runs
    it once. The diagnosis then names the kernel that reproduced
    `observed` (`ranking[i].exact`, `ranking[i].details`)."""

    batch_invariance: bool = False
    """Also run every configuration on sub-batches of x's rows (single
    rows, and `batch_sizes`) and report whether each row keeps its bits
    (`results[i].batch_invariance`)."""

    batch_sizes: Sequence[int] = ()
    """Sub-batch sizes besides 1, each 1..M (at most 8); only with
    batch_invariance=True."""

    timeout: Optional[float] = dataclasses.field(default=None, metadata=_COMPARE)
    """The call's deadline in seconds (None: the client's), for hashing,
    uploads, the request and reading outputs together; a whole-model check
    gives it to each request."""

    progress: ProgressArg = dataclasses.field(default=None, metadata=_COMPARE)
    """True for the phases of a call (hashing, uploading, verifying or
    diagnosing) and their times on stderr (a tqdm bar when tqdm is
    installed), or a callable (phase, done, total); see
    tensorcheck._progress."""

    # The options part of a request as the fields make it, but the scales
    # (`_proto`), serialized (bytes pickle, generated messages do not);
    # made, and so every field checked, by __post_init__. An attribute of
    # each instance, not a field: no part of ==, repr(), dataclasses.fields()
    # or asdict().
    _checked: ClassVar[bytes]

    def __post_init__(self) -> None:
        check_progress(self.progress)
        # Sequences as tuples: the options cannot change after their check,
        # and an iterator given is read once.
        for name in ("configs", "accept", "batch_sizes"):
            value = getattr(self, name)
            if isinstance(value, Iterable) and not isinstance(value, (str, bytes, tuple)):
                object.__setattr__(self, name, tuple(value))
        object.__setattr__(self, "_checked", self._unscaled().SerializeToString())
        if self.x_scale is not None:
            as_scale(self.x_scale, "x_scale")
        if self.w_scale is not None:
            as_scale(self.w_scale, "w_scale")
        for name in ("x_global_scale", "w_global_scale"):
            if getattr(self, name) is not None:
                as_scale(getattr(self, name), name, block_scales=False)
        if self.timeout is not None:
            non_negative(self.timeout, "timeout")

    def _proto(self) -> pb.VerifyRequest:
        """The options part of a Verify or Diagnose request, a new message:
        everything but the tensors (and `timeout` and `progress`, which are
        the client's). The scales are converted here, at each request, so
        that a scale tensor updated in place is sent as it is now."""
        req = pb.VerifyRequest.FromString(self._checked)
        # Inline in the options part of the request, so that a copy of it
        # (the Diagnose of assert_linear_parity) has them.
        if self.x_scale is not None:
            fill_proto(req.op.input_scale, as_scale(self.x_scale, "x_scale"))
        if self.w_scale is not None:
            fill_proto(req.op.weight_scale, as_scale(self.w_scale, "w_scale"))
        if self.x_global_scale is not None:
            fill_proto(
                req.op.input_global_scale,
                as_scale(self.x_global_scale, "x_global_scale", block_scales=False),
            )
        if self.w_global_scale is not None:
            fill_proto(
                req.op.weight_global_scale,
                as_scale(self.w_global_scale, "w_global_scale", block_scales=False),
            )
        return req

    def _unscaled(self) -> pb.VerifyRequest:
        """_proto without the scales, each field checked: TypeError or
        ValueError naming the field for a value that is not one."""
        configs = config_list(self.configs, "configs")
        accept = accept_list(self.accept)
        op = pb.LinearOp(
            weight_layout=choice(self.weight_layout, _LAYOUTS, "weight_layout"),
            activation=choice(self.activation, _ACTIVATIONS, "activation"),
        )
        if self.reference is not None:
            check_spec(self.reference, "reference")
        tolerance = self._tolerance()
        if self.output_dtype is not None:
            op.output_dtype = parse_dtype(self.output_dtype, "output_dtype")
        top_k = non_negative(self.top_k, "top_k", integer=True)
        top_groups = non_negative(self.top_groups, "top_groups", integer=True)
        repeat = non_negative(self.repeat, "repeat", integer=True)
        sweep = non_negative(self.algorithm_sweep, "algorithm_sweep", integer=True)
        sizes = batch_size_list(self.batch_sizes, bool(self.batch_invariance))
        max_inline = non_negative(
            self.max_inline_output_bytes, "max_inline_output_bytes", integer=True
        )
        req = pb.VerifyRequest(
            op=op,
            configs=configs,
            tolerance=tolerance,
            repeat=repeat,
            disallow_reduced_precision_reduction=bool(self.disallow_reduced_precision_reduction),
            algorithm_sweep=sweep,
            accept=accept,
        )
        if self.batch_invariance:
            req.batch_invariance.enabled = True
            req.batch_invariance.batch_sizes.extend(sizes)
        if self.reference is not None:
            # Unset otherwise: the server then applies its own default.
            req.reference = self.reference
        req.output.return_outputs = bool(self.return_outputs)
        req.output.max_inline_output_bytes = max_inline
        req.output.top_k = top_k
        req.output.top_groups = top_groups
        if self.bound_threshold is not None:
            # Unset otherwise: the server then applies its own default.
            req.bound_threshold.value = positive(self.bound_threshold, "bound_threshold")
        if self.gpu is not None:
            req.gpu = gpu_name(self.gpu)
        return req

    def _tolerance(self) -> pb.Tolerance:
        preset = self.tolerance or LAYER_TOLERANCE
        t = pb.Tolerance(
            preset=choice(preset, _PRESETS, "tolerance"), nan_equal=bool(self.nan_equal)
        )
        name = preset.lower()
        if self.atol is not None:
            t.atol.value = non_negative(self.atol, "atol")
        if self.rtol is not None:
            t.rtol.value = non_negative(self.rtol, "rtol")
        if name == "explicit" and (self.atol is None or self.rtol is None):
            raise ValueError("atol: tolerance='explicit' needs both atol= and rtol=")
        if self.max_ulp is not None:
            t.max_ulp = non_negative(self.max_ulp, "max_ulp", integer=True)
        elif name == "ulp":
            raise ValueError("max_ulp: tolerance='ulp' needs max_ulp= (0 means bitwise equal)")
        if self.bound_factor is not None:
            t.bound_factor = positive(self.bound_factor, "bound_factor")
        if self.bound_precision is not None:
            if not isinstance(self.bound_precision, str):
                raise TypeError("bound_precision: expected a precision name such as 'tf32'")
            t.bound_precision = self.bound_precision
        return t


# Every option's name, and those the Compare RPC takes.
OPTION_NAMES = frozenset(f.name for f in dataclasses.fields(VerifyOptions))
COMPARE_OPTION_NAMES = frozenset(
    f.name for f in dataclasses.fields(VerifyOptions) if f.metadata.get("compare")
)
_DEFAULTS = VerifyOptions()


def fold_options(
    options: Optional[VerifyOptions],
    overrides: Mapping[str, Any],
    where: str,
    *,
    taken: frozenset[str] = OPTION_NAMES,
) -> VerifyOptions:
    """`options` (None: the defaults) with the call's keyword arguments
    `overrides` applied over it: the options of the call named `where`.
    TypeError naming what is not a VerifyOptions, and the keywords that
    are not among `taken` (the fields the entry point takes); TypeError or
    ValueError naming the field for a bad value."""
    if options is not None and not isinstance(options, VerifyOptions):
        raise TypeError(
            f"options: expected a tensorcheck.VerifyOptions, got {type(options).__name__}"
        )
    unknown = sorted(set(overrides) - taken)
    if unknown:
        message = f"{where}() got unexpected keyword arguments {unknown}"
        near = [m for name in unknown for m in difflib.get_close_matches(name, taken, n=1)]
        if near:
            message += f" (did you mean {', '.join(near)}?)"
        raise TypeError(message)
    if not overrides:
        return _DEFAULTS if options is None else options
    if options is None:
        return VerifyOptions(**overrides)
    return dataclasses.replace(options, **overrides)
