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
