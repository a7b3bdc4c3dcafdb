"""End-to-end tests: start tensorcheck-server on a free port, drive the CLI.

Run: python3 -m pytest tests/e2e -q   (needs numpy and pytest)

Binaries: TENSORCHECK_SERVER_BIN (default <repo>/build/server/tensorcheck-server)
and TENSORCHECK_CLI_BIN (default <repo>/build/client/cli/tensorcheck). Tests
skip when a binary they need is missing. Expected values are computed here
with numpy in float64, independently of the server.
"""

from __future__ import annotations

import json
import socket
import struct
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest
from e2e_support import run_cli, write_safetensors

TOP_LEVEL_KEYS = [
    "verdict", "tolerance", "observed_vs_reference", "reference", "results",
    "output_shape", "notes", "diagnosis", "uploaded_bytes", "reused_bytes",
]
STATS_KEYS = {
    "total", "mismatched", "max_abs", "max_abs_index", "max_rel", "max_rel_index",
    "mean_abs", "rms", "rel_l2", "cosine", "max_ulp", "mean_ulp", "bitwise_equal",
    "bitwise_equal_count", "ulp_histogram", "nan_actual", "nan_expected",
    "inf_actual", "inf_expected", "nan_mismatch", "worst", "top_columns",
    "top_rows", "bound_ratio", "bound_precision", "compared_dtype", "passed",
    "negligible",
}
CONFIG_RESULT_KEYS = {
    "config", "vs_reference", "vs_observed", "elapsed_ms", "details",
    "deterministic", "runs", "shared_computation", "batch_invariance",
}


def verify(server: str, *args: str, **kw) -> subprocess.CompletedProcess:
    return run_cli("--server", server, "verify", *args, **kw)



def to_bf16_bits(a: np.ndarray) -> np.ndarray:
    """Truncates float32 to bfloat16 bit patterns (exact values chosen below)."""
    return (np.ascontiguousarray(a, dtype=np.float32).view(np.uint32) >> 16).astype(np.uint16)


def bf16_bits_to_f64(b: np.ndarray) -> np.ndarray:
    return (b.astype(np.uint32) << 16).view(np.float32).astype(np.float64)


@pytest.fixture()
def layer(tmp_path: Path) -> dict[str, object]:
    """A float32 layer 3x16 -> 5 with bias, and its fp64 output."""
    rng = np.random.default_rng(7)
    x = rng.standard_normal((3, 16)).astype(np.float32)
    w = (rng.standard_normal((5, 16)) / 4).astype(np.float32)
    b = rng.standard_normal(5).astype(np.float32)
    ref64 = x.astype(np.float64) @ w.astype(np.float64).T + b.astype(np.float64)
    for name, arr in (("x", x), ("w", w), ("b", b)):
        np.save(tmp_path / f"{name}.npy", arr)
    return {"dir": tmp_path, "x": x, "w": w, "b": b, "ref64": ref64,
            "args": ["--input", str(tmp_path / "x.npy"), "--weight", str(tmp_path / "w.npy"),
                     "--bias", str(tmp_path / "b.npy")]}


def save_observed(layer: dict[str, object], y: np.ndarray, name: str = "y.npy") -> str:
    path = Path(layer["dir"]) / name  # type: ignore[arg-type]
    np.save(path, y)
    return str(path)


# ---------------------------------------------------------------- verify


def test_observed_equal_to_reference_passes_with_documented_json(server, layer):
    y = layer["ref64"].astype(np.float32)  # the fp64 result rounded once to fp32
    r = verify(server, *layer["args"], "--observed", save_observed(layer, y),
               "--config", "cpu:fp32", "--json")
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert list(report) == TOP_LEVEL_KEYS
    assert report["verdict"] == "pass"
    assert report["diagnosis"] is None
    assert report["output_shape"] == [3, 5]
    assert report["tolerance"]["preset"] == "torch"
    assert report["tolerance"]["atol"] == pytest.approx(1e-5)
    assert report["tolerance"]["rtol"] == pytest.approx(1.3e-6)
    ovr = report["observed_vs_reference"]
    assert set(ovr) == STATS_KEYS
    assert ovr["total"] == 15
    assert ovr["mismatched"] == 0
    assert ovr["passed"] is True
    assert ovr["compared_dtype"] == "float32"
    assert len(report["results"]) == 1
    res = report["results"][0]
    assert set(res) == CONFIG_RESULT_KEYS
    assert res["config"].startswith("cpu:fp32:")
    assert set(res["vs_reference"]) == STATS_KEYS
    assert set(res["vs_observed"]) == STATS_KEYS
    assert report["reference"]["config"].startswith("cpu:fp64:")


def test_observed_with_one_bad_element_fails_with_numpy_statistics(server, layer):
    ref32 = layer["ref64"].astype(np.float32)
    y = ref32.copy()
    y[1, 2] += np.float32(0.5)
    r = verify(server, *layer["args"], "--observed", save_observed(layer, y), "--json")
    assert r.returncode == 1, r.stderr
    report = json.loads(r.stdout)
    assert report["verdict"] == "fail"
    ovr = report["observed_vs_reference"]
    # The reference output is fp64 rounded to the input's dtype (fp32).
    diff = np.abs(y.astype(np.float64) - ref32.astype(np.float64))
    assert ovr["mismatched"] == 1
    assert ovr["total"] == 15
    assert ovr["max_abs"] == pytest.approx(diff.max(), rel=1e-12)
    assert ovr["max_abs_index"] == [1, 2]
    assert ovr["bitwise_equal"] is False
    assert ovr["bitwise_equal_count"] == 14
    assert ovr["passed"] is False


def test_parity_failure_prints_numpy_style_message(server, layer):
    y = (layer["ref64"] + 1.0).astype(np.float32)
    r = verify(server, *layer["args"], "--observed", save_observed(layer, y))
    assert r.returncode == 1, r.stderr
    assert "Tensor-likes are not close!" in r.stdout
    assert "Mismatched elements: 15 / 15 (100%)" in r.stdout
    assert "Greatest absolute difference:" in r.stdout
    assert "Greatest relative difference:" in r.stdout


def test_configs_without_observed_pass_against_reference(server, layer):
    r = verify(server, *layer["args"], "--config", "cpu:fp32", "--config", "cpu:fp64",
               "--json")
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert report["observed_vs_reference"] is None
    assert [c["config"].rsplit(":", 1)[0] for c in report["results"]] == ["cpu:fp32", "cpu:fp64"]
    for c in report["results"]:
        assert c["vs_observed"] is None
        assert c["vs_reference"]["passed"] is True
    fp64 = report["results"][1]["vs_reference"]
    assert fp64["bitwise_equal"] is True
    assert fp64["max_ulp"] == 0


def test_safetensors_and_bf16_npy_inputs_are_read(server, tmp_path):
    rng = np.random.default_rng(3)
    # Values exactly representable in bf16: small integers over 8.
    x = (rng.integers(-8, 8, (2, 8)) / 8).astype(np.float32)
    w = (rng.integers(-8, 8, (4, 8)) / 8).astype(np.float32)
    st = tmp_path / "m.safetensors"
    write_safetensors(st, {"x": ("BF16", to_bf16_bits(x)), "fc.weight": ("BF16", to_bf16_bits(w))})
    np.save(tmp_path / "xb.npy", to_bf16_bits(x))
    r = verify(server, "--input", str(tmp_path / "xb.npy"), "--dtype", "input=bf16",
               "--weight", f"{st}:fc.weight", "--config", "cpu:bf16", "--json")
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert report["output_shape"] == [2, 4]
    assert report["results"][0]["vs_reference"]["compared_dtype"] == "bfloat16"
    # Exact inputs and short sums: every configuration is bitwise equal.
    assert report["results"][0]["vs_reference"]["bitwise_equal"] is True
    r2 = verify(server, "--input", f"{st}:x", "--weight", f"{st}:fc.weight", "--json")
    assert r2.returncode == 0, r2.stderr


def test_save_outputs_writes_each_configuration_and_reference(server, layer):
    out = Path(layer["dir"]) / "outputs"
    r = verify(server, *layer["args"], "--config", "cpu:fp32", "--save-outputs", str(out),
               "--json")
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    names = [report["reference"]["config"], report["results"][0]["config"]]
    for name in names:
        path = out / (name.replace(":", "_") + ".npy")
        assert path.is_file(), sorted(p.name for p in out.iterdir())
        y = np.load(path)
        assert y.shape == (3, 5)
        np.testing.assert_allclose(y.astype(np.float64), layer["ref64"], rtol=1e-5, atol=1e-5)


def test_junit_and_github_reports_carry_the_failure(server, layer, tmp_path):
    y = (layer["ref64"] + 1.0).astype(np.float32)
    junit = tmp_path / "report.xml"
    summary = tmp_path / "summary.md"
    summary.write_text("previous step\n")
    r = verify(server, *layer["args"], "--observed", save_observed(layer, y),
               "--config", "cpu:fp32", "--junit", str(junit), "--github",
               env={"GITHUB_STEP_SUMMARY": str(summary)})
    assert r.returncode == 1, r.stderr
    suite = ET.parse(junit).getroot().find("testsuite")
    assert suite is not None
    cases = suite.findall("testcase")
    assert len(cases) == 2  # observed vs reference, cpu:fp32
    failures = [c for c in cases if c.find("failure") is not None]
    assert len(failures) == 1
    assert "Mismatched elements: 15 / 15" in (failures[0].find("failure").text or "")
    error_lines = [l for l in r.stdout.splitlines() if l.startswith("::error ")]
    assert error_lines, r.stdout
    # Properties escape ':' and ','; data escapes newlines.
    assert "title=tensorcheck verify%3A observed vs cpu%3Afp64" in error_lines[0]
    assert "%0A" in error_lines[0]
    text = summary.read_text()
    assert text.startswith("previous step\n")
    assert "## tensorcheck verify: **FAIL**" in text


def test_tolerance_ulp_and_explicit_are_sent(server, layer):
    y = layer["ref64"].astype(np.float32)
    obs = save_observed(layer, y)
    r = verify(server, *layer["args"], "--observed", obs, "--tolerance", "ulp",
               "--max-ulp", "2", "--json")
    assert r.returncode == 0, r.stderr
    tol = json.loads(r.stdout)["tolerance"]
    assert tol["preset"] == "ulp" and tol["max_ulp"] == 2
    r = verify(server, *layer["args"], "--observed", obs, "--tolerance", "explicit",
               "--atol", "0.25", "--rtol", "0", "--json")
    assert r.returncode == 0, r.stderr
    tol = json.loads(r.stdout)["tolerance"]
    assert tol["preset"] == "explicit" and tol["atol"] == 0.25 and tol["rtol"] == 0


# ---------------------------------------------------------------- errors


def test_malformed_files_are_input_errors(server, layer, tmp_path):
    args = layer["args"]
    bad_magic = tmp_path / "bad_magic.npy"
    bad_magic.write_bytes(b"NOTNUMPY" + b"\0" * 64)
    big_endian = tmp_path / "be.npy"
    np.save(big_endian, layer["x"].astype(">f4"))
    fortran = tmp_path / "fortran.npy"
    np.save(fortran, np.asfortranarray(layer["x"]))
    truncated = tmp_path / "trunc.npy"
    truncated.write_bytes((Path(layer["dir"]) / "x.npy").read_bytes()[:-7])
    obj = tmp_path / "obj.npy"
    np.save(obj, np.array([1, "a"], dtype=object), allow_pickle=True)
    for path, needle in ((bad_magic, "magic"), (big_endian, "big-endian"),
                         (fortran, "fortran_order"), (truncated, "truncated"),
                         (obj, "object")):
        r = verify(server, "--input", str(path), *args[2:])
        assert r.returncode == 2, (path, r.stderr)
        assert needle in r.stderr and path.name in r.stderr, r.stderr


def test_hostile_safetensors_are_input_errors(server, layer, tmp_path):
    header = json.dumps({
        "a": {"dtype": "F32", "shape": [5, 16], "data_offsets": [0, 320]},
        "b": {"dtype": "F32", "shape": [5, 16], "data_offsets": [160, 480]},
    }).encode()
    overlap = tmp_path / "overlap.safetensors"
    overlap.write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * 480)
    r = verify(server, "--input", str(Path(layer["dir"]) / "x.npy"),
               "--weight", f"{overlap}:a")
    assert r.returncode == 2 and "overlap" in r.stderr, r.stderr
    past_end = tmp_path / "past.safetensors"
    past_end.write_bytes(struct.pack("<Q", 10_000) + b"{}")
    r = verify(server, "--input", str(Path(layer["dir"]) / "x.npy"),
               "--weight", f"{past_end}:a")
    assert r.returncode == 2 and "past the end" in r.stderr, r.stderr
    good = tmp_path / "good.safetensors"
    write_safetensors(good, {"fc.weight": ("F32", layer["w"]), "fc.bias": ("F32", layer["b"])})
    r = verify(server, "--input", str(Path(layer["dir"]) / "x.npy"),
               "--weight", f"{good}:missing")
    assert r.returncode == 2, r.stderr
    assert "fc.bias, fc.weight" in r.stderr


def test_uint16_npy_without_dtype_flag_is_input_error(server, layer, tmp_path):
    np.save(tmp_path / "u.npy", to_bf16_bits(layer["x"]))
    r = verify(server, "--input", str(tmp_path / "u.npy"), *layer["args"][2:])
    assert r.returncode == 2
    assert "--dtype" in r.stderr


@pytest.mark.parametrize("spec", ["cpu:fp99", "cpu", "cpu:fp32:sideways", "a:b:c:d"])
def test_bad_spec_is_usage_error(server, layer, spec):
    r = verify(server, *layer["args"], "--config", spec)
    assert r.returncode == 2, r.stderr
    assert spec in r.stderr


def test_unknown_flag_and_missing_input_are_usage_errors(server, layer):
    assert verify(server, *layer["args"], "--frobnicate").returncode == 2
    assert verify(server, "--weight", str(Path(layer["dir"]) / "w.npy")).returncode == 2
    r = run_cli("--server", server, "diagnose", *layer["args"])
    assert r.returncode == 2 and "--observed" in r.stderr


def test_server_rejection_of_shapes_is_input_error(server, layer, tmp_path):
    np.save(tmp_path / "w_bad.npy", np.zeros((5, 15), np.float32))  # K mismatch
    r = verify(server, "--input", str(Path(layer["dir"]) / "x.npy"),
               "--weight", str(tmp_path / "w_bad.npy"))
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "INVALID_ARGUMENT" in r.stderr


def test_closed_port_is_server_error(layer):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # The port is closed once the socket is.
    r = run_cli("--server", f"127.0.0.1:{port}", "verify", *layer["args"], "--timeout", "10")
    assert r.returncode == 3, (r.stdout, r.stderr)
    assert "server error (UNAVAILABLE)" in r.stderr


# ---------------------------------------------------------------- other commands


def test_capabilities_lists_the_cpu_backend(server):
    r = run_cli("--server", server, "capabilities", "--json")
    assert r.returncode == 0, r.stderr
    caps = json.loads(r.stdout)
    cpu = [b for b in caps["backends"] if b["name"] == "cpu"]
    assert cpu and cpu[0]["available"] is True


def test_health_asks_the_grpc_health_service(server):
    r = run_cli("--server", server, "health")
    assert (r.returncode, r.stdout) == (0, "SERVING\n"), r.stderr
    r = run_cli("--server", server, "health", "--service", "tensorcheck.v1.TensorCheck")
    assert (r.returncode, r.stdout) == (0, "SERVING\n"), r.stderr
    r = run_cli("--server", server, "health", "--service", "no.such.Service")
    assert r.returncode == 2 and "NOT_FOUND" in r.stderr


def test_health_of_an_unreachable_server_is_exit_3(tmp_path):
    r = run_cli("--server", "127.0.0.1:1", "health", "--timeout", "2")
    assert r.returncode == 3 and "UNAVAILABLE" in r.stderr


def test_diagnose_ranks_fp32_first_for_an_fp32_output(server, tmp_path):
    rng = np.random.default_rng(11)
    x = rng.standard_normal((4, 256)).astype(np.float32)
    w = (rng.standard_normal((32, 256)) / 16).astype(np.float32)
    # fp32 accumulation, independently of the server (numpy's own sgemm
    # order, sequential per row here to differ from a blocked GEMM).
    y = np.zeros((4, 32), np.float32)
    for k in range(256):
        y += x[:, k:k + 1] * w[:, k][None, :]
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "w.npy", w)
    np.save(tmp_path / "y.npy", y)
    r = run_cli("--server", server, "diagnose", "--input", str(tmp_path / "x.npy"),
                "--weight", str(tmp_path / "w.npy"), "--observed", str(tmp_path / "y.npy"),
                "--candidates", "cpu:fp32,cpu:bf16,cpu:fp16", "--json")
    if r.returncode == 2 and "UNIMPLEMENTED" in r.stderr:
        pytest.skip("the server does not implement Diagnose yet")
    assert r.returncode in (0, 1), r.stderr
    report = json.loads(r.stdout)
    assert list(report) == TOP_LEVEL_KEYS
    d = report["diagnosis"]
    assert d is not None
    assert {"best", "equivalent", "tied", "confidence", "ranking", "framework_hint",
            "localization", "explanation"} <= set(d)
    assert d["ranking"][0]["config"].startswith("cpu:fp32")
    assert set(d["ranking"][0]) == {
        "config", "bitwise_equal_fraction", "max_ulp", "mean_ulp", "bound_ratio", "equivalent",
        "disagreements", "expected_disagreements", "plausibility_p", "plausible",
        "consistent_fraction", "compared_elements", "ruled_out", "shared_computation",
        "exact", "details", "framework_default", "accepted"}
    assert r.returncode == (0 if d["best"] is not None else 1)


def test_readme_flax_case_reads_verdict_first_in_at_most_20_lines(server, tmp_path):
    """README's Flax case (scripts/make_demo_tensors.py): the default text
    opens with the server's headline, whose words agree with the JSON's
    numbers, and fits in 20 lines; --accept tf32 passes it, exit 0."""
    root = Path(__file__).resolve().parents[2]
    subprocess.run(["python3" if not (root / ".venv/bin/python").exists()
                    else str(root / ".venv/bin/python"),
                    str(root / "scripts/make_demo_tensors.py"), str(tmp_path)],
                   check=True, capture_output=True)
    args = ["--server", server, "diagnose", "--input", str(tmp_path / "x.npy"),
            "--weight", str(tmp_path / "kernel.npy"), "--weight-layout", "in_out",
            "--bias", str(tmp_path / "bias.npy"), "--observed", str(tmp_path / "flax_y.npy")]
    text = run_cli(*args)
    assert text.returncode == 0, text.stderr
    lines = text.stdout.rstrip("\n").split("\n")
    assert len(lines) <= 20, text.stdout
    report = json.loads(run_cli(*args, "--json").stdout)["diagnosis"]
    assert lines[0].startswith("Rounding, not a bug: the output is cpu:tf32:unfused")
    assert report["verdict"] == "rounding"
    # "bit for bit" only where every element is bitwise equal.
    best = next(c for c in report["ranking"] if c["config"] == report["best"])
    assert ("bit for bit" in report["headline"]) == (best["bitwise_equal_fraction"] == 1.0)
    assert "Cannot be told apart" not in text.stdout
    accepted = run_cli(*args, "--accept", "tf32")
    assert accepted.returncode == 0, accepted.stdout
    refused = run_cli(*args, "--accept", "cpu:fp32:fused")
    assert refused.returncode == 1, refused.stdout
    # In the headline, the paragraph before "Advice:" (how many lines it
    # wraps to depends on whether the demo's numpy BLAS summed in the
    # server's order: "bit for bit" or "in another summation order").
    assert "Not accepted" in refused.stdout.split("\nAdvice:")[0]
