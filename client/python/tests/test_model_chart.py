"""The chart of bound_ratio across depth in ModelReport.to_html: the page
`tensorcheck render` draws from the report's JSON, the very picture
`tensorcheck sweep --html` draws, point for point. The case and its
numbers are the CLI's test's (client/cli/html_report_test.cc,
BoundRatioSvgTest), computed by hand: threshold 3; three layer calls with
bound_ratio 0, 0.5 and 4. The axis spans the decades of 0.5 .. 4 and 3,
1e-1 .. 1e1, and one more below for the zero: 4 decade lines over the
plot's 264 px, from y = 16 (top) to 280 (the floor); x spans 64 .. 880.

Every test here runs the CLI (the `cli` fixture, conftest.py): skipped,
with the reason, when it is not built."""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Callable, Optional

import pytest

from tensorcheck._model import LayerCheck, ModelReport
from tensorcheck._pb import pb
from tensorcheck._report import Report


def _layer(
    name: str,
    best: str,
    bound_ratio: Optional[float],
    diagnose: bool = True,
    *,
    bound_reason: str = "",
) -> LayerCheck:
    """A layer call's answer, with the server's decisions about it
    (`call`) as it makes them at threshold 3: explained by `best`
    (Verify: by its pass), `bound_reason` when the ratio exceeds 3."""
    resp = pb.VerifyResponse(verdict=pb.VERDICT_PASS)
    if diagnose:
        resp.diagnosis.best = best
        resp.diagnosis.confidence = 0.9
        resp.call.explaining.append(best)
    resp.call.explained = True
    resp.call.bound_threshold = 3.0
    resp.call.bound_exceeded = bool(bound_reason)
    resp.call.bound_reason = bound_reason
    stats = resp.observed_vs_reference
    stats.total = 8
    if bound_ratio is not None:
        stats.bound_ratio.value = bound_ratio
    layer = LayerCheck(name, 0, (2, 4), (8, 4), "out_in", "bfloat16")
    layer._fill(Report.from_proto(resp))
    return layer


@pytest.fixture
def chart(cli: Path, tmp_path: Path) -> Callable[[ModelReport], str]:
    """The depth chart (its <svg>) of a report's to_html page."""

    def draw(report: ModelReport) -> str:
        path = tmp_path / "model.html"
        report.to_html(path)
        page = path.read_text()
        start = page.index('<svg class="depth"')
        return page[start : page.index("</svg>", start) + len("</svg>")]

    return draw


def _three_calls() -> ModelReport:
    return ModelReport(
        [
            _layer("blocks.0.up", "cpu:bf16:fused", 0.0),
            _layer("blocks.1.up", "cpu:bf16:fused", 0.5),
            _layer(
                "blocks.2.mlp.down_proj",
                "cpu:bf16:unfused",
                4.0,
                bound_reason="bound_ratio 4 exceeds 3",
            ),
        ],
        bound_threshold=3.0,
    )


def test_zeros_sit_on_the_floor_labelled_zero_and_the_legend_says_so(
    chart: Callable[[ModelReport], str],
) -> None:
    report = _three_calls()
    svg = chart(report)
    # Decade lines at 280, 192, 104, 16 (264 / 3 apart), labelled 0, 0.1,
    # 1, 10 (4 px below the line): no silent floor at 1e-3 or 1e-2.
    for y, label in (("284", "0"), ("196", "0.1"), ("108", "1"), ("20", "10")):
        assert f'y="{y}" text-anchor="end">{label}</text>' in svg, label
    assert ">0.001</text>" not in svg and ">1e-03</text>" not in svg
    assert ">0.01</text>" not in svg
    # The zero: on the floor, hollow, its tooltip the true value.
    assert (
        '<circle cx="64" cy="280" r="4" fill="#fff" stroke="#4f7cc9" stroke-width="1.5">'
        "<title>blocks.0.up: cpu:bf16:fused, bound_ratio 0</title></circle>"
    ) in svg
    # 0.5: 16 + 264 * (1 - (log10 0.5 + 2) / 3) = 130.4906; 4: 51.0187;
    # the threshold 3: 62.0133.
    assert '<circle cx="472" cy="130.491" r="4" fill="#4f7cc9"' in svg
    assert '<circle cx="880" cy="51.0187" r="4" fill="#2da44e"' in svg
    assert 'y1="62.0133" y2="62.0133" stroke="#cf222e"' in svg
    # The legend: the configurations, then what the floor means.
    assert ">cpu:bf16:fused</text>" in svg and ">cpu:bf16:unfused</text>" in svg
    assert (
        '<circle cx="70" cy="370" r="5" fill="#fff" stroke="#57606a" stroke-width="1.5"/>'
        '<text x="82" y="374">0 (bit-exact) shown at the floor</text>'
    ) in svg
    assert 'viewBox="0 0 900 386"' in svg  # 320 + 3 legend rows of 22


def test_the_first_divergence_at_the_right_edge_is_labelled_inside(
    chart: Callable[[ModelReport], str],
) -> None:
    # The last call diverges (it alone is unfused, against a consensus of
    # fused): its label, 40 characters (282 px at most), turns left of
    # the ring at x = 880.
    report = ModelReport(
        [
            _layer("blocks.0.up", "cpu:bf16:fused", 0.5),
            _layer("blocks.1.up", "cpu:bf16:fused", 0.5),
            _layer(
                "blocks.2.mlp.down_proj",
                "cpu:bf16:unfused",
                4.0,
                bound_reason="bound_ratio 4 exceeds 3",
            ),
        ],
        bound_threshold=3.0,
    )
    first = report.first_divergence()
    assert first is not None and first.name == "blocks.2.mlp.down_proj"
    svg = chart(report)
    # Without a zero the axis is 1e-1 .. 1e1: 4 sits at 16 + 264 * (1 - 1.60206 / 2) = 68.5281.
    assert (
        '<text x="868" y="60.5281" text-anchor="end" fill="#cf222e">'
        "first divergence: blocks.2.mlp.down_proj</text>"
    ) in svg
    assert "at the floor" not in svg


def test_infinity_sits_on_the_top_line_and_nan_is_left_out(
    chart: Callable[[ModelReport], str],
) -> None:
    report = ModelReport(
        [
            _layer("l0", "a", math.inf, bound_reason="bound_ratio inf exceeds 3"),
            _layer("l1", "a", 2.0),
            _layer("l2", "a", math.nan, bound_reason="bound_ratio nan exceeds 3"),
        ],
        bound_threshold=3.0,
    )
    svg = chart(report)
    # Decades of 2 .. 3: 1 .. 10, no floor of zeros.
    assert '<circle cx="64" cy="16" r="4" fill="#fff"' in svg
    assert ">inf shown at the top</text>" in svg
    assert "at the floor" not in svg
    assert 'y="284" text-anchor="end">1</text>' in svg
    assert "l2" not in svg and "nan" not in svg


def test_verify_only_layers_are_labelled_so(chart: Callable[[ModelReport], str]) -> None:
    # A Verify run: the report says so (diagnose=False), as check_captures
    # records it; render reads a Diagnose run's response without a
    # diagnosis as a server error.
    report = ModelReport(
        [_layer("l0", "", 0.5, diagnose=False)], bound_threshold=3.0, diagnose=False
    )
    svg = chart(report)
    assert ">(verify only)</text>" in svg
    # One layer call: the point in the middle of the plot.
    assert '<circle cx="472"' in svg


def test_every_text_of_the_page_fits_its_svg(cli: Path, tmp_path: Path) -> None:
    """Each <text> of the chart inside its viewBox, by the bound the CLI's
    layout promises (0.64 em a character at 11 px; ascent 0.95 em, descent
    0.25 em), rotation included."""
    report = _three_calls()
    path = tmp_path / "model.html"
    report.to_html(path)
    page = path.read_text()
    svg = page[page.index('<svg class="depth"') : page.index("</svg>")]
    w, h = (float(v) for v in re.search(r'viewBox="0 0 (\S+) (\S+)"', svg).groups())  # type: ignore[union-attr]
    texts = re.findall(r"<text([^>]*)>([^<]*)</text>", svg)
    assert len(texts) >= 8
    for attrs, body in texts:
        text = re.sub(r"&[^;]+;", "_", body)
        width = 0.64 * 11 * len(text)
        x = float(re.search(r' x="([^"]+)"', attrs).group(1))  # type: ignore[union-attr]
        y = float(re.search(r' y="([^"]+)"', attrs).group(1))  # type: ignore[union-attr]
        anchor = re.search(r'text-anchor="(\w+)"', attrs)
        a = anchor.group(1) if anchor else "start"
        x0 = x - width if a == "end" else x - width / 2 if a == "middle" else x
        corners = [(px, py) for px in (x0, x0 + width) for py in (y - 0.95 * 11, y + 0.25 * 11)]
        rot = re.search(r"rotate\((\S+) (\S+) (\S+)\)", attrs)
        if rot:
            deg, cx, cy = (float(v) for v in rot.groups())
            c, s = math.cos(math.radians(deg)), math.sin(math.radians(deg))
            corners = [
                (cx + (px - cx) * c - (py - cy) * s, cy + (px - cx) * s + (py - cy) * c)
                for px, py in corners
            ]
        for px, py in corners:
            assert 0 <= px <= w and 0 <= py <= h, (body, px, py)
    # Numbers in the page's cells never break across lines ("7.32e-" over "05").
    assert re.search(r"\.num\s*\{[^}]*white-space:\s*nowrap", page)
    # blocks.1.up's and blocks.2's bound_ratio in the table of layer calls.
    assert '<td class="num">0.5</td>' in page
    assert '<td class="num">4</td>' in page
