"""How a ModelReport reads in Python: its text summary, a comparison of
two models, and the pytest message (docs/model-checks.md).

The artifacts (JUnit XML, the HTML page, the GitHub summary) are not
drawn here: the CLI's `tensorcheck render` draws them from the JSON report
(tensorcheck._render), one renderer for both clients."""

from __future__ import annotations

import math
from typing import Optional, Protocol

from ._format import cap_lines, format_share, ulp_cell
from ._model_types import LayerCheck

__all__ = [
    "describe_configs",
    "format_summary",
    "format_comparison",
    "failure_message",
]


class _ModelReport(Protocol):
    """What the output reads of a `tensorcheck.ModelReport`. The
    ModelReport (tensorcheck._model) prints itself with this module, which
    therefore names its layers (tensorcheck._model_types) but not it."""

    @property
    def layers(self) -> list[LayerCheck]: ...

    @property
    def framework(self) -> str: ...

    @property
    def model(self) -> str: ...

    @property
    def error(self) -> Optional[str]: ...

    @property
    def uploaded_bytes(self) -> int: ...

    @property
    def reused_bytes(self) -> int: ...

    @property
    def sent_bytes(self) -> int: ...

    @property
    def elapsed_s(self) -> float: ...

    @property
    def checked(self) -> list[LayerCheck]: ...

    @property
    def consensus(self) -> Optional[str]: ...

    def first_divergence(self) -> Optional[LayerCheck]: ...


class _ModelComparison(Protocol):
    """What the output reads of a `tensorcheck.ModelComparison`."""

    @property
    def names(self) -> tuple[str, str]: ...

    @property
    def reports(self) -> tuple[_ModelReport, _ModelReport]: ...

    @property
    def pairs(self) -> list[tuple[Optional[LayerCheck], Optional[LayerCheck]]]: ...

    @property
    def first_difference(self) -> Optional[tuple[Optional[LayerCheck], Optional[LayerCheck]]]: ...


_MAX_GROUPS_LISTED = 2


def _num(v: Optional[float]) -> str:
    if v is None:
        return "-"
    if math.isnan(v):
        return "nan"
    if math.isinf(v):
        return "inf" if v > 0 else "-inf"
    return f"{v:.3g}"


def _shape(s: tuple[int, ...]) -> str:
    return "[" + ",".join(str(d) for d in s) + "]"


def _best(layer: LayerCheck) -> str:
    """The configuration explaining a layer call, with its confidence;
    those computing the same bits on its inputs are one entry ("a = b";
    more than two in the table as "a (+5 same bits)", as the CLI's)."""
    if not layer.checked:
        return "-"
    if layer.report is not None and layer.report.diagnosis is None:
        return "(verify only)"
    if not layer.best:
        return "none explains it"
    if len(layer.equivalent) <= 1:
        text = " = ".join([layer.best, *layer.equivalent])
    else:
        text = f"{layer.best} (+{len(layer.equivalent)} same bits)"
    conf = f", confidence {layer.confidence:.2f}" if layer.confidence is not None else ""
    return text + conf


def _where(layer: LayerCheck) -> str:
    """Where the differences concentrate (the diagnosis' top columns and
    rows), for a layer call that failed: for one explained bit for bit
    they only say where the runner-up would have differed."""
    if layer.status != "failed" or layer.explained and not layer.divergence_reason:
        return "-"
    parts = []
    for what, groups in (("cols", layer.columns), ("rows", layer.rows)):
        if groups:
            shown = ", ".join(
                f"{g.index} ({format_share(g.share)})" for g in groups[:_MAX_GROUPS_LISTED]
            )
            parts.append(f"{what} {shown}")
    return "; ".join(parts) or "-"


def _sentence(text: str) -> str:
    """`text` ending in a full stop: the rules' own reasons have none, the
    server's verdict_reason ends in one already."""
    return text if text.endswith(".") else text + "."


# A layer call's status as text: the server's verdict words (PASS, FAIL),
# ERROR for one whose request failed, "-" for one not checked.
_STATUS_WORDS = {"passed": "PASS", "failed": "FAIL", "error": "ERROR", "not_checked": "-"}
# Failed layer calls a summary or a failure message lists one line each.
_FAILED_LISTED = 8


def _status(layer: LayerCheck) -> str:
    return _STATUS_WORDS[layer.status]


def _answer(layer: LayerCheck) -> str:
    """What a failed layer call's line says: the server's headline for it
    (its verdict reason from an older server), else the rule it broke, its
    error, or its tolerance verdict."""
    if layer.headline:
        return layer.headline
    if layer.divergence_reason:
        return _sentence(layer.divergence_reason)
    if layer.error:
        return layer.error
    return f"verdict {(layer.verdict or '-').upper()} under the tolerance"


def _failed_lines(report: _ModelReport) -> list[str]:
    """One line per failed (or refused) layer call, "  #13 blocks.3.mlp.down:
    FAIL: <the server's headline>", beneath it the model's rule it broke
    when that is not the server's verdict (a consensus it does not match,
    a bound_ratio over the threshold, non-finite values) and its advice;
    the first _FAILED_LISTED, then how many more."""
    failed = [
        (i, layer) for i, layer in enumerate(report.layers) if layer.status in ("failed", "error")
    ]
    lines = []
    for i, layer in failed[:_FAILED_LISTED]:
        lines.append(f"  #{i} {layer.label}: {_status(layer)}: {_answer(layer)}")
        rule = layer.divergence_reason
        if layer.headline and rule and rule not in (layer.headline, layer.verdict_reason):
            lines.append(f"      Rule: {_sentence(rule)}")
        if layer.advice:
            lines.append(f"      Advice: {layer.advice}")
    if len(failed) > _FAILED_LISTED:
        lines.append(f"  ... {len(failed) - _FAILED_LISTED} more")
    return lines


def _table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in [header, *rows]]
    lines.insert(1, "  ".join("-" * w for w in widths).rstrip())
    return "\n".join(lines)


# --- text ---------------------------------------------------------------------


def _segments(report: _ModelReport) -> list[tuple[str, list[LayerCheck]]]:
    """Runs of consecutive layer calls explained by the same configuration
    (the consensus where it explains a layer, else the layer's best)."""
    consensus = report.consensus
    runs: list[tuple[str, list[LayerCheck]]] = []
    for layer in report.layers:
        if not layer.checked:
            label = "not checked"
        elif layer.report is None or layer.report.diagnosis is None:
            label = layer.status
        elif not layer.explained:
            label = "unexplained"
        elif consensus is not None and consensus in layer.configs_explaining:
            label = consensus
        else:
            label = layer.best or "unexplained"
        if runs and runs[-1][0] == label:
            runs[-1][1].append(layer)
        else:
            runs.append((label, [layer]))
    return runs


def describe_configs(report: _ModelReport) -> str:
    """What a model ran, in one line: "cpu:bf16:fused everywhere", or
    "cpu:bf16:fused up to blocks.1.attn.out, cpu:bf16:unfused from
    blocks.1.mlp.up on"."""
    runs = _segments(report)
    if not runs:
        return "no linear layers"
    if len(runs) == 1:
        return f"{runs[0][0]} everywhere"
    parts = []
    for i, (label, ls) in enumerate(runs):
        if i == 0:
            parts.append(f"{label} up to {ls[-1].label}")
        elif i == len(runs) - 1:
            parts.append(f"{label} from {ls[0].label} on")
        elif len(ls) == 1:
            parts.append(f"{label} at {ls[0].label}")
        else:
            parts.append(f"{label} from {ls[0].label} to {ls[-1].label}")
    return ", ".join(parts)


def format_summary(report: _ModelReport) -> str:
    title = " ".join(x for x in (report.framework, report.model) if x) or "model"
    if not report.layers:
        return (
            f"{title}: no linear layer calls were captured (the model has no "
            "linear layers, or none ran), so nothing was checked."
        )
    rows = [
        [
            str(i),
            layer.label,
            f"{_shape(layer.input_shape)}x{_shape(layer.weight_shape)}",
            layer.dtype,
            _best(layer),
            _status(layer),
            _num(layer.max_abs),
            ulp_cell(layer),
            _num(layer.bound_ratio),
            _where(layer),
        ]
        for i, layer in enumerate(report.layers)
    ]
    header = [
        "#", "layer", "x · W", "dtype", "best", "status", "max_abs", "max_ulp",
        "bound_ratio", "differences at",
    ]  # fmt: skip
    out = [
        f"{title}: {len(report.checked)} of {len(report.layers)} layer calls checked "
        "(# numbers them from 0 in execution order)"
    ]
    out.append(_table(header, rows))
    out.append("")
    out.append(f"Configurations: {describe_configs(report)}.")
    first = report.first_divergence()
    if report.error:
        out.append(
            f"Stopped early: {report.error} ({len(report.checked)} of "
            f"{len(report.layers)} layer calls checked; the rest are not checked)."
        )
    if first is not None:
        out.append(
            f"First divergence: #{report.layers.index(first)} {first.label}: "
            f"{_sentence(first.divergence_reason or '')}"
        )
    elif report.checked and not report.error:
        consensus = report.consensus
        by = f" by {consensus}" if consensus else ""
        out.append(f"No divergence: all {len(report.checked)} layer calls explained{by}.")
    failed = _failed_lines(report)
    if failed:
        count = sum(layer.status in ("failed", "error") for layer in report.layers)
        out.append(f"{count} of {len(report.layers)} layer calls did not pass:")
        out.extend(failed)
    mib = 1 << 20
    out.append(
        f"Tensors sent: {report.sent_bytes / mib:.2f} MiB "
        f"(uploaded to the store {report.uploaded_bytes / mib:.2f} MiB, "
        f"reused from it {report.reused_bytes / mib:.2f} MiB); {report.elapsed_s:.2f} s."
    )
    return "\n".join(out)


def format_comparison(cmp: _ModelComparison) -> str:
    a_name, b_name = cmp.names
    out = [f"{n}: {describe_configs(r)}" for n, r in zip(cmp.names, cmp.reports)]
    first = cmp.first_difference
    if first is not None:
        a, b = first
        assert a is not None and b is not None
        out.append(f"First difference: {a.label}: {a_name} {_best(a)}; {b_name} {_best(b)}.")
    else:
        out.append("No difference: every paired layer call is explained alike.")
    rows = []
    for a, b in cmp.pairs:
        name = (a or b).label if (a or b) is not None else "?"  # type: ignore[union-attr]
        differs = a is None or b is None or not (a.configs_explaining & b.configs_explaining)
        rows.append(
            [
                name,
                "-" if a is None else _best(a),
                "-" if b is None else _best(b),
                "<>" if differs else "",
            ]
        )
    out.append("")
    out.append(_table(["layer", a_name, b_name, ""], rows))
    return "\n".join(out)


def failure_message(report: _ModelReport) -> str:
    """The AssertionError text of assert_model_parity, at most 25 lines:
    the first diverging (or failing) layer call's answer from the server
    (its headline) first, then where it is and the rule it broke, its
    advice, what ran where, and the other failed layer calls."""
    first = report.first_divergence()
    lines = []
    if first is None:
        failing = [layer for layer in report.layers if layer.status != "passed"]
        first = failing[0] if failing else None
    if first is not None:
        i = report.layers.index(first)
        lead = first.headline or ""
        if lead:
            lines.append(lead)
        why = first.divergence_reason or first.error or ""
        if not why and first.verdict == "fail":
            why = f"verdict {_STATUS_WORDS['failed']} under the tolerance"
        where = (
            f"Model parity {_status(first)} at layer call #{i} {first.label} "
            f"(of {len(report.layers)}, numbered from 0)"
        )
        if why and why not in (lead, first.verdict_reason):
            where += f": {_sentence(why)}"
        lines.append(where)
        if first.advice:
            lines.append(f"Advice: {first.advice}")
        if not lead and first.report is not None and first.report.diagnosis is None:
            lines.extend(first.report.failure_message().splitlines()[:8])
    elif report.error:
        lines.append(f"Model parity not established: {report.error}.")
    elif not report.layers:
        lines.append("Model parity not established: no linear layer calls were captured.")
    if report.error and first is not None:
        lines.append(f"Stopped early: {report.error}.")
    if report.layers:
        lines.append("")
        lines.append(f"Configurations: {describe_configs(report)}.")
        count = sum(layer.status in ("failed", "error") for layer in report.layers)
        if count > 1:
            lines.append(f"{count} layer calls did not pass:")
            lines.extend(_failed_lines(report))
        lines.append("The table of every layer call: print(report.summary()) on the ModelReport.")
    return "\n".join(cap_lines(lines))
