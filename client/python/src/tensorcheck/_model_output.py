"""How a ModelReport reads: the text table, the pytest message, JUnit XML
and the HTML page (docs/model-checks.md shows each)."""

from __future__ import annotations

import base64
import html
import math
import os
import struct
import zlib
from typing import TYPE_CHECKING, Optional, Union
from xml.etree import ElementTree

import numpy as np

from ._format import cap_lines, format_share

if TYPE_CHECKING:
    from ._model import LayerCheck, ModelComparison, ModelReport
    from ._report import Diagnosis

__all__ = ["format_summary", "format_comparison", "failure_message", "write_junit", "write_html"]

_MAX_GROUPS_LISTED = 2


def _num(v: Optional[float]) -> str:
    if v is None:
        return "-"
    if math.isnan(v):
        return "nan"
    if math.isinf(v):
        return "inf" if v > 0 else "-inf"
    return f"{v:.3g}"


def _ulp(v: Union[int, float, None]) -> str:
    if v is None:
        return "-"
    return "inf" if v == math.inf else str(int(v))


def _shape(s: tuple[int, ...]) -> str:
    return "[" + ",".join(str(d) for d in s) + "]"


def _best(layer: LayerCheck, full: bool = False) -> str:
    """The configuration explaining a layer call, with its confidence;
    those computing the same bits on its inputs are one entry ("a = b";
    more than two in the table as "a (+5 same bits)", as the CLI's)."""
    if not layer.checked:
        return "-"
    if layer.report is not None and layer.report.diagnosis is None:
        return "(verify only)"
    if not layer.best:
        return "none explains it"
    if full or len(layer.equivalent) <= 1:
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


def _explanation_after(reason: Optional[str], explanation: str) -> str:
    """The diagnosis' explanation without the server's verdict sentence it
    opens with (docs/numerics.md, "Verdict") when that sentence is the
    divergence reason shown just before it."""
    if reason and explanation.startswith(reason):
        return explanation[len(reason) :].lstrip()
    return explanation


# A layer call's status as text: the server's verdict words (PASS, FAIL),
# ERROR for a request the server refused, "-" for one not checked.
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


def _failed_lines(report: ModelReport) -> list[str]:
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


def format_summary(report: ModelReport) -> str:
    from ._model import describe_configs

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
            _ulp(layer.max_ulp),
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


def format_comparison(cmp: ModelComparison) -> str:
    from ._model import describe_configs

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


def failure_message(report: ModelReport) -> str:
    """The AssertionError text of assert_model_parity, at most 25 lines:
    the first diverging (or failing) layer call's answer from the server
    (its headline) first, then where it is and the rule it broke, its
    advice, what ran where, and the other failed layer calls."""
    from ._model import describe_configs

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


def write_junit(report: ModelReport, path: Union[str, os.PathLike[str]]) -> None:
    suite = ElementTree.Element(
        "testsuite",
        name=f"tensorcheck.model {report.model}".strip(),
        tests=str(len(report.layers)),
        failures=str(sum(layer.status == "failed" for layer in report.layers)),
        errors=str(sum(layer.status == "error" for layer in report.layers)),
        skipped=str(sum(layer.status == "not_checked" for layer in report.layers)),
        time=f"{report.elapsed_s:.3f}",
    )
    first = report.first_divergence()
    for layer in report.layers:
        case = ElementTree.SubElement(
            suite, "testcase", classname="tensorcheck.model", name=layer.label
        )
        detail = (
            f"{_shape(layer.input_shape)} x {_shape(layer.weight_shape)} {layer.dtype}; "
            f"best {_best(layer)}; "
            f"max_abs {_num(layer.max_abs)}, max_ulp {_ulp(layer.max_ulp)}, "
            f"bound_ratio {_num(layer.bound_ratio)}"
        )
        if layer.status == "failed":
            why = _answer(layer)
            if layer is first:
                why = "first divergence: " + why
            node = ElementTree.SubElement(case, "failure", message=why)
            more = [
                f"Rule: {_sentence(layer.divergence_reason)}"
                if layer.divergence_reason and layer.divergence_reason != layer.headline
                else "",
                f"Advice: {layer.advice}" if layer.advice else "",
                layer.explanation,
            ]
            node.text = "\n".join([detail, *(m for m in more if m)])
        elif layer.status == "error":
            node = ElementTree.SubElement(case, "error", message=layer.error or "error")
            node.text = detail
        elif layer.status == "not_checked":
            ElementTree.SubElement(
                case, "skipped", message=f"not checked: {layer.error or report.error or 'stopped'}"
            )
        else:
            ElementTree.SubElement(case, "system-out").text = detail
    ElementTree.ElementTree(suite).write(path, encoding="utf-8", xml_declaration=True)


# --- the HTML page ------------------------------------------------------------------

_PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf"]
_STYLE = """
body{font:14px/1.45 system-ui,sans-serif;margin:24px;max-width:1200px;color:#222}
h1{font-size:22px}h2{font-size:17px;margin-top:32px;border-top:1px solid #ccc;padding-top:12px}
table{border-collapse:collapse;margin:8px 0}
td,th{border:1px solid #ccc;padding:3px 7px;text-align:left;vertical-align:top}
th{background:#f2f2f2}.fail{color:#b00020;font-weight:600}.ok{color:#1b7f2a}.note{color:#555}
.first{background:#fff1f1}code{font-size:13px}
"""


def _chart(report: ModelReport) -> str:
    """bound_ratio across depth, log scale, a point per checked layer call
    colored by the configuration explaining it; the first divergence in red."""
    pts = [(i, layer) for i, layer in enumerate(report.layers) if layer.bound_ratio is not None]
    w, h, left, bottom, top = 900, 280, 60, 40, 20
    n = max(len(report.layers), 1)
    if not pts:
        return '<p class="note">No layer call has a bound_ratio to chart.</p>'
    vals = [max(layer.bound_ratio or 0.0, 1e-3) for _, layer in pts]
    lo = math.floor(math.log10(min(vals + [report.bound_threshold / 10])))
    hi = math.ceil(math.log10(max(vals + [report.bound_threshold * 2])))
    hi = max(hi, lo + 1)

    def x(i: int) -> float:
        return left + (w - left - 20) * (i + 0.5) / n

    def y(v: float) -> float:
        v = max(v, 10.0**lo)
        return top + (h - top - bottom) * (hi - math.log10(v)) / (hi - lo)

    colors: dict[str, str] = {}
    out = [f'<svg width="{w}" height="{h}" role="img" aria-label="bound_ratio across depth">']
    for e in range(lo, hi + 1):
        out.append(
            f'<line x1="{left}" x2="{w - 20}" y1="{y(10.0**e):.1f}" y2="{y(10.0**e):.1f}" '
            'stroke="#ddd"/>'
            f'<text x="{left - 6}" y="{y(10.0**e) + 4:.1f}" font-size="11" '
            f'text-anchor="end">1e{e}</text>'
        )
    t = y(report.bound_threshold)
    out.append(
        f'<line x1="{left}" x2="{w - 20}" y1="{t:.1f}" y2="{t:.1f}" stroke="#b00020" '
        f'stroke-dasharray="4 3"/><text x="{w - 22}" y="{t - 4:.1f}" font-size="11" '
        f'text-anchor="end" fill="#b00020">threshold {report.bound_threshold:g}</text>'
    )
    first = report.first_divergence()
    if first is not None:
        fx = x(report.layers.index(first))
        out.append(
            f'<line x1="{fx:.1f}" x2="{fx:.1f}" y1="{top}" y2="{h - bottom}" stroke="#b00020"/>'
            f'<text x="{fx + 4:.1f}" y="{top + 10}" font-size="11" fill="#b00020">'
            f"first divergence: {html.escape(first.label)}</text>"
        )
    for i, layer in pts:
        label = layer.best or "unexplained"
        color = (
            "#b00020"
            if not layer.best
            else colors.setdefault(label, _PALETTE[len(colors) % len(_PALETTE)])
        )
        out.append(
            f'<circle cx="{x(i):.1f}" cy="{y(layer.bound_ratio or 0.0):.1f}" r="4" fill="{color}">'
            f"<title>{html.escape(layer.label)}: {html.escape(label)}, bound_ratio "
            f"{_num(layer.bound_ratio)}</title></circle>"
        )
    out.append(
        f'<text x="{(w + left) / 2:.0f}" y="{h - 8}" font-size="12" text-anchor="middle">'
        "layer call (execution order)</text>"
        f'<text x="14" y="{(h - bottom + top) / 2:.0f}" font-size="12" text-anchor="middle" '
        f'transform="rotate(-90 14 {(h - bottom + top) / 2:.0f})">bound_ratio</text></svg>'
    )
    legend = " ".join(
        f'<span style="color:{c}">&#9679;</span> <code>{html.escape(k)}</code>'
        for k, c in colors.items()
    )
    return "".join(out) + f"<p>{legend}</p>"


def _histogram(layer: LayerCheck) -> str:
    stats = layer.report.observed_vs_reference if layer.report is not None else None
    if stats is None or not stats.ulp_histogram:
        return ""
    buckets = stats.ulp_histogram
    most = max(b.count for b in buckets) or 1
    bw, h = 36, 110
    out = [f'<svg width="{bw * len(buckets) + 10}" height="{h + 34}">']
    for i, b in enumerate(buckets):
        bh = (h - 10) * b.count / most
        name = _ulp(b.lo) if b.lo == b.hi else f"{_ulp(b.lo)}-{_ulp(b.hi)}"
        out.append(
            f'<rect x="{5 + i * bw}" y="{h - bh:.1f}" width="{bw - 6}" height="{bh:.1f}" '
            f'fill="#1f77b4"><title>{b.count} element(s) {name} ULP</title></rect>'
            f'<text x="{5 + i * bw + (bw - 6) / 2}" y="{h + 14}" font-size="10" '
            f'text-anchor="middle">{name}</text>'
        )
    out.append(
        f'<text x="5" y="{h + 30}" font-size="11">ULP distance to the fp64 reference '
        "(element counts)</text></svg>"
    )
    return "".join(out)


def _png_gray(cells: np.ndarray) -> bytes:
    """An 8-bit grayscale PNG (zlib from the standard library)."""
    rows, cols = cells.shape
    raw = b"".join(b"\x00" + cells[r].tobytes() for r in range(rows))

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    ihdr = struct.pack(">IIBBBBB", cols, rows, 8, 0, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", ihdr)
        + chunk(b"IDAT", zlib.compress(raw, 6))
        + chunk(b"IEND", b"")
    )


def _heatmap(layer: LayerCheck, observed: Optional[np.ndarray], max_cells: int = 256) -> str:
    """|observed - best candidate| over the output as a matrix, max-pooled,
    when the best candidate's output came back (return_outputs=True)."""
    if observed is None or layer.report is None or not layer.best:
        return ""
    best = next((r for r in layer.report.results if r.config == layer.best), None)
    if best is None or best.output is None:
        return (
            '<p class="note">No heatmap: run the check with return_outputs=True to '
            "draw |observed &minus; best| per element.</p>"
        )
    n = observed.shape[-1]
    a = observed.astype(np.float64).reshape(-1, n)
    e = best.output.astype(np.float64).reshape(-1, n)
    diff = np.abs(a - e)
    diff[np.isnan(diff)] = np.inf
    rows, cols = diff.shape
    gr, gc = min(rows, max_cells), min(cols, max_cells)
    ri = np.linspace(0, rows, gr + 1).astype(int)
    ci = np.linspace(0, cols, gc + 1).astype(int)
    pooled = np.maximum.reduceat(np.maximum.reduceat(diff, ri[:-1], axis=0), ci[:-1], axis=1)
    finite = pooled[np.isfinite(pooled)]
    top = float(finite.max()) if finite.size else 0.0
    scaled = np.where(np.isfinite(pooled), pooled / top if top > 0 else 0.0, 1.0)
    cells = (255 - np.clip(scaled, 0, 1) * 255).astype(np.uint8)
    png = base64.b64encode(_png_gray(cells)).decode()
    scale = max(1, 512 // max(gr, gc))
    return (
        f"<p>|observed &minus; {html.escape(layer.best)}| ({rows}&times;{cols}, black = "
        f"{_num(top)}, white = equal):</p>"
        f'<img alt="heatmap of {html.escape(layer.label)}" width="{gc * scale}" '
        f'height="{gr * scale}" style="image-rendering:pixelated;border:1px solid #ccc" '
        f'src="data:image/png;base64,{png}">'
    )


def _ranking(d: Diagnosis) -> str:
    rows = []
    for rank, group in enumerate(d.ranking_groups(), 1):
        r = group[0]
        names = " = ".join(f"<code>{html.escape(g.config)}</code>" for g in group)
        rows.append(
            f"<tr><td>{rank}</td><td>{names}</td><td>{'yes' if r.plausible else 'no'}</td>"
            f"<td>{format_share(r.bitwise_equal_fraction)}</td><td>{_ulp(r.max_ulp)}</td>"
            f"<td>{_num(r.mean_ulp)}</td><td>{_num(r.bound_ratio)}</td>"
            f"<td>{html.escape(r.ruled_out)}</td></tr>"
        )
    return (
        "<table><tr><th>rank</th><th>configuration(s)</th><th>plausible</th>"
        "<th>bitwise equal</th><th>max_ulp</th><th>mean_ulp</th><th>bound_ratio</th>"
        "<th>ruled out because</th></tr>" + "".join(rows) + "</table>"
    )


def _layer_section(
    i: int, layer: LayerCheck, first: Optional[LayerCheck], observed: Optional[np.ndarray]
) -> str:
    cls = (
        "fail"
        if layer.status in ("failed", "error")
        else "ok"
        if layer.status == "passed"
        else "note"
    )
    out = [
        f'<h2 id="layer-{i}"{" class=first" if layer is first else ""}>{i}. '
        f"<code>{html.escape(layer.label)}</code> "
        f'<span class="{cls}">{html.escape(layer.status)}</span></h2>',
        f"<p>{_shape(layer.input_shape)} &middot; {_shape(layer.weight_shape)} "
        f"({layer.weight_layout}), {layer.dtype}. "
        f"Best: <code>{html.escape(_best(layer, full=True))}</code>. "
        f"max_abs {_num(layer.max_abs)}, max_ulp {_ulp(layer.max_ulp)}, "
        f"bound_ratio {_num(layer.bound_ratio)}, differences at {html.escape(_where(layer))}.</p>",
    ]
    if layer.divergence_reason:
        out.append(
            f'<p class="fail">{"First divergence: " if layer is first else ""}'
            f"{html.escape(_sentence(layer.divergence_reason))}</p>"
        )
    if layer.error:
        out.append(f'<p class="fail">{html.escape(layer.error)}</p>')
    d = layer.report.diagnosis if layer.report is not None else None
    if d is not None:
        explanation = _explanation_after(layer.divergence_reason, d.explanation)
        if explanation:
            out.append(f"<p>{html.escape(explanation)}</p>")
        if d.ranking:
            out.append(_ranking(d))
    out.append(_histogram(layer))
    out.append(_heatmap(layer, observed))
    return "\n".join(x for x in out if x)


def write_html(report: ModelReport, path: Union[str, os.PathLike[str]]) -> None:
    from ._model import describe_configs

    title = " ".join(x for x in ("tensorcheck", report.framework, report.model) if x)
    first = report.first_divergence()
    observed: dict[int, np.ndarray] = {}
    if len(report.captures) == len(report.layers):
        observed = {i: c.output for i, c in enumerate(report.captures)}
    overview = []
    for i, layer in enumerate(report.layers):
        overview.append(
            f"<tr{' class=first' if layer is first else ''}><td>{i}</td>"
            f'<td><a href="#layer-{i}"><code>{html.escape(layer.label)}</code></a></td>'
            f"<td>{html.escape(_best(layer))}</td><td>{html.escape(_status(layer))}</td>"
            f"<td>{_num(layer.max_abs)}</td><td>{_ulp(layer.max_ulp)}</td><td>{_num(layer.bound_ratio)}</td></tr>"
        )
    verdict = (
        f'<p class="fail">First divergence: <a href="#layer-{report.layers.index(first)}">'
        f"<code>{html.escape(first.label)}</code></a>: "
        f"{html.escape(_sentence(first.divergence_reason or ''))}</p>"
        if first is not None
        else '<p class="ok">No divergence.</p>'
    )
    stopped = (
        f'<p class="fail">Stopped early: {html.escape(report.error)}</p>' if report.error else ""
    )
    page = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{html.escape(title)}</title><style>{_STYLE}</style></head><body>",
        f"<h1>{html.escape(title)}</h1>",
        f"<p>{len(report.checked)} of {len(report.layers)} layer calls checked. "
        f"Configurations: {html.escape(describe_configs(report))}.</p>",
        verdict,
        stopped,
        _chart(report),
        "<table><tr><th>#</th><th>layer</th><th>best (confidence)</th><th>status</th>"
        "<th>max_abs</th><th>max_ulp</th><th>bound_ratio</th></tr>"
        + "".join(overview)
        + "</table>",
    ]
    for i, layer in enumerate(report.layers):
        page.append(_layer_section(i, layer, first, observed.get(i)))
    page.append("</body></html>")
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(x for x in page if x))
