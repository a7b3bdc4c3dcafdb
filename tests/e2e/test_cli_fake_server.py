"""CLI tests against an in-process fake server (Python grpcio).

The fake answers with canned responses that exercise what a real server
rarely produces (non-finite numbers, infinite ULP distances, odd
configuration names, every error code), and records each request so the
tests can check how flags map to request fields. Skips without grpcio and
grpcio-tools, or without the CLI binary (TENSORCHECK_CLI_BIN, default
<repo>/build/client/cli/tensorcheck).
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import threading
import time
import xml.etree.ElementTree as ET
from concurrent import futures
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pytest

grpc = pytest.importorskip("grpc")
protoc = pytest.importorskip("grpc_tools.protoc")

REPO = Path(__file__).resolve().parents[2]
CLI_BIN = Path(os.environ.get("TENSORCHECK_CLI_BIN", REPO / "build/client/cli/tensorcheck"))
UINT64_MAX = 2**64 - 1


@pytest.fixture(scope="session")
def pb(tmp_path_factory) -> Any:
    """The Python stubs of the API: the installed client's, else generated
    into a temporary directory (a top-level `tensorcheck` package there
    would shadow the installed client, so it is used only without one)."""
    try:
        from tensorcheck._pb import pb as msgs, pb_grpc as svc
        return msgs, svc
    except ImportError:
        pass
    out = tmp_path_factory.mktemp("pb")
    include = Path(protoc.__file__).parent / "_proto"
    rc = protoc.main([
        "grpc_tools.protoc", f"-I{REPO / 'proto'}", f"-I{include}",
        f"--python_out={out}", f"--grpc_python_out={out}",
        str(REPO / "proto/tensorcheck/v1/tensorcheck.proto"),
    ])
    assert rc == 0
    sys.path.insert(0, str(out))
    msgs = importlib.import_module("tensorcheck.v1.tensorcheck_pb2")
    svc = importlib.import_module("tensorcheck.v1.tensorcheck_pb2_grpc")
    return msgs, svc


def stats(m, *, passed: bool, total: int = 6, mismatched: int = 0, **kw) -> Any:
    s = m.Stats(total=total, mismatched=mismatched, passed=passed,
                compared_dtype=m.DTYPE_BFLOAT16, **kw)
    return s


class FakeServer:
    """Canned answers; `error` makes the next call fail with that code."""

    def __init__(self, m) -> None:
        self.m = m
        self.requests: list[Any] = []
        self.error: tuple[Any, str] | None = None
        self.delay_s = 0.0
        # Diagnose answers only once GetProgress was asked this many times
        # about it (0: at once); GetProgress answers the call's x-request-id.
        self.hold_for_progress_polls = 0
        self.progress_polls = 0
        self.request_id: str | None = None
        self._polled = threading.Condition()

    def _maybe_fail(self, context) -> bool:
        if self.delay_s:
            time.sleep(self.delay_s)
        if self.error is not None:
            code, msg = self.error
            context.abort(code, msg)
        return False

    def _response(self, request) -> Any:
        m = self.m
        tol = m.Tolerance(preset=request.tolerance.preset or m.Tolerance.PRESET_TORCH,
                          nan_equal=request.tolerance.nan_equal,
                          max_ulp=request.tolerance.max_ulp)
        tol.atol.value = 1e-5
        tol.rtol.value = 1.6e-2
        bad = stats(m, passed=False, mismatched=2, max_abs=float("inf"),
                    max_abs_index=[1, 2], max_rel=float("nan"), max_rel_index=[0, 0],
                    max_ulp=UINT64_MAX, mean_ulp=1.5, cosine=-0.0,
                    bitwise_equal_count=4, nan_mismatch=1)
        bad.ulp_histogram.add(lo=0, hi=0, count=4)
        bad.ulp_histogram.add(lo=UINT64_MAX, hi=UINT64_MAX, count=1)
        bad.worst.add(index=[1, 2], actual=float("inf"), expected=2.0, actual_bits="0x7f80",
                      expected_bits="0x4000", abs_diff=float("inf"), rel_diff=float("inf"),
                      ulp=UINT64_MAX)
        bad.top_columns.add(index=2, mismatched=2, share=1.0)
        bad.bound_ratio.value = 3.5
        bad.bound_precision = "bf16"
        good = stats(m, passed=True, bitwise_equal=True, bitwise_equal_count=6)
        r = m.VerifyResponse(verdict=m.VERDICT_FAIL if request.HasField("observed")
                             else m.VERDICT_PASS, tolerance=tol, output_shape=[2, 3],
                             notes=["cuBLASLt GELU is the tanh approximation"])
        if request.HasField("observed"):
            r.observed_vs_reference.CopyFrom(bad)
        out = m.Tensor(dtype=m.DTYPE_BFLOAT16, shape=[2, 3],
                       data=np.array([0x3f80, 0xc020, 0x3f00, 0, 0x8000, 0x4000],
                                     "<u2").tobytes())
        ref = r.reference
        ref.config = "cpu:fp64:none"
        ref.vs_reference.CopyFrom(good)
        ref.elapsed_ms = 0.25
        if request.output.return_outputs:
            ref.output.CopyFrom(out)
        names = list(request.configs) or ["cpu:fp32:none"]
        for i, name in enumerate(names):
            c = r.results.add(config=name, elapsed_ms=1.5 + i, runs=max(1, request.repeat),
                              deterministic=True)
            c.details["algo"] = "7"
            if i > 0:
                # The second and later configurations reused the first's GEMM.
                c.shared_computation = names[0]
            c.vs_reference.CopyFrom(good if i == 0 else bad)
            if request.HasField("observed"):
                c.vs_observed.CopyFrom(bad if i == 0 else good)
            if request.output.return_outputs:
                c.output.CopyFrom(out)
        return r

    def Verify(self, request, context):
        self.requests.append(request)
        self._maybe_fail(context)
        return self._response(request)

    def Diagnose(self, request, context):
        self.requests.append(request)
        with self._polled:
            self.request_id = dict(context.invocation_metadata()).get("x-request-id")
            self.progress_polls = 0
            self._polled.notify_all()
            self._polled.wait_for(lambda: self.progress_polls >= self.hold_for_progress_polls,
                                  timeout=60)
        self._maybe_fail(context)
        r = self._response(request)
        m = self.m
        d = r.diagnosis
        if len(request.configs) > 0 and request.configs[0] == "cpu:fp16":
            d.explanation = "Nothing explains the observed output: the weight looks transposed."
        else:
            d.best = "cpu:tf32:unfused"
            d.equivalent.append("cpu:tf32rna:unfused")
            d.confidence = 0.93
            d.framework_hint = "JAX/Flax default on Ampere+: fp32 matmul in TF32, bias added separately"
            d.explanation = "The observed output is consistent with TF32 inputs (error/bound ~ 1)."
            # 3 of 94,674 elements differ: 99.997%, never "100.0%".
            rc = d.ranking.add(config="cpu:tf32:unfused", bitwise_equal_fraction=0.99996831,
                               max_ulp=1, mean_ulp=0.02, disagreements=3,
                               expected_disagreements=2.5, plausibility_p=0.46, plausible=True,
                               consistent_fraction=1.0, compared_elements=94674)
            rc.bound_ratio.value = 1.02
            d.ranking.add(config="cpu:fp32:unfused", bitwise_equal_fraction=0.1,
                          max_ulp=UINT64_MAX, mean_ulp=40, disagreements=85206,
                          expected_disagreements=12.5, plausibility_p=0.0, plausible=False,
                          consistent_fraction=0.25, compared_elements=94674,
                          ruled_out="85206 of 94674 elements differ where its accumulation "
                                    "noise predicts 12.5.",
                          shared_computation="cpu:fp32:fused")
            d.localization.columns.add(index=3, mismatched=4, share=0.5)
            d.localization.outliers.add(index=[0, 1], actual=1.0, expected=9.0, ulp=300)
        return r

    def GetProgress(self, request, context):
        m = self.m
        with self._polled:
            if request.request_id != self.request_id:
                context.abort(grpc.StatusCode.NOT_FOUND, "no such call in flight")
            self.progress_polls += 1
            self._polled.notify_all()
        return m.GetProgressResponse(method="Diagnose", phase="running the candidates", done=5,
                                     total=13, elapsed_seconds=2.0)

    def GetCapabilities(self, request, context):
        self._maybe_fail(context)
        m = self.m
        r = m.GetCapabilitiesResponse(server_version="fake-1", default_reference="cpu:fp64")
        r.backends.add(name="cpu", available=True, precisions=["fp32", "fp64"],
                       configs=["cpu:fp32:none"], storage_dtypes=[m.DTYPE_FLOAT32])
        r.backends.add(name="cublaslt", available=False, unavailable_reason="no GPU")
        return r


@pytest.fixture(scope="session")
def fake_server(pb) -> Iterator[tuple[FakeServer, str]]:
    if not CLI_BIN.is_file():
        pytest.skip(f"CLI binary not built: {CLI_BIN} (set TENSORCHECK_CLI_BIN)")
    m, svc = pb
    fake = FakeServer(m)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))

    class Servicer(svc.TensorCheckServicer):
        def Verify(self, request, context):
            return fake.Verify(request, context)

        def Diagnose(self, request, context):
            return fake.Diagnose(request, context)

        def GetCapabilities(self, request, context):
            return fake.GetCapabilities(request, context)

        def GetProgress(self, request, context):
            return fake.GetProgress(request, context)

    svc.add_TensorCheckServicer_to_server(Servicer(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield fake, f"127.0.0.1:{port}"
    server.stop(grace=None)


@pytest.fixture()
def fake(fake_server) -> Iterator[tuple[FakeServer, str]]:
    f, addr = fake_server
    f.error = None
    f.delay_s = 0.0
    f.hold_for_progress_polls = 0
    f.requests.clear()
    yield f, addr


@pytest.fixture()
def files(tmp_path: Path) -> list[str]:
    np.save(tmp_path / "x.npy", np.ones((2, 4), np.float32))
    np.save(tmp_path / "w.npy", np.ones((3, 4), np.float32))
    np.save(tmp_path / "y.npy", np.ones((2, 3), np.float32))
    return ["--input", str(tmp_path / "x.npy"), "--weight", str(tmp_path / "w.npy")]


def cli(addr: str, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    e = dict(os.environ)
    e.pop("GITHUB_STEP_SUMMARY", None)
    e.update(env or {})
    return subprocess.run([str(CLI_BIN), "--server", addr, *args], capture_output=True,
                          text=True, timeout=60, env=e)


def test_json_follows_the_report_format(fake, files, tmp_path):
    _, addr = fake
    r = cli(addr, "verify", *files, "--observed", str(tmp_path / "y.npy"),
            "--config", "cpu:fp32", "--config", "cpu:bf16", "--json")
    assert r.returncode == 1, r.stderr
    j = json.loads(r.stdout)
    assert list(j) == ["verdict", "tolerance", "observed_vs_reference", "reference", "results",
                       "output_shape", "notes", "diagnosis", "uploaded_bytes",
                       "reused_bytes"]
    assert j["verdict"] == "fail"
    assert j["tolerance"] == {"preset": "torch", "atol": 1e-5, "rtol": 1.6e-2, "max_ulp": 0,
                              "bound_factor": 1.0, "nan_equal": False}
    o = j["observed_vs_reference"]
    assert o["max_abs"] == "inf" and o["max_rel"] == "nan" and o["max_ulp"] == "inf"
    assert o["max_abs_index"] == [1, 2]
    assert o["ulp_histogram"] == [{"lo": 0, "hi": 0, "count": 4},
                                  {"lo": "inf", "hi": "inf", "count": 1}]
    assert o["worst"][0] == {"index": [1, 2], "actual": "inf", "expected": 2.0,
                             "actual_bits": "0x7f80", "expected_bits": "0x4000",
                             "abs_diff": "inf", "rel_diff": "inf", "ulp": "inf"}
    assert o["top_columns"] == [{"index": 2, "mismatched": 2, "share": 1.0}]
    assert o["bound_ratio"] == 3.5 and o["bound_precision"] == "bf16"
    assert o["compared_dtype"] == "bfloat16"
    assert j["reference"]["vs_reference"]["bound_ratio"] is None
    assert j["reference"]["vs_observed"] is None
    res = j["results"][0]
    assert list(res) == ["config", "vs_reference", "vs_observed", "elapsed_ms", "details",
                         "deterministic", "runs", "shared_computation", "batch_invariance"]
    assert res["batch_invariance"] is None  # not asked for
    assert res["details"] == {"algo": "7"}
    assert res["shared_computation"] == ""
    assert j["results"][1]["shared_computation"] == "cpu:fp32"
    assert j["reference"]["shared_computation"] == ""
    assert j["diagnosis"] is None
    assert j["notes"] == ["cuBLASLt GELU is the tanh approximation"]


def test_flags_map_to_request_fields(fake, files, tmp_path):
    f, addr = fake
    r = cli(addr, "verify", *files, "--bias", str(tmp_path / "x.npy").replace("x.npy", "b.npy"))
    assert r.returncode == 2  # b.npy does not exist: input error before any call
    assert not f.requests
    r = cli(addr, "verify", *files, "--observed", str(tmp_path / "y.npy"),
            "--weight-layout", "in_out", "--activation", "gelu", "--output-dtype", "bf16",
            "--reference", "cpu:fp64", "--tolerance", "ulp", "--max-ulp", "3", "--nan-equal",
            "--top-k", "4", "--repeat", "5", "--config", "cpu:fp32,cpu:tf32:fused")
    assert r.returncode == 1, r.stderr
    req = f.requests[-1]
    assert list(req.configs) == ["cpu:fp32", "cpu:tf32:fused"]
    assert req.reference == "cpu:fp64"
    assert req.op.weight_layout == 2 and req.op.activation == 3
    assert req.op.output_dtype == 4
    assert req.tolerance.preset == 5 and req.tolerance.max_ulp == 3 and req.tolerance.nan_equal
    assert req.output.top_k == 4 and req.repeat == 5
    assert not req.output.return_outputs
    assert req.op.input.dtype == 2 and list(req.op.input.shape) == [2, 4]
    assert req.op.input.data == np.ones((2, 4), "<f4").tobytes()
    assert req.observed.dtype == 2
    r = cli(addr, "verify", *files, "--tolerance", "explicit", "--atol", "0.5")
    assert r.returncode == 0, r.stderr
    t = f.requests[-1].tolerance
    assert t.preset == 4 and t.HasField("atol") and t.atol.value == 0.5
    assert not t.HasField("rtol")


@pytest.mark.parametrize("code,exit_code", [
    ("INVALID_ARGUMENT", 2), ("NOT_FOUND", 2), ("FAILED_PRECONDITION", 2),
    ("OUT_OF_RANGE", 2), ("RESOURCE_EXHAUSTED", 2), ("UNIMPLEMENTED", 2),
    ("INTERNAL", 3), ("UNAVAILABLE", 3), ("UNKNOWN", 3), ("UNAUTHENTICATED", 3),
    ("PERMISSION_DENIED", 3),
])
def test_server_status_maps_to_exit_code(fake, files, code, exit_code):
    f, addr = fake
    f.error = (getattr(grpc.StatusCode, code), "weight: [3, 4] expected, got [3, 5]")
    r = cli(addr, "verify", *files)
    assert r.returncode == exit_code, r.stderr
    assert f"({code}): weight: [3, 4] expected, got [3, 5]" in r.stderr
    if exit_code == 3:
        assert f"server error ({code})" in r.stderr


def test_deadline_is_server_error(fake, files):
    f, addr = fake
    f.delay_s = 2.0
    r = cli(addr, "verify", *files, "--timeout", "0.3")
    assert r.returncode == 3
    assert "server error (DEADLINE_EXCEEDED)" in r.stderr


def test_save_outputs_writes_bf16_as_exact_float32(fake, files, tmp_path):
    _, addr = fake
    out = tmp_path / "out"
    r = cli(addr, "verify", *files, "--config", "cpu:bf16:fused", "--save-outputs", str(out))
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in out.iterdir()) == ["cpu_bf16_fused.npy", "cpu_fp64_none.npy"]
    y = np.load(out / "cpu_bf16_fused.npy")
    assert y.dtype == np.float32 and y.shape == (2, 3)
    np.testing.assert_array_equal(y, np.array([[1.0, -2.5, 0.5], [0.0, -0.0, 2.0]], np.float32))
    assert np.signbit(y[1, 1])


def test_junit_escapes_and_counts_failures(fake, files, tmp_path):
    _, addr = fake
    junit = tmp_path / "r.xml"
    # Without an observed output, each configuration is a test case that
    # fails when it is not within tolerance of the reference.
    r = cli(addr, "verify", *files, "--config", "cpu:fp32", "--config", "cpu:bf16",
            "--junit", str(junit))
    assert r.returncode == 0, r.stderr  # the fake's verdict
    root = ET.parse(junit).getroot()
    suite = root.find("testsuite")
    assert suite.get("tests") == "2" and suite.get("failures") == "1"
    cases = suite.findall("testcase")
    assert [c.get("name") for c in cases] == ["cpu:fp32", "cpu:bf16"]
    failure = cases[1].find("failure")
    assert "Tensor-likes are not close!" in failure.text
    assert "Mismatched elements: 2 / 6 (33.3%)" in failure.text
    assert failure.get("message").startswith("Compared with cpu:fp64:none: Tensor-likes")
    assert "\n" not in failure.get("message")


def test_github_annotations_escape_properties_and_data(fake, files, tmp_path):
    _, addr = fake
    summary = tmp_path / "summary.md"
    r = cli(addr, "verify", *files, "--observed", str(tmp_path / "y.npy"), "--github",
            env={"GITHUB_STEP_SUMMARY": str(summary)})
    assert r.returncode == 1
    errors = [l for l in r.stdout.splitlines() if l.startswith("::error")]
    assert errors[0].startswith(
        "::error title=tensorcheck verify%3A observed vs cpu%3Afp64%3Anone::Tensor-likes are not close!%0A%0AMismatched elements: 2 / 6 (33.3%25)")
    assert all("\r" not in l for l in errors)
    assert "## tensorcheck verify: **FAIL**" in summary.read_text()
    # With --json the annotations go to stderr and stdout stays pure JSON.
    r = cli(addr, "verify", *files, "--observed", str(tmp_path / "y.npy"), "--github", "--json")
    json.loads(r.stdout)
    assert "::error title=" in r.stderr


def test_human_output_reads_like_torch(fake, files, tmp_path):
    _, addr = fake
    r = cli(addr, "verify", *files, "--observed", str(tmp_path / "y.npy"), "--repeat", "3")
    assert r.returncode == 1
    out = r.stdout
    assert "Tensor-likes are not close!" in out
    assert "Mismatched elements: 2 / 6 (33.3%)" in out
    assert "Greatest absolute difference: inf at index (1, 2) (up to 1e-05 allowed)" in out
    assert "Greatest relative difference: nan at index (0, 0) (up to 0.016 allowed)" in out
    assert "deterministic" in out and "yes (3 runs)" in out
    assert "cpu:fp32:none" in out


def test_shared_computation_marks_the_epilogue_only_time(fake, files, tmp_path):
    _, addr = fake
    # The shared GEMM's marker and footnote are --verbose's.
    r = cli(addr, "verify", *files, "--config", "cpu:fp32", "--config", "cpu:bf16", "--verbose")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    fp32 = next(l for l in lines if l.startswith("  cpu:fp32 "))
    bf16 = next(l for l in lines if l.startswith("  cpu:bf16 "))
    assert fp32.endswith("1.5 ms ") and bf16.endswith("2.5 ms*")
    assert "  * cpu:bf16 reused the GEMM of cpu:fp32 (elapsed: epilogue only)." in lines
    # 4 of 6 bitwise-equal; 6 of 6 is exactly all.
    assert "66.7%" in bf16 and "100%" in fp32 and "100.0%" not in r.stdout


def test_a_long_diagnosis_shows_the_servers_phase_and_count_on_a_terminal(fake, files,
                                                                           tmp_path):
    from test_cli_store import run_with_tty_stderr

    f, addr = fake
    # The diagnosis answers after the CLI asked four times (every 500 ms):
    # the phase is then past the line's quiet half second, and the CLI
    # draws each answer before it asks again.
    f.hold_for_progress_polls = 4
    out, err = run_with_tty_stderr([str(CLI_BIN), "--server", addr, "diagnose", *files,
                                    "--observed", str(tmp_path / "y.npy")], timeout=120)
    assert "Best match: cpu:tf32:unfused" in out, err
    assert "diagnosis: running the candidates 5/13, " in err, err
    assert f.progress_polls >= 4 and len(f.request_id or "") == 32
    # Not on a terminal (or with --no-progress): no line, and no questions.
    f.hold_for_progress_polls = 0
    r = cli(addr, "diagnose", *files, "--observed", str(tmp_path / "y.npy"))
    assert r.returncode == 0, r.stderr
    assert "running the candidates" not in r.stderr and f.progress_polls == 0


def test_diagnose_reports_best_match(fake, files, tmp_path):
    f, addr = fake
    junit = tmp_path / "d.xml"
    r = cli(addr, "diagnose", *files, "--observed", str(tmp_path / "y.npy"),
            "--candidates", "cpu:tf32,cpu:fp32", "--junit", str(junit), "--github")
    assert r.returncode == 0, r.stderr
    assert list(f.requests[-1].configs) == ["cpu:tf32", "cpu:fp32"]
    assert "Best match: cpu:tf32:unfused (confidence 0.93)" in r.stdout
    assert "JAX/Flax default" in r.stdout
    assert "::notice title=tensorcheck diagnose::PASS: best match cpu%3Atf32%3Aunfused" not in r.stdout
    assert "::notice title=tensorcheck diagnose::PASS: best match cpu:tf32:unfused" in r.stdout
    cases = ET.parse(junit).getroot().find("testsuite").findall("testcase")
    assert cases[0].get("name") == "diagnosis" and cases[0].find("failure") is None
    r = cli(addr, "diagnose", *files, "--observed", str(tmp_path / "y.npy"), "--json")
    d = json.loads(r.stdout)["diagnosis"]
    assert d["best"] == "cpu:tf32:unfused" and d["equivalent"] == ["cpu:tf32rna:unfused"]
    assert d["ranking"][1]["max_ulp"] == "inf" and d["ranking"][1]["bound_ratio"] is None
    assert d["localization"]["outliers"][0]["index"] == [0, 1]
    first, second = d["ranking"]
    assert list(first)[6:] == ["disagreements", "expected_disagreements", "plausibility_p",
                               "plausible", "consistent_fraction", "compared_elements",
                               "ruled_out", "shared_computation", "exact", "details",
                               "framework_default", "accepted"]
    assert (first["disagreements"], first["expected_disagreements"], first["plausibility_p"],
            first["plausible"], first["consistent_fraction"], first["compared_elements"],
            first["ruled_out"], first["shared_computation"]) == (
        3, 2.5, 0.46, True, 1.0, 94674, "", "")
    assert second["plausible"] is False and second["plausibility_p"] == 0.0
    assert second["ruled_out"].startswith("85206 of 94674 elements differ")
    assert second["shared_computation"] == "cpu:fp32:fused"


def test_diagnose_text_shows_plausibility_ruled_out_and_shared_gemm(fake, files, tmp_path):
    _, addr = fake
    summary = tmp_path / "summary.md"
    r = cli(addr, "diagnose", *files, "--observed", str(tmp_path / "y.npy"), "--github",
            "--verbose", env={"GITHUB_STEP_SUMMARY": str(summary)})
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    header = next(l for l in lines if l.lstrip().startswith("rank"))
    assert header.split()[:4] == ["rank", "config", "plausible", "bitwise-equal"]
    assert lines[lines.index(header) + 1].split()[:4] == [
        "1", "cpu:tf32:unfused", "yes", "99.997%"]
    assert lines[lines.index(header) + 2].split()[:4] == [
        "2", "cpu:fp32:unfused*", "no", "10.0%"]
    assert "  * cpu:fp32:unfused reused the GEMM of cpu:fp32:fused." in lines
    i = lines.index("  Ruled out:")
    assert lines[i + 1] == ("    2. cpu:fp32:unfused: 85206 of 94674 elements differ where its "
                            "accumulation noise predicts 12.5.")
    assert "100.0%" not in r.stdout
    assert all(len(l) <= 100 for l in lines[:i + 2]), r.stdout
    md = summary.read_text()
    assert "| 1 | `cpu:tf32:unfused` | yes | 99.997% |" in md
    assert "| 2 | `cpu:fp32:unfused` (GEMM of `cpu:fp32:fused`) | no | 10.0% |" in md
    assert "- `cpu:fp32:unfused`: 85206 of 94674 elements differ" in md


def test_diagnose_without_a_match_exits_1(fake, files, tmp_path):
    _, addr = fake
    r = cli(addr, "diagnose", *files, "--observed", str(tmp_path / "y.npy"),
            "--candidates", "cpu:fp16", "--json")
    assert r.returncode == 1, r.stderr
    assert json.loads(r.stdout)["diagnosis"]["best"] is None


def test_capabilities(fake):
    _, addr = fake
    r = cli(addr, "capabilities", "--json")
    assert r.returncode == 0, r.stderr
    caps = json.loads(r.stdout)
    assert caps["backends"][1] == {
        "name": "cublaslt", "available": False, "unavailable_reason": "no GPU",
        "precisions": [], "bias_modes": [], "configs": [], "device": None,
        "storage_dtypes": []}
    r = cli(addr, "capabilities")
    assert "Backend cublaslt: unavailable" in r.stdout and "no GPU" in r.stdout
