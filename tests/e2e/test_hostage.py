"""One request cannot hold the shared server hostage (docs/reliability.md):
a cancelled or expired request stops computing, SIGTERM bounds the
process's life, readiness follows the queue, idle connections are closed,
the per-tensor limit is a flag, and the log records the status the client
actually got.

Requests go as raw bytes through generic unary calls (as in
test_robustness.py), so deadlines and cancels are the client's own. The
largest case is the one that used to compute for 9 s after its client's
deadline: 1024x4096 -> 4096 with eight configurations.
"""

from __future__ import annotations

import json
import os
import threading
import time

import numpy as np
import pytest

grpc = pytest.importorskip("grpc")
pytest.importorskip("tensorcheck")

from e2e_support import ServerProcess, free_port, gauge, running, wait_until  # noqa: E402
from tensorcheck._pb import pb  # noqa: E402

VERIFY = "/tensorcheck.v1.TensorCheck/Verify"
CAPABILITIES = "/tensorcheck.v1.TensorCheck/GetCapabilities"
HEALTH = "/grpc.health.v1.Health/Check"
# What a cancelled request may still cost, in server CPU seconds, once its
# client has its answer: the engine stops within about 100 ms of work per
# thread (two threads here), plus the time to free the request's memory.
MAX_CPU_AFTER_STOP = 0.5
EIGHT_CONFIGS = ["cpu:fp32", "cpu:tf32:fused", "cpu:bf16:fused", "cpu:bf16:unfused",
                 "cpu:fp16:fused", "cpu:fp16:unfused", "cpu:fp16acc:fused", "cpu:fp64:unfused"]


def tensor(a: np.ndarray) -> "pb.Tensor":
    return pb.Tensor(dtype=pb.DTYPE_FLOAT32, shape=list(a.shape), data=a.tobytes())


def large_request(configs: list[str] | None = None) -> bytes:
    rng = np.random.default_rng(7)
    x = rng.standard_normal((1024, 4096), dtype=np.float32)
    w = rng.standard_normal((4096, 4096), dtype=np.float32) / 64
    b = rng.standard_normal(4096, dtype=np.float32)
    return pb.VerifyRequest(
        op=pb.LinearOp(input=tensor(x), weight=tensor(w), bias=tensor(b)),
        configs=configs or EIGHT_CONFIGS).SerializeToString()


def small_request() -> bytes:
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 8), dtype=np.float32)
    w = rng.standard_normal((3, 8), dtype=np.float32)
    return pb.VerifyRequest(op=pb.LinearOp(input=tensor(x), weight=tensor(w)),
                            configs=["cpu:fp32"]).SerializeToString()


def raw_call(channel: grpc.Channel, method: str = VERIFY):
    return channel.unary_unary(method, request_serializer=lambda b: b,
                               response_deserializer=lambda b: b)


def sanitized() -> bool:
    return any(k in os.environ for k in ("ASAN_OPTIONS", "TSAN_OPTIONS"))


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def request_logs(server: ServerProcess) -> list[dict]:
    out = []
    for line in list(server.stderr):
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if entry.get("msg") == "request":
            out.append(entry)
    return out


def wait_for_log(server: ServerProcess, count: int, timeout: float = 60) -> list[dict]:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        logs = request_logs(server)
        if len(logs) >= count:
            return logs
        time.sleep(0.05)
    pytest.fail(f"fewer than {count} request log lines: {server.stderr[-5:]}")


def cpu_in_window(pid: int, seconds: float = 2.0) -> float:
    before = cpu_seconds(pid)
    time.sleep(seconds)
    return cpu_seconds(pid) - before


def health(channel: grpc.Channel, service: str = "tensorcheck.v1.TensorCheck") -> int:
    """1 SERVING, 2 NOT_SERVING (grpc.health.v1 HealthCheckResponse)."""
    name = service.encode()
    request = bytes([0x0a, len(name)]) + name if name else b""
    answer = raw_call(channel, HEALTH)(request, timeout=10)
    return answer[1] if len(answer) >= 2 else 0


@pytest.mark.parametrize("how", ["deadline", "cancel"])
def test_stopped_request_stops_computing_and_its_log_says_so(how):
    port = free_port()
    server = ServerProcess("--threads", "1", "--log-format", "json", "--metrics-port", str(port))
    try:
        data = large_request()
        with grpc.insecure_channel(server.address) as channel:
            call = raw_call(channel)
            if how == "deadline":
                with pytest.raises(grpc.RpcError) as e:
                    call(data, timeout=1.0)
                assert e.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            else:
                future = call.future(data, timeout=600)
                # Cancelled while it computes, however long its 80 MB took
                # to arrive on this machine.
                wait_until(lambda: running(port), "the request computing on the one worker")
                assert future.cancel()
            # The client has its answer: the server has at most the bound
            # left to spend on it (it used to compute for 9 more seconds).
            spent = cpu_in_window(server.proc.pid)
            if not sanitized():  # a sanitizer's own work would be measured
                assert spent <= MAX_CPU_AFTER_STOP, f"{spent:.2f} s of CPU after the {how}"
            log = wait_for_log(server, 1)[-1]
            want = "DEADLINE_EXCEEDED" if how == "deadline" else "CANCELLED"
            assert log["status"] == want, log
            assert log.get("delivered") is False, log
            # Still serving.
            raw_call(channel)(small_request(), timeout=30)
    finally:
        assert server.stop() == 0


def test_requests_without_a_deadline_are_capped_by_max_request_seconds():
    server = ServerProcess("--threads", "1", "--max-request-seconds", "0.5")
    try:
        with grpc.insecure_channel(server.address) as channel:
            with pytest.raises(grpc.RpcError) as e:
                raw_call(channel)(large_request())  # no client deadline
            assert e.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            assert "--max-request-seconds" in e.value.details()
    finally:
        assert server.stop() == 0


def test_sigterm_ends_the_process_within_the_grace_period_and_a_bound():
    grace = 1.0
    port = free_port()
    server = ServerProcess("--threads", "1", "--shutdown-grace-seconds", str(grace),
                           "--metrics-port", str(port))
    outcome: dict = {}
    data = large_request(EIGHT_CONFIGS + ["cpu:fp16acc:unfused"])

    def long_call():
        with grpc.insecure_channel(server.address) as channel:
            try:
                raw_call(channel)(data, timeout=600)
                outcome["code"] = grpc.StatusCode.OK
            except grpc.RpcError as e:
                outcome["code"], outcome["details"] = e.code(), e.details()

    t = threading.Thread(target=long_call)
    t.start()
    wait_until(lambda: running(port), "the long request computing on the one worker")
    start = time.monotonic()
    server.proc.send_signal(15)
    # The process exits by itself: grace, then the cancelled request stops
    # at its next check (TensorCheckServer::kCancelGrace is 5 s at most),
    # then gRPC stops. It used to outlive SIGTERM by minutes.
    rc = server.proc.wait(timeout=grace + 5 + 5)
    took = time.monotonic() - start
    t.join(timeout=30)
    assert rc == 0
    assert outcome.get("code") == grpc.StatusCode.CANCELLED, outcome
    assert "shutting down" in outcome.get("details", "")
    assert any("cancelling requests in flight" in line for line in server.stderr)
    print(f"exited {took:.2f} s after SIGTERM (grace {grace} s)")


def test_readiness_is_not_serving_while_the_queue_is_full_and_recovers():
    port = free_port()
    server = ServerProcess("--threads", "1", "--max-queue", "1", "--metrics-port", str(port))
    try:
        with grpc.insecure_channel(server.address) as channel:
            assert health(channel) == 1
            long_call = raw_call(channel).future(large_request(), timeout=600)
            wait_until(lambda: running(port), "the long request computing on the one worker")
            # A small request takes the one place in the queue...
            waiting = raw_call(channel).future(small_request(), timeout=600)
            wait_until(lambda: gauge(port, "tensorcheck_requests_queued") == 1,
                       "the first small request queued")
            # ... and the next is refused.
            refused = raw_call(channel).future(small_request(), timeout=600).exception(timeout=600)
            assert refused is not None and refused.code() == grpc.StatusCode.UNAVAILABLE, refused
            hint = dict(refused.trailing_metadata() or ()).get("grpc-retry-pushback-ms")
            assert hint is not None and int(hint) > 0
            assert health(channel) == 2  # readiness
            assert health(channel, "") == 1  # liveness: the server as a whole
            long_call.cancel()
            waiting.result(timeout=600)  # the queued request runs once the worker is free
            assert health(channel) == 1
    finally:
        assert server.stop() == 0


def test_idle_connections_are_closed():
    server = ServerProcess("--max-connection-idle-seconds", "1")
    try:
        states: list = []
        channel = grpc.insecure_channel(server.address)
        channel.subscribe(states.append, try_to_connect=False)
        raw_call(channel, CAPABILITIES)(b"", timeout=30)
        end = time.monotonic() + 20
        while time.monotonic() < end:
            ready = [i for i, s in enumerate(states) if s == grpc.ChannelConnectivity.READY]
            if ready and grpc.ChannelConnectivity.IDLE in states[ready[0]:]:
                break
            time.sleep(0.1)
        ready = states.index(grpc.ChannelConnectivity.READY)
        assert grpc.ChannelConnectivity.IDLE in states[ready:], states
        channel.close()
    finally:
        assert server.stop() == 0


def test_the_per_tensor_limit_is_a_flag():
    server = ServerProcess("--max-message-mb", "300", "--max-tensor-mb", "300")
    try:
        with grpc.insecure_channel(server.address) as channel:
            caps = pb.GetCapabilitiesResponse.FromString(raw_call(channel, CAPABILITIES)(b""))
            assert caps.limits.max_tensor_bytes == 300 << 20  # was capped at 256 MiB
    finally:
        assert server.stop() == 0
    server = ServerProcess("--max-message-mb", "4", "--max-tensor-mb", "1")
    try:
        w = np.zeros((4, 1 << 17), np.float32)  # 2 MiB
        x = np.zeros((1, 1 << 17), np.float32)
        req = pb.VerifyRequest(op=pb.LinearOp(input=tensor(x), weight=tensor(w)),
                               configs=["cpu:fp32"])
        with grpc.insecure_channel(server.address) as channel:
            with pytest.raises(grpc.RpcError) as e:
                raw_call(channel)(req.SerializeToString(), timeout=30)
            assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "op.weight" in e.value.details()
    finally:
        assert server.stop() == 0


def test_a_response_too_big_to_send_is_refused_before_computing():
    server = ServerProcess("--max-message-mb", "8", "--log-format", "json")
    try:
        rng = np.random.default_rng(1)
        x = rng.standard_normal((1024, 256), dtype=np.float32)
        w = rng.standard_normal((1024, 256), dtype=np.float32)
        # Five outputs of 4 MiB: 20 MiB of response against an 8 MiB limit.
        req = pb.VerifyRequest(op=pb.LinearOp(input=tensor(x), weight=tensor(w)),
                               configs=["cpu:fp32", "cpu:bf16", "cpu:tf32", "cpu:fp16"],
                               output=pb.OutputOptions(return_outputs=True))
        with grpc.insecure_channel(server.address) as channel:
            with pytest.raises(grpc.RpcError) as e:
                raw_call(channel)(req.SerializeToString(), timeout=60)
            assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "output.return_outputs" in e.value.details()
        log = wait_for_log(server, 1)[-1]
        assert log["status"] == "RESOURCE_EXHAUSTED"
    finally:
        assert server.stop() == 0
