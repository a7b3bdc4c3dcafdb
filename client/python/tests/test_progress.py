"""progress=: the phases of a call (hashing, uploading, diagnosing), how
far each got and how long it took, against the in-process fake store."""

from __future__ import annotations

import re
import sys
import threading
import types
from collections.abc import Iterator
from typing import Any

import grpc
import numpy as np
import pytest

import tensorcheck
from in_process_server import serve_in_process
from tensorcheck._pb import pb
from test_store import FakeStore

MiB = 1 << 20
TIMEOUT_S = 30

RNG = np.random.default_rng(11)
# x and observed above 1 MiB (by digest), the weight 1 MiB exactly (inline).
X = RNG.standard_normal((600, 512)).astype(np.float32)
W = RNG.standard_normal((512, 512)).astype(np.float32)
Y = RNG.standard_normal((600, 512)).astype(np.float32)
LARGE = X.nbytes + Y.nbytes  # computed here, not by the client


class _CompareStore(FakeStore):
    def Compare(self, request: pb.CompareRequest, context: Any) -> pb.CompareResponse:
        return pb.CompareResponse(headline="A sentence of the server's.")


@pytest.fixture
def target() -> Iterator[str]:
    with serve_in_process(
        _CompareStore(), workers=8, options=[("grpc.max_receive_message_length", 64 * MiB)]
    ) as t:
        yield t


class _Record:
    def __init__(self) -> None:
        self.calls: list[tuple[str, int, int]] = []
        self.lock = threading.Lock()

    def __call__(self, phase: str, done: int, total: int) -> None:
        with self.lock:
            self.calls.append((phase, done, total))

    def phases(self) -> list[str]:
        return list(dict.fromkeys(p for p, _, _ in self.calls))

    def of(self, phase: str) -> list[tuple[int, int]]:
        return [(d, t) for p, d, t in self.calls if p == phase]


def test_a_callable_receives_each_phase_from_0_to_its_total(target: str) -> None:
    rec = _Record()
    with tensorcheck.Client(target, timeout=TIMEOUT_S) as client:
        client.diagnose_linear(X, W, observed=Y, candidates=["cpu:fp32"], progress=rec)
        assert rec.phases() == ["hashing", "uploading", "diagnosing"]
        for phase, total in (("hashing", LARGE), ("uploading", LARGE), ("diagnosing", 1)):
            seen = rec.of(phase)
            assert seen[0] == (0, total) and seen[-1] == (total, total), phase
            done = [d for d, _ in seen]
            assert done == sorted(done), phase  # never backwards
        # Again: hashed (compared) again, nothing to upload.
        again = _Record()
        client.diagnose_linear(X, W, observed=Y, progress=again)
        assert again.phases() == ["hashing", "diagnosing"]
        # Small tensors: the request alone; verify_linear says "verifying".
        small = _Record()
        client.verify_linear(W[:4], W, observed=W[:4] @ W.T, progress=small)
        assert small.calls == [("verifying", 0, 1), ("verifying", 1, 1)]


def test_progress_true_without_tqdm_writes_phases_and_times_on_stderr(
    target: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "tqdm", None)  # as if not installed
    with tensorcheck.Client(target, timeout=TIMEOUT_S) as client:
        client.diagnose_linear(X, W, observed=Y, candidates=["cpu:fp32", "cpu:tf32"], progress=True)
    mib = f"{LARGE / MiB:.1f} MiB"
    seconds = r"\d+\.\d\d s"
    patterns = [
        rf"tensorcheck: hashing 2 tensors \({mib}\) \.\.\.",
        rf"tensorcheck: hashing done in {seconds}",
        rf"tensorcheck: uploading 2 tensors \({mib}\) \.\.\.",
        rf"tensorcheck: uploading done in {seconds} \({seconds} in all\)",
        # The candidates this call listed: a count the client knows.
        r"tensorcheck: diagnosing 2 candidates \.\.\.",
        rf"tensorcheck: diagnosing done in {seconds} \({seconds} in all\)",
    ]
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == len(patterns), lines
    for line, pattern in zip(lines, patterns):
        assert re.fullmatch(pattern, line), (line, pattern)


def test_no_candidate_count_when_the_server_picks_them(
    target: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "tqdm", None)
    with tensorcheck.Client(target, timeout=TIMEOUT_S) as client:
        client.diagnose_linear(W[:4], W, observed=W[:4] @ W.T, progress=True)
        client.compare_outputs(W[:4], W, None, {"a": W[:4], "b": W[:4]}, progress=True)
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == "tensorcheck: diagnosing ..."
    assert lines[2] == "tensorcheck: diagnosing 2 outputs ..."
    assert re.fullmatch(r"tensorcheck: diagnosing done in \d+\.\d\d s", lines[3])


def test_progress_true_with_tqdm_draws_a_bar_per_phase(
    target: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    bars: list[dict[str, Any]] = []

    class FakeBar:
        def __init__(self, **kw: Any) -> None:
            self.state = dict(kw, n=0, closed=False)
            bars.append(self.state)

        def update(self, n: int) -> None:
            self.state["n"] += n

        def close(self) -> None:
            self.state["closed"] = True

    monkeypatch.setitem(sys.modules, "tqdm", types.SimpleNamespace(tqdm=FakeBar))
    with tensorcheck.Client(target, timeout=TIMEOUT_S) as client:
        client.compare_outputs(X, W, None, {"torch": Y, "flax": X}, progress=True)
    hashed = LARGE + X.nbytes  # x, and both outputs
    assert [(b["desc"], b["total"], b["n"], b["unit"], b["closed"]) for b in bars] == [
        (f"tensorcheck hashing 3 tensors ({hashed / MiB:.1f} MiB)", hashed, hashed, "B", True),
        # x and the flax output have the same bytes: one upload, one digest.
        (f"tensorcheck uploading 2 tensors ({LARGE / MiB:.1f} MiB)", LARGE, LARGE, "B", True),
        ("tensorcheck diagnosing 2 outputs", 1, 1, "call", True),
    ]


class _SlowDiagnosis(FakeStore):
    """A Diagnose that answers once GetProgress was asked about it
    `polls` times; GetProgress answers the call's own x-request-id."""

    def __init__(self, polls: int) -> None:
        super().__init__()
        self.polls = polls
        self.asked = 0
        self.request_id: str | None = None
        self.cv = threading.Condition()

    def Diagnose(self, request: pb.VerifyRequest, context: Any) -> pb.VerifyResponse:
        with self.cv:
            self.request_id = dict(context.invocation_metadata()).get("x-request-id")
            self.cv.notify_all()
            self.cv.wait_for(lambda: self.asked >= self.polls, timeout=TIMEOUT_S)
        return pb.VerifyResponse(verdict=pb.VERDICT_PASS)

    def GetProgress(self, request: pb.GetProgressRequest, context: Any) -> pb.GetProgressResponse:
        with self.cv:
            if request.request_id != self.request_id:
                context.abort(grpc.StatusCode.NOT_FOUND, "no such call in flight")
            self.asked += 1
            self.cv.notify_all()
            # The reference and 4 of 12 candidates, then all 13.
            done = 5 if self.asked < self.polls else 13
        return pb.GetProgressResponse(
            method="Diagnose", phase="running the candidates", done=done, total=13
        )


def test_the_servers_phase_and_count_come_while_it_works() -> None:
    server = _SlowDiagnosis(polls=3)
    with serve_in_process(server) as t, tensorcheck.Client(t, timeout=TIMEOUT_S) as client:
        rec = _Record()
        client.diagnose_linear(W[:4], W, observed=W[:4] @ W.T, progress=rec)
    assert server.request_id is not None and len(server.request_id) == 32
    # Each answer once (the same answer twice is not repeated), between the
    # phase's start and its end.
    assert rec.calls == [
        ("diagnosing", 0, 1),
        ("diagnosing: running the candidates", 5, 13),
        ("diagnosing", 1, 1),
    ] or rec.calls == [
        ("diagnosing", 0, 1),
        ("diagnosing: running the candidates", 5, 13),
        ("diagnosing: running the candidates", 13, 13),
        ("diagnosing", 1, 1),
    ]


def test_progress_true_shows_the_servers_count_in_the_bar(monkeypatch: pytest.MonkeyPatch) -> None:
    bars: list[dict[str, Any]] = []

    class FakeBar:
        def __init__(self, **kw: Any) -> None:
            self.__dict__.update(kw, n=0, closed=False, descs=[])
            bars.append(self.__dict__)

        def update(self, n: int) -> None:
            self.n += n

        def set_description(self, desc: str, refresh: bool = True) -> None:
            self.descs.append(desc)

        def refresh(self) -> None:
            pass

        def close(self) -> None:
            self.closed = True

    monkeypatch.setitem(sys.modules, "tqdm", types.SimpleNamespace(tqdm=FakeBar))
    server = _SlowDiagnosis(polls=2)
    with serve_in_process(server) as t, tensorcheck.Client(t, timeout=TIMEOUT_S) as client:
        client.diagnose_linear(W[:4], W, observed=W[:4] @ W.T, progress=True)
    (bar,) = bars
    assert bar["descs"][0] == "tensorcheck diagnosing: running the candidates"
    assert (bar["total"], bar["n"], bar["unit"], bar["closed"]) == (13, 13, "candidate", True)


def test_a_server_without_get_progress_is_asked_once() -> None:
    # An older server answers GetProgress UNIMPLEMENTED: the client stops
    # asking, and the call goes on.
    class Older(FakeStore):
        def __init__(self) -> None:
            super().__init__()
            self.asked = 0
            self.cv = threading.Condition()

        def Diagnose(self, request: pb.VerifyRequest, context: Any) -> pb.VerifyResponse:
            with self.cv:
                self.cv.wait_for(lambda: self.asked >= 1, timeout=TIMEOUT_S)
            return pb.VerifyResponse(verdict=pb.VERDICT_PASS)

        def GetProgress(self, request: pb.GetProgressRequest, context: Any) -> Any:
            with self.cv:
                self.asked += 1
                self.cv.notify_all()
            context.abort(grpc.StatusCode.UNIMPLEMENTED, "Method not found!")

    server = Older()
    rec = _Record()
    with serve_in_process(server) as t, tensorcheck.Client(t, timeout=TIMEOUT_S) as client:
        client.diagnose_linear(W[:4], W, observed=W[:4] @ W.T, progress=rec)
    assert server.asked == 1
    assert rec.calls == [("diagnosing", 0, 1), ("diagnosing", 1, 1)]


def test_a_call_that_fails_ends_its_phase(monkeypatch: pytest.MonkeyPatch, capsys: Any) -> None:
    monkeypatch.setitem(sys.modules, "tqdm", None)
    with tensorcheck.Client("127.0.0.1:1", timeout=TIMEOUT_S) as client:
        with pytest.raises(tensorcheck.UnavailableError):
            client.diagnose_linear(W[:4], W, observed=W[:4] @ W.T, progress=True)
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == "tensorcheck: diagnosing ..."
    assert re.fullmatch(r"tensorcheck: diagnosing stopped after \d+\.\d\d s", lines[1])


def test_progress_must_be_a_bool_or_a_callable(offline_client: tensorcheck.Client) -> None:
    with pytest.raises(TypeError, match="^progress: expected None, a bool or a callable"):
        offline_client.diagnose_linear(W[:4], W, observed=W[:4], progress="yes")


class _SizeRecorder(FakeStore):
    """Records the request size each Verify, Diagnose and Compare declared
    (tensorcheck-request-bytes) beside the size that arrived."""

    def __init__(self) -> None:
        super().__init__()
        self.sizes: list[tuple[str, str | None, int]] = []

    def _record(self, method: str, request: Any, context: Any) -> None:
        declared = dict(context.invocation_metadata()).get("tensorcheck-request-bytes")
        self.sizes.append((method, declared, request.ByteSize()))

    def Verify(self, request: pb.VerifyRequest, context: Any) -> pb.VerifyResponse:
        self._record("Verify", request, context)
        return pb.VerifyResponse(verdict=pb.VERDICT_PASS)

    def Diagnose(self, request: pb.VerifyRequest, context: Any) -> pb.VerifyResponse:
        self._record("Diagnose", request, context)
        return pb.VerifyResponse(verdict=pb.VERDICT_PASS)


def test_requests_declare_their_size_for_the_servers_admission() -> None:
    # The server admits a request for its declared size before it reads it
    # (docs/api.md, "Request size"): the size must be the real one.
    server = _SizeRecorder()
    with serve_in_process(server) as t, tensorcheck.Client(t, timeout=TIMEOUT_S) as client:
        client.verify_linear(W[:4], W, configs=["cpu:fp32"])
        client.diagnose_linear(W[:4], W, observed=W[:4] @ W.T)
    assert [m for m, _, _ in server.sizes] == ["Verify", "Diagnose"]
    for method, declared, size in server.sizes:
        # The bytes sent, which the client writes itself: their length
        # prefixes may take a few more bytes than protobuf's canonical ones.
        assert declared is not None and 0 <= int(declared) - size <= 16, (method, declared, size)
