"""The server's answer, first, in every message; accept=; compare_outputs;
pytest tracebacks; an unreachable server; server= and its deprecated
names. Against fakes in the test process (answer_server.py, test_store's
FakeStore): what the client sends and how it renders what it gets."""

from __future__ import annotations

import hashlib
import os
import re
import socket
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest

import tensorcheck
from answer_server import (
    ADVICE,
    HEADLINE,
    REASON,
    AnswerServicer,
    diagnose_response,
    diagnosis,
    serve_answers,
)
from in_process_server import serve_in_process
from tensorcheck._model import Capture, check_captures
from tensorcheck._pb import pb
from tensorcheck._wire import encode_request
from test_store import FakeStore

TESTS = Path(__file__).resolve().parent
MiB = 1 << 20
TIMEOUT_S = 30

X = np.arange(12, dtype=np.float32).reshape(4, 3) / 8
W = np.arange(24, dtype=np.float32).reshape(8, 3) / 16
B = np.ones(8, np.float32)
Y = (X.astype(np.float64) @ W.T.astype(np.float64) + B).astype(np.float32)


# --- the headline first -------------------------------------------------------------


def _failure(servicer: AnswerServicer, **kw: Any) -> list[str]:
    with serve_answers(servicer) as target:
        with pytest.raises(AssertionError) as e:
            tensorcheck.assert_linear_parity(
                X, W, B, observed=Y, server=target, timeout=TIMEOUT_S, **kw
            )
    return str(e.value).splitlines()


def test_a_failed_parity_opens_with_the_headline_and_its_advice_in_25_lines() -> None:
    servicer = AnswerServicer()
    lines = _failure(servicer)
    assert servicer.methods == ["Verify", "Diagnose"]
    assert lines[:2] == [HEADLINE, f"Advice: {ADVICE}"]
    assert len(lines) <= 25
    # The torch-style summary and the diagnosis follow; what does not fit is
    # counted, not dropped silently.
    assert "Tensor-likes are not close!" in lines
    assert "Mismatched elements: 3 / 32 (9.4%)" in lines
    assert f"Why: {REASON}" in lines
    assert lines[-1].startswith("... (") and lines[-1].endswith(
        "more lines: the Report has everything)"
    )
    # The headline names where to look: not repeated on a line of its own.
    assert not any(line.startswith("Where to look") for line in lines)


def test_an_older_server_without_headline_leads_with_its_verdict_reason() -> None:
    servicer = AnswerServicer(diagnose=diagnose_response(diagnosis(headline="", advice="")))
    lines = _failure(servicer)
    assert lines[0] == REASON
    assert lines[1] == ""  # then the comparison
    assert "Why:" not in "\n".join(lines)


def test_without_a_diagnosis_the_torch_style_summary_leads() -> None:
    servicer = AnswerServicer()
    lines = _failure(servicer, diagnose=False)
    assert servicer.methods == ["Verify"]
    assert lines[0] == "Tensor-likes are not close!"


def test_str_of_a_report_opens_with_the_headline() -> None:
    r = pb.VerifyResponse(verdict=pb.VERDICT_PASS)
    r.tolerance.preset = pb.Tolerance.PRESET_TORCH
    r.reference.config = "cpu:fp64:none"
    s = r.observed_vs_reference
    s.total, s.mismatched, s.max_abs, s.max_ulp = 1024, 0, 1.5e-6, 2
    r.diagnosis.CopyFrom(diagnosis(headline="Rounding, not a bug: it is cpu:fp32:fused."))
    r.diagnosis.advice = ""
    text = str(tensorcheck.Report.from_proto(r)).splitlines()
    assert text[:3] == [
        "Rounding, not a bug: it is cpu:fp32:fused.",
        "Verdict: PASS (tolerance torch)",
        "observed vs cpu:fp64:none: 0 / 1024 outside tolerance torch, max_abs 1.5e-06, max 2 ULP",
    ]


# --- accept= -----------------------------------------------------------------------


def _accepting(verdict: int, headline: str, advice: str = "") -> AnswerServicer:
    v = pb.VerifyResponse(verdict=verdict)
    v.tolerance.preset = pb.Tolerance.PRESET_TORCH
    v.reference.config = "cpu:fp64:none"
    s = v.observed_vs_reference
    s.total, s.mismatched, s.max_abs, s.max_ulp = 32, 32, 1.05e-3, 9000
    d = v.diagnosis
    d.best, d.confidence, d.headline, d.advice = "cpu:tf32:unfused", 0.95, headline, advice
    d.verdict = pb.Diagnosis.VERDICT_ROUNDING
    if verdict == pb.VERDICT_PASS:
        d.accepted, d.accepted_as = True, "cpu:tf32:unfused"
    return AnswerServicer(verify=v)


def test_accept_passes_on_the_servers_acceptance_although_the_tolerance_fails() -> None:
    # Every element is outside the torch tolerance, yet the server accepts
    # the output as TF32 rounding: PASS is its verdict, one Verify only.
    servicer = _accepting(pb.VERDICT_PASS, "Rounding, not a bug: ... Accepted (tf32).")
    with serve_answers(servicer) as target:
        report = tensorcheck.assert_linear_parity(
            X, W, B, observed=Y, server=target, timeout=TIMEOUT_S, accept=["tf32"]
        )
        assert report.passed and report.accept == ("tf32",)
        assert report.diagnosis is not None and report.diagnosis.accepted_as == "cpu:tf32:unfused"
        with tensorcheck.Client(target, timeout=TIMEOUT_S) as client:
            r = client.verify_linear(X, W, B, observed=Y, accept="cpu:tf32:unfused")
            assert r.verdict == "pass"
            client.diagnose_linear(X, W, B, observed=Y, accept=["cpu:bf16:unfused", "tf32"])
    assert servicer.methods == ["Verify", "Verify", "Diagnose"]
    assert [list(req.accept) for _, req in servicer.requests] == [
        ["tf32"],
        ["cpu:tf32:unfused"],
        ["cpu:bf16:unfused", "tf32"],
    ]


def test_accept_fails_with_the_headline_and_advice_first() -> None:
    # Verify diagnosed among the accepted configurations only ("Unexplained"
    # there); the Diagnose over every candidate says what the output is,
    # and that headline leads.
    headline = "Rounding, not a bug: the output is cpu:tf32:unfused. Not accepted: it is not fp32."
    advice = "To get cpu:fp32:fused instead of cpu:tf32:unfused: jax.config.update(...)."
    servicer = _accepting(pb.VERDICT_FAIL, "Unexplained: no offered configuration (fp32) ...")
    d = pb.Diagnosis(best="cpu:tf32:unfused", headline=headline, advice=advice)
    d.verdict = pb.Diagnosis.VERDICT_ROUNDING
    servicer.diagnose = diagnose_response(d)
    lines = _failure(servicer, accept="fp32", candidates=["cpu:fp32", "cpu:tf32"])
    assert servicer.methods == ["Verify", "Diagnose"]
    ((_, verify), (_, diag)) = servicer.requests
    assert list(verify.accept) == list(diag.accept) == ["fp32"]
    assert list(verify.configs) == [] and list(diag.configs) == ["cpu:fp32", "cpu:tf32"]
    assert lines[:3] == [headline, f"Advice: {advice}", ""]
    assert lines[3] == "Verdict: FAIL (accept fp32)"
    assert lines[4] == (
        "observed vs cpu:fp64:none: 32 / 32 outside tolerance torch, max_abs 0.00105, max 9000 ULP"
    )
    assert len(lines) <= 25


def test_accept_keeps_verifys_answer_when_the_wider_diagnosis_accepts() -> None:
    # The verdict is Verify's: a message never reads "Accepted" under FAIL.
    servicer = _accepting(pb.VERDICT_FAIL, "Unexplained: the accepted answer of Verify.")
    d = pb.Diagnosis(best="cpu:tf32:unfused", headline="Rounding ... Accepted (tf32).")
    d.accepted = True
    servicer.diagnose = diagnose_response(d)
    lines = _failure(servicer, accept="tf32")
    assert lines[0] == "Unexplained: the accepted answer of Verify."


def test_accept_against_a_server_that_ignores_it_is_unimplemented() -> None:
    # A server that predates acceptance answers Verify without a diagnosis:
    # its verdict would be the tolerance's, not the acceptance asked for.
    servicer = AnswerServicer(verify=pb.VerifyResponse(verdict=pb.VERDICT_PASS))
    with serve_answers(servicer) as target, tensorcheck.Client(target) as client:
        with pytest.raises(tensorcheck.UnimplementedError, match="predates accept="):
            client.verify_linear(X, W, B, observed=Y, accept="tf32", timeout=TIMEOUT_S)
        client.verify_linear(X, W, B, observed=Y, timeout=TIMEOUT_S)  # without: fine


@pytest.mark.parametrize(
    "accept, exc, pattern",
    [
        ("cpu:tf32:fused:x", ValueError, r"^accept: 'cpu:tf32:fused:x' is not of the form"),
        (["tf32", "::"], ValueError, r"^accept\[1\]: '::' is not of the form"),
        ([32], TypeError, r"^accept\[0\]: expected a configuration"),
    ],
)
def test_accept_is_checked_before_any_call(
    offline_client: tensorcheck.Client, accept: Any, exc: type, pattern: str
) -> None:
    with pytest.raises(exc, match=pattern):
        offline_client.verify_linear(X, W, B, observed=Y, accept=accept)


def test_accept_needs_an_observed_output(offline_client: tensorcheck.Client) -> None:
    with pytest.raises(ValueError, match="^accept: needs observed="):
        offline_client.verify_linear(X, W, B, accept="tf32")


# --- compare_outputs ------------------------------------------------------------------


COMPARE_HEADLINE = (
    "torch is cpu:fp32:fused (PyTorch's default), flax is cpu:tf32:unfused (JAX's default "
    "on Ampere); their difference is rounding: at most 0.0011 expected, 0.00105 seen. For flax "
    "to match torch: set jax_default_matmul_precision to 'highest'."
)


def _compare_response() -> pb.CompareResponse:
    r = pb.CompareResponse(headline=COMPARE_HEADLINE, reference="cpu:fp64:none")
    r.output_shape[:] = [4, 8]
    for name, best, head in (
        ("torch", "cpu:fp32:fused", "Rounding, not a bug: torch is cpu:fp32:fused."),
        ("flax", "cpu:tf32:unfused", "Rounding, not a bug: flax is cpu:tf32:unfused."),
    ):
        o = r.outputs.add(name=name)
        o.vs_reference.max_abs = 1e-3 if name == "flax" else 1e-6
        o.diagnosis.best, o.diagnosis.headline = best, head
        o.diagnosis.verdict = pb.Diagnosis.VERDICT_ROUNDING
    p = r.pair
    p.a, p.b, p.rounding = "torch", "flax", True
    p.configs_max_abs, p.expected_max_abs = 1.0e-3, 1.1e-3
    p.stats.max_abs, p.stats.max_ulp, p.stats.total = 1.05e-3, 12, 32
    p.advice_b_to_a = "Set jax_default_matmul_precision to 'highest'."
    p.advice_a_to_b = "Set torch.backends.cuda.matmul.allow_tf32 = True."
    return r


def test_compare_outputs_sends_two_named_outputs_and_renders_the_headline_first() -> None:
    y_flax = Y + np.float32(2.0**-10)
    servicer = AnswerServicer(compare=_compare_response())
    with serve_answers(servicer) as target:
        result = tensorcheck.compare_outputs(
            X,
            W,
            B,
            {"torch": Y, "flax": y_flax},
            server=target,
            timeout=TIMEOUT_S,
            candidates=["cpu:fp32", "cpu:tf32"],
            accept="fp32",
        )
    ((method, req),) = servicer.requests
    assert method == "Compare"
    assert [o.name for o in req.observed] == ["torch", "flax"]
    assert req.observed[0].tensor.data == Y.astype("<f4").tobytes()
    assert req.observed[1].tensor.data == y_flax.astype("<f4").tobytes()
    assert list(req.observed[1].tensor.shape) == [4, 8]
    assert req.op.weight.data == W.astype("<f4").tobytes()
    assert list(req.configs) == ["cpu:fp32", "cpu:tf32"] and list(req.accept) == ["fp32"]

    assert result.headline == COMPARE_HEADLINE
    assert result["flax"].diagnosis is not None
    assert result.diagnoses["flax"].best == "cpu:tf32:unfused"  # type: ignore[union-attr]
    assert result.pair is not None and result.pair.rounding
    assert (result.pair.expected_max_abs, result.pair.stats.max_abs) == (1.1e-3, 1.05e-3)  # type: ignore[union-attr]
    assert result.pair.advice == {
        "flax": "Set jax_default_matmul_precision to 'highest'.",
        "torch": "Set torch.backends.cuda.matmul.allow_tf32 = True.",
    }
    assert result.passed is None  # the response carries no verdict
    lines = str(result).splitlines()
    assert lines[:3] == [
        COMPARE_HEADLINE,
        "  torch: Rounding, not a bug: torch is cpu:fp32:fused.",
        "  flax: Rounding, not a bug: flax is cpu:tf32:unfused.",
    ]
    assert lines[3] == (
        "  torch vs flax: max_abs 0.00105, max 12 ULP; "
        "expected at most 0.0011 (rounding of both: yes)"
    )
    # The advice for flax is in the headline already; torch's is not.
    assert lines[4:] == ["  Advice for torch: Set torch.backends.cuda.matmul.allow_tf32 = True."]
    d = result.to_dict()
    assert d["headline"] == COMPARE_HEADLINE and d["pair"]["expected_max_abs"] == 1.1e-3
    assert d["outputs"][1]["diagnosis"]["best"] == "cpu:tf32:unfused"


@pytest.mark.parametrize(
    "outputs, exc, pattern",
    [
        ({"torch": Y}, ValueError, r"^outputs: expected exactly two outputs .* got 1: \['torch'\]"),
        ({"a": Y, "b": Y, "c": Y}, ValueError, r"got 3: \['a', 'b', 'c'\]"),
        ({"torch": Y, "my flax": Y}, ValueError, r"^outputs: the name 'my flax' is not"),
        ({"torch": Y, "x" * 65: Y}, ValueError, r"is not 1 to 64 letters"),
        (
            {"torch": Y, "flax": Y[:, :4]},
            ValueError,
            r"^outputs\['flax'\]: expected shape \[4, 8\]",
        ),
        ({"torch": Y, "flax": None}, ValueError, r"^outputs\['flax'\]: expected an array"),
        ([Y, Y], TypeError, r"^outputs: expected a dict of two named outputs"),
    ],
)
def test_compare_outputs_refuses_anything_but_two_named_outputs(
    offline_client: tensorcheck.Client, outputs: Any, exc: type, pattern: str
) -> None:
    with pytest.raises(exc, match=pattern):
        offline_client.compare_outputs(X, W, B, outputs)


class _CompareStore(FakeStore):
    """The fake store, and a Compare that needs every digest stored."""

    def __init__(self) -> None:
        super().__init__()
        self.compare_requests: list[pb.CompareRequest] = []

    def Compare(self, request: pb.CompareRequest, context: grpc.ServicerContext) -> Any:
        self._log("Compare")
        self.compare_requests.append(request)
        tensors = [request.op.input, request.op.weight] + [o.tensor for o in request.observed]
        for t in tensors:
            if t.WhichOneof("source") == "digest" and t.digest not in self.blobs:
                context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"missing {t.digest}")
        return _compare_response()


def test_compare_outputs_sends_large_tensors_through_the_store() -> None:
    rng = np.random.default_rng(3)
    x = rng.standard_normal((600, 512)).astype(np.float32)  # 1.2 MiB: by digest
    w = rng.standard_normal((512, 512)).astype(np.float32)  # 1 MiB exactly: inline
    y1 = rng.standard_normal((600, 512)).astype(np.float32)
    y2 = y1 + np.float32(1e-3)
    servicer = _CompareStore()
    with serve_in_process(servicer, options=[("grpc.max_receive_message_length", 64 * MiB)]) as t:
        with tensorcheck.Client(t, timeout=TIMEOUT_S) as client:
            result = client.compare_outputs(x, w, None, {"torch": y1, "flax": y2})
    (req,) = servicer.compare_requests
    for t_, a in ((req.op.input, x), (req.observed[0].tensor, y1), (req.observed[1].tensor, y2)):
        assert t_.digest == "sha256:" + hashlib.sha256(a.tobytes()).hexdigest()
    assert req.op.weight.data == w.tobytes()
    assert [o.name for o in req.observed] == ["torch", "flax"]
    assert servicer.calls.count("UploadTensor") == 3
    assert result.uploaded_bytes == x.nbytes + y1.nbytes + y2.nbytes
    assert result.headline == COMPARE_HEADLINE


def test_a_compare_request_encodes_as_protobuf_builds_it() -> None:
    req = pb.CompareRequest(configs=["cpu:fp32"], accept=["tf32"])
    raw = encode_request(req, [("op.input", X), ("observed[torch]", Y), ("observed[flax]", Y)])
    want = pb.CompareRequest(configs=["cpu:fp32"], accept=["tf32"])
    want.op.input.dtype = pb.DTYPE_FLOAT32
    want.op.input.shape[:] = [4, 3]
    want.op.input.data = X.tobytes()
    for name in ("torch", "flax"):
        o = want.observed.add(name=name)
        o.tensor.dtype, o.tensor.data = pb.DTYPE_FLOAT32, Y.tobytes()
        o.tensor.shape[:] = [4, 8]
    assert pb.CompareRequest.FromString(raw) == want


# --- pytest shows the test's line, not the library's ---------------------------------------


_FAILING_TESTS = """
import numpy as np
import tensorcheck
from answer_server import serve_answers
from tensorcheck._model import LayerCheck, ModelReport
from tensorcheck._pb import pb
from tensorcheck._report import Report

X = np.ones((4, 3), np.float32)
W = np.ones((8, 3), np.float32)
Y = np.zeros((4, 8), np.float32)


def test_module_level():
    with serve_answers() as target:
        tensorcheck.assert_linear_parity(X, W, observed=Y, server=target, timeout=30)


def test_client_method():
    with serve_answers() as target, tensorcheck.Client(target, timeout=30) as client:
        client.assert_linear_parity(X, W, observed=Y)


def test_model():
    resp = pb.VerifyResponse(verdict=pb.VERDICT_FAIL)
    resp.diagnosis.best = "cpu:fp32:fused"
    resp.diagnosis.headline = "Not rounding: MODEL HEADLINE."
    resp.diagnosis.verdict = pb.Diagnosis.VERDICT_DEFECT
    resp.call.explained = True
    resp.call.explaining.append("cpu:fp32:fused")
    resp.call.divergence = "the server's verdict is defect"
    resp.call.bound_threshold = 3.0
    layer = LayerCheck("fc", 0, (4, 3), (8, 3), "out_in", "float32")
    layer._fill(Report.from_proto(resp))
    tensorcheck.assert_model_parity(ModelReport([layer]))
"""


def test_pytest_shows_the_failing_test_line_and_the_headline_not_library_frames(
    tmp_path: Path,
) -> None:
    (tmp_path / "test_parity.py").write_text(textwrap.dedent(_FAILING_TESTS))
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])
    )
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_parity.py"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    text = out.stdout + out.stderr
    assert out.returncode == 1, text
    assert "3 failed" in text, text

    # The answer, as the first line of each assertion's message ("E   ...").
    # Counted on the "E" lines only: pytest's short summary repeats the whole
    # message where it detects CI (the CI or BUILD_NUMBER variables) and
    # truncates it to the terminal's width elsewhere.
    def e_lines(message: str) -> int:
        return len(re.findall(rf"^E +AssertionError: {re.escape(message)}$", text, re.M))

    assert e_lines(HEADLINE) == 2, text
    assert e_lines("Not rounding: MODEL HEADLINE.") == 1, text
    # The test's own lines, and none of the library's.
    assert "tensorcheck.assert_linear_parity(X, W, observed=Y, server=target" in text
    assert "client.assert_linear_parity(X, W, observed=Y)" in text
    assert "tensorcheck.assert_model_parity(ModelReport([layer]))" in text
    library = Path(tensorcheck.__file__).parent
    assert str(library) not in text, text
    for source in (
        "raise AssertionError(format_parity_failure",
        "raise AssertionError(failure_message",
    ):
        assert source not in text, text


# --- an unreachable server ---------------------------------------------------------------


@pytest.fixture
def unused_address() -> str:
    """A loopback port nothing listens on: bound, then released."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"127.0.0.1:{port}"


def _says_where_and_how(
    e: tensorcheck.Error, address: str, method: str, source: str = "given as server="
) -> None:
    text = str(e)
    assert isinstance(e, tensorcheck.UnavailableError) and e.method == method
    assert text.startswith(
        f"UNAVAILABLE ({method}): no answer from a tensorcheck server at {address} ({source}; "
    )
    assert "TENSORCHECK_SERVER" in text and 'server="host:port"' in text
    # Never the store's RPCs, which the user did not call.
    for internal in {"FindMissingTensors", "UploadTensor", "QueryUploadStatus"} - {method}:
        assert internal not in text


def test_an_unreachable_server_is_named_with_how_to_point_elsewhere(unused_address: str) -> None:
    big = np.zeros((600, 512), np.float32)  # over 1 MiB: the store is asked first
    w = np.zeros((8, 512), np.float32)
    with tensorcheck.Client(unused_address, timeout=TIMEOUT_S) as client:
        for method, call in (
            (
                "Verify",
                lambda: client.verify_linear(big, w, observed=np.zeros((600, 8), np.float32)),
            ),
            ("Diagnose", lambda: client.diagnose_linear(X, W, B, observed=Y)),
            (
                "Verify",
                lambda: client.assert_linear_parity(
                    big, w, observed=np.zeros((600, 8), np.float32)
                ),
            ),
            (
                "Compare",
                lambda: client.compare_outputs(big, w, None, {"a": big[:, :8], "b": big[:, :8]}),
            ),
            ("GetCapabilities", client.capabilities),
            ("UploadTensor", lambda: client.upload(big)),
        ):
            with pytest.raises(tensorcheck.UnavailableError) as e:
                call()
            _says_where_and_how(e.value, unused_address, method)


def test_the_message_says_where_the_address_came_from(
    unused_address: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TENSORCHECK_SERVER", unused_address)
    with tensorcheck.Client(timeout=TIMEOUT_S) as client:
        with pytest.raises(tensorcheck.UnavailableError) as e:
            client.capabilities()
    _says_where_and_how(e.value, unused_address, "GetCapabilities", "from TENSORCHECK_SERVER")
    monkeypatch.delenv("TENSORCHECK_SERVER")
    with pytest.raises(tensorcheck.UnavailableError) as e:
        with tensorcheck.Client(timeout=TIMEOUT_S) as client:
            client.capabilities()
    if not str(e.value).startswith(
        "UNAVAILABLE (GetCapabilities): no answer from a tensorcheck server at localhost:50051"
    ):
        pytest.skip(f"something answers at localhost:50051 here: {e.value}")
    _says_where_and_how(
        e.value, "localhost:50051", "GetCapabilities", "the default: TENSORCHECK_SERVER is unset"
    )


def test_a_model_check_against_an_unreachable_server_names_it(unused_address: str) -> None:
    w = np.ones((8, 3), np.float32)
    captures = [Capture("fc", 0, X, w, None, Y)]
    report = check_captures(captures, server=unused_address, timeout=TIMEOUT_S)
    assert report.error is not None and unused_address in report.error
    assert "TENSORCHECK_SERVER" in report.error and "FindMissingTensors" not in report.error
    assert report.layers[0].status == "not_checked"


# --- server=, and the old names ----------------------------------------------------------


def test_server_is_the_address_and_target_a_deprecated_alias(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("TENSORCHECK_SERVER", raising=False)
    monkeypatch.delenv("TENSORCHECK_TARGET", raising=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the new names warn about nothing
        with tensorcheck.Client(server="a:1") as c:
            assert c.server == "a:1" and repr(c) == "tensorcheck.Client(server='a:1')"
        with tensorcheck.Client() as c:
            assert c.server == tensorcheck.DEFAULT_SERVER == "localhost:50051"
    with pytest.warns(DeprecationWarning, match="target= is deprecated: use server="):
        with tensorcheck.Client(target="b:2") as c:
            assert c.server == "b:2"
    with pytest.warns(DeprecationWarning, match="Client.target is deprecated"):
        assert c.target == "b:2"
    with pytest.raises(TypeError, match="^server: give server= or the deprecated target="):
        with pytest.warns(DeprecationWarning):
            tensorcheck.Client("a:1", target="b:2")
    assert tensorcheck.DEFAULT_TARGET == tensorcheck.DEFAULT_SERVER


def test_the_old_environment_variable_still_works_and_warns(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("TENSORCHECK_SERVER", raising=False)
    monkeypatch.setenv("TENSORCHECK_TARGET", "old:3")
    with pytest.warns(
        DeprecationWarning, match=r"\$TENSORCHECK_TARGET is deprecated: set \$TENSORCHECK_SERVER"
    ):
        with tensorcheck.Client() as c:
            assert c.server == "old:3"
    monkeypatch.setenv("TENSORCHECK_SERVER", "new:4")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with tensorcheck.Client() as c:
            assert c.server == "new:4"


def test_the_one_off_helpers_take_server_and_warn_for_target(unused_address: str) -> None:
    with pytest.warns(DeprecationWarning, match="target= is deprecated"):
        with pytest.raises(tensorcheck.UnavailableError) as e:
            tensorcheck.assert_linear_parity(X, W, B, observed=Y, target=unused_address, timeout=10)
    assert unused_address in str(e.value)
