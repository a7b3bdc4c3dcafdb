"""End-to-end tests of `tensorcheck sweep` (docs/model-checks.md).

A toy model of three linear layers, one of them called twice, in bfloat16:
its captures and weights are written here as safetensors files (no
`safetensors` package needed: an 8-byte header length, a JSON header, the
data), and every captured output is computed here with numpy, independently
of the server:

- fused (one rounding, as `cpu:fp64:fused` and, but for rare elements,
  `cpu:bf16:fused` compute): the products and the bias summed in float64
  (a product of two bfloat16 values is exact there, and the sum's error
  stays far below a bfloat16 ULP), rounded once to bfloat16;
- unfused (`cpu:*:unfused`): x @ W^T rounded to bfloat16, then the bias
  added and rounded again.

Binaries: TENSORCHECK_SERVER_BIN and TENSORCHECK_CLI_BIN, as in e2e_support.
"""

from __future__ import annotations

import hashlib
import json
import struct
import subprocess
import threading
import xml.etree.ElementTree as ET
from collections.abc import Callable
from concurrent import futures
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest
from e2e_support import CLI_BIN, ServerProcess, run_cli

BF16 = ml_dtypes.bfloat16
ST_DTYPES = {
    np.dtype(np.float64): "F64",
    np.dtype(np.float32): "F32",
    np.dtype(np.float16): "F16",
    np.dtype(BF16): "BF16",
}
# Layer calls in execution order: (call name, module, input width, output width, bias).
CALLS = [
    ("blocks.0.up", "blocks.0.up", 64, 96, True),
    ("blocks.0.down", "blocks.0.down", 96, 64, True),
    ("lm_head", "lm_head", 64, 48, True),
    ("lm_head#1", "lm_head", 64, 48, True),
]
JSON_LAYER_KEYS = [
    "name",
    "call",
    "input_shape",
    "weight_shape",
    "weight_layout",
    "dtype",
    "status",
    "verdict",
    "diagnosis_verdict",
    "verdict_reason",
    "best",
    "confidence",
    "equivalent",
    "tied",
    "explained",
    "max_abs",
    "max_ulp",
    "negligible",
    "bound_ratio",
    "columns",
    "rows",
    "explanation",
    "error",
    "report",
    "error_code",
    "response",
]


def write_safetensors(
    path: Path, tensors: dict[str, np.ndarray], metadata: dict[str, str] | None = None
) -> None:
    """The tensors in the order given (their data offsets follow it)."""
    header: dict[str, Any] = {}
    if metadata is not None:
        header["__metadata__"] = metadata
    blobs = []
    offset = 0
    for name, arr in tensors.items():
        data = np.ascontiguousarray(arr).tobytes()
        header[name] = {
            "dtype": ST_DTYPES[arr.dtype],
            "shape": list(arr.shape),
            "data_offsets": [offset, offset + len(data)],
        }
        offset += len(data)
        blobs.append(data)
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + b"".join(blobs))


def round_bf16(y: np.ndarray) -> np.ndarray:
    """float64 to bfloat16 rounded once, to nearest even: 8 significant
    bits. (`astype(bfloat16)` on float64 goes through float32, which rounds
    twice.) Normal numbers only, as in this model."""
    m, e = np.frexp(y)  # y = m * 2**e, 0.5 <= |m| < 1
    return np.ldexp(np.rint(m * 256), e - 8).astype(BF16)  # exact from here


def fused(x: np.ndarray, w: np.ndarray, b: np.ndarray | None) -> np.ndarray:
    y = x.astype(np.float64) @ w.astype(np.float64).T
    if b is not None:
        y = y + b.astype(np.float64)
    return round_bf16(y)


def unfused(x: np.ndarray, w: np.ndarray, b: np.ndarray | None) -> np.ndarray:
    y = round_bf16(x.astype(np.float64) @ w.astype(np.float64).T)
    if b is not None:
        y = round_bf16(y.astype(np.float64) + b.astype(np.float64))
    return y


def make_weights(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    weights: dict[str, np.ndarray] = {}
    for _, module, k, n, bias in CALLS:
        if f"{module}.weight" in weights:
            continue
        weights[f"{module}.weight"] = (rng.standard_normal((n, k)) / np.sqrt(k)).astype(
            BF16
        )
        if bias:
            weights[f"{module}.bias"] = rng.standard_normal(n).astype(BF16)
    return weights


def run_model(
    weights: dict[str, np.ndarray],
    how: dict[str, Callable[..., np.ndarray]] | None = None,
    rows: int = 8,
) -> dict[str, np.ndarray]:
    """Captures of every layer call, in execution order; `how` picks the
    arithmetic of a call (default fused)."""
    how = how or {}
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, rows, 64)).astype(BF16)
    captures: dict[str, np.ndarray] = {}

    def call(name: str, module: str, inp: np.ndarray) -> np.ndarray:
        out = how.get(name, fused)(
            inp, weights[f"{module}.weight"], weights.get(f"{module}.bias")
        )
        captures[f"{name}.input"] = inp
        captures[f"{name}.output"] = out
        return out

    h = call("blocks.0.up", "blocks.0.up", x)
    h = np.maximum(h.astype(np.float64), 0).astype(BF16)  # relu, exact in bf16
    h = call("blocks.0.down", "blocks.0.down", h)
    call("lm_head", "lm_head", h)
    call("lm_head#1", "lm_head", (h.astype(np.float64) * 0.5).astype(BF16))
    return captures


def sweep(server: str, *args: str, **kw):
    return run_cli("--server", server, "sweep", "--no-progress", *args, **kw)


@pytest.fixture()
def model(tmp_path: Path) -> tuple[Path, Path, dict[str, np.ndarray]]:
    weights = make_weights()
    w_path, c_path = tmp_path / "model.safetensors", tmp_path / "captures.safetensors"
    write_safetensors(w_path, weights)
    write_safetensors(c_path, run_model(weights))
    return w_path, c_path, weights


def sweep_json(server: str, w_path: Path, c_path: Path, *args: str, **kw):
    r = sweep(
        server,
        "--weights",
        str(w_path),
        "--captures",
        str(c_path),
        "--json",
        *args,
        **kw,
    )
    assert r.stdout, r.stderr
    return r, json.loads(r.stdout)


def test_correct_model_passes_with_weights_uploaded_once(
    server, model, tmp_path
) -> None:
    w_path, c_path, weights = model
    junit, html = tmp_path / "sweep.xml", tmp_path / "sweep.html"
    r, j = sweep_json(
        server, w_path, c_path, "--junit", str(junit), "--html", str(html)
    )
    assert r.returncode == 0, (r.stderr, json.dumps(j, indent=1)[:3000])
    assert list(j) == [
        "layers",
        "first_divergence",
        "consensus",
        "layers_checked",
        "layers_total",
        "passed",
        "uploaded_bytes",
        "reused_bytes",
        "diagnose",
        "bound_threshold",
    ]
    assert [(layer["name"], layer["call"]) for layer in j["layers"]] == [
        ("blocks.0.up", 0),
        ("blocks.0.down", 0),
        ("lm_head", 0),
        ("lm_head", 1),
    ]
    for layer in j["layers"]:
        assert list(layer) == JSON_LAYER_KEYS
        assert layer["status"] == "passed", layer
        assert layer["explained"] is True
        assert layer["diagnosis_verdict"] == "rounding", layer["verdict_reason"]
        assert layer["dtype"] == "bfloat16"
        assert layer["weight_layout"] == "out_in"
        assert layer["report"]["diagnosis"]["best"] == layer["best"]
        # The whole-model verdict: within the output precision's bound.
        assert layer["report"]["tolerance"]["preset"] == "bound"
        assert (
            layer["bound_ratio"]
            == layer["report"]["observed_vs_reference"]["bound_ratio"]
        )
    assert j["layers"][0]["input_shape"] == [2, 8, 64]
    assert j["layers"][0]["weight_shape"] == [96, 64]
    assert j["first_divergence"] is None
    assert j["passed"] is True
    assert j["layers_checked"] == j["layers_total"] == 4
    assert j["consensus"] is not None and j["consensus"].endswith(":fused")

    # JUnit: one test case per layer call, none failed.
    root = ET.parse(junit).getroot()
    cases = root.findall(".//testcase")
    assert [c.get("name") for c in cases] == [
        "blocks.0.up",
        "blocks.0.down",
        "lm_head",
        "lm_head#1",
    ]
    assert all(c.get("classname") == "tensorcheck.sweep" for c in cases)
    assert root.findall(".//failure") == []

    # HTML: one self-contained page with the chart and every layer call.
    page = html.read_text()
    assert "<svg" in page
    chart = page[page.index('<svg class="depth"') :]
    chart = chart[: chart.index("</svg>")]
    assert chart.count("<circle") >= 4  # a point per layer call, legend besides
    for name in ("blocks.0.up", "blocks.0.down", "lm_head", "lm_head#1"):
        assert name in page
    assert "http://" not in page and "https://" not in page
    assert "<script" not in page and "<link" not in page

    # A second sweep of the same weights uploads nothing.
    r2, j2 = sweep_json(server, w_path, c_path)
    assert r2.returncode == 0
    assert j2["uploaded_bytes"] == 0
    weight_bytes = sum(a.nbytes for a in weights.values())
    assert j2["reused_bytes"] >= weight_bytes


def render(*args: str, **kw):
    return run_cli("render", *args, **kw)


def annotations(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("::")]


def test_render_draws_the_sweeps_own_reports_from_its_json(server, tmp_path) -> None:
    """`tensorcheck render` of a sweep's JSON report writes, byte for
    byte, the JUnit, GitHub summary and HTML page the sweep wrote: one
    renderer (docs/model-checks.md, "tensorcheck render")."""
    weights = make_weights()
    w_path, c_path = tmp_path / "model.safetensors", tmp_path / "captures.safetensors"
    write_safetensors(w_path, weights)
    write_safetensors(c_path, run_model(weights, how={"blocks.0.down": unfused}))
    junit, html, summary = (
        tmp_path / "sweep.xml",
        tmp_path / "sweep.html",
        tmp_path / "sweep.md",
    )
    r, j = sweep_json(
        server,
        w_path,
        c_path,
        "--junit",
        str(junit),
        "--html",
        str(html),
        "--github",
        env={"GITHUB_STEP_SUMMARY": str(summary)},
    )
    assert r.returncode == 1, r.stderr
    assert j["diagnose"] is True and j["bound_threshold"] is None
    # --html keeps the outputs the page draws: the reference's and the best's.
    for layer in j["layers"]:
        response = layer["response"]
        assert response["call"]["explaining"], layer["name"]
        assert response["reference"]["output"]["data"]
        drawn = [c["config"] for c in response["results"] if "output" in c]
        assert drawn == [layer["best"]], layer["name"]
    report = tmp_path / "report.json"
    report.write_text(r.stdout)

    junit2, html2, summary2 = tmp_path / "r.xml", tmp_path / "r.html", tmp_path / "r.md"
    rr = render(
        str(report),
        "--junit",
        str(junit2),
        "--html",
        str(html2),
        "--github",
        "--captures",
        str(c_path),
        env={"GITHUB_STEP_SUMMARY": str(summary2)},
    )
    assert rr.returncode == r.returncode, rr.stderr
    assert junit2.read_bytes() == junit.read_bytes()
    assert summary2.read_bytes() == summary.read_bytes()
    page = html.read_bytes()
    assert page.count(b"data:image/png;base64,") >= 8  # two heatmaps per layer call
    assert html2.read_bytes() == page
    # Without --json the annotations go to stdout; the sweep's went to stderr.
    assert annotations(rr.stdout) == annotations(r.stderr) != []

    # The JSON back, and the table of a sweep that printed one.
    again = render(str(report), "--json")
    assert again.returncode == 1, again.stderr
    assert again.stdout == r.stdout
    table = sweep(server, "--weights", str(w_path), "--captures", str(c_path))
    assert table.returncode == 1, table.stderr
    # REPORT.json may be - for stdin.
    text = subprocess.run(
        [str(CLI_BIN), "render", "-"],
        input=r.stdout,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert text.returncode == 1, text.stderr
    assert text.stdout == table.stdout


def test_render_of_a_bad_report_is_an_input_error_naming_the_field(
    server, model, tmp_path
) -> None:
    w_path, c_path, _ = model
    r, j = sweep_json(server, w_path, c_path)
    assert r.returncode == 0, r.stderr
    j["layers"][2]["response"]["diagnosis"] = "cpu:bf16:fused"
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(j))
    rr = render(str(bad))
    assert rr.returncode == 2
    assert f"tensorcheck: render: {bad}: layers[2].response: " in rr.stderr
    assert "diagnosis" in rr.stderr
    del j["layers"][1]["dtype"]
    bad.write_text(json.dumps(j))
    assert "layers[1].dtype: missing" in render(str(bad)).stderr
    bad.write_text(r.stdout[: len(r.stdout) // 2])
    rr = render(str(bad))
    assert rr.returncode == 2 and "not JSON" in rr.stderr
    # --captures is for --html's heatmaps.
    good = tmp_path / "good.json"
    good.write_text(r.stdout)
    rr = render(str(good), "--captures", str(c_path))
    assert rr.returncode == 2 and "--captures" in rr.stderr
    assert render(str(good)).returncode == 0


def test_text_table_ends_with_the_consensus(server, model) -> None:
    w_path, c_path, _ = model
    r = sweep(server, "--weights", str(w_path), "--captures", str(c_path))
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].split()[:3] == ["layer", "shapes", "dtype"]
    assert "[2,8,64]x[96,64]" in r.stdout
    assert any(line.startswith("lm_head#1 ") for line in lines)
    assert lines[-1].startswith("No divergence: all 4 layer calls explained by ")


def test_unfused_layer_is_the_first_divergence(server, tmp_path) -> None:
    weights = make_weights()
    w_path, c_path = tmp_path / "model.safetensors", tmp_path / "captures.safetensors"
    write_safetensors(w_path, weights)
    write_safetensors(c_path, run_model(weights, how={"blocks.0.down": unfused}))
    junit, summary = tmp_path / "sweep.xml", tmp_path / "summary.md"
    r, j = sweep_json(
        server,
        w_path,
        c_path,
        "--junit",
        str(junit),
        "--github",
        env={"GITHUB_STEP_SUMMARY": str(summary)},
    )
    assert r.returncode == 1, (r.stderr, json.dumps(j["layers"][1], indent=1)[:3000])
    # --github with --json: the annotations on stderr, the table appended.
    assert "::error title=tensorcheck sweep%3A blocks.0.down::" in r.stderr
    assert "## tensorcheck sweep: **FAIL**" in summary.read_text()
    # Numbered from 0, as the first divergence's "#1".
    assert "| 1 | `blocks.0.down` |" in summary.read_text()
    assert j["first_divergence"]["name"] == "blocks.0.down"
    assert j["first_divergence"]["index"] == 1
    assert j["layers"][1]["status"] == "failed"
    assert j["layers"][1]["best"].endswith(":unfused")
    assert "unfused" in j["first_divergence"]["reason"]
    assert j["passed"] is False
    failures = ET.parse(junit).getroot().findall(".//failure")
    assert len(failures) == 1
    assert failures[0].get("message") == j["first_divergence"]["reason"]


def test_order_from_metadata_overrides_offsets(server, tmp_path) -> None:
    weights = make_weights()
    captures = run_model(weights, how={"blocks.0.down": unfused})
    # Written in reverse; the metadata restores the execution order, so the
    # first divergence is blocks.0.down, the second call, not the third
    # written.
    reordered = dict(reversed(list(captures.items())))
    order = json.dumps([name for name, *_ in CALLS])
    w_path, c_path = tmp_path / "model.safetensors", tmp_path / "captures.safetensors"
    write_safetensors(w_path, weights)
    write_safetensors(c_path, reordered, metadata={"tensorcheck.layers": order})
    r, j = sweep_json(server, w_path, c_path)
    assert [layer["name"] for layer in j["layers"]][:2] == [
        "blocks.0.up",
        "blocks.0.down",
    ]
    assert j["first_divergence"]["index"] == 1
    assert j["first_divergence"]["name"] == "blocks.0.down"
    assert r.returncode == 1


def test_weight_off_by_one_ulp_in_the_weights_file_is_the_first_divergence(
    server, tmp_path
) -> None:
    weights = make_weights()
    captures = run_model(weights)  # from the true weights
    perturbed = dict(weights)
    bits = weights["blocks.0.down.weight"].view(np.uint16).copy()
    # One ULP up in eight elements: in the input feature of the largest
    # magnitude, so the change reaches the rounded outputs.
    h = captures["blocks.0.down.input"].astype(np.float64)
    k = int(np.argmax(np.abs(h).max(axis=(0, 1))))
    bits[0:64:8, k] += 1
    perturbed["blocks.0.down.weight"] = bits.view(BF16)
    # Precondition, in numpy: the perturbed weight changes some outputs.
    moved = fused(
        captures["blocks.0.down.input"],
        perturbed["blocks.0.down.weight"],
        weights["blocks.0.down.bias"],
    )
    assert (
        moved.view(np.uint16) != captures["blocks.0.down.output"].view(np.uint16)
    ).sum() >= 8
    w_path, c_path = tmp_path / "model.safetensors", tmp_path / "captures.safetensors"
    write_safetensors(w_path, perturbed)
    write_safetensors(c_path, captures)
    r, j = sweep_json(server, w_path, c_path)
    assert r.returncode == 1, (r.stderr, json.dumps(j["layers"][1], indent=1)[:3000])
    assert j["first_divergence"]["name"] == "blocks.0.down", j["first_divergence"]
    assert j["layers"][0]["status"] == "passed"


def test_weight_doubled_in_the_weights_file_is_a_defect_naming_its_output_column(
    server, tmp_path
) -> None:
    """The weights file holds one element of blocks.0.down twice what the
    captures ran with: the server's verdict on that layer call is defect,
    and its sentence, naming the output column, is the divergence's reason."""
    weights = make_weights()
    captures = run_model(weights)  # from the true weights
    h = captures["blocks.0.down.input"].astype(np.float64).reshape(-1, 96)
    w = weights["blocks.0.down.weight"].astype(np.float64)
    # The input feature of the largest magnitude and the weight row whose
    # element there is largest: doubling it (exact in bfloat16) moves
    # output column n by h[:, k]·W[n, k] in every row.
    k = int(np.argmax(np.abs(h).max(axis=0)))
    n = int(np.argmax(np.abs(w[:, k])))
    checkpoint = dict(weights)
    doubled = w.copy()
    doubled[n, k] *= 2
    checkpoint["blocks.0.down.weight"] = doubled.astype(BF16)
    # Precondition, in numpy: column n moves, and no other.
    b = weights["blocks.0.down.bias"]
    before = fused(h, weights["blocks.0.down.weight"], b)
    moved = fused(h, checkpoint["blocks.0.down.weight"], b) != before
    assert list(np.flatnonzero(moved.any(axis=0))) == [n]
    assert moved[:, n].sum() >= 8
    w_path, c_path = tmp_path / "ckpt.safetensors", tmp_path / "captures.safetensors"
    write_safetensors(w_path, checkpoint)
    write_safetensors(c_path, captures)
    junit = tmp_path / "sweep.xml"
    r, j = sweep_json(server, w_path, c_path, "--junit", str(junit))
    assert r.returncode == 1, (r.stderr, json.dumps(j["layers"][1], indent=1)[:3000])
    layer = j["layers"][1]
    assert j["first_divergence"]["name"] == "blocks.0.down", j["first_divergence"]
    assert layer["status"] == "failed"
    assert layer["diagnosis_verdict"] == "defect", layer["verdict_reason"]
    # The reason is the server's sentence, verbatim, everywhere.
    reason = layer["verdict_reason"]
    assert j["first_divergence"]["reason"] == reason
    assert reason == layer["report"]["diagnosis"]["verdict_reason"]
    assert f"output column {n} \N{LEFT RIGHT ARROW} weight row {n}" in reason
    failures = ET.parse(junit).getroot().findall(".//failure")
    assert [f.get("message") for f in failures] == [reason]
    for other in (j["layers"][0], *j["layers"][2:]):
        assert other["status"] == "passed", other["verdict_reason"]
        assert other["diagnosis_verdict"] == "rounding"


def test_large_activations_go_by_digest_and_are_not_uploaded_again(
    server, tmp_path
) -> None:
    weights = make_weights()
    captures = run_model(weights, rows=6144)  # inputs and outputs of 1.5 to 2.4 MB
    w_path, c_path = tmp_path / "model.safetensors", tmp_path / "captures.safetensors"
    write_safetensors(w_path, weights)
    write_safetensors(c_path, captures)
    # Every distinct tensor sent by digest: the weights and biases, and the
    # captures above 1 MiB (lm_head's input is blocks.0.down's output).
    by_digest = {
        hashlib.sha256(a.tobytes()).hexdigest(): a.nbytes for a in weights.values()
    }
    for a in captures.values():
        if a.nbytes > 1 << 20:
            by_digest[hashlib.sha256(a.tobytes()).hexdigest()] = a.nbytes
    expected = sum(by_digest.values())
    first = sweep_json(server, w_path, c_path, "--jobs", "1")[1]
    assert first["passed"] is True
    assert first["uploaded_bytes"] + first["reused_bytes"] == expected
    second = sweep_json(server, w_path, c_path, "--jobs", "1")[1]
    assert second["uploaded_bytes"] == 0
    assert second["reused_bytes"] == expected
    per_call = sum(layer["report"]["reused_bytes"] for layer in second["layers"])
    assert per_call >= expected


def test_weights_evicted_meanwhile_are_uploaded_again(tmp_path) -> None:
    """A store of 6 MiB cannot hold the run's 11.8 MB of tensors: uploading
    the activations evicts the least recently used tensors first, lm_head's
    weight and bias among them (uploaded at the start, named only by the
    last calls). Their Diagnose answers FAILED_PRECONDITION with the missing
    digests; the CLI uploads them again and retries."""
    weights = make_weights()
    captures = run_model(weights, rows=6144)
    w_path, c_path = tmp_path / "model.safetensors", tmp_path / "captures.safetensors"
    write_safetensors(w_path, weights)
    write_safetensors(c_path, captures)
    distinct = {
        hashlib.sha256(a.tobytes()).hexdigest(): a.nbytes for a in weights.values()
    }
    for a in captures.values():
        if a.nbytes > 1 << 20:
            distinct[hashlib.sha256(a.tobytes()).hexdigest()] = a.nbytes
    assert sum(distinct.values()) > 6 << 20
    own = ServerProcess("--store-bytes", str(6 << 20))
    try:
        r, j = sweep_json(own.address, w_path, c_path, "--jobs", "1")
    finally:
        own.stop()
    assert r.returncode == 0, (r.stderr, j)
    assert [layer["status"] for layer in j["layers"]] == ["passed"] * 4
    # The server turned a request away for evicted weights, and the retry
    # after uploading them passed.
    log = "\n".join(own.stdout + own.stderr)
    assert "tensors not in the server's store: op.weight" in log
    lm_head_params = weights["lm_head.weight"].nbytes + weights["lm_head.bias"].nbytes
    assert j["uploaded_bytes"] >= sum(distinct.values()) + lm_head_params


def test_one_file_with_captures_and_a_flax_kernel(server, tmp_path) -> None:
    """The captures file holds the weights too (save_captures(weights=True)),
    lm_head's as a Flax kernel [K, N]."""
    weights = make_weights()
    tensors = dict(run_model(weights))
    for name, a in weights.items():
        if name == "lm_head.weight":
            tensors["lm_head.kernel"] = np.ascontiguousarray(a.T)
        else:
            tensors[name] = a
    path = tmp_path / "all.safetensors"
    write_safetensors(path, tensors)
    r, j = sweep_json(server, path, path)
    assert r.returncode == 0, (r.stderr, j)
    assert [layer["weight_layout"] for layer in j["layers"]] == ["out_in"] * 2 + [
        "in_out"
    ] * 2
    assert j["layers"][2]["weight_shape"] == [64, 48]


def test_server_without_a_store_gets_everything_inline(model) -> None:
    w_path, c_path, _ = model
    own = ServerProcess("--store-bytes", "0")
    try:
        r, j = sweep_json(own.address, w_path, c_path)
    finally:
        own.stop()
    assert r.returncode == 0, (r.stderr, j)
    assert j["passed"] is True
    assert j["uploaded_bytes"] == 0 and j["reused_bytes"] == 0


def test_missing_weight_is_an_input_error_naming_the_layer(
    server, model, tmp_path
) -> None:
    _, c_path, weights = model
    w_path = tmp_path / "partial.safetensors"
    write_safetensors(
        w_path, {k: v for k, v in weights.items() if not k.startswith("lm_head")}
    )
    r = sweep(server, "--weights", str(w_path), "--captures", str(c_path))
    assert r.returncode == 2, r.stderr
    assert "layer 'lm_head'" in r.stderr
    assert "'lm_head.weight' or 'lm_head.kernel'" in r.stderr
    assert r.stdout == ""


def test_shape_mismatch_is_an_input_error_naming_the_layer(
    server, model, tmp_path
) -> None:
    _, c_path, weights = model
    bad = dict(weights)
    bad["blocks.0.down.weight"] = weights["blocks.0.down.weight"][:, :95].copy()
    w_path = tmp_path / "bad.safetensors"
    write_safetensors(w_path, bad)
    r = sweep(server, "--weights", str(w_path), "--captures", str(c_path))
    assert r.returncode == 2, r.stderr
    assert "layer 'blocks.0.down'" in r.stderr
    assert "[64, 95]" in r.stderr and "[2, 8, 96]" in r.stderr


def test_sharded_weights_and_a_map(server, tmp_path) -> None:
    weights = make_weights()
    captures = run_model(weights)
    # Two shards under a checkpoint's own names; the map links them.
    renamed = {
        k.replace("blocks.0.", "model.layers.0.mlp."): v for k, v in weights.items()
    }
    shard1 = {k: v for k, v in renamed.items() if "lm_head" not in k}
    shard2 = {k: v for k, v in renamed.items() if "lm_head" in k}
    paths = [tmp_path / "s1.safetensors", tmp_path / "s2.safetensors"]
    write_safetensors(paths[0], shard1)
    write_safetensors(paths[1], shard2)
    c_path = tmp_path / "captures.safetensors"
    write_safetensors(c_path, captures)
    m = tmp_path / "map.json"
    m.write_text(
        json.dumps(
            {
                "blocks.0.up": "model.layers.0.mlp.up",
                "blocks.0.down": "model.layers.0.mlp.down",
            }
        )
    )
    r = sweep(
        server,
        "--weights",
        str(paths[0]),
        "--weights",
        str(paths[1]),
        "--captures",
        str(c_path),
        "--map",
        str(m),
        "--json",
    )
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["passed"] is True
    # The same tensor name in two shards is an error naming both.
    write_safetensors(
        paths[1],
        {**shard2, "model.layers.0.mlp.up.bias": shard1["model.layers.0.mlp.up.bias"]},
    )
    r = sweep(
        server,
        "--weights",
        str(paths[0]),
        "--weights",
        str(paths[1]),
        "--captures",
        str(c_path),
        "--map",
        str(m),
    )
    assert r.returncode == 2
    assert "s1.safetensors" in r.stderr and "s2.safetensors" in r.stderr
    # A map that is not JSON.
    m.write_text("{not json")
    r = sweep(
        server, "--weights", str(paths[0]), "--captures", str(c_path), "--map", str(m)
    )
    assert r.returncode == 2 and "--map" in r.stderr


def test_checkpoint_under_a_model_prefix_is_an_input_error_naming_its_tensors(
    server, tmp_path
) -> None:
    """A port whose blocks.0.down weight is 5 times the checkpoint's, its
    captures file holding the weights it ran with, and the checkpoint
    saved with "model." before every name: the layer calls would all take
    their weights from the captures file, and the checkpoint go unused."""
    weights = make_weights()
    x5 = (weights["blocks.0.down.weight"].astype(np.float64) * 5).astype(BF16)
    port = {**weights, "blocks.0.down.weight": x5}
    c_path = tmp_path / "captures.safetensors"
    write_safetensors(c_path, {**run_model(port), **port})
    ckpt = tmp_path / "ckpt.safetensors"
    write_safetensors(ckpt, {f"model.{k}": v for k, v in weights.items()})
    names = sorted(f"model.{k}" for k in weights)
    assert len(names) == 6
    listed = ", ".join(f"'{n}'" for n in names)
    hint = (
        'they all start with "model.": map each layer to its name under that prefix '
        'with --map FILE ({"blocks.0.up": "model.blocks.0.up", ...})'
    )

    for files in ([ckpt, c_path], [ckpt]):
        args = [a for f in files for a in ("--weights", str(f))]
        r = sweep(server, *args, "--captures", str(c_path), "--json")
        assert r.returncode == 2, r.stderr
        assert r.stdout == ""
        assert (
            f"--weights {ckpt}: no captured layer call takes a weight or bias from it; "
            f"its 6 tensors: {listed}; {hint}"
        ) in r.stderr, r.stderr

    # The hint's fix: the checkpoint's weights, and the layer whose weight
    # differs is the first divergence.
    m = tmp_path / "map.json"
    m.write_text(json.dumps({c[1]: f"model.{c[1]}" for c in CALLS}))
    r, j = sweep_json(server, ckpt, c_path, "--map", str(m))
    assert r.returncode == 1, r.stderr
    assert j["first_divergence"]["name"] == "blocks.0.down", j["first_divergence"]
    assert [la["status"] for la in j["layers"]] == [
        "passed",
        "failed",
        "passed",
        "passed",
    ]
    # And the captures file's own weights, given too, are now the unused ones.
    r = sweep(
        server,
        *("--weights", str(ckpt), "--weights", str(c_path)),
        *("--captures", str(c_path), "--map", str(m)),
    )
    assert r.returncode == 2
    assert f"--weights {c_path}: no captured layer call takes" in r.stderr, r.stderr


def test_weights_file_matching_no_layer_is_an_input_error(
    server, model, tmp_path
) -> None:
    w_path, c_path, weights = model
    extra = tmp_path / "extra.safetensors"
    write_safetensors(extra, {"decoder.fc9.weight": weights["lm_head.weight"]})
    r = sweep(
        server,
        *("--weights", str(w_path), "--weights", str(extra)),
        *("--captures", str(c_path)),
    )
    assert r.returncode == 2, r.stderr
    assert r.stdout == ""
    assert (
        f"--weights {extra}: no captured layer call takes a weight or bias from it; "
        "its 1 tensor: 'decoder.fc9.weight' (a layer's weights are"
    ) in r.stderr, r.stderr
    assert "they all start with" not in r.stderr


def test_weights_with_norms_and_embeddings_beside_the_layers_are_accepted(
    server, tmp_path
) -> None:
    weights = make_weights()
    rng = np.random.default_rng(2)
    checkpoint = {
        "embed.weight": rng.standard_normal((100, 64)).astype(BF16),
        **weights,
        "blocks.0.norm.weight": np.ones(96, BF16),
        "blocks.0.norm.bias": np.zeros(96, BF16),
    }
    w_path, c_path = tmp_path / "model.safetensors", tmp_path / "captures.safetensors"
    write_safetensors(w_path, checkpoint)
    write_safetensors(c_path, run_model(weights))
    r, j = sweep_json(server, w_path, c_path)
    assert r.returncode == 0, (r.stderr, j)
    assert j["passed"] is True


def test_non_finite_output_and_empty_captures_are_input_errors(
    server, model, tmp_path
) -> None:
    w_path, _, weights = model
    captures = run_model(weights)
    captures["lm_head.output"] = captures["lm_head.output"].copy()
    captures["lm_head.output"][0, 0, 3] = np.inf
    bad = tmp_path / "inf.safetensors"
    write_safetensors(bad, captures)
    r = sweep(server, "--weights", str(w_path), "--captures", str(bad))
    assert r.returncode == 2
    assert "layer 'lm_head'" in r.stderr and "non-finite" in r.stderr
    r = sweep(server, "--weights", str(w_path), "--captures", str(w_path))
    assert r.returncode == 2
    assert "no layer captures found in" in r.stderr


class KillingProxy:
    """A gRPC proxy in front of a server that kills the server just before
    forwarding Diagnose call number `kill_at` (1-based): with --jobs 1 the
    calls before it were answered, that one and the rest meet a dead server,
    whatever the timing."""

    def __init__(self, grpc: Any, target: ServerProcess, kill_at: int) -> None:
        self.grpc = grpc
        self.target = target
        self.kill_at = kill_at
        self.diagnoses = 0
        self.lock = threading.Lock()
        opts = [
            ("grpc.max_send_message_length", 1 << 30),
            ("grpc.max_receive_message_length", 1 << 30),
        ]
        self.channel = grpc.insecure_channel(target.address, options=opts)
        self.server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=4), options=opts
        )
        self.server.add_generic_rpc_handlers((self,))
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def service(self, details):  # grpc.GenericRpcHandler
        method = details.method
        grpc = self.grpc

        def forward(call):
            try:
                return call()
            except grpc.RpcError as e:  # the server's status, passed on
                raise _Abort(e.code(), e.details()) from None

        def unary(request, context):
            if method.endswith("/Diagnose"):
                with self.lock:
                    self.diagnoses += 1
                    if (
                        self.diagnoses == self.kill_at
                        and self.target.proc.poll() is None
                    ):
                        self.target.proc.kill()
                        self.target.proc.wait()
            try:
                return forward(
                    lambda: self.channel.unary_unary(method)(request, timeout=60)
                )
            except _Abort as a:
                context.abort(a.code, a.details)

        def stream_in(requests, context):
            try:
                return forward(
                    lambda: self.channel.stream_unary(method)(requests, timeout=60)
                )
            except _Abort as a:
                context.abort(a.code, a.details)

        def stream_out(request, context):
            try:
                yield from self.channel.unary_stream(method)(request, timeout=60)
            except grpc.RpcError as e:
                context.abort(e.code(), e.details())

        if method.endswith("/UploadTensor"):
            return grpc.stream_unary_rpc_method_handler(stream_in)
        if method.endswith("/ReadTensor"):
            return grpc.unary_stream_rpc_method_handler(stream_out)
        return grpc.unary_unary_rpc_method_handler(unary)

    def stop(self) -> None:
        self.server.stop(grace=None)
        self.channel.close()


class _Abort(Exception):
    def __init__(self, code: Any, details: str) -> None:
        super().__init__(details)
        self.code = code
        self.details = details


def test_server_killed_mid_sweep_reports_what_was_checked(model, tmp_path) -> None:
    grpc = pytest.importorskip("grpc")
    w_path, c_path, _ = model
    own = ServerProcess()  # this test's alone: it dies here
    proxy = KillingProxy(grpc, own, kill_at=3)
    try:
        junit = tmp_path / "sweep.xml"
        r = sweep(
            proxy.address,
            "--weights",
            str(w_path),
            "--captures",
            str(c_path),
            "--jobs",
            "1",
            "--json",
            "--junit",
            str(junit),
        )
    finally:
        proxy.stop()
        own.stop()
    assert r.returncode == 3, r.stderr
    assert "UNAVAILABLE" in r.stderr
    j = json.loads(r.stdout)
    assert [layer["status"] for layer in j["layers"]] == [
        "passed",
        "passed",
        "error",
        "not_checked",
    ]
    assert j["layers"][2]["error"] and "UNAVAILABLE" in j["layers"][2]["error"]
    assert j["layers"][3]["report"] is None
    assert j["layers_checked"] == 2 and j["layers_total"] == 4
    assert j["passed"] is False
    assert len(ET.parse(junit).getroot().findall(".//testcase")) == 4


def test_unreachable_server_exits_3(model) -> None:
    w_path, c_path, _ = model
    r = sweep(
        "127.0.0.1:1",
        "--weights",
        str(w_path),
        "--captures",
        str(c_path),
        "--json",
        "--timeout",
        "20",
    )
    assert r.returncode == 3
    j = json.loads(r.stdout)
    assert {layer["status"] for layer in j["layers"]} == {"not_checked"}


def test_no_diagnose_verifies_each_layer(server, model) -> None:
    w_path, c_path, _ = model
    r, j = sweep_json(server, w_path, c_path, "--no-diagnose")
    assert r.returncode == 0, r.stderr
    assert all(layer["verdict"] == "pass" for layer in j["layers"])
    assert all(layer["best"] is None for layer in j["layers"])
    assert j["consensus"] is None
