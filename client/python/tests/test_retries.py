"""The client honours the server's retry hint (`grpc-retry-pushback-ms`).

An in-process fake server refuses the first N calls with a status code and,
optionally, the hint, then answers. No real server is needed. Waits are
checked from below only (the client must wait at least what the server
asked); nothing here bounds how long a call may take.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Optional

import grpc
import numpy as np
import pytest

import tensorcheck
from in_process_server import serve_in_process
from tensorcheck._errors import retry_after_from_metadata
from tensorcheck._pb import pb, pb_grpc

PUSHBACK_KEY = "grpc-retry-pushback-ms"
# gRPC sends a deadline under 10 s (grpc-timeout) rounded up to about 10 ms;
# longer ones are rounded more coarsely. What a server sees may exceed the
# call's timeout by that much.
WIRE_ROUNDING = 0.020


class RefusingServer(pb_grpc.TensorCheckServicer):
    """Refuses the first `refusals` calls with `code` (and the pushback
    metadata when `pushback_ms` is not None), then answers. Records each
    call's remaining deadline as the server saw it."""

    def __init__(self) -> None:
        self.refusals = 0
        self.code = grpc.StatusCode.UNAVAILABLE
        self.pushback_ms: Optional[str] = "50"
        self.calls = 0
        self.remaining: list[Optional[float]] = []
        self._lock = threading.Lock()

    def _answer(self, context: grpc.ServicerContext, response: object) -> object:
        with self._lock:
            self.calls += 1
            n = self.calls
            self.remaining.append(context.time_remaining())
        if n <= self.refusals:
            if self.pushback_ms is not None:
                context.set_trailing_metadata(((PUSHBACK_KEY, self.pushback_ms),))
                context.abort(self.code, f"server busy; retry after {self.pushback_ms} ms")
            context.abort(self.code, "refused")
        return response

    def Verify(self, request: pb.VerifyRequest, context: grpc.ServicerContext) -> object:
        return self._answer(context, pb.VerifyResponse(verdict=pb.VERDICT_PASS))

    def GetCapabilities(
        self, request: pb.GetCapabilitiesRequest, context: grpc.ServicerContext
    ) -> object:
        return self._answer(context, pb.GetCapabilitiesResponse(server_version="fake"))


@pytest.fixture
def fake() -> Iterator[tuple[RefusingServer, str]]:
    servicer = RefusingServer()
    with serve_in_process(servicer) as target:
        yield servicer, target


TRANSIENT = [grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED]


@pytest.mark.parametrize("code", TRANSIENT, ids=lambda c: c.name)
def test_refusals_with_pushback_are_retried_until_answered(fake, code):
    servicer, target = fake
    servicer.refusals, servicer.code, servicer.pushback_ms = 2, code, "50"
    with tensorcheck.Client(target, timeout=30) as client:
        start = time.monotonic()
        caps = client.capabilities()
        elapsed = time.monotonic() - start
    assert caps.server_version == "fake"
    assert servicer.calls == 3  # two refusals, two retries, one answer
    assert elapsed >= 2 * 0.050  # it waited the hint before each retry


def test_verify_is_retried_like_every_call(fake):
    servicer, target = fake
    servicer.refusals = 1
    x = np.ones((2, 4), np.float32)
    w = np.ones((3, 4), np.float32)
    with tensorcheck.Client(target, timeout=30) as client:
        report = client.verify_linear(x, w, configs=["cpu:fp32"])
    assert report.passed
    assert servicer.calls == 2


def test_retries_stop_at_max_retries_and_raise_the_last_refusal(fake):
    servicer, target = fake
    servicer.refusals, servicer.pushback_ms = 100, "40"
    with tensorcheck.Client(target, timeout=30, max_retries=2) as client:
        start = time.monotonic()
        with pytest.raises(tensorcheck.UnavailableError) as info:
            client.capabilities()
        elapsed = time.monotonic() - start
    assert servicer.calls == 3
    assert elapsed >= 2 * 0.040
    err = info.value
    assert err.retry_after == pytest.approx(0.040)
    assert err.method == "GetCapabilities"
    assert "retry after 40 ms" in err.message


def test_max_retries_zero_disables_retries(fake):
    servicer, target = fake
    servicer.refusals = 1
    with tensorcheck.Client(target, timeout=30, max_retries=0) as client:
        with pytest.raises(tensorcheck.UnavailableError) as info:
            client.capabilities()
    assert servicer.calls == 1
    assert info.value.retry_after == pytest.approx(0.050)


@pytest.mark.parametrize("code", TRANSIENT, ids=lambda c: c.name)
def test_a_refusal_without_pushback_is_not_retried(fake, code):
    # E.g. RESOURCE_EXHAUSTED for a tensor over the per-tensor limit:
    # permanent, sending it again cannot help.
    servicer, target = fake
    servicer.refusals, servicer.code, servicer.pushback_ms = 1, code, None
    with tensorcheck.Client(target, timeout=30) as client:
        with pytest.raises(tensorcheck.Error) as info:
            client.capabilities()
    assert servicer.calls == 1
    assert info.value.code == code
    assert info.value.retry_after is None


@pytest.mark.parametrize(
    "code",
    [grpc.StatusCode.INTERNAL, grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.ABORTED],
    ids=lambda c: c.name,
)
def test_other_codes_are_not_retried_even_with_pushback(fake, code):
    servicer, target = fake
    servicer.refusals, servicer.code = 1, code
    with tensorcheck.Client(target, timeout=30) as client:
        with pytest.raises(tensorcheck.Error) as info:
            client.capabilities()
    assert servicer.calls == 1
    assert info.value.code == code
    assert info.value.retry_after == pytest.approx(0.050)  # reported, not acted on


def test_a_wait_that_would_end_past_the_deadline_raises_the_refusal(fake):
    servicer, target = fake
    servicer.refusals, servicer.pushback_ms = 1, "5000"
    with tensorcheck.Client(target, timeout=1.0) as client:
        with pytest.raises(tensorcheck.UnavailableError) as info:
            client.capabilities()
    assert servicer.calls == 1
    assert info.value.retry_after == pytest.approx(5.0)


def test_retries_stop_at_the_calls_timeout(fake):
    servicer, target = fake
    servicer.refusals, servicer.pushback_ms = 1000, "100"
    with tensorcheck.Client(target, max_retries=1000) as client:
        with pytest.raises((tensorcheck.UnavailableError, tensorcheck.DeadlineExceededError)):
            client.capabilities(timeout=0.45)
    # Each wait is at least 100 ms and ends before the 450 ms deadline: at
    # most four waits, so at most five attempts, each sent what is left of
    # the one deadline (never a fresh 450 ms).
    assert 1 <= servicer.calls <= 5
    for waits, r in enumerate(servicer.remaining):
        assert r is not None and r <= 0.45 - 0.100 * waits + WIRE_ROUNDING, servicer.remaining


def test_retries_share_the_calls_deadline(fake):
    # Each attempt gets what is left of the one deadline, not a fresh one.
    servicer, target = fake
    servicer.refusals, servicer.pushback_ms = 2, "200"
    with tensorcheck.Client(target) as client:
        client.capabilities(timeout=3)  # under 10 s: see WIRE_ROUNDING
    assert servicer.calls == 3
    remaining = servicer.remaining
    for before, after in zip(remaining, remaining[1:]):
        assert before is not None and after is not None
        # At least the 200 ms hint passed between the attempts.
        assert after <= before - 0.200 + WIRE_ROUNDING, remaining


def test_no_timeout_means_no_deadline_on_retries(fake):
    servicer, target = fake
    servicer.refusals, servicer.pushback_ms = 1, "10"
    with tensorcheck.Client(target) as client:
        client.capabilities()
    assert servicer.calls == 2
    assert servicer.remaining[1] is None or servicer.remaining[1] > 1e6


@pytest.mark.parametrize(
    "metadata, expected",
    [
        ([(PUSHBACK_KEY, "250")], 0.25),
        ([(PUSHBACK_KEY, "0")], 0.0),
        ([("other", "1"), (PUSHBACK_KEY, b"100")], 0.1),
        ([(PUSHBACK_KEY, " 7 ")], 0.007),
        ([(PUSHBACK_KEY, "-5")], None),  # gRPC's own retries read negative as "do not retry"
        ([(PUSHBACK_KEY, "1.5")], None),
        ([(PUSHBACK_KEY, "soon")], None),
        ([(PUSHBACK_KEY, "")], None),
        ([("other", "1")], None),
        ([], None),
        (None, None),
    ],
)
def test_retry_after_is_read_from_the_pushback_metadata(metadata, expected):
    got = retry_after_from_metadata(metadata)
    if expected is None:
        assert got is None
    else:
        assert got == pytest.approx(expected)


def test_errors_made_by_hand_have_no_retry_hint():
    assert tensorcheck.UnavailableError("m").retry_after is None
    err = tensorcheck.ResourceExhaustedError("m", retry_after=0.2)
    assert err.retry_after == 0.2 and err.code == grpc.StatusCode.RESOURCE_EXHAUSTED


@pytest.mark.parametrize(
    "value, exc", [(-1, ValueError), (1.5, TypeError), ("3", TypeError), (True, TypeError)]
)
def test_max_retries_is_checked(value, exc):
    with pytest.raises(exc, match="max_retries"):
        tensorcheck.Client("127.0.0.1:1", max_retries=value)
