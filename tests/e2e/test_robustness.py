"""Nothing a client sends can crash the server: mutated and hostile requests
get an error status, and the server keeps answering.

Requests go as raw bytes through a generic unary call, so even bytes that
are not a valid VerifyRequest reach the server's parser. Bounded: a few
hundred small requests, each with a deadline.
"""

from __future__ import annotations

import hashlib
import random

import numpy as np
import pytest

grpc = pytest.importorskip("grpc")
tensorcheck = pytest.importorskip("tensorcheck")

from e2e_support import ServerProcess  # noqa: E402
from tensorcheck._pb import pb, pb_grpc  # noqa: E402

VERIFY = "/tensorcheck.v1.TensorCheck/Verify"
DIAGNOSE = "/tensorcheck.v1.TensorCheck/Diagnose"


def tensor(a: np.ndarray, dtype: int) -> "pb.Tensor":
    return pb.Tensor(dtype=dtype, shape=list(a.shape), data=a.tobytes())


def valid_request() -> "pb.VerifyRequest":
    rng = np.random.default_rng(5)
    x = rng.standard_normal((3, 8), dtype=np.float32)
    w = rng.standard_normal((4, 8), dtype=np.float32)
    b = rng.standard_normal(4, dtype=np.float32)
    y = (x.astype(np.float64) @ w.T.astype(np.float64) + b).astype(np.float32)
    return pb.VerifyRequest(
        op=pb.LinearOp(input=tensor(x, pb.DTYPE_FLOAT32), weight=tensor(w, pb.DTYPE_FLOAT32),
                       bias=tensor(b, pb.DTYPE_FLOAT32)),
        observed=tensor(y, pb.DTYPE_FLOAT32), configs=["cpu:fp32", "cpu:bf16:unfused"])


def hostile_requests() -> list["pb.VerifyRequest"]:
    out = []
    for shape in ([2**31, 2**31], [2**62, 4], [-1, 8], [0, 8], [3, 0], [1] * 9, []):
        r = valid_request()
        del r.op.input.shape[:]
        r.op.input.shape.extend(shape)
        out.append(r)
    r = valid_request()
    r.op.weight.shape[:] = [2**40, 8]
    out.append(r)
    r = valid_request()
    r.configs.extend(["cpu:fp32"] * 1000)
    out.append(r)
    r = valid_request()
    r.configs[:] = ["::", "cpu:", ":fp32", "cpu:fp32:fused:extra", "\x00\xff", "a" * 10000]
    out.append(r)
    r = valid_request()
    r.output.top_k = 2**31 - 1
    out.append(r)
    r = valid_request()
    r.repeat = -5
    out.append(r)
    r = valid_request()
    r.tolerance.atol.value = float("nan")
    out.append(r)
    r = valid_request()
    r.tolerance.preset = pb.Tolerance.PRESET_BOUND
    r.tolerance.bound_factor = float("inf")
    out.append(r)
    r = valid_request()
    r.op.output_dtype = 77
    out.append(r)
    r = valid_request()
    r.observed.data = b""
    out.append(r)
    r = valid_request()
    r.op.input.digest = "sha256:" + "f" * 5000
    out.append(r)
    return out


def mutated(data: bytes, rng: random.Random) -> bytes:
    b = bytearray(data)
    kind = rng.randrange(4)
    if kind == 0 and b:  # flip bytes
        for _ in range(rng.randint(1, 8)):
            b[rng.randrange(len(b))] ^= 1 << rng.randrange(8)
    elif kind == 1:  # truncate
        del b[rng.randrange(len(b) + 1):]
    elif kind == 2 and b:  # overwrite a run with random bytes
        i = rng.randrange(len(b))
        for j in range(i, min(len(b), i + rng.randint(1, 16))):
            b[j] = rng.randrange(256)
    else:  # splice in random bytes
        i = rng.randrange(len(b) + 1)
        b[i:i] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 32)))
    return bytes(b)


def test_hostile_and_mutated_requests_get_errors_and_the_server_keeps_serving():
    server = ServerProcess()
    rng = random.Random(1234)
    seen: set[grpc.StatusCode] = set()
    try:
        with grpc.insecure_channel(server.address) as channel:
            calls = {m: channel.unary_unary(m, request_serializer=lambda b: b,
                                            response_deserializer=lambda b: b)
                     for m in (VERIFY, DIAGNOSE)}

            def send(method: str, data: bytes) -> grpc.StatusCode:
                try:
                    calls[method](data, timeout=30)
                    code = grpc.StatusCode.OK
                except grpc.RpcError as e:
                    assert e.code() != grpc.StatusCode.UNAVAILABLE, e.details()
                    # Bytes that do not parse are INVALID_ARGUMENT with a
                    # reason, never gRPC's empty UNIMPLEMENTED.
                    assert e.code() != grpc.StatusCode.UNIMPLEMENTED, data
                    assert e.details(), e.code()
                    code = e.code()
                seen.add(code)
                return code

            refusals = {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.RESOURCE_EXHAUSTED,
                        grpc.StatusCode.FAILED_PRECONDITION}
            for r in hostile_requests():
                for method in (VERIFY, DIAGNOSE):
                    assert send(method, r.SerializeToString()) in refusals, r
            base = valid_request().SerializeToString()
            for i in range(300):
                send(VERIFY if i % 2 else DIAGNOSE, mutated(base, rng))
            assert server.proc.poll() is None, "the server exited"
            # Still serving correctly.
            with tensorcheck.Client(server.address) as client:
                r = valid_request()
                x = np.frombuffer(r.op.input.data, np.float32).reshape(3, 8)
                w = np.frombuffer(r.op.weight.data, np.float32).reshape(4, 8)
                assert client.verify_linear(x, w, configs=["cpu:fp32"]).passed
    finally:
        assert server.stop() == 0
    assert {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.OK} <= seen


def test_upload_messages_that_do_not_parse_are_invalid_argument_naming_the_message():
    """UploadTensor's messages are parsed by the server too: bytes that are
    not an UploadTensorRequest end the stream INVALID_ARGUMENT with the
    reason, first message or later, and the server keeps serving."""
    server = ServerProcess()
    try:
        with grpc.insecure_channel(server.address) as channel:
            upload = channel.stream_unary(
                "/tensorcheck.v1.TensorCheck/UploadTensor",
                request_serializer=lambda b: b,
                response_deserializer=lambda b: b,
            )
            corrupt = b"\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01"
            data = bytes(range(256)) * 16
            first = pb.UploadTensorRequest(
                digest=pb.TensorDigest(
                    hash="sha256:" + hashlib.sha256(data).hexdigest(), size_bytes=len(data)
                ),
                upload_id="bad-later",
                data=data[:1024],
            ).SerializeToString()
            for messages in ([corrupt], [first, corrupt]):
                with pytest.raises(grpc.RpcError) as e:
                    upload(iter(messages), timeout=30)
                assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
                assert "not a valid tensorcheck.v1.UploadTensorRequest" in e.value.details()
            # What arrived before the bad message is kept for resuming.
            query = pb.QueryUploadStatusRequest(
                digest=pb.TensorDigest(
                    hash="sha256:" + hashlib.sha256(data).hexdigest(), size_bytes=len(data)
                ),
                upload_id="bad-later",
            )
            stub = pb_grpc.TensorCheckStub(channel)
            assert stub.QueryUploadStatus(query, timeout=30).committed_size == 1024
    finally:
        assert server.stop() == 0
