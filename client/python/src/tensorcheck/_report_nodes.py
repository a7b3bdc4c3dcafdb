"""The parts of a `Report` (tensorcheck._report): statistics, the
tolerance, each configuration's result, the diagnosis, as Python objects.

They sit below both `_report` (the Report itself) and `_format` (the
messages that read them), so that neither imports the other back.
Attributes hold real Python values (floats may be inf/nan, a ULP distance
of a NaN-against-number pair is `math.inf`, unset messages are None);
`to_dict()` gives the objects of docs/json-report.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Optional

import numpy as np
from google.protobuf.message import Message
from google.protobuf.wrappers_pb2 import DoubleValue

from ._node import Ulp, _Node
from ._pb import pb
from ._tensors import ReadTensor, dtype_name, from_proto

__all__ = [
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
# The diagnosis's verdict: "" from a server that predates it (UNSPECIFIED)
# and for a value this client does not know.
_DIAGNOSIS_VERDICT_NAMES = {
    pb.Diagnosis.VERDICT_ROUNDING: "rounding",
    pb.Diagnosis.VERDICT_DEFECT: "defect",
    pb.Diagnosis.VERDICT_UNEXPLAINED: "unexplained",
}


def _ulp(v: int) -> Ulp:
    return math.inf if v == _ULP_INFINITE else int(v)


def _wrapped(msg: Message, name: str) -> Optional[float]:
    """The value of the google.protobuf.DoubleValue field `name`; None when unset."""
    if not msg.HasField(name):
        return None
    wrapper: DoubleValue = getattr(msg, name)
    return wrapper.value


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
class NegligibleElements(_Node):
    """The differing elements near zero: |expected| < `below` (2^-10 of the
    largest finite |expected|), left out of the headline ULP figure
    (docs/numerics.md, "ULP figures and elements near zero")."""

    below: float
    differing: int
    max_abs: float
    significant_max_ulp: Ulp
    note: str
    _ulp_fields = ("significant_max_ulp",)

    @classmethod
    def from_proto(cls, m: pb.NegligibleElements) -> NegligibleElements:
        return cls(
            below=m.below,
            differing=m.differing,
            max_abs=m.max_abs,
            significant_max_ulp=_ulp(m.significant_max_ulp),
            note=m.note,
        )


@dataclass(frozen=True)
class CallDecision(_Node):
    """The server's decisions about one layer call that a whole-model check
    rests on (docs/api.md, "Layer-call decisions"; docs/model-checks.md,
    "The rules"): the configurations explaining the output (best first),
    why the call diverges on its own ("" when it does not), and whether
    its bound_ratio exceeds the request's threshold."""

    explained: bool
    explaining: list[str]
    divergence: str
    bound_threshold: float
    bound_exceeded: bool
    bound_reason: str

    @classmethod
    def from_proto(cls, m: pb.CallDecision) -> CallDecision:
        return cls(
            explained=m.explained,
            explaining=list(m.explaining),
            divergence=m.divergence,
            bound_threshold=m.bound_threshold,
            bound_exceeded=m.bound_exceeded,
            bound_reason=m.bound_reason,
        )


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
    # Present when differing elements near zero are left out of the headline
    # ULP figure (`significant_max_ulp`); max_ulp keeps the largest over all.
    negligible: Optional[NegligibleElements] = None
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
            negligible=(
                NegligibleElements.from_proto(m.negligible) if m.HasField("negligible") else None
            ),
        )

    @property
    def headline_max_ulp(self) -> Ulp:
        """The ULP figure to show: significant_max_ulp when elements near
        zero are left out, else max_ulp."""
        return self.max_ulp if self.negligible is None else self.negligible.significant_max_ulp

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
class SubBatch(_Node):
    """One sub-batch size of a batch-invariance check: the rows ran in
    `runs` runs of `batch_size` rows (the last of `tail_rows` when M is not
    a multiple); `rows_differing` rows changed bits against the whole
    batch, by at most `max_ulp`. `details` / `tail_details` name the kernel
    the backend chose for each run length ("algo", ...)."""

    batch_size: int
    runs: int
    rows_differing: int
    max_ulp: Ulp
    details: dict[str, str]
    tail_rows: int = 0
    tail_details: dict[str, str] = field(default_factory=dict)
    _ulp_fields = ("max_ulp",)

    @classmethod
    def from_proto(cls, m: pb.SubBatch) -> SubBatch:
        return cls(
            batch_size=m.batch_size,
            runs=m.runs,
            rows_differing=m.rows_differing,
            max_ulp=_ulp(m.max_ulp),
            details=dict(sorted(m.details.items())),
            tail_rows=m.tail_rows,
            tail_details=dict(sorted(m.tail_details.items())),
        )


@dataclass(frozen=True)
class BatchInvariance(_Node):
    """Whether a configuration gives every row the same bits when it runs
    on sub-batches of the rows (`batch_invariance=True`): `invariant` when
    all `rows` keep their bits in every size of `sub_batches`;
    otherwise `rows_differing` rows differ somewhere, by at most `max_ulp`.
    `full_batch_details` names the kernel chosen for the whole batch."""

    invariant: bool
    rows: int
    rows_differing: int
    max_ulp: Ulp
    full_batch_details: dict[str, str]
    sub_batches: list[SubBatch]
    _ulp_fields = ("max_ulp",)

    @classmethod
    def from_proto(cls, m: pb.BatchInvariance) -> BatchInvariance:
        return cls(
            invariant=m.invariant,
            rows=m.rows,
            rows_differing=m.rows_differing,
            max_ulp=_ulp(m.max_ulp),
            full_batch_details=dict(sorted(m.full_batch_details.items())),
            sub_batches=[SubBatch.from_proto(s) for s in m.sub_batches],
        )


@dataclass(frozen=True)
class ConfigResult(_Node):
    """One configuration's run. `output` is a numpy array when the call
    asked for `return_outputs=True` (it is not part of to_dict()); an
    output the server returned by digest (larger than
    `max_inline_output_bytes`) was read from its store by the client."""

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
    # With batch_invariance=True: whether the rows keep their bits on
    # sub-batches (None when not asked).
    batch_invariance: Optional[BatchInvariance] = None
    _not_json = ("output",)

    @classmethod
    def from_proto(
        cls, m: pb.ConfigResult, name: str = "result", read: Optional[ReadTensor] = None
    ) -> ConfigResult:
        return cls(
            config=m.config,
            vs_reference=Stats.from_proto(m.vs_reference) if m.HasField("vs_reference") else None,
            vs_observed=Stats.from_proto(m.vs_observed) if m.HasField("vs_observed") else None,
            elapsed_ms=m.elapsed_ms,
            details=dict(sorted(m.details.items())),
            deterministic=m.deterministic,
            runs=m.runs,
            output=(from_proto(m.output, f"{name}.output", read) if m.HasField("output") else None),
            shared_computation=m.shared_computation,
            batch_invariance=(
                BatchInvariance.from_proto(m.batch_invariance)
                if m.HasField("batch_invariance")
                else None
            ),
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
    them all zero, with `compared_elements` 0. `exact` is True when every
    element equals the observed output bit for bit; `details` names the
    kernel (the algorithm an `algorithm_sweep` ran, "algo": ...).
    `framework_default` says which frameworks compute it by default for the
    storage dtype ("PyTorch's default for fp32 tensors", "" when none);
    `accepted` whether it matches a configuration of `accept=`."""

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
    exact: bool = False
    details: dict[str, str] = field(default_factory=dict)
    framework_default: str = ""
    accepted: bool = False
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
            exact=m.exact,
            details=dict(sorted(m.details.items())),
            framework_default=m.framework_default,
            accepted=m.accepted,
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
class DefectGroup(_Node):
    """A column (last dim) or row (flattened leading dims) that rounding of
    the best candidate does not explain: `disagreements` of its elements
    differ from best in bits where its error model expects
    `expected_disagreements` (`p_value`: the chance of at least that many,
    Bonferroni-corrected); `beyond_threshold` lie beyond the per-element
    threshold; the farthest is `max_ulp` ULP and `max_sigma` predicted
    standard errors from best. Columns only: `shift_t`, the self-normalised
    sum of the group's differences in predicted standard errors (about
    standard normal under rounding), and `shift_p_value`, its
    Bonferroni-corrected two-sided tail: a column shifted to one side."""

    index: int
    disagreements: int
    expected_disagreements: float
    p_value: float
    beyond_threshold: int
    max_ulp: Ulp
    max_sigma: float
    shift_t: float = 0.0
    shift_p_value: float = 1.0
    _ulp_fields = ("max_ulp",)

    @classmethod
    def from_proto(cls, m: pb.DefectGroup) -> DefectGroup:
        return cls(
            index=m.index,
            disagreements=m.disagreements,
            expected_disagreements=m.expected_disagreements,
            p_value=m.p_value,
            beyond_threshold=m.beyond_threshold,
            max_ulp=_ulp(m.max_ulp),
            max_sigma=m.max_sigma,
            shift_t=m.shift_t,
            shift_p_value=m.shift_p_value,
        )


@dataclass(frozen=True)
class DefectElement(_Node):
    """An element beyond the per-element threshold: the observed value
    (`element.actual`) against best's (`element.expected`), and its distance
    in predicted standard errors of another summation order."""

    element: Optional[Element]
    sigma: float

    @classmethod
    def from_proto(cls, m: pb.DefectElement) -> DefectElement:
        return cls(
            element=Element.from_proto(m.element) if m.HasField("element") else None,
            sigma=m.sigma,
        )


@dataclass(frozen=True)
class Defect(_Node):
    """What is not rounding of the best candidate (a `defect` verdict), as
    the server found it: `where_to_look` says which weight row, input row or
    bias element to check ("output column 2 <-> weight row 2 (out_in
    layout) and bias element 2"); `columns` and `rows` are the groups
    holding more disagreements than rounding allows; `element_count`
    elements lie beyond `element_threshold_sigma` predicted standard
    errors (a threshold a clean output crosses anywhere with chance at most
    `false_alarm_rate`), `elements` the largest of them."""

    element_threshold_sigma: float
    false_alarm_rate: float
    element_count: int
    elements: list[DefectElement]
    columns: list[DefectGroup]
    rows: list[DefectGroup]
    max_ulp: Ulp
    max_sigma: float
    where_to_look: str
    _ulp_fields = ("max_ulp",)

    @classmethod
    def from_proto(cls, m: pb.Defect) -> Defect:
        return cls(
            element_threshold_sigma=m.element_threshold_sigma,
            false_alarm_rate=m.false_alarm_rate,
            element_count=m.element_count,
            elements=[DefectElement.from_proto(e) for e in m.elements],
            columns=[DefectGroup.from_proto(g) for g in m.columns],
            rows=[DefectGroup.from_proto(g) for g in m.rows],
            max_ulp=_ulp(m.max_ulp),
            max_sigma=m.max_sigma,
            where_to_look=m.where_to_look,
        )


@dataclass(frozen=True)
class Diagnosis(_Node):
    """Which configuration the observed output matches, and why.

    `best` is None when no candidate explains the output; `confidence` in
    [0, 1] as the server documents it; `explanation` is one paragraph.

    `verdict` is the server's answer to "bug or rounding?"
    (docs/numerics.md, "Verdict"): "rounding" (every element, column and
    row consistent with best), "defect" (best explains the bulk; `defect`
    lists what it does not: a wrong weight, input or bias value) or
    "unexplained" (no candidate explains the bulk); "" from a server that
    predates the verdict. `verdict_reason` is the server's sentence for it;
    `defect` is None when the server sent none.

    `headline` is the answer in one sentence ("Rounding, not a bug: ...",
    "Not rounding: ... Look at ...", "Unexplained: ..."), which every
    message of this client prints first (`lead`); `advice` what to change
    in the framework so that the output becomes the configuration wanted
    ("" when it already is, or no switch is known). With `accept=`:
    `accepted`, whether the output is rounding of an accepted
    configuration, and `accepted_as`, which. All empty from a server that
    predates them.

    `candidate_tiers`: the tiers of the server's default candidates that
    ran (docs/numerics.md, "Diagnosis"): [1], or [1, 2] when no first-tier
    candidate explained the output and the second tier (FP8 recipes,
    multi-pass precisions) ran too; [] when the request named its
    candidates (or from a server that predates the tiers)."""

    best: Optional[str]
    equivalent: list[str]
    tied: list[str]
    confidence: float
    ranking: list[RankedCandidate]
    framework_hint: str
    localization: Localization
    explanation: str
    verdict: str = ""
    verdict_reason: str = ""
    defect: Optional[Defect] = None
    headline: str = ""
    advice: str = ""
    accepted: bool = False
    accepted_as: str = ""
    candidate_tiers: list[int] = field(default_factory=list)

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
            verdict=_DIAGNOSIS_VERDICT_NAMES.get(m.verdict, ""),
            verdict_reason=m.verdict_reason,
            defect=Defect.from_proto(m.defect) if m.HasField("defect") else None,
            headline=m.headline,
            advice=m.advice,
            accepted=m.accepted,
            accepted_as=m.accepted_as,
            candidate_tiers=list(m.candidate_tiers),
        )

    @property
    def lead(self) -> str:
        """The line a message about this diagnosis opens with: the server's
        `headline`, else (a server that predates it) its `verdict_reason`,
        else ""."""
        return self.headline or self.verdict_reason

    def ranking_groups(self) -> list[list[RankedCandidate]]:
        """The ranking as the reports display it: one list per row, in
        ranking order. A row holds the candidates that computed the same bits
        on the given inputs (they name each other in `equivalent` and carry
        identical statistics), the one ranked highest first; a candidate
        joins the row of the first candidate ranked above it that names it
        (or that it names). `ranking` itself keeps one entry per candidate.

            [[c.config for c in row] for row in diagnosis.ranking_groups()]
            # [["cpu:fp32:fused", "cpu:tf32:fused", "cpu:fp32:unfused"],
            #  ["cpu:bf16:fused"], ...]
        """
        rows: list[list[RankedCandidate]] = []
        placed: set[int] = set()
        for i, head in enumerate(self.ranking):
            if i in placed:
                continue
            row = [head]
            for j in range(i + 1, len(self.ranking)):
                c = self.ranking[j]
                if j in placed or c.config == head.config:
                    continue
                if c.config in head.equivalent or head.config in c.equivalent:
                    row.append(c)
                    placed.add(j)
            rows.append(row)
        return rows
