"""The reference a call sends: none unless the caller names one, so the
server applies its own default (the fp64 configuration of its fastest
backend); a named one travels as given. An in-process fake server records
each request as it arrived on the wire; no real server is needed."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import grpc
import numpy as np
import pytest

import tensorcheck
from in_process_server import serve_in_process
from tensorcheck._pb import pb, pb_grpc


class RecordingServer(pb_grpc.TensorCheckServicer):
    """Keeps every Verify and Diagnose request and answers with `verdict`."""

    def __init__(self) -> None:
        self.verdict = pb.VERDICT_PASS
        self.requests: list[tuple[str, pb.VerifyRequest]] = []
        self._lock = threading.Lock()

    def _record(self, method: str, request: pb.VerifyRequest) -> pb.VerifyResponse:
        with self._lock:
            self.requests.append((method, request))
        return pb.VerifyResponse(verdict=self.verdict, output_shape=[2, 3])

    def Verify(self, request: pb.VerifyRequest, context: grpc.ServicerContext) -> object:
        return self._record("Verify", request)

    def Diagnose(self, request: pb.VerifyRequest, context: grpc.ServicerContext) -> object:
        return self._record("Diagnose", request)


@pytest.fixture
def recorded() -> Iterator[tuple[RecordingServer, tensorcheck.Client]]:
    servicer = RecordingServer()
    with serve_in_process(servicer, workers=2) as target:
        with tensorcheck.Client(target, timeout=30) as client:
            yield servicer, client


# Small enough to travel inline: the fake has no tensor store.
X = np.ones((2, 4), np.float32)
W = np.ones((3, 4), np.float32)
Y = np.full((2, 3), 4.0, np.float32)

CALLS = {
    "verify_linear": lambda c, **kw: c.verify_linear(X, W, observed=Y, **kw),
    "diagnose_linear": lambda c, **kw: c.diagnose_linear(X, W, observed=Y, **kw),
    "assert_linear_parity": lambda c, **kw: c.assert_linear_parity(X, W, observed=Y, **kw),
}


@pytest.mark.parametrize("call", CALLS)
def test_a_call_without_reference_sends_none(recorded, call):
    servicer, client = recorded
    CALLS[call](client)
    assert len(servicer.requests) == 1
    method, req = servicer.requests[0]
    assert method == ("Diagnose" if call == "diagnose_linear" else "Verify")
    assert req.reference == ""


@pytest.mark.parametrize("call", CALLS)
def test_a_named_reference_is_sent_as_given(recorded, call):
    servicer, client = recorded
    CALLS[call](client, reference="cpu:fp32")
    assert [req.reference for _, req in servicer.requests] == ["cpu:fp32"]


@pytest.mark.parametrize("reference, sent", [(None, ""), ("cpu:fp32", "cpu:fp32")])
def test_the_diagnosis_after_a_failed_parity_check_sends_the_same_reference(
    recorded, reference, sent
):
    servicer, client = recorded
    servicer.verdict = pb.VERDICT_FAIL
    with pytest.raises(AssertionError):
        client.assert_linear_parity(X, W, observed=Y, reference=reference)
    assert [(m, req.reference) for m, req in servicer.requests] == [
        ("Verify", sent),
        ("Diagnose", sent),
    ]


def test_the_one_off_assert_linear_parity_sends_no_reference_by_default(recorded):
    servicer, client = recorded
    tensorcheck.assert_linear_parity(X, W, observed=Y, server=client.server)
    assert [req.reference for _, req in servicer.requests] == [""]
