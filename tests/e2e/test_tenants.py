"""Tenants end to end (docs/operations.md, "Tenants and tokens"): the server
binary with --tokens-file on loopback, driven by the Python client and raw
stubs. Tokens are checked, rights enforced, each tenant's tensors invisible
to the others, quotas trip with a retry hint and recover, and a rewritten
tokens file takes over on SIGHUP and on its own."""

from __future__ import annotations

import hashlib
import json
import signal
import time
from pathlib import Path

import grpc
import numpy as np
import pytest
import tensorcheck
from e2e_support import ServerProcess
from tensorcheck._pb import pb, pb_grpc

MiB = 1 << 20


def sha(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def tokens_file(path: Path, tenants: list[dict]) -> Path:
    path.write_text(json.dumps({"tenants": tenants}))
    return path


TENANTS = [
    {"name": "team-a", "token_sha256": [sha("token-a")]},
    {"name": "team-b", "token_sha256": [sha("token-b")]},
    {"name": "verify-only", "token_sha256": [sha("token-v")], "rights": ["verify"]},
    {"name": "limited", "token_sha256": [sha("token-l")],
     "quota": {"requests_per_minute": 30, "stored_bytes": 3 * MiB}},
    {"name": "serial", "token_sha256": [sha("token-s")], "quota": {"concurrent_requests": 1}},
]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    path = tokens_file(tmp_path_factory.mktemp("tokens") / "tokens.json", TENANTS)
    process = ServerProcess("--tokens-file", str(path), "--log-format", "json")
    yield process
    process.stop()


def client(server: ServerProcess, token: str | None, **kw) -> tensorcheck.Client:
    return tensorcheck.Client(server.address, token=token, **kw)


def small_layer(seed: int = 0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((4, 8)).astype(np.float32)
    w = rng.standard_normal((3, 8)).astype(np.float32)
    return x, w


def missing_for(server: ServerProcess, token: str, digest: pb.TensorDigest) -> bool:
    with grpc.insecure_channel(server.address) as channel:
        stub = pb_grpc.TensorCheckStub(channel)
        resp = stub.FindMissingTensors(
            pb.FindMissingTensorsRequest(digests=[digest]),
            metadata=(("authorization", f"Bearer {token}"),), timeout=30)
    return len(resp.missing_digests) == 1


def test_no_token_or_an_unknown_one_is_unauthenticated(server):
    x, w = small_layer()
    for token in (None, "token-z", sha("token-a")):
        with client(server, token) as c:
            with pytest.raises(tensorcheck.UnauthenticatedError):
                c.verify_linear(x, w, configs=["cpu:fp32"])
            with pytest.raises(tensorcheck.UnauthenticatedError):
                c.capabilities()


def test_a_known_token_is_served(server):
    x, w = small_layer()
    with client(server, "token-a") as c:
        r = c.verify_linear(x, w, configs=["cpu:fp32"], return_outputs=True)
    ref = x.astype(np.float64) @ w.astype(np.float64).T
    np.testing.assert_allclose(r.result("cpu:fp32").output, ref, rtol=1e-5, atol=1e-5)


def test_health_answers_without_a_token(server):
    with grpc.insecure_channel(server.address) as channel:
        check = channel.unary_unary("/grpc.health.v1.Health/Check",
                                    request_serializer=lambda b: b,
                                    response_deserializer=lambda b: b)
        reply = check(b"", timeout=30)
    assert reply == b"\x08\x01"  # HealthCheckResponse{status: SERVING}


def test_a_tenant_without_the_right_is_permission_denied(server):
    x, w = small_layer()
    with client(server, "token-v") as c:
        c.verify_linear(x, w, configs=["cpu:fp32"])
        with pytest.raises(tensorcheck.PermissionDeniedError, match="'store' right"):
            c.upload(np.ones((600, 600), np.float32))
        with pytest.raises(tensorcheck.PermissionDeniedError, match="Diagnose"):
            c.diagnose_linear(x, w, observed=x @ w.T)


def test_a_tenant_cannot_see_or_use_another_tenants_tensor(server):
    rng = np.random.default_rng(7)
    w = rng.standard_normal((512, 1024)).astype(np.float32)  # 2 MiB: goes by digest
    x = rng.standard_normal((2, 1024)).astype(np.float32)
    with client(server, "token-a") as a:
        ref = a.upload(w)
        assert not missing_for(server, "token-a", ref.tensor_digest())
        np.testing.assert_array_equal(a.read_tensor(ref), w)
    # B: not there, not readable, not usable by digest alone.
    assert missing_for(server, "token-b", ref.tensor_digest())
    with client(server, "token-b") as b:
        with pytest.raises(tensorcheck.NotFoundError):
            b.read_tensor(ref)
        with pytest.raises(tensorcheck.FailedPreconditionError) as e:
            b.verify_linear(x, ref, configs=["cpu:fp32"])
        assert [m.digest for m in e.value.missing_tensors] == [ref.digest]
        # With the bytes, B uploads every one of them (no instant "present").
        before = sum('"method":"UploadTensor"' in line for line in server.stderr)
        r = b.verify_linear(x, w, configs=["cpu:fp32"], return_outputs=True)
    np.testing.assert_allclose(r.result("cpu:fp32").output,
                               x.astype(np.float64) @ w.T.astype(np.float64), rtol=1e-4, atol=1e-4)
    uploads = [json.loads(line) for line in server.stderr
               if '"method":"UploadTensor"' in line][before:]
    assert [(u["tenant"], u["received_bytes"], u["already_present"]) for u in uploads] == [
        ("team-b", w.nbytes, False)]
    assert not missing_for(server, "token-b", ref.tensor_digest())


def test_a_tenant_cannot_watch_another_tenants_call(server):
    # A's diagnosis runs; A sees its progress by its request id, B does not.
    # Valid only while the call is in flight: A's answer before and after
    # B's question shows it was; otherwise the case is run again, larger.
    rng = np.random.default_rng(8)

    def progress(token: str, rid: str) -> grpc.StatusCode:
        with grpc.insecure_channel(server.address) as channel:
            try:
                pb_grpc.TensorCheckStub(channel).GetProgress(
                    pb.GetProgressRequest(request_id=rid),
                    metadata=(("authorization", f"Bearer {token}"),), timeout=30)
            except grpc.RpcError as e:
                return e.code()
        return grpc.StatusCode.OK

    for attempt, m in enumerate((64, 256, 1024, 2048)):
        rid = f"tenants-test/{attempt}"
        x = rng.standard_normal((m, 1024)).astype(np.float32)
        w = rng.standard_normal((1024, 1024)).astype(np.float32)
        y = (x @ w.T).astype(np.float32)
        metadata = (("authorization", "Bearer token-a"), ("x-request-id", rid))
        request = pb.VerifyRequest(observed=pb.Tensor(dtype=pb.DTYPE_FLOAT32, shape=y.shape,
                                                      data=y.tobytes()))
        request.op.input.CopyFrom(pb.Tensor(dtype=pb.DTYPE_FLOAT32, shape=x.shape,
                                            data=x.tobytes()))
        request.op.weight.CopyFrom(pb.Tensor(dtype=pb.DTYPE_FLOAT32, shape=w.shape,
                                             data=w.tobytes()))
        channel = grpc.insecure_channel(server.address,
                                        options=[("grpc.max_send_message_length", 64 * MiB)])
        call = pb_grpc.TensorCheckStub(channel).Diagnose.future(request, metadata=metadata,
                                                                timeout=300)
        while not call.done() and progress("token-a", rid) != grpc.StatusCode.OK:
            pass
        b_saw = progress("token-b", rid)
        still_running = progress("token-a", rid) == grpc.StatusCode.OK
        call.result()
        channel.close()
        assert b_saw == grpc.StatusCode.NOT_FOUND
        if still_running:
            return
    pytest.fail("every diagnosis ended before it could be watched")


def test_one_concurrent_request_admits_a_sequential_client_every_time(server):
    # Each call starts once the previous answer is in: never two at once.
    # The place is freed when the answer is handed to gRPC; freed only when
    # it had been delivered, 25-37% of such calls were refused.
    x, w = small_layer(3)
    with client(server, "token-s", max_retries=0) as c:
        for _ in range(60):
            assert c.verify_linear(x, w, configs=["cpu:fp32"]).passed


def test_requests_per_minute_trip_with_a_retry_hint_and_recover(server):
    x, w = small_layer(3)
    with client(server, "token-l", max_retries=0) as c:
        # The burst: a minute's worth, and more for each 2 s the burst took
        # (a loaded machine refills while it sends), then the refusal.
        accepted = 0
        with pytest.raises(tensorcheck.ResourceExhaustedError, match="30 requests per minute") as e:
            while accepted <= 1000:
                c.verify_linear(x, w, configs=["cpu:fp32"])
                accepted += 1
        assert accepted >= 30
        # One request every 2 s refills: the hint says when.
        assert e.value.retry_after is not None and 0 < e.value.retry_after <= 2.0
        time.sleep(e.value.retry_after + 0.05)
        c.verify_linear(x, w, configs=["cpu:fp32"])
    # Another tenant was never held back.
    with client(server, "token-a", max_retries=0) as a:
        a.verify_linear(x, w, configs=["cpu:fp32"])


def test_stored_bytes_over_the_quota_drop_the_tenants_oldest_or_are_refused(server):
    rng = np.random.default_rng(11)
    t1, t2 = (rng.standard_normal((512, 512)).astype(np.float32) for _ in range(2))  # 1 MiB each
    t3 = rng.standard_normal((512, 768)).astype(np.float32)  # 1.5 MiB
    big = rng.standard_normal((1024, 1024)).astype(np.float32)  # 4 MiB > 3 MiB
    with client(server, "token-l", max_retries=0) as c:
        with pytest.raises(tensorcheck.ResourceExhaustedError, match="quota"):
            c.upload(big)
        r1, r2, r3 = c.upload(t1), c.upload(t2), c.upload(t3)
    # 3.5 MiB > 3 MiB: the tenant's least recently used (t1) made room.
    assert missing_for(server, "token-l", r1.tensor_digest())
    assert not missing_for(server, "token-l", r2.tensor_digest())
    assert not missing_for(server, "token-l", r3.tensor_digest())
    # Its capabilities show its own share of the store, not everyone's.
    with client(server, "token-l") as c:
        store = c.capabilities().store
    assert store is not None
    assert (store.budget_bytes, store.bytes_used, store.tensor_count) == (
        3 * MiB, t2.nbytes + t3.nbytes, 2)


def wait_until_accepted(process: ServerProcess, token: str) -> None:
    """Calls until the token is accepted (a minute at most: a hang)."""
    deadline = time.monotonic() + 60
    while True:
        try:
            with client(process, token) as c:
                c.capabilities()
            return
        except tensorcheck.UnauthenticatedError:
            assert time.monotonic() < deadline, process.stderr[-5:]
            time.sleep(0.05)


def test_a_rewritten_tokens_file_takes_over_on_sighup_and_when_polled(tmp_path):
    path = tokens_file(tmp_path / "tokens.json", [TENANTS[0]])
    process = ServerProcess("--tokens-file", str(path), "--credentials-reload-seconds", "0.2")
    try:
        with client(process, "token-a") as c:
            c.capabilities()
        # Rotation: a new token, the old one revoked. SIGHUP reloads at once.
        tokens_file(path, [{"name": "team-a", "token_sha256": [sha("token-a2")]}])
        process.proc.send_signal(signal.SIGHUP)
        wait_until_accepted(process, "token-a2")
        with client(process, "token-a") as c, pytest.raises(tensorcheck.UnauthenticatedError):
            c.capabilities()
        # A broken file keeps the tokens in force, and says why in the log.
        path.write_text("{not json")
        process.proc.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 60
        while not any("tokens file not reloaded" in line for line in process.stderr):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        with client(process, "token-a2") as c:
            c.capabilities()
        # Without a signal: the poll sees the change.
        tokens_file(path, [{"name": "team-a", "token_sha256": [sha("token-a3")]}])
        wait_until_accepted(process, "token-a3")
        assert process.proc.poll() is None  # SIGHUP never stopped it
    finally:
        assert process.stop() == 0


def reflect(address: str, token: str | None, request: bytes) -> bytes:
    """One grpc.reflection.v1alpha request (serialized by hand: no
    reflection package needed) and its serialized response."""
    with grpc.insecure_channel(address) as channel:
        info = channel.stream_stream(
            "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
            request_serializer=lambda b: b, response_deserializer=lambda b: b)
        metadata = (("authorization", f"Bearer {token}"),) if token else None
        return next(iter(info(iter([request]), metadata=metadata, timeout=30)))


LIST_SERVICES = b"\x3a\x00"  # ServerReflectionRequest{list_services: ""}
SYMBOL = b"\x22\x1atensorcheck.v1.TensorCheck"  # {file_containing_symbol: ...}


def test_reflection_needs_a_token_with_the_right(server):
    with pytest.raises(grpc.RpcError) as e:
        reflect(server.address, None, LIST_SERVICES)
    assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
    with pytest.raises(grpc.RpcError) as e:
        reflect(server.address, "token-v", LIST_SERVICES)
    assert e.value.code() == grpc.StatusCode.PERMISSION_DENIED
    listed = reflect(server.address, "token-a", LIST_SERVICES)
    for name in (b"tensorcheck.v1.TensorCheck", b"grpc.health.v1.Health"):
        assert name in listed
    described = reflect(server.address, "token-a", SYMBOL)
    assert b"tensorcheck/v1/tensorcheck.proto" in described
    assert b"VerifyRequest" in described


def test_reflection_is_open_on_a_server_without_tenants():
    process = ServerProcess()
    try:
        assert b"tensorcheck.v1.TensorCheck" in reflect(process.address, None, LIST_SERVICES)
    finally:
        assert process.stop() == 0
