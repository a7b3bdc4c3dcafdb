"""What a whole-model check captures and finds per layer call: `Capture`,
`Captures` and `LayerCheck`.

They sit below both `_model` (the checks and the ModelReport) and
`_model_output` (how a ModelReport reads), so that neither imports the
other back; docs/model-checks.md describes them.
"""

from __future__ import annotations

import dataclasses
import threading
from collections import Counter
from typing import Any, Optional, Union

import numpy as np

from ._format import stats_summary_line
from ._node import _json, _json_float, _json_ulp
from ._report import NegligibleElements, Report

__all__ = [
    "Capture",
    "Captures",
    "LayerCheck",
    "PASSED",
    "FAILED",
    "ERROR",
    "NOT_CHECKED",
    "NO_CALL_DECISION",
    "DEFAULT_BOUND_THRESHOLD",
]

# LayerCheck.status values.
PASSED, FAILED, ERROR, NOT_CHECKED = "passed", "failed", "error", "not_checked"

# The server's default bound_ratio threshold (VerifyRequest.bound_threshold,
# docs/api.md): a layer call whose error is more than this many times what
# its precision's error model predicts diverges (docs/numerics.md: about 1
# is ordinary). A run that names no threshold gets it; the server decides.
DEFAULT_BOUND_THRESHOLD = 3.0

# The `error` of a layer call whose response carries no decisions about it.
NO_CALL_DECISION = (
    "the server's response carries no call decision (VerifyResponse.call): the server "
    "predates it, so the call cannot be judged; upgrade the server"
)


@dataclasses.dataclass
class Capture:
    """One linear layer call as the model ran it: host arrays in the
    model's dtype. The capturers hand every call of one parameter the same
    array object, so that a weight used by several calls (a module called
    twice, tied weights) is hashed and uploaded once (by id())."""

    name: str
    call: int
    input: np.ndarray
    weight: np.ndarray
    bias: Optional[np.ndarray]
    output: np.ndarray
    weight_layout: str = "out_in"  # or "in_out" (a Flax kernel [K, N])

    @property
    def label(self) -> str:
        """The name, with `#call` for a module's second and later calls
        (the captures file's key prefix)."""
        return self.name if self.call == 0 else f"{self.name}#{self.call}"


class Captures:
    """Collects captures in execution order, numbering each name's calls."""

    def __init__(self) -> None:
        self.items: list[Capture] = []
        self._calls: Counter[str] = Counter()
        self._lock = threading.Lock()

    def add(
        self,
        name: str,
        x: np.ndarray,
        weight: np.ndarray,
        bias: Optional[np.ndarray],
        output: np.ndarray,
        *,
        weight_layout: str = "out_in",
    ) -> None:
        with self._lock:
            call = self._calls[name]
            self._calls[name] += 1
            self.items.append(Capture(name, call, x, weight, bias, output, weight_layout))


@dataclasses.dataclass
class LayerCheck:
    """One layer call's check: what was sent, and what the server found.

    `status` is "passed", "failed" (verdict fail under the tolerance, or a
    divergence: see `divergence_reason`), "error" (its request failed: the
    server refused it or went away during it; or the server answered
    without its decisions: `error`) or "not_checked" (the run stopped
    before sending it, e.g. the server went away).
    `explained` and `configs_explaining` are the server's decisions about
    the call (`report.call`, docs/api.md, "Layer-call decisions"): whether
    a configuration explains this output (Verify only: whether its verdict
    is pass), and every one that does (the diagnosis' best with its
    equivalents and ties).

    `verdict` is the tolerance's pass/fail; `diagnosis_verdict` the
    server's "rounding", "defect" or "unexplained" (docs/numerics.md,
    "Verdict") and `verdict_reason` its sentence, None from a server that
    predates them. A "defect" or "unexplained" layer is a divergence whose
    reason is `verdict_reason`. `headline` is the server's answer for the
    layer in one sentence (its verdict reason from a server that predates
    headlines) and `advice` what to change, which the messages print first
    for a failed layer; neither is in to_dict() (the layer's `report` has
    them).

    In text, a layer call is `#index`, its 0-based position in execution
    order (`ModelReport.layers`, the summary's `#` column and
    `first_divergence.index` in to_dict()), and its status reads PASS,
    FAIL, ERROR or "-" (not checked), the server's verdict words; `status`
    itself keeps the JSON's values.
    """

    name: str
    call: int
    input_shape: tuple[int, ...]
    weight_shape: tuple[int, ...]
    weight_layout: str
    dtype: str
    status: str = NOT_CHECKED
    verdict: Optional[str] = None
    best: Optional[str] = None
    confidence: Optional[float] = None
    equivalent: list[str] = dataclasses.field(default_factory=list)
    tied: list[str] = dataclasses.field(default_factory=list)
    explained: bool = False
    max_abs: Optional[float] = None
    max_ulp: Union[int, float, None] = None
    # The differing elements near zero that the server left out of the
    # headline ULP figure (Stats.negligible), if any.
    negligible: Optional[NegligibleElements] = None
    bound_ratio: Optional[float] = None
    columns: list[Any] = dataclasses.field(default_factory=list)
    rows: list[Any] = dataclasses.field(default_factory=list)
    explanation: str = ""
    error: Optional[str] = None
    # The gRPC status code's name of `error` ("UNAVAILABLE"), for a request
    # that failed.
    error_code: Optional[str] = None
    divergence_reason: Optional[str] = None
    diagnosis_verdict: Optional[str] = None
    verdict_reason: Optional[str] = None
    headline: Optional[str] = None
    advice: Optional[str] = None
    report: Optional[Report] = dataclasses.field(default=None, repr=False)

    @property
    def label(self) -> str:
        return self.name if self.call == 0 else f"{self.name}#{self.call}"

    @property
    def checked(self) -> bool:
        """The server answered this call with its decisions about it."""
        return self.report is not None and self.report.call is not None

    @property
    def configs_explaining(self) -> set[str]:
        """Every configuration that explains this output, as the server
        decided (`report.call.explaining`: best, equivalent and tied;
        without a bias `b:p:none` stands for `b:p:fused` and `b:p:unfused`
        too); empty when none does or the call was not checked."""
        call = None if self.report is None else self.report.call
        return set() if call is None else set(call.explaining)

    def _fill(self, report: Report) -> None:
        self.report = report
        call = report.call
        if call is None:
            # A server that predates CallDecision: the rules' per-call
            # decisions are its to make, so the call cannot be judged here.
            self.status = ERROR
            self.error = NO_CALL_DECISION
            return
        self.explained = call.explained
        self.verdict = report.verdict
        stats = report.observed_vs_reference
        if stats is not None:
            self.max_abs = stats.max_abs
            self.max_ulp = stats.max_ulp
            self.negligible = stats.negligible
            self.bound_ratio = stats.bound_ratio
        d = report.diagnosis
        if d is None:
            # Verify only: where the observed output differs from the
            # reference, and that comparison on one line (docs/model-checks.md,
            # "The JSON report").
            if stats is not None:
                self.columns = list(stats.top_columns)
                self.rows = list(stats.top_rows)
                ref = report.reference.config if report.reference is not None else ""
                self.explanation = (
                    f"observed vs {ref or 'the reference'}: {stats_summary_line(stats)}"
                )
            return
        self.best = d.best
        self.confidence = d.confidence if d.best else None
        self.equivalent = list(d.equivalent)
        self.tied = list(d.tied)
        self.explanation = d.explanation
        self.columns = list(d.localization.columns)
        self.rows = list(d.localization.rows)
        if d.verdict:
            self.diagnosis_verdict = d.verdict
            self.verdict_reason = d.verdict_reason
        self.headline = d.lead or None
        self.advice = d.advice or None

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "call": self.call,
            "input_shape": list(self.input_shape),
            "weight_shape": list(self.weight_shape),
            "weight_layout": self.weight_layout,
            "dtype": self.dtype,
            "status": self.status,
            "verdict": self.verdict,
            "diagnosis_verdict": self.diagnosis_verdict,
            "verdict_reason": self.verdict_reason,
            "best": self.best or None,
            "confidence": _json_float(self.confidence),
            "equivalent": list(self.equivalent),
            "tied": list(self.tied),
            "explained": self.explained,
            "max_abs": _json_float(self.max_abs),
            "max_ulp": None if self.max_ulp is None else _json_ulp(self.max_ulp),
            "negligible": None if self.negligible is None else self.negligible.to_dict(),
            "bound_ratio": _json_float(self.bound_ratio),
            "columns": _json(self.columns),
            "rows": _json(self.rows),
            "explanation": self.explanation,
            "error": self.error,
            "report": None if self.report is None else self.report.to_dict(),
            "error_code": self.error_code,
            # The whole response, in protobuf's JSON mapping.
            "response": None if self.report is None else self.report._response_dict(),
        }
