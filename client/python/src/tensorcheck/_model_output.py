"""How a ModelReport reads: the text table, the pytest message, JUnit XML
and the HTML page (docs/model-checks.md shows each)."""

from __future__ import annotations

import base64
import html
import math
import os
import struct
import zlib
from typing import TYPE_CHECKING, Optional, Protocol, Union
from xml.etree import ElementTree

import numpy as np

from ._format import cap_lines, format_share, ulp_cell
from ._model_types import Capture, LayerCheck

if TYPE_CHECKING:
    from ._report_nodes import Diagnosis

__all__ = [
    "describe_configs",
    "format_summary",
    "format_comparison",
    "failure_message",
    "write_junit",
    "write_html",
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
    def applied_bound_threshold(self) -> float: ...

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
    def captures(self) -> list[Capture]: ...

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


def write_junit(report: _ModelReport, path: Union[str, os.PathLike[str]]) -> None:
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
            f"max_abs {_num(layer.max_abs)}, max_ulp {ulp_cell(layer)}, "
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

# The chart of bound_ratio across depth is the picture `tensorcheck sweep
# --html` draws (client/cli/html_charts.cc, BoundRatioSvg): the same axis,
# places, colours and legend, so that a model reads alike from either client.
_PALETTE = ["#4f7cc9", "#2da44e", "#bf8700", "#8250df", "#1b7c83", "#d4a72c", "#e16f24", "#57606a"]
ZERO_CAPTION = "0 (bit-exact) shown at the floor"
INF_CAPTION = "inf shown at the top"
_FONT_PX = 11.0
_STYLE = """
body{font:14px/1.45 system-ui,sans-serif;color:#222;box-sizing:border-box;width:100%;
max-width:1800px;margin:0 auto;padding:16px 24px}
p{max-width:120ch}
h1{font-size:22px}h2{font-size:17px;margin-top:32px;border-top:1px solid #ccc;padding-top:12px}
table{border-collapse:collapse;margin:8px 0}
td,th{border:1px solid #ccc;padding:3px 7px;text-align:left;vertical-align:top}
th{background:#f2f2f2;white-space:nowrap}.fail{color:#b00020;font-weight:600}.ok{color:#1b7f2a}
.note{color:#555}.num{white-space:nowrap}
.first{background:#fff1f1}code{font-size:13px}
svg{max-width:100%;height:auto}
svg text{font-family:system-ui,sans-serif;font-size:11px;fill:#1f2328}
"""


def _g6(v: float) -> str:
    """A coordinate as the CLI writes one (absl::StrCat: six significant digits)."""
    return f"{v:.6g}"


def _text_width(text: str) -> float:
    """An upper bound on the width of `text` in the charts' 11 px font:
    0.64 em a character, as the CLI's SvgTextWidth."""
    return 0.64 * _FONT_PX * len(text)


def _chart_config(layer: LayerCheck) -> str:
    if layer.report is not None and layer.report.diagnosis is None:
        return "(verify only)"
    return layer.best or "none explains it"


def _chart(report: _ModelReport) -> str:
    """bound_ratio across depth, log scale, a point per layer call colored
    by the configuration explaining it; the threshold dashed, the first
    divergence ringed. A ratio of 0 (the output bitwise the reference's)
    has no logarithm: the axis gains a decade at the bottom, labelled 0,
    and zeros sit on that floor, hollow, the legend saying so; an infinite
    ratio sits on the top line."""
    pts = [
        (i, layer.bound_ratio, _chart_config(layer), layer.label)
        for i, layer in enumerate(report.layers)
        if layer.bound_ratio is not None and not math.isnan(layer.bound_ratio)
    ]
    if not pts:
        return '<p class="note">No layer call has a bound_ratio to chart.</p>'
    configs: list[str] = []
    for _, _, config, _ in pts:
        if config not in configs:
            configs.append(config)
    threshold = report.applied_bound_threshold
    finite = [r for _, r, _, _ in pts if 0 < r < math.inf]
    zeros = any(r <= 0 for _, r, _, _ in pts)
    infs = any(r == math.inf for _, r, _, _ in pts)
    ylo = math.floor(math.log10(min([threshold, *finite])))
    yhi = math.ceil(math.log10(max([threshold, *finite])))
    if yhi <= ylo:
        yhi = ylo + 1
    if zeros:
        ylo -= 1  # the floor holds the zeros
    width, height, left, right, top, bottom = 900, 320, 64, 20, 16, 40
    plot_w, plot_h = width - left - right, height - top - bottom
    n = len(report.layers)

    def x_of(i: int) -> float:
        return left + (plot_w / 2 if n <= 1 else plot_w * i / (n - 1))

    def y_of(r: float) -> float:
        if not r > 0:
            return top + plot_h
        if r == math.inf:
            return top
        return top + plot_h * (1 - (math.log10(r) - ylo) / (yhi - ylo))

    def colour(config: str) -> str:
        return _PALETTE[min(configs.index(config), 7)]

    legend = [(c, colour(c)) for c in configs]
    if zeros:
        legend.append((ZERO_CAPTION, ""))
    if infs:
        legend.append((INF_CAPTION, ""))
    full_height = height + 22 * len(legend)
    out = [
        f'<svg class="depth" width="{width}" height="{full_height}" '
        f'viewBox="0 0 {width} {full_height}" role="img" aria-label="bound_ratio across depth">',
        f'<rect x="{left}" y="{top}" width="{plot_w}" height="{plot_h}" fill="none" '
        'stroke="#d0d7de"/>',
    ]
    # Every decade a grid line; at most 10 of them labelled (the floor of
    # zeros always), so that labels never overlap.
    decades = yhi - ylo
    step = (decades + 9) // 10
    for k in range(decades + 1):
        grid_y = top + plot_h * (1 - k / decades)
        line = (
            f'<line x1="{left}" x2="{left + plot_w}" y1="{_g6(grid_y)}" y2="{_g6(grid_y)}" '
            'stroke="#eaeef2"/>'
        )
        if k % step == 0 or (zeros and k == 0):
            label = "0" if zeros and k == 0 else _num(10.0 ** (ylo + k))
            line += (
                f'<text class="tick" x="{left - 6}" y="{_g6(grid_y + 4)}" text-anchor="end">'
                f"{label}</text>"
            )
        out.append(line)
    t = y_of(threshold)
    out.append(
        f'<line x1="{left}" x2="{left + plot_w}" y1="{_g6(t)}" y2="{_g6(t)}" stroke="#cf222e" '
        f'stroke-dasharray="4 3"/><text x="{left + plot_w - 4}" y="{_g6(t - 4)}" '
        f'text-anchor="end" fill="#cf222e">threshold {_num(threshold)}</text>'
    )
    mid = top + plot_h // 2
    out.append(
        f'<text x="{_g6(left + plot_w / 2)}" y="{height - 8}" text-anchor="middle">'
        f"layer call (execution order, 1 to {n})</text>"
        f'<text x="14" y="{mid}" text-anchor="middle" transform="rotate(-90 14 {mid})">'
        "bound_ratio (log)</text>"
    )
    first = report.first_divergence()
    first_index = report.layers.index(first) if first is not None else None
    for i, ratio, config, name in pts:
        x, y = x_of(i), y_of(ratio)
        fill = colour(config) if 0 < ratio < math.inf else "#fff"  # hollow: 0 or inf
        out.append(
            f'<circle cx="{_g6(x)}" cy="{_g6(y)}" r="4" fill="{fill}"'
            f' stroke="{colour(config)}" stroke-width="1.5"><title>{html.escape(name)}: '
            f"{html.escape(config)}, bound_ratio {_num(ratio)}</title></circle>"
        )
        if i == first_index:
            # The label on the side of the ring with room for it, inside the picture.
            label = f"first divergence: {name}"
            flip = x + 12 + _text_width(label) > width - 4
            anchor = ' text-anchor="end"' if flip else ""
            ly = y + 20 if y - 8 < 14 else y - 8
            out.append(
                f'<circle cx="{_g6(x)}" cy="{_g6(y)}" r="9" fill="none" stroke="#cf222e" '
                f'stroke-width="2"/><text x="{_g6(x - 12 if flip else x + 12)}" y="{_g6(ly)}"'
                f'{anchor} fill="#cf222e">{html.escape(label)}</text>'
            )
    for k, (text, swatch) in enumerate(legend):
        y = height + 22 * k + 6
        out.append(
            f'<circle cx="{left + 6}" cy="{y}" r="5" fill="{swatch or "#fff"}" '
            f'stroke="{swatch or "#57606a"}" stroke-width="1.5"/><text x="{left + 18}" '
            f'y="{y + 4}">{html.escape(text)}</text>'
        )
    out.append("</svg>")
    return "\n".join(out)


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
            f'<td class="num">{format_share(r.bitwise_equal_fraction)}</td>'
            f'<td class="num">{_ulp(r.max_ulp)}</td>'
            f'<td class="num">{_num(r.mean_ulp)}</td><td class="num">{_num(r.bound_ratio)}</td>'
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
        f'<span class="{cls}">{html.escape(_status(layer))}</span></h2>',
        f"<p>{_shape(layer.input_shape)} &middot; {_shape(layer.weight_shape)} "
        f"({layer.weight_layout}), {layer.dtype}. "
        f"Best: <code>{html.escape(_best(layer, full=True))}</code>. "
        f'max_abs <span class="num">{_num(layer.max_abs)}</span>, '
        f'max_ulp <span class="num">{ulp_cell(layer)}</span>, '
        f'bound_ratio <span class="num">{_num(layer.bound_ratio)}</span>, '
        f"differences at {html.escape(_where(layer))}.</p>",
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


def write_html(report: _ModelReport, path: Union[str, os.PathLike[str]]) -> None:
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
            f'<td class="num">{_num(layer.max_abs)}</td><td class="num">{ulp_cell(layer)}</td>'
            f'<td class="num">{_num(layer.bound_ratio)}</td></tr>'
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
