"""End-to-end tests of `--html FILE`: the page the CLI writes is
self-contained, its heatmap PNGs decode with Python's own zlib, and it
renders in headless Chromium.

Run: python3 -m pytest tests/e2e/test_html.py -q   (needs numpy and pytest;
the rendering test needs Debian's `chromium` package and skips without it)

Binaries: TENSORCHECK_SERVER_BIN (default <repo>/build/server/tensorcheck-server)
and TENSORCHECK_CLI_BIN (default <repo>/build/client/cli/tensorcheck).
"""

from __future__ import annotations

import base64
import json
import re
import shutil
import struct
import subprocess
import zlib
from pathlib import Path

import numpy as np
import pytest

from e2e_support import run_cli

PNG_URI = re.compile(r'data:image/png;base64,([A-Za-z0-9+/=]+)"')


def chromium_binary() -> str:
    for name in ("chromium", "chromium-browser"):
        path = shutil.which(name)
        if path:
            return path
    pytest.skip("no chromium or chromium-browser on PATH "
                "(install Debian's package: apt-get install -y chromium)")


def decode_png(data: bytes) -> tuple[int, int, bytes]:
    """Checks signature, chunk CRCs and the zlib stream; returns (w, h, pixels)."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, width, height, idat, palette = 8, 0, 0, b"", b""
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos:pos + 4])
        kind = data[pos + 4:pos + 8]
        body = data[pos + 8:pos + 8 + length]
        (crc,) = struct.unpack(">I", data[pos + 8 + length:pos + 12 + length])
        assert crc == zlib.crc32(kind + body), kind
        if kind == b"IHDR":
            width, height, depth, colour = struct.unpack(">IIBB", body[:10])
            assert (depth, colour) == (8, 3)
        elif kind == b"PLTE":
            palette = body
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    assert palette and len(palette) % 3 == 0
    raw = zlib.decompress(idat)
    assert len(raw) == height * (width + 1)
    rows = [raw[r * (width + 1):(r + 1) * (width + 1)] for r in range(height)]
    assert all(row[0] == 0 for row in rows)  # filter "none"
    return width, height, b"".join(row[1:] for row in rows)


def assert_self_contained(page: str) -> None:
    for bad in ("http://", "https://", 'src="//', "<script", "<link", "@import"):
        assert bad not in page, bad


@pytest.fixture()
def problem(tmp_path: Path) -> dict[str, object]:
    """An fp32 layer 16x64 -> 24, its output summed sequentially in fp32 by
    numpy, with element (5, 7) corrupted."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal((16, 64)).astype(np.float32)
    w = (rng.standard_normal((24, 64)) / 8).astype(np.float32)
    y = np.zeros((16, 24), np.float32)
    for k in range(64):
        y += x[:, k:k + 1] * w[:, k][None, :]
    y[5, 7] += np.float32(4.0)
    for name, arr in (("x", x), ("w", w), ("y", y)):
        np.save(tmp_path / f"{name}.npy", arr)
    return {"dir": tmp_path,
            "args": ["--input", str(tmp_path / "x.npy"), "--weight", str(tmp_path / "w.npy")],
            "observed": str(tmp_path / "y.npy")}


def diagnose_html(server: str, problem: dict[str, object]) -> tuple[Path, dict, str]:
    out = Path(problem["dir"]) / "report.html"  # type: ignore[arg-type]
    r = run_cli("--server", server, "diagnose", *problem["args"],  # type: ignore[arg-type]
                "--observed", str(problem["observed"]),
                "--candidates", "cpu:fp32,cpu:bf16,cpu:fp16", "--json", "--html", str(out))
    if r.returncode == 2 and "UNIMPLEMENTED" in r.stderr:
        pytest.skip("the server does not implement Diagnose yet")
    assert r.returncode in (0, 1), r.stderr
    assert out.is_file(), r.stderr
    return out, json.loads(r.stdout), out.read_text(encoding="utf-8")


def test_diagnose_html_is_self_contained_with_decodable_heatmaps(server, problem):
    _, report, page = diagnose_html(server, problem)
    assert_self_contained(page)
    d = report["diagnosis"]
    for c in d["ranking"]:
        assert f"<code>{c['config']}</code>" in page
    if d["best"] is None:
        assert "no candidate explains the output" in page
    pngs = [base64.b64decode(m) for m in PNG_URI.findall(page)]
    # |observed - best (or closest) candidate| and |observed - reference|.
    assert len(pngs) == 2
    for png in pngs:
        width, height, pixels = decode_png(png)
        assert (width, height) == (24, 16)  # small outputs are not resampled
    # The corrupted element is the largest difference from the candidate:
    # the top of the colour ramp, and the only pixel there.
    _, _, pixels = decode_png(pngs[0])
    top = max(p for p in pixels if p != 254)  # 254: non-finite
    assert pixels[5 * 24 + 7] == top
    assert pixels.count(top) == 1


# Measures a page as Chromium lays it out, from a copy with this script
# appended (the page itself holds none): every SVG <text>'s box against
# its <svg>'s, every number cell's and span's lines, the body's width and
# the background of each row of the layer table. The result goes into the
# DOM as JSON, which --dump-dom prints.
MEASURE_JS = r"""
<script>
(function () {
  const out = {clipped: [], wrapped: [], numbers: 0, texts: 0, svgs: 0,
               body: document.body.getBoundingClientRect().width,
               window: window.innerWidth, rows: [], first: null,
               overflow: document.documentElement.scrollWidth - window.innerWidth};
  for (const svg of document.querySelectorAll('svg')) {
    out.svgs++;
    const box = svg.getBoundingClientRect();
    for (const t of svg.querySelectorAll('text')) {
      out.texts++;
      const r = t.getBoundingClientRect();
      if (r.left < box.left - 0.5 || r.right > box.right + 0.5 ||
          r.top < box.top - 0.5 || r.bottom > box.bottom + 0.5) {
        out.clipped.push([t.textContent, r.left - box.left, box.right - r.right,
                          r.top - box.top, box.bottom - r.bottom]);
      }
    }
  }
  for (const el of document.querySelectorAll('td.num, span.num')) {
    out.numbers++;
    const range = document.createRange();
    range.selectNodeContents(el);
    const tops = new Set();
    for (const r of range.getClientRects()) if (r.width > 0) tops.add(Math.round(r.top));
    if (tops.size > 1 || getComputedStyle(el).whiteSpace !== 'nowrap') {
      out.wrapped.push(el.textContent);
    }
  }
  for (const tr of document.querySelectorAll('table.layers tr')) {
    const cells = tr.querySelectorAll('td');
    if (cells.length < 4) continue;
    out.rows.push({status: cells[3].textContent, cls: tr.className,
                   background: getComputedStyle(cells[0]).backgroundColor});
  }
  const h1 = document.querySelector('h1');
  const next = h1 && h1.nextElementSibling;
  if (next) out.first = {cls: next.className, text: next.textContent,
                         next: next.nextElementSibling ? next.nextElementSibling.className : ''};
  const pre = document.createElement('pre');
  pre.id = 'tc-measure';
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
})();
</script>
"""


def chromium_measure(page: Path, width: int) -> dict:
    """MEASURE_JS's findings on `page` in a `width` px wide window."""
    chromium = chromium_binary()
    probe = page.with_name(page.stem + f"-measure-{width}.html")
    probe.write_text(page.read_text(encoding="utf-8").replace("</body>", MEASURE_JS + "</body>"),
                     encoding="utf-8")
    r = subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu",
                        f"--user-data-dir={page.parent / 'chromium-profile'}", "--no-first-run",
                        "--disable-extensions", f"--window-size={width},1000",
                        "--virtual-time-budget=5000", "--dump-dom", probe.as_uri()],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr[-2000:]
    m = re.search(r'<pre id="tc-measure">(.*?)</pre>', r.stdout, re.S)
    assert m, r.stdout[-2000:]
    import html as html_module
    return json.loads(html_module.unescape(m.group(1)))


def assert_laid_out(found: dict) -> None:
    """No chart text past its picture's edge, no number over two lines."""
    assert found["svgs"] > 0 and found["texts"] > 0 and found["numbers"] > 0, found
    assert found["clipped"] == [], found["clipped"]
    assert found["wrapped"] == [], found["wrapped"]


def test_the_measure_sees_a_clipped_caption_and_a_broken_number(tmp_path):
    """The layout checks below can fail: an old page's faults are found."""
    page = tmp_path / "faulty.html"
    page.write_text(
        '<!DOCTYPE html><html><body style="width:60px">'
        '<svg width="76" height="40" viewBox="0 0 76 40"><text x="60" y="30" '
        'text-anchor="end">ULP distance (bar height: log scale)</text></svg>'
        '<table><tr><td class="num">7.31945e-05</td></tr></table></body></html>',
        encoding="utf-8")
    found = chromium_measure(page, 400)
    assert [c[0] for c in found["clipped"]] == ["ULP distance (bar height: log scale)"]
    assert found["wrapped"] == ["7.31945e-05"]


def test_diagnose_html_fills_the_window_and_clips_and_wraps_nothing(server, problem):
    out, report, _ = diagnose_html(server, problem)
    wide = chromium_measure(out, 1400)
    assert_laid_out(wide)
    # A fluid page: the body takes the window less its padding (24 px a
    # side) and the scroll bar, not a 1100 px column.
    assert wide["body"] >= wide["window"] - 2 * 24 - 20, wide["body"]
    assert wide["overflow"] <= 0, wide["overflow"]  # and nothing sticks out of it
    # In a narrow window tables overflow rather than break numbers.
    assert_laid_out(chromium_measure(out, 640))
    # The answer first: the server's headline (an older server's verdict).
    d = report["diagnosis"]
    first = wide["first"]
    if d.get("headline"):
        assert first["cls"].startswith("verdict headline"), first
        assert first["text"] == d["headline"]
        assert (first["next"] == "advice") == bool(d.get("advice")), (first, d.get("advice"))
    elif d.get("verdict"):
        assert first["cls"] == f"verdict verdict-{d['verdict']}", first


def test_sweep_html_shades_failed_rows_red(server, tmp_path):
    from test_cli_sweep import make_weights, run_model, unfused, write_safetensors

    weights = make_weights()
    w_path, c_path = tmp_path / "model.safetensors", tmp_path / "captures.safetensors"
    write_safetensors(w_path, weights)
    write_safetensors(c_path, run_model(weights, how={"blocks.0.down": unfused}))
    page = tmp_path / "sweep.html"
    r = run_cli("--server", server, "sweep", "--no-progress", "--weights", str(w_path),
                "--captures", str(c_path), "--json", "--html", str(page))
    assert r.returncode == 1, r.stderr
    j = json.loads(r.stdout)
    statuses = [layer["status"] for layer in j["layers"]]
    assert statuses[1] == "failed" and statuses.count("passed") >= 2, statuses
    found = chromium_measure(page, 1400)
    assert_laid_out(found)
    assert found["overflow"] <= 0, found["overflow"]  # the table's long names wrap
    # The page shows the tables' words for the JSON's statuses.
    words = {"passed": "PASS", "failed": "FAIL", "error": "ERROR", "not_checked": "-"}
    assert [row["status"] for row in found["rows"]] == [words[s] for s in statuses]
    for row in found["rows"]:
        if row["status"] == "FAIL":
            # #ffebe9, the red of the page's failures, never the green
            # (#e6f4ea) of a best match.
            assert row["background"] == "rgb(255, 235, 233)", row
            assert "failed" in row["cls"].split()
        else:
            assert row["background"] == "rgba(0, 0, 0, 0)", row
    first = j["first_divergence"]["index"]
    assert "first" in found["rows"][first]["cls"].split()


def test_diagnose_html_renders_in_headless_chromium(server, problem):
    chromium = chromium_binary()
    out, report, _ = diagnose_html(server, problem)
    work = Path(problem["dir"])  # type: ignore[arg-type]
    common = [chromium, "--headless", "--no-sandbox", "--disable-gpu",
              f"--user-data-dir={work / 'chromium-profile'}", "--no-first-run",
              "--disable-extensions"]
    shot = work / "report.png"
    r = subprocess.run([*common, f"--screenshot={shot}", "--window-size=1200,2000",
                        out.as_uri()], capture_output=True, text=True, timeout=60)
    assert shot.is_file(), r.stderr[-2000:]
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    # A blank 1200x2000 page compresses to a few kB; charts and tables do not.
    assert len(data) > 20_000, len(data)
    dom = subprocess.run([*common, "--dump-dom", out.as_uri()], capture_output=True,
                         text=True, timeout=60)
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert "bitwise-equal" in dom.stdout and "plausible" in dom.stdout
    for c in report["diagnosis"]["ranking"]:
        assert c["config"] in dom.stdout


def test_verify_html_without_observed_maps_each_configuration(server, problem):
    out = Path(problem["dir"]) / "verify.html"  # type: ignore[arg-type]
    r = run_cli("--server", server, "verify", *problem["args"],  # type: ignore[arg-type]
                "--config", "cpu:fp32", "--config", "cpu:bf16", "--html", str(out))
    assert r.returncode in (0, 1), r.stderr
    page = out.read_text(encoding="utf-8")
    assert_self_contained(page)
    assert re.search(r"ULP distance, cpu:fp32:\w+ vs reference cpu:fp64", page)
    assert re.search(r"ULP distance, cpu:bf16:\w+ vs reference cpu:fp64", page)
    assert len(PNG_URI.findall(page)) == 2
