"""The server process: flags, JSON logs, health, and a graceful drain.

Each test starts its own tensorcheck-server (TENSORCHECK_SERVER_BIN, default
<repo>/build/server/tensorcheck-server) on a free loopback port and talks to
it with the Python client (installed into the venv by scripts/setup.sh).
"""

from __future__ import annotations

import json
import signal
import time
from concurrent import futures

import numpy as np
import pytest

grpc = pytest.importorskip("grpc")
tensorcheck = pytest.importorskip("tensorcheck")

from e2e_support import ServerProcess as Server  # noqa: E402
from e2e_support import free_port, running, wait_until  # noqa: E402

def health(address: str) -> int:
    """grpc.health.v1.Health/Check with an empty request; the status enum."""
    with grpc.insecure_channel(address) as channel:
        check = channel.unary_unary("/grpc.health.v1.Health/Check",
                                    request_serializer=lambda b: b,
                                    response_deserializer=lambda b: b)
        reply = check(b"", timeout=10)
    # HealthCheckResponse{status = 1: varint}; absent means UNKNOWN (0).
    return reply[1] if len(reply) >= 2 and reply[0] == 0x08 else 0


def problem(m: int, k: int, n: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((m, k), dtype=np.float32)
    w = (rng.standard_normal((n, k)) / np.sqrt(k)).astype(np.float32)
    return x, w


def test_port_zero_prints_the_address_and_health_is_serving():
    server = Server()
    try:
        assert server.stdout[0] == f"listening on {server.address}"
        assert health(server.address) == 1  # SERVING
    finally:
        assert server.stop() == 0


def test_json_log_has_one_line_per_request_with_method_shapes_and_status():
    server = Server("--log-format", "json", "--log-level", "info")
    try:
        x, w = problem(3, 16, 4)
        with tensorcheck.Client(server.address) as client:
            client.verify_linear(x, w, configs=["cpu:fp32", "cpu:tf32"])
            with pytest.raises(tensorcheck.InvalidArgumentError):
                client.verify_linear(x, w, configs=["cpu:fp33"])
    finally:
        assert server.stop() == 0
    records = [json.loads(line) for line in server.stderr if line.strip()]
    requests = [r for r in records if r.get("msg") == "request"]
    assert len(requests) == 2, server.stderr
    ok, bad = requests
    assert ok["method"] == "Verify" and ok["status"] == "OK"
    assert ok["configs"] == "cpu:fp32,cpu:tf32"
    assert ok["input"] == "[3, 16]" and ok["weight"] == "[4, 16]"
    assert isinstance(ok["elapsed_ms"], (int, float))
    assert bad["status"] == "INVALID_ARGUMENT" and "configs[0]" in bad["error"]
    # Each call has its own id (docs/api.md, "Request ids").
    assert len(ok["request_id"]) == 32 and ok["request_id"] != bad["request_id"]
    assert all({"time", "level", "msg"} <= set(r) for r in records)


def test_max_message_mb_bounds_requests():
    server = Server("--max-message-mb", "1")
    try:
        x, w = problem(4, 512, 1024)  # the weight alone is 2 MiB
        with tensorcheck.Client(server.address) as client:
            with pytest.raises(tensorcheck.ResourceExhaustedError):
                client.verify_linear(x, w)
            small = client.verify_linear(*problem(2, 8, 3))
            assert small.passed
    finally:
        assert server.stop() == 0


def test_sigterm_drains_in_flight_requests_refuses_new_ones_and_exits_zero():
    port = free_port()
    server = Server("--threads", "1", "--shutdown-grace-seconds", "60", "--metrics-port", str(port))
    x, w = problem(64, 512, 512, seed=3)
    try:
        with tensorcheck.Client(server.address, timeout=120) as client:
            # Size the slow request to a few seconds on this machine (the
            # fastest of three calibration runs, so a loaded machine does
            # not shrink it).
            one = 1e9
            for _ in range(3):
                start = time.monotonic()
                client.verify_linear(x, w, configs=["cpu:fp16acc"])
                one = min(one, max(time.monotonic() - start, 1e-3))
            repeat = int(min(100, max(5, 3.0 / one)))
            with futures.ThreadPoolExecutor(1) as pool:
                slow = pool.submit(client.verify_linear, x, w,
                                   configs=["cpu:fp16acc"], repeat=repeat)
                wait_until(lambda: running(port), "the slow request computing")
                server.proc.send_signal(signal.SIGTERM)
                # Draining: new work is refused, health is NOT_SERVING.
                deadline = time.monotonic() + 300  # ends a hang only
                refused = None
                while time.monotonic() < deadline and refused is None:
                    try:
                        client.verify_linear(*problem(2, 8, 3))
                    except tensorcheck.Error as e:
                        refused = e
                    time.sleep(0.05)
                assert isinstance(refused, tensorcheck.UnavailableError), refused
                report = slow.result(timeout=120)
                assert report.results[0].runs == repeat
                assert report.results[0].deterministic
    finally:
        code = server.stop()
    assert code == 0
    assert any("draining" in line for line in server.stderr)
