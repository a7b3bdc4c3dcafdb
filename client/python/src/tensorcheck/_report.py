"""`Report`: a VerifyResponse as Python objects, and its JSON form.

Attributes hold real Python values (floats may be inf/nan, a ULP distance
of a NaN-against-number pair is `math.inf`, unset messages are None);
`to_dict()` gives exactly the object of docs/json-report.md, the one the
CLI's `--json` prints: proto field names, lower-case enum words, non-finite
floats as the strings "inf"/"-inf"/"nan", unset messages as null.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import Field, dataclass, field, fields
from typing import TYPE_CHECKING, Any, ClassVar, Optional, Union

import numpy as np
from google.protobuf.message import Message
from google.protobuf.wrappers_pb2 import DoubleValue

from ._pb import pb
from ._tensors import dtype_name, from_proto

__all__ = [
    "Report",
    "Stats",
    "ConfigResult",
    "Tolerance",
    "Diagnosis",
    "RankedCandidate",
    "Localization",
    "Element",
    "Group",
    "UlpBucket",
    "Capabilities",
    "BackendInfo",
    "DeviceInfo",
    "Limits",
]

# UINT64_MAX on the wire: the ULP distance of NaN against a number.
_ULP_INFINITE = (1 << 64) - 1

_PRESET_NAMES = {
    pb.Tolerance.PRESET_UNSPECIFIED: "torch",  # same as TORCH
    pb.Tolerance.PRESET_TORCH: "torch",
    pb.Tolerance.PRESET_NUMPY: "numpy",
    pb.Tolerance.PRESET_POLYGRAPHY: "polygraphy",
    pb.Tolerance.PRESET_EXPLICIT: "explicit",
    pb.Tolerance.PRESET_ULP: "ulp",
    pb.Tolerance.PRESET_BOUND: "bound",
}
_VERDICT_NAMES = {pb.VERDICT_PASS: "pass", pb.VERDICT_FAIL: "fail"}

Ulp = Union[int, float]  # an int, or math.inf for NaN against a number


def _json_float(v: Optional[float]) -> Union[float, str, None]:
    if v is None:
        return None
    if math.isnan(v):
        return "nan"
    if math.isinf(v):
        return "inf" if v > 0 else "-inf"
    return v


def _ulp(v: int) -> Ulp:
    return math.inf if v == _ULP_INFINITE else int(v)


def _json_ulp(v: Ulp) -> Union[int, str]:
    return "inf" if v == math.inf else int(v)


def _wrapped(msg: Message, name: str) -> Optional[float]:
    """The value of the google.protobuf.DoubleValue field `name`; None when unset."""
    if not msg.HasField(name):
        return None
    wrapper: DoubleValue = getattr(msg, name)
    return wrapper.value


def _json(value: Any) -> Any:
    if isinstance(value, _Node):
        return value.to_dict()
    if isinstance(value, (list, tuple)):
        return [_json(v) for v in value]
    if isinstance(value, dict):
        return {k: _json(v) for k, v in value.items()}
    if isinstance(value, float):
        return _json_float(value)
    return value


class _Node:
    """to_dict() over the dataclass fields, in order; subclasses list the
    fields that are not part of the JSON and override special encodings."""

    _not_json: tuple[str, ...] = ()
    _ulp_fields: tuple[str, ...] = ()

    if TYPE_CHECKING:
        # Every subclass is a dataclass; declaring what @dataclass adds lets
        # dataclasses.fields() take `self` here.
        __dataclass_fields__: ClassVar[dict[str, Field[Any]]]

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in fields(self):
            if f.name in self._not_json:
                continue
            v = getattr(self, f.name)
            out[f.name] = _json_ulp(v) if f.name in self._ulp_fields else _json(v)
        return out


@dataclass(frozen=True)
class UlpBucket(_Node):
    """Histogram bucket: `count` elements `lo`..`hi` ULP apart (inclusive)."""

    lo: Ulp
    hi: Ulp
    count: int
    _ulp_fields = ("lo", "hi")

    @classmethod
    def from_proto(cls, m: pb.UlpBucket) -> UlpBucket:
        return cls(lo=_ulp(m.lo), hi=_ulp(m.hi), count=m.count)


@dataclass(frozen=True)
class Element(_Node):
    """One compared element: its index in the output shape, both values,
    their bit patterns in the compared dtype, the differences."""

    index: tuple[int, ...]
    actual: float
    expected: float
    actual_bits: str
    expected_bits: str
    abs_diff: float
    rel_diff: float
    ulp: Ulp
    _ulp_fields = ("ulp",)

    @classmethod
    def from_proto(cls, m: pb.Element) -> Element:
        return cls(
            index=tuple(m.index),
            actual=m.actual,
            expected=m.expected,
            actual_bits=m.actual_bits,
            expected_bits=m.expected_bits,
            abs_diff=m.abs_diff,
            rel_diff=m.rel_diff,
            ulp=_ulp(m.ulp),
        )

    def to_dict(self) -> dict[str, Any]:
        d = super().to_dict()
        d["index"] = list(self.index)
        return d


@dataclass(frozen=True)
class Group(_Node):
    """A column (last dim) or row (flattened leading dims) and how many of
    all mismatched elements it holds (`share` in [0, 1])."""

    index: int
    mismatched: int
    share: float

    @classmethod
    def from_proto(cls, m: pb.Group) -> Group:
        return cls(index=m.index, mismatched=m.mismatched, share=m.share)


@dataclass(frozen=True)
class Stats(_Node):
    """Differences of `actual` against `expected`, the server's names (docs/json-report.md).
    Indices are tuples in the output's shape."""

    total: int
    mismatched: int
    max_abs: float
    max_abs_index: tuple[int, ...]
    max_rel: float
    max_rel_index: tuple[int, ...]
    mean_abs: float
    rms: float
    rel_l2: float
    cosine: float
    max_ulp: Ulp
    mean_ulp: float
    bitwise_equal: bool
    bitwise_equal_count: int
    ulp_histogram: list[UlpBucket]
    nan_actual: int
    nan_expected: int
    inf_actual: int
    inf_expected: int
    nan_mismatch: int
    worst: list[Element]
    top_columns: list[Group]
    top_rows: list[Group]
    bound_ratio: Optional[float]
    bound_precision: str
    compared_dtype: Optional[str]
    passed: bool
    _ulp_fields = ("max_ulp",)

    @classmethod
    def from_proto(cls, m: pb.Stats) -> Stats:
        return cls(
            total=m.total,
            mismatched=m.mismatched,
            max_abs=m.max_abs,
            max_abs_index=tuple(m.max_abs_index),
            max_rel=m.max_rel,
            max_rel_index=tuple(m.max_rel_index),
            mean_abs=m.mean_abs,
            rms=m.rms,
            rel_l2=m.rel_l2,
            cosine=m.cosine,
            max_ulp=_ulp(m.max_ulp),
            mean_ulp=m.mean_ulp,
            bitwise_equal=m.bitwise_equal,
            bitwise_equal_count=m.bitwise_equal_count,
            ulp_histogram=[UlpBucket.from_proto(b) for b in m.ulp_histogram],
            nan_actual=m.nan_actual,
            nan_expected=m.nan_expected,
            inf_actual=m.inf_actual,
            inf_expected=m.inf_expected,
            nan_mismatch=m.nan_mismatch,
            worst=[Element.from_proto(e) for e in m.worst],
            top_columns=[Group.from_proto(g) for g in m.top_columns],
            top_rows=[Group.from_proto(g) for g in m.top_rows],
            bound_ratio=_wrapped(m, "bound_ratio"),
            bound_precision=m.bound_precision,
            compared_dtype=dtype_name(m.compared_dtype),
            passed=m.passed,
        )

    def to_dict(self) -> dict[str, Any]:
        d = super().to_dict()
        d["max_abs_index"] = list(self.max_abs_index)
        d["max_rel_index"] = list(self.max_rel_index)
        return d

    @property
    def mismatched_fraction(self) -> float:
        return self.mismatched / self.total if self.total else 0.0


@dataclass(frozen=True)
class Tolerance(_Node):
    """The tolerance as the server applied it (preset resolved for the
    compared dtype, atol/rtol filled in, bound_factor 0 shown as 1).
    `bound_precision` is not part of the JSON report."""

    preset: str
    atol: Optional[float]
    rtol: Optional[float]
    max_ulp: Ulp
    bound_factor: float
    nan_equal: bool
    bound_precision: str = ""
    _ulp_fields = ("max_ulp",)
    _not_json = ("bound_precision",)

    @classmethod
    def from_proto(cls, m: pb.Tolerance) -> Tolerance:
        return cls(
            preset=_PRESET_NAMES.get(m.preset, "torch"),
            atol=_wrapped(m, "atol"),
            rtol=_wrapped(m, "rtol"),
            max_ulp=_ulp(m.max_ulp),
            bound_factor=m.bound_factor or 1.0,
            nan_equal=m.nan_equal,
            bound_precision=getattr(m, "bound_precision", ""),
        )


@dataclass(frozen=True)
class ConfigResult(_Node):
    """One configuration's run. `output` is a numpy array when the call
    asked for `return_outputs=True` (it is not part of to_dict())."""

    config: str
    vs_reference: Optional[Stats]
    vs_observed: Optional[Stats]
    elapsed_ms: float
    details: dict[str, str]
    deterministic: bool
    runs: int
    output: Optional[np.ndarray] = field(default=None, repr=False, compare=False)
    # The configuration whose GEMM this one reused ("" when it ran its own):
    # the same operands in the same arithmetic on these inputs, so only the
    # epilogue (bias, activation, output rounding) ran here and `elapsed_ms`
    # is the epilogue's time.
    shared_computation: str = ""
    _not_json = ("output",)

    @classmethod
    def from_proto(cls, m: pb.ConfigResult, name: str = "result") -> ConfigResult:
        return cls(
            config=m.config,
            vs_reference=Stats.from_proto(m.vs_reference) if m.HasField("vs_reference") else None,
            vs_observed=Stats.from_proto(m.vs_observed) if m.HasField("vs_observed") else None,
            elapsed_ms=m.elapsed_ms,
            details=dict(sorted(m.details.items())),
            deterministic=m.deterministic,
            runs=m.runs,
            output=from_proto(m.output, f"{name}.output") if m.HasField("output") else None,
            shared_computation=m.shared_computation,
        )


@dataclass(frozen=True)
class RankedCandidate(_Node):
    """A candidate configuration and how well it agrees with the observed
    output.

    The plausibility test (docs/numerics.md, "Diagnosis") asks whether the
    observed output could be this candidate computed in another summation
    order: `disagreements` of `compared_elements` differ from it in bits
    where its accumulation noise predicts `expected_disagreements`;
    `plausibility_p` is the Poisson probability of at least that many;
    `consistent_fraction` the share within 4 predicted standard errors.
    `ruled_out` says in one sentence why it cannot be best ("" when the
    evidence allows it); `shared_computation` names the configuration whose
    GEMM it reused ("" when none). A server that predates the test leaves
    them all zero, with `compared_elements` 0."""

    config: str
    bitwise_equal_fraction: float
    max_ulp: Ulp
    mean_ulp: float
    bound_ratio: Optional[float]
    equivalent: list[str]
    disagreements: int = 0
    expected_disagreements: float = 0.0
    plausibility_p: float = 0.0
    plausible: bool = False
    consistent_fraction: float = 0.0
    compared_elements: int = 0
    ruled_out: str = ""
    shared_computation: str = ""
    _ulp_fields = ("max_ulp",)

    @classmethod
    def from_proto(cls, m: pb.RankedCandidate) -> RankedCandidate:
        return cls(
            config=m.config,
            bitwise_equal_fraction=m.bitwise_equal_fraction,
            max_ulp=_ulp(m.max_ulp),
            mean_ulp=m.mean_ulp,
            bound_ratio=_wrapped(m, "bound_ratio"),
            equivalent=list(m.equivalent),
            disagreements=m.disagreements,
            expected_disagreements=m.expected_disagreements,
            plausibility_p=m.plausibility_p,
            plausible=m.plausible,
            consistent_fraction=m.consistent_fraction,
            compared_elements=m.compared_elements,
            ruled_out=m.ruled_out,
            shared_computation=m.shared_computation,
        )

    @property
    def plausible_text(self) -> str:
        """ "yes", "no", or "-" when the server ran no plausibility test."""
        if self.plausible:
            return "yes"
        return "no" if self.compared_elements > 0 else "-"


@dataclass(frozen=True)
class Localization(_Node):
    """Where the differences from the best candidate sit."""

    columns: list[Group]
    rows: list[Group]
    outliers: list[Element]

    @classmethod
    def from_proto(cls, m: pb.Localization) -> Localization:
        return cls(
            columns=[Group.from_proto(g) for g in m.columns],
            rows=[Group.from_proto(g) for g in m.rows],
            outliers=[Element.from_proto(e) for e in m.outliers],
        )


@dataclass(frozen=True)
class Diagnosis(_Node):
    """Which configuration the observed output matches, and why.

    `best` is None when no candidate explains the output; `confidence` in
    [0, 1] as the server documents it; `explanation` is one paragraph."""

    best: Optional[str]
    equivalent: list[str]
    tied: list[str]
    confidence: float
    ranking: list[RankedCandidate]
    framework_hint: str
    localization: Localization
    explanation: str

    @classmethod
    def from_proto(cls, m: pb.Diagnosis) -> Diagnosis:
        return cls(
            best=m.best or None,
            equivalent=list(m.equivalent),
            tied=list(m.tied),
            confidence=m.confidence,
            ranking=[RankedCandidate.from_proto(r) for r in m.ranking],
            framework_hint=m.framework_hint,
            localization=Localization.from_proto(m.localization),
            explanation=m.explanation,
        )


@dataclass(frozen=True)
class Report(_Node):
    """The answer of `verify_linear` / `diagnose_linear`.

    report.passed, report.verdict                 # True, "pass"
    report.observed_vs_reference.max_abs          # None without observed
    report.results[0].config                      # "cpu:tf32:fused"
    report.results[0].vs_observed.max_ulp
    report.diagnosis.best                         # diagnose_linear only
    report.to_dict()                              # the CLI's --json object
    """

    verdict: Optional[str]
    tolerance: Tolerance
    observed_vs_reference: Optional[Stats]
    reference: Optional[ConfigResult]
    results: list[ConfigResult]
    output_shape: tuple[int, ...]
    notes: list[str]
    diagnosis: Optional[Diagnosis]

    @classmethod
    def from_proto(cls, m: pb.VerifyResponse) -> Report:
        return cls(
            verdict=_VERDICT_NAMES.get(m.verdict),
            tolerance=Tolerance.from_proto(m.tolerance),
            observed_vs_reference=(
                Stats.from_proto(m.observed_vs_reference)
                if m.HasField("observed_vs_reference")
                else None
            ),
            reference=(
                ConfigResult.from_proto(m.reference, "reference")
                if m.HasField("reference")
                else None
            ),
            results=[ConfigResult.from_proto(r, f"results[{i}]") for i, r in enumerate(m.results)],
            output_shape=tuple(m.output_shape),
            notes=list(m.notes),
            diagnosis=Diagnosis.from_proto(m.diagnosis) if m.HasField("diagnosis") else None,
        )

    @property
    def passed(self) -> bool:
        return self.verdict == "pass"

    def result(self, config: str) -> ConfigResult:
        """The result of one configuration, by its canonical name or a
        prefix of it ("cpu:tf32" finds "cpu:tf32:fused")."""
        for r in self.results:
            if r.config == config:
                return r
        matches = [r for r in self.results if r.config.startswith(config + ":")]
        if len(matches) == 1:
            return matches[0]
        raise KeyError(f"no single result for {config!r}; have {[r.config for r in self.results]}")

    def to_dict(self) -> dict[str, Any]:
        d = super().to_dict()
        d["output_shape"] = list(self.output_shape)
        return d

    def failure_message(self) -> str:
        """The numpy/torch-style message of a failed comparison of the
        observed output against the reference (or, without an observed
        output, of the first failing configuration)."""
        return format_mismatch(self)


# --- messages --------------------------------------------------------------

_SHARE_MAX_DECIMALS = 6


def format_share(value: Union[int, float], whole: Optional[int] = None) -> str:
    """A share as a percentage that reads 100% or 0% only when it is exactly
    that: `format_share(0.99996831)` is "99.997%", not "100.0%".

    `value` is a fraction in [0, 1]; with `whole` it is a count of `whole`
    instead (`format_share(3, 1024)` is "0.3%"), and all and none are
    decided on the counts (part == whole is "100%", an empty whole "0%").
    One decimal, or as many more (up to 6) as it takes not to read 100.0 or
    0.0; beyond that "<0.000001%" and ">99.999999%". NaN is "nan%"; values
    outside [0, 1] get one decimal. The CLI's FormatShare
    (client/cli/format.h) follows the same rule.
    """
    fraction = float(value)
    if whole is not None:
        part = value
        if whole <= 0 or part == 0:
            return "0%"
        if part == whole:
            return "100%"
        fraction = part / whole
        # A count short of the whole (or above none) never reads as all (none).
        if fraction >= 1 and part < whole:
            return ">99.999999%"
        if fraction <= 0 and part > 0:
            return "<0.000001%"
    if math.isnan(fraction):
        return "nan%"
    if fraction == 1:
        return "100%"
    if fraction == 0:
        return "0%"
    percent = 100 * fraction
    if fraction < 0 or fraction > 1:
        return f"{percent:.1f}%"
    for decimals in range(1, _SHARE_MAX_DECIMALS + 1):
        # Decided on the printed text: would the reader see 100.0... or 0.0...?
        text = f"{percent:.{decimals}f}"
        if float(text) not in (0.0, 100.0):
            return text + "%"
    return "<0.000001%" if percent < 50 else ">99.999999%"


def _fmt_index(index: Sequence[int]) -> str:
    return "(" + ", ".join(str(i) for i in index) + ("," if len(index) == 1 else "") + ")"


def _fmt_num(v: Optional[float]) -> str:
    return "None" if v is None else repr(float(v)) if isinstance(v, float) else str(v)


def format_mismatch(report: Report) -> str:
    stats, what = report.observed_vs_reference, "observed output vs reference"
    if stats is None:
        failing = [r for r in report.results if r.vs_reference and not r.vs_reference.passed]
        if not failing:
            return "All comparisons passed."
        stats, what = failing[0].vs_reference, f"{failing[0].config} vs reference"
    assert stats is not None
    tol = report.tolerance
    lines = ["Tensor-likes are not close!" if not stats.passed else "Tensor-likes are close.", ""]
    lines.append(
        f"Mismatched elements: {stats.mismatched} / {stats.total} "
        f"({format_share(stats.mismatched, stats.total)})"
    )
    preset = tol.preset
    if preset in ("torch", "numpy", "polygraphy", "explicit"):
        lines.append(
            f"Greatest absolute difference: {_fmt_num(stats.max_abs)} at index "
            f"{_fmt_index(stats.max_abs_index)} (up to {_fmt_num(tol.atol)} allowed)"
        )
        lines.append(
            f"Greatest relative difference: {_fmt_num(stats.max_rel)} at index "
            f"{_fmt_index(stats.max_rel_index)} (up to {_fmt_num(tol.rtol)} allowed)"
        )
    else:
        lines.append(
            f"Greatest absolute difference: {_fmt_num(stats.max_abs)} at index "
            f"{_fmt_index(stats.max_abs_index)}"
        )
        lines.append(
            f"Greatest relative difference: {_fmt_num(stats.max_rel)} at index "
            f"{_fmt_index(stats.max_rel_index)}"
        )
    if preset == "ulp":
        lines.append(f"Greatest ULP distance: {stats.max_ulp} (up to {tol.max_ulp} allowed)")
    else:
        lines.append(
            f"Greatest ULP distance: {stats.max_ulp}"
            + (f" in {stats.compared_dtype}" if stats.compared_dtype else "")
        )
    if stats.nan_mismatch:
        lines.append(f"NaN at different positions: {stats.nan_mismatch}")
    if stats.bound_ratio is not None:
        lines.append(
            f"Error / predicted error of {stats.bound_precision or 'the precision'}: "
            f"{stats.bound_ratio:.3g}"
        )
    lines.append(f"(tolerance {preset}; {what})")
    worst = [e for e in stats.worst if e.ulp != 0 or not (e.abs_diff == 0)]  # `not ==`: keeps NaN
    if worst:
        lines.append("")
        lines.append("Worst elements (index: actual vs expected, ULP):")
        for e in worst[:5]:
            lines.append(f"  {_fmt_index(e.index)}: {e.actual!r} vs {e.expected!r}, {e.ulp} ULP")
    # Only worth a line when a few columns hold most of the mismatches.
    if stats.top_columns and sum(g.share for g in stats.top_columns) >= 0.5:
        cols = ", ".join(f"{g.index} ({format_share(g.share)})" for g in stats.top_columns)
        lines.append(f"Mismatches concentrate in columns: {cols}")
    return "\n".join(lines)


def format_diagnosis(d: Diagnosis) -> str:
    lines = []
    if d.best:
        head = f"Diagnosis: best match {d.best} (confidence {d.confidence:.2f})"
        if d.equivalent:
            head += f", equivalent here: {', '.join(d.equivalent)}"
        if d.tied:
            head += f"; cannot be told apart from: {', '.join(d.tied)}"
        lines.append(head)
    else:
        lines.append(
            "Diagnosis: no candidate configuration explains the observed output "
            f"(confidence {d.confidence:.2f})"
        )
    if d.framework_hint:
        lines.append(f"Framework hint: {d.framework_hint}")
    if d.explanation:
        lines.append(d.explanation)
    if d.ranking:
        shown = d.ranking[:_RANKING_SHOWN]
        lines.append("Ranking (config: plausible, bitwise-equal share, max ULP, bound ratio):")
        for r in shown:
            br = "n/a" if r.bound_ratio is None else f"{r.bound_ratio:.3g}"
            marker = _SHARED_MARKER if r.shared_computation else ""
            lines.append(
                f"  {r.config}{marker}: {r.plausible_text}, "
                f"{format_share(r.bitwise_equal_fraction)}, {r.max_ulp}, {br}"
            )
        lines.extend(_shared_footnotes(shown, "."))
        ruled_out = [(i, r) for i, r in enumerate(shown, 1) if r.ruled_out]
        if ruled_out:
            lines.append("  Ruled out:")
            lines.extend(f"    {i}. {r.config}: {r.ruled_out}" for i, r in ruled_out)
    return "\n".join(lines)


# How many ranked candidates the diagnosis message lists (to_dict() has all).
_RANKING_SHOWN = 5
# Marks a configuration that reused another configuration's GEMM.
_SHARED_MARKER = "*"


def _shared_footnotes(items: Sequence[RankedCandidate], suffix: str) -> list[str]:
    """One line per configuration whose GEMM others reused, in order of
    first appearance: "* A, B reused the GEMM of C<suffix>"."""
    groups: dict[str, list[str]] = {}
    for item in items:
        if item.shared_computation:
            groups.setdefault(item.shared_computation, []).append(item.config)
    return [
        f"  {_SHARED_MARKER} {', '.join(configs)} reused the GEMM of {shared}{suffix}"
        for shared, configs in groups.items()
    ]


# --- capabilities ------------------------------------------------------------


@dataclass(frozen=True)
class DeviceInfo(_Node):
    name: str
    compute_capability: str
    memory_bytes: int
    driver_version: str
    runtime_version: str
    cublas_version: str

    @classmethod
    def from_proto(cls, m: pb.DeviceInfo) -> DeviceInfo:
        return cls(
            name=m.name,
            compute_capability=m.compute_capability,
            memory_bytes=m.memory_bytes,
            driver_version=m.driver_version,
            runtime_version=m.runtime_version,
            cublas_version=m.cublas_version,
        )


@dataclass(frozen=True)
class BackendInfo(_Node):
    name: str
    available: bool
    unavailable_reason: str
    precisions: list[str]
    bias_modes: list[str]
    configs: list[str]
    device: Optional[DeviceInfo]
    storage_dtypes: list[Optional[str]]  # None for a dtype this client does not know

    @classmethod
    def from_proto(cls, m: pb.BackendInfo) -> BackendInfo:
        return cls(
            name=m.name,
            available=m.available,
            unavailable_reason=m.unavailable_reason,
            precisions=list(m.precisions),
            bias_modes=list(m.bias_modes),
            configs=list(m.configs),
            device=DeviceInfo.from_proto(m.device) if m.HasField("device") else None,
            storage_dtypes=[dtype_name(d) for d in m.storage_dtypes],
        )


@dataclass(frozen=True)
class Limits(_Node):
    max_message_bytes: int
    max_tensor_bytes: int
    max_configs: int
    max_rank: int
    max_top_k: int
    max_repeat: int

    @classmethod
    def from_proto(cls, m: pb.Limits) -> Limits:
        return cls(
            max_message_bytes=m.max_message_bytes,
            max_tensor_bytes=m.max_tensor_bytes,
            max_configs=m.max_configs,
            max_rank=m.max_rank,
            max_top_k=m.max_top_k,
            max_repeat=m.max_repeat,
        )


@dataclass(frozen=True)
class Capabilities(_Node):
    """What a server host runs (GetCapabilitiesResponse)."""

    server_version: str
    backends: list[BackendInfo]
    limits: Optional[Limits]
    default_reference: str
    tolerance_presets: list[str]
    tensor_store: bool

    @classmethod
    def from_proto(cls, m: pb.GetCapabilitiesResponse) -> Capabilities:
        return cls(
            server_version=m.server_version,
            backends=[BackendInfo.from_proto(b) for b in m.backends],
            limits=Limits.from_proto(m.limits) if m.HasField("limits") else None,
            default_reference=m.default_reference,
            tolerance_presets=list(m.tolerance_presets),
            tensor_store=m.tensor_store,
        )

    def backend(self, name: str) -> Optional[BackendInfo]:
        return next((b for b in self.backends if b.name == name), None)

    @property
    def configs(self) -> list[str]:
        """Every configuration an available backend runs here."""
        return [c for b in self.backends if b.available for c in b.configs]
