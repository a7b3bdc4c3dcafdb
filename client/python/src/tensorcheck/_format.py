"""The messages a failed parity check raises: the server's answer first
(`Diagnosis.headline`), then a torch-style mismatch summary and the
diagnosis, with shares that read 100% or 0% only when exact.

The client decides no verdict and writes no sentence of its own about
one: the headline, the verdict's reason and the advice are the server's,
printed as sent; what is added here are labels and numbers."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Optional, Protocol, Union

if TYPE_CHECKING:
    from ._report_nodes import (
        ConfigResult,
        Defect,
        DefectGroup,
        Diagnosis,
        NegligibleElements,
        RankedCandidate,
        Stats,
        Tolerance,
    )

__all__ = [
    "format_share",
    "format_mismatch",
    "format_diagnosis",
    "format_report",
    "format_parity_failure",
    "lead_lines",
    "cap_lines",
    "MESSAGE_MAX_LINES",
]

_SHARE_MAX_DECIMALS = 6
# The most lines a failed assertion's message has (the full answer is the
# Report's): enough for the answer, the statistics and the best candidates.
MESSAGE_MAX_LINES = 25
# The server's verdict words (VerifyResponse.verdict), as every message
# prints them.
VERDICT_WORDS = {"pass": "PASS", "fail": "FAIL"}


def format_share(value: Union[int, float], whole: Optional[int] = None) -> str:
    """A share as a percentage that reads 100% or 0% only when it is exactly
    that: `format_share(0.99996831)` is "99.997%", not "100.0%".

    `value` is a fraction in [0, 1]; with `whole` it is a count of `whole`
    instead (`format_share(3, 1024)` is "0.3%"), and all and none are
    decided on the counts (part == whole is "100%", an empty whole "0%").
    One decimal, or as many more (up to 6) as it takes not to read 100.0 or
    0.0; beyond that "<0.000001%" and ">99.999999%". NaN is "nan%"; values
    outside [0, 1] get one decimal. The CLI's FormatShare
    (core/share_format.h) follows the same rule.
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


class _Report(Protocol):
    """What the messages read of a `tensorcheck.Report`. The Report
    (tensorcheck._report) prints itself with this module, which therefore
    names its parts (tensorcheck._report_nodes) but not the Report."""

    @property
    def verdict(self) -> Optional[str]: ...

    @property
    def accept(self) -> tuple[str, ...]: ...

    @property
    def tolerance(self) -> Tolerance: ...

    @property
    def observed_vs_reference(self) -> Optional[Stats]: ...

    @property
    def reference(self) -> Optional[ConfigResult]: ...

    @property
    def results(self) -> list[ConfigResult]: ...

    @property
    def diagnosis(self) -> Optional[Diagnosis]: ...


class _UlpFigures(Protocol):
    """What ulp_cell reads: Stats, and a model's LayerCheck."""

    @property
    def max_ulp(self) -> Union[int, float, None]: ...

    @property
    def negligible(self) -> Optional[NegligibleElements]: ...


def ulp_cell(c: _UlpFigures) -> str:
    """The headline ULP figure of a comparison for a table cell or a
    summary line: "5", or "5 (2 near 0)" when the server left two differing
    elements near zero out of it (`negligible`); "-" without a figure."""

    def text(v: Union[int, float, None]) -> str:
        return "-" if v is None else "inf" if v == math.inf else str(int(v))

    if c.negligible is None:
        return text(c.max_ulp)
    return f"{text(c.negligible.significant_max_ulp)} ({c.negligible.differing} near 0)"


def stats_summary_line(stats: Stats) -> str:
    """A comparison on one line, "mismatched 40 / 1024 (3.9%), max_abs
    0.0625, max_ulp 6, bitwise-equal 68.4%": the CLI's words
    (client/cli/internal/report_format.h, StatsSummaryLine), which the
    JSON report of a Verify-only model check shows for each layer call."""
    total = stats.total
    return (
        f"mismatched {stats.mismatched} / {total} ({format_share(stats.mismatched, total)}), "
        f"max_abs {_g6(stats.max_abs)}, max_ulp {ulp_cell(stats)}, "
        f"bitwise-equal {format_share(stats.bitwise_equal_count, total)}"
    )


def _g6(v: float) -> str:
    """Six significant digits, as C's %.6g ("nan", "inf", "-inf" too)."""
    return f"{v:.6g}"


def _fmt_index(index: Sequence[int]) -> str:
    return "(" + ", ".join(str(i) for i in index) + ("," if len(index) == 1 else "") + ")"


def _fmt_num(v: Optional[float]) -> str:
    return "None" if v is None else repr(float(v)) if isinstance(v, float) else str(v)


def format_mismatch(report: _Report, *, worst_shown: int = 5) -> str:
    """The torch-style lines of a comparison that failed its tolerance
    (observed vs reference, else the first failing configuration), the
    `worst_shown` worst elements among them."""
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
        # The tolerance counts every element: its figure is the one it judged.
        lines.append(f"Greatest ULP distance: {stats.max_ulp} (up to {tol.max_ulp} allowed)")
    else:
        lines.append(
            f"Greatest ULP distance: {stats.headline_max_ulp}"
            + (f" in {stats.compared_dtype}" if stats.compared_dtype else "")
            + (f", {stats.negligible.note}" if stats.negligible else "")
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
    if worst and worst_shown > 0:
        lines.append("")
        lines.append("Worst elements (index: actual vs expected, ULP):")
        for e in worst[:worst_shown]:
            lines.append(f"  {_fmt_index(e.index)}: {e.actual!r} vs {e.expected!r}, {e.ulp} ULP")
    # Only worth a line when a few columns hold most of the mismatches.
    if stats.top_columns and sum(g.share for g in stats.top_columns) >= 0.5:
        cols = ", ".join(f"{g.index} ({format_share(g.share)})" for g in stats.top_columns)
        lines.append(f"Mismatches concentrate in columns: {cols}")
    return "\n".join(lines)


def lead_lines(d: Diagnosis) -> list[str]:
    """What every message about a diagnosis opens with: the server's
    headline (else, from a server that predates it, its verdict reason),
    then its advice, each as sent; [] when the server sent neither."""
    lines = [d.lead] if d.lead else []
    if d.advice:
        lines.append(f"Advice: {d.advice}")
    return lines


def format_diagnosis(
    d: Diagnosis,
    *,
    lead: bool = True,
    ranking_shown: Optional[int] = None,
    defect_shown: Optional[int] = None,
) -> str:
    """The diagnosis message: the server's headline and advice first
    (`lead_lines`; lead=False leaves them to the caller), the verdict's
    reason when the headline is there too, the accepted configuration,
    what is not rounding (a `defect` verdict; `defect_shown` columns, rows
    and elements of each, default 5), then the best match and the ranking
    (its first `ranking_shown` rows, default 5)."""
    lines = lead_lines(d) if lead else []
    if d.headline and d.verdict_reason:
        lines.append(f"Why: {d.verdict_reason}")
    if d.accepted_as:
        lines.append(f"Accepted as: {d.accepted_as}")
    if d.defect is not None:
        shown = _DEFECT_SHOWN if defect_shown is None else defect_shown
        lines.extend(_defect_lines(d.defect, d.headline, shown))
    verdict = f"; verdict {d.verdict}" if d.verdict else ""
    head = f"Best match: {d.best or 'none'} (confidence {d.confidence:.2f}{verdict})"
    if d.best and d.equivalent:
        head += f", equivalent here: {', '.join(d.equivalent)}"
    if d.best and d.tied:
        head += f"; cannot be told apart from: {', '.join(d.tied)}"
    lines.append(head)
    if d.framework_hint:
        lines.append(f"Framework hint: {d.framework_hint}")
    if d.explanation and not d.headline:
        # The headline says it in one sentence; the paragraph is for
        # servers that predate it (`Diagnosis.explanation` keeps it).
        lines.append(d.explanation)
    if d.ranking:
        # Candidates that computed the same bits share one row, "A = B = C".
        shown = _RANKING_SHOWN if ranking_shown is None else ranking_shown
        rows = d.ranking_groups()[:shown]
        ranked = {c.config for c in d.ranking}
        lines.append("Ranking (config: plausible, bitwise-equal share, max ULP, bound ratio):")
        for row in rows:
            r = row[0]
            br = "n/a" if r.bound_ratio is None else f"{r.bound_ratio:.3g}"
            row_lines = _wrapped_names(_row_names(row, ranked, marked=True))
            row_lines[-1] += (
                f": {r.plausible_text}, {format_share(r.bitwise_equal_fraction)}, {r.max_ulp}, {br}"
            )
            lines.extend(row_lines)
        lines.extend(_shared_footnotes([c for row in rows for c in row], "."))
        ruled_out = [(i, row) for i, row in enumerate(rows, 1) if row[0].ruled_out]
        if ruled_out:
            lines.append("  Ruled out:")
            lines.extend(
                f"    {i}. {' = '.join(_row_names(row, ranked, marked=False))}: {row[0].ruled_out}"
                for i, row in ruled_out
            )
    return "\n".join(lines)


# How many ranking rows the diagnosis message lists (to_dict() has all).
_RANKING_SHOWN = 5
# How many defect columns, rows and elements it lists (to_dict() has all
# the server sent).
_DEFECT_SHOWN = 5


def _fmt_sigma(v: float) -> str:
    """A distance in predicted standard errors, one decimal ("inf" for an
    element where exactly one side is finite; 3 significant digits from a
    million on, "1.78e+15")."""
    if v == math.inf:
        return "inf"
    return f"{v:.3g}" if abs(v) >= 1e6 else f"{v:.1f}"


def _defect_group_lines(
    kind: str, groups: Sequence[DefectGroup], shown: int = _DEFECT_SHOWN
) -> list[str]:
    """One line per group, "  column 2: 64 disagreements vs 0.8 expected,
    max 4096 ULP, 812.3 sigma", the first _DEFECT_SHOWN, then how many more."""
    lines = [
        f"  {kind} {g.index}: {g.disagreements} disagreements vs "
        f"{g.expected_disagreements:.3g} expected, max {g.max_ulp} ULP, "
        f"{_fmt_sigma(g.max_sigma)} sigma" + (f", shift t = {g.shift_t:.1f}" if g.shift_t else "")
        for g in groups[:shown]
    ]
    if len(groups) > shown:
        lines.append(f"  ... {len(groups) - shown} more {kind}s")
    return lines


def _defect_lines(defect: Defect, headline: str = "", shown: int = _DEFECT_SHOWN) -> list[str]:
    """Where to look (unless the headline says it already), the columns and
    rows rounding does not explain, and the elements beyond the threshold,
    largest first: each line only when the server sent something for it."""
    lines = []
    if defect.where_to_look and defect.where_to_look not in headline:
        lines.append(f"Where to look: {defect.where_to_look}")
    if defect.columns:
        lines.append("Columns not explained by rounding:")
        lines.extend(_defect_group_lines("column", defect.columns, shown))
    if defect.rows:
        lines.append("Rows not explained by rounding:")
        lines.extend(_defect_group_lines("row", defect.rows, shown))
    if defect.element_count or defect.elements:
        lines.append(
            f"Elements beyond {_fmt_sigma(defect.element_threshold_sigma)} sigma: "
            f"{defect.element_count} (farthest: {defect.max_ulp} ULP, "
            f"{_fmt_sigma(defect.max_sigma)} sigma)"
        )
        listed = defect.elements[:shown]
        for de in listed:
            e = de.element
            if e is None:
                lines.append(f"  (index not sent): {_fmt_sigma(de.sigma)} sigma")
                continue
            lines.append(
                f"  {_fmt_index(e.index)}: observed {e.actual!r}, best {e.expected!r}, "
                f"{e.ulp} ULP, {_fmt_sigma(de.sigma)} sigma"
            )
        more = max(defect.element_count, len(defect.elements)) - len(listed)
        if more > 0:
            lines.append(f"  ... {more} more")
    return lines


# Marks a configuration that reused another configuration's GEMM.
_SHARED_MARKER = "*"
# A row's names are wrapped before an "=" past this many characters.
_NAMES_WIDTH = 72


def _row_names(row: Sequence[RankedCandidate], ranked: set[str], marked: bool) -> list[str]:
    """The names of one ranking row, its candidates first (each marked, if
    `marked`, when it reused another's GEMM), then any name in the first
    one's `equivalent` that the ranking (`ranked`) lacks."""
    names = [c.config + (_SHARED_MARKER if marked and c.shared_computation else "") for c in row]
    names.extend(e for e in dict.fromkeys(row[0].equivalent) if e not in ranked)
    return names


def _wrapped_names(names: Sequence[str]) -> list[str]:
    """`names` as "  A = B = C", wrapped before an "=" at _NAMES_WIDTH into
    continuation lines "    = D = E"; a name longer than that stays whole."""
    lines = ["  " + names[0]]
    for name in names[1:]:
        if len(lines[-1]) + 3 + len(name) > _NAMES_WIDTH:
            lines.append("    = " + name)
        else:
            lines[-1] += " = " + name
    return lines


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


def cap_lines(lines: Sequence[str], limit: int = MESSAGE_MAX_LINES) -> list[str]:
    """`lines` cut to at most `limit`, the last saying how many were left
    out; blank lines at either end dropped first."""
    out = list(lines)
    while out and not out[-1].strip():
        out.pop()
    while out and not out[0].strip():
        out.pop(0)
    if len(out) <= limit:
        return out
    kept = out[: limit - 1]
    return kept + [f"... ({len(out) - len(kept)} more lines: the Report has everything)"]


def _g(v: Optional[float]) -> str:
    return "-" if v is None else f"{v:.3g}"


def _stats_line(label: str, stats: Stats, preset: str) -> str:
    """One comparison in a line: "observed vs cpu:fp64:none: 3 / 1024
    outside tolerance torch, max_abs 1.05e-03, max 12 ULP"."""
    bound = "" if stats.bound_ratio is None else f", bound_ratio {stats.bound_ratio:.3g}"
    return (
        f"{label}: {stats.mismatched} / {stats.total} outside tolerance {preset}, "
        f"max_abs {_g(stats.max_abs)}, max {ulp_cell(stats)} ULP{bound}"
    )


def _verdict_line(report: _Report) -> Optional[str]:
    """ "Verdict: PASS (tolerance torch)" or, with accept=, "Verdict: FAIL
    (accept tf32)": the server's word and what it was decided on."""
    if report.verdict is None:
        return None
    word = VERDICT_WORDS.get(report.verdict, report.verdict.upper())
    on = (
        f"accept {', '.join(report.accept)}"
        if report.accept
        else f"tolerance {report.tolerance.preset}"
    )
    return f"Verdict: {word} ({on})"


# Configurations a report's text lists one line each (to_dict() has all).
_RESULTS_SHOWN = 8


def format_report(report: _Report) -> str:
    """str(report): the server's answer first (headline, advice), the
    verdict, the observed output and each configuration against the
    reference in a line each, then the diagnosis."""
    d = report.diagnosis
    lines = lead_lines(d) if d is not None else []
    verdict = _verdict_line(report)
    if verdict is not None:
        lines.append(verdict)
    preset = report.tolerance.preset
    ref = report.reference.config if report.reference is not None else "reference"
    if report.observed_vs_reference is not None:
        lines.append(_stats_line(f"observed vs {ref}", report.observed_vs_reference, preset))
    for r in report.results[:_RESULTS_SHOWN]:
        if r.vs_reference is not None:
            lines.append(_stats_line(f"{r.config} vs {ref}", r.vs_reference, preset))
    if len(report.results) > _RESULTS_SHOWN:
        lines.append(f"... {len(report.results) - _RESULTS_SHOWN} more configurations")
    if d is not None:
        lines.extend(format_diagnosis(d, lead=False).splitlines())
    return "\n".join(lines)


def format_parity_failure(
    report: _Report, diagnosis: Optional[Diagnosis], diagnosis_error: Optional[str] = None
) -> str:
    """The AssertionError of assert_linear_parity, at most
    MESSAGE_MAX_LINES lines: the server's headline and advice first, then
    the comparison (torch-style; with accept=, the verdict and the
    statistics in a line each) and the diagnosis (or why there is none)."""
    lines = lead_lines(diagnosis) if diagnosis is not None else []
    if lines:
        lines.append("")
    if report.accept:
        verdict = _verdict_line(report)
        if verdict is not None:
            lines.append(verdict)
        if report.observed_vs_reference is not None:
            ref = report.reference.config if report.reference is not None else "reference"
            lines.append(
                _stats_line(
                    f"observed vs {ref}", report.observed_vs_reference, report.tolerance.preset
                )
            )
    else:
        # With a diagnosis, its elements (against the best match) stand for
        # the worst ones (against the reference).
        worst = 0 if diagnosis is not None else 3
        lines.extend(format_mismatch(report, worst_shown=worst).splitlines())
    if diagnosis is not None:
        lines.append("")
        lines.extend(
            format_diagnosis(diagnosis, lead=False, ranking_shown=3, defect_shown=2).splitlines()
        )
    elif diagnosis_error:
        lines.extend(["", f"Diagnosis unavailable: {diagnosis_error}"])
    return "\n".join(cap_lines(lines))
