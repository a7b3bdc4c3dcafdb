"""The tensor store from the Python client (docs/api.md).

Three parts:

* without a server: digests (hashlib, `sha256sum`, the worked example of
  docs/api.md, torch/JAX tensors hashed in place), TensorRef, the
  MissingTensors status detail;
* against an in-process fake store server: what the client sends (one
  FindMissingTensors per request, uploads of the missing tensors only,
  chunks, upload ids, resuming, `already_present`, the FAILED_PRECONDITION
  retry, the fallback to inline tensors, outputs by digest);
* against the real server ($TENSORCHECK_SERVER_BIN, see conftest.py),
  skipped when that binary has no store: uploads counted with
  GetCapabilities().store, round trips, eviction, `--store-bytes 0`; and
  the big layer shapes, run only with TENSORCHECK_BIG_TESTS=1.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from typing import Optional

import grpc
import ml_dtypes
import numpy as np
import pytest
from google.protobuf import any_pb2

import tensorcheck
from in_process_server import serve_in_process
from numerics import linear64
from tensorcheck._errors import missing_tensors
from tensorcheck._pb import pb, pb_grpc
from tensorcheck._store import CHUNK_BYTES, MAX_RESUMES, byte_view, digest_of
from tensorcheck._tensors import as_array

MiB = 1 << 20
WORKED_EXAMPLE = "sha256:f3ae939bfe8dd5d00cb5acc191fd33b1a8c456d6af1341923d47b08db0719406"


def sha256(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


# --- digests, without a server ------------------------------------------------------


def test_worked_example_of_the_api_doc():
    w = np.array([[1.0, -2.0], [0.5, 3.0]], dtype=ml_dtypes.bfloat16)
    assert w.tobytes() == b"\x80\x3f\x00\xc0\x00\x3f\x40\x40"
    ref = tensorcheck.TensorRef.of(as_array(w, "w"))
    assert ref.digest == WORKED_EXAMPLE
    assert (ref.size_bytes, ref.dtype, ref.shape) == (8, "bfloat16", (2, 2))
    t = ref.to_proto()
    assert (t.dtype, list(t.shape), t.digest) == (pb.DTYPE_BFLOAT16, [2, 2], WORKED_EXAMPLE)
    assert t.WhichOneof("source") == "digest"


@pytest.mark.parametrize(
    "dtype", [np.float64, np.float32, np.float16, ml_dtypes.bfloat16], ids=lambda d: d.__name__
)
@pytest.mark.parametrize("shape", [(0,), (), (7,), (3, 5), (2, 3, 4), (513, 1025)])
def test_digest_is_sha256_of_the_wire_bytes(dtype, shape):
    rng = np.random.default_rng(1)
    a = rng.standard_normal(shape).astype(dtype)
    assert digest_of(as_array(a, "a")) == sha256(a.tobytes(order="C"))
    # A transposed (non-contiguous) view hashes as its C-order copy.
    if a.ndim == 2:
        assert digest_of(as_array(a.T, "a")) == sha256(np.ascontiguousarray(a.T).tobytes())


def test_digest_agrees_with_sha256sum():
    if shutil.which("sha256sum") is None:
        pytest.skip("sha256sum is not installed")
    a = np.random.default_rng(2).standard_normal((300, 701)).astype(np.float32)
    out = subprocess.run(
        ["sha256sum"], input=a.tobytes(), capture_output=True, check=True
    ).stdout.decode()
    assert digest_of(a) == "sha256:" + out.split()[0]
    out = subprocess.run(
        ["sha256sum"], input=b"\x80\x3f\x00\xc0\x00\x3f\x40\x40", capture_output=True, check=True
    ).stdout.decode()
    assert "sha256:" + out.split()[0] == WORKED_EXAMPLE


def test_hashing_reads_the_array_in_place():
    a = np.zeros((1024, 1024), dtype=ml_dtypes.bfloat16)
    view = np.frombuffer(byte_view(a), dtype=np.uint8)
    assert np.shares_memory(view, a)
    assert as_array(a, "a") is a  # C-contiguous little-endian: no copy at all


def test_tensor_ref_checks_itself():
    ref = tensorcheck.TensorRef(WORKED_EXAMPLE[len("sha256:") :], 8, "bfloat16", [2, 2])
    assert ref.digest == WORKED_EXAMPLE and ref.shape == (2, 2)  # prefix added, tuple
    with pytest.raises(ValueError, match="digest"):
        tensorcheck.TensorRef("sha256:ABC", 8, "bfloat16", (2, 2))
    with pytest.raises(ValueError, match="size_bytes"):
        tensorcheck.TensorRef(WORKED_EXAMPLE, 9, "bfloat16", (2, 2))
    with pytest.raises(ValueError, match="dtype"):
        tensorcheck.TensorRef(WORKED_EXAMPLE, 8, "int8", (8,))
    with pytest.raises(AttributeError):
        ref.digest = "x"  # type: ignore[misc]  # frozen


def test_jax_arrays_hash_like_their_bytes():
    jnp = pytest.importorskip("jax.numpy", reason="jax is not installed")
    for dtype in (jnp.float32, jnp.bfloat16, jnp.float16):
        x = jnp.arange(3 * 1000, dtype=jnp.float32).reshape(3, 1000).astype(dtype) / 7
        host = np.asarray(x)
        assert digest_of(as_array(x, "x")) == sha256(host.tobytes())


def test_torch_tensors_hash_in_place():
    torch = pytest.importorskip("torch", reason="torch is not installed")
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        t = (torch.arange(3 * 1000, dtype=torch.float32).reshape(3, 1000) / 7).to(dtype)
        arr = as_array(t, "t")
        # A CPU contiguous tensor is viewed, not copied (bf16 via int16).
        assert arr.__array_interface__["data"][0] == t.data_ptr()
        raw = t.view(torch.int16).numpy().tobytes() if dtype == torch.bfloat16 else t.numpy()
        assert digest_of(arr) == sha256(raw if isinstance(raw, bytes) else raw.tobytes())


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _rpc_status(code: int, message: str, details: list[any_pb2.Any]) -> bytes:
    """google.rpc.Status, encoded by hand from its three fields."""
    msg = message.encode()
    out = b"\x08" + _varint(code) + b"\x12" + _varint(len(msg)) + msg
    for d in details:
        raw = d.SerializeToString()
        out += b"\x1a" + _varint(len(raw)) + raw
    return out


def _missing_detail(items: list[tuple[str, str, int]]) -> bytes:
    m = pb.MissingTensors(
        digests=[pb.TensorDigest(hash=h, size_bytes=n) for _, h, n in items],
        fields=[f for f, _, _ in items],
    )
    other = any_pb2.Any(type_url="type.googleapis.com/google.rpc.DebugInfo", value=b"\x12\x01x")
    mine = any_pb2.Any(
        type_url="type.googleapis.com/tensorcheck.v1.MissingTensors", value=m.SerializeToString()
    )
    return _rpc_status(9, "missing", [other, mine])


def test_missing_tensors_status_detail_parses():
    h = "ab" * 32
    md = (
        ("grpc-retry-pushback-ms", "5"),
        (
            "grpc-status-details-bin",
            _missing_detail([("op.weight", "sha256:" + h, 64), ("observed", h, 8)]),
        ),
    )
    got = missing_tensors(md)
    assert got == [("op.weight", "sha256:" + h, 64), ("observed", "sha256:" + h, 8)]
    assert got[0].field == "op.weight" and got[1].size_bytes == 8
    assert missing_tensors((("grpc-status-details-bin", b"\xff\xff\xff"),)) == []
    assert missing_tensors(None) == []


def test_missing_tensors_parse_like_grpc_status():
    rpc_status = pytest.importorskip("grpc_status.rpc_status", reason="grpcio-status not installed")
    from google.rpc import status_pb2  # noqa: F401  (googleapis-common-protos)

    raw = _missing_detail([("op.input", "sha256:" + "cd" * 32, 16)])
    status = status_pb2.Status.FromString(raw)
    assert rpc_status is not None and status.code == 9
    assert missing_tensors((("grpc-status-details-bin", raw),))[0].field == "op.input"


# --- against a fake store server ---------------------------------------------------


class FakeStore(pb_grpc.TensorCheckServicer):
    """An in-memory store behind the store RPCs, and a Verify that checks
    every digest is stored (FAILED_PRECONDITION with the MissingTensors
    detail otherwise) and answers PASS. Knobs inject faults."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.blobs: dict[str, bytes] = {}
        self.partial: dict[str, bytearray] = {}
        self.has_store = True
        self.chunk_bytes = CHUNK_BYTES
        self.calls: list[str] = []
        self.chunks: list[tuple[int, int]] = []  # (offset, length) received
        self.first_messages: list[pb.UploadTensorRequest] = []
        self.verify_requests: list[pb.VerifyRequest] = []
        # Faults: break this many upload streams after `break_after` chunks.
        self.upload_breaks = 0
        self.break_after = 2
        # Read streams to break after one chunk.
        self.read_breaks = 0
        # Digests dropped from the store right before the next Verify.
        self.evict_before_verify: set[str] = set()
        # True: before every Verify, not only the next (each attempt meets
        # a store without them, as behind a balancer over replicas).
        self.keep_evicting = False
        # Limits.max_message_bytes in GetCapabilities.
        self.max_message_bytes = 256 * MiB
        # Verify returns op.input as the reference output.
        self.return_input = False
        # FindMissingTensors answers UNIMPLEMENTED although the store is
        # there (as a proxy, or a garbled request, could).
        self.find_missing_unimplemented = False

    def _log(self, name: str) -> None:
        with self.lock:
            self.calls.append(name)

    def GetCapabilities(self, request, context):
        self._log("GetCapabilities")
        r = pb.GetCapabilitiesResponse(server_version="fake", tensor_store=self.has_store)
        if self.has_store:
            r.store.present = True
            r.store.chunk_bytes = self.chunk_bytes
        r.limits.max_message_bytes = self.max_message_bytes
        return r

    def FindMissingTensors(self, request, context):
        self._log("FindMissingTensors")
        if not self.has_store or self.find_missing_unimplemented:
            context.abort(grpc.StatusCode.UNIMPLEMENTED, "no store" if not self.has_store else "")
        return pb.FindMissingTensorsResponse(
            missing_digests=[d for d in request.digests if d.hash not in self.blobs]
        )

    def UploadTensor(self, request_iterator, context):
        self._log("UploadTensor")
        first = next(request_iterator)
        self.first_messages.append(first)
        d, uid = first.digest, first.upload_id
        if d.hash in self.blobs:
            return pb.UploadTensorResponse(
                digest=d, committed_size=d.size_bytes, already_present=True
            )
        buf = self.partial.setdefault(uid, bytearray())
        n = 0
        msg: Optional[pb.UploadTensorRequest] = first
        while msg is not None:
            if msg.offset != len(buf) or len(msg.data) > self.chunk_bytes:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"bad chunk at {msg.offset}")
            if len(buf) + len(msg.data) > d.size_bytes:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, "past the declared size")
            if msg.data or msg is first:
                self.chunks.append((msg.offset, len(msg.data)))
            buf += msg.data
            n += 1
            if self.upload_breaks and n >= self.break_after:
                self.upload_breaks -= 1
                context.abort(grpc.StatusCode.UNAVAILABLE, "connection dropped (fake)")
            msg = next(request_iterator, None)
        if len(buf) != d.size_bytes:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"{len(buf)} bytes held")
        if sha256(bytes(buf)) != d.hash:
            del self.partial[uid]
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "hash mismatch")
        self.blobs[d.hash] = bytes(buf)
        del self.partial[uid]
        return pb.UploadTensorResponse(digest=d, committed_size=d.size_bytes)

    def QueryUploadStatus(self, request, context):
        self._log("QueryUploadStatus")
        if request.digest.hash in self.blobs:
            return pb.QueryUploadStatusResponse(
                committed_size=request.digest.size_bytes, complete=True
            )
        held = self.partial.get(request.upload_id, b"")
        return pb.QueryUploadStatusResponse(committed_size=len(held))

    def ReadTensor(self, request, context):
        self._log("ReadTensor")
        blob = self.blobs.get(request.digest.hash)
        if blob is None:
            context.abort(grpc.StatusCode.NOT_FOUND, "not stored")
        pos = request.offset
        sent = 0
        while pos < len(blob):
            if self.read_breaks and sent == 1:
                self.read_breaks -= 1
                context.abort(grpc.StatusCode.UNAVAILABLE, "connection dropped (fake)")
            data = blob[pos : pos + self.chunk_bytes]
            yield pb.ReadTensorResponse(offset=pos, data=data)
            pos += len(data)
            sent += 1

    def Diagnose(self, request, context):
        return self.Verify(request, context)

    def Verify(self, request, context):
        self._log("Verify")
        self.verify_requests.append(request)
        for h in self.evict_before_verify:
            self.blobs.pop(h, None)
        if not self.keep_evicting:
            self.evict_before_verify = set()
        fields = [("op.input", request.op.input), ("op.weight", request.op.weight)]
        if request.op.HasField("bias"):
            fields.append(("op.bias", request.op.bias))
        if request.HasField("observed"):
            fields.append(("observed", request.observed))
        missing = []
        for name, t in fields:
            if t.WhichOneof("source") == "digest":
                if not self.has_store:
                    context.abort(grpc.StatusCode.FAILED_PRECONDITION, "no store")
                if t.digest not in self.blobs:
                    size = int(np.prod(t.shape)) * (2 if t.dtype == pb.DTYPE_BFLOAT16 else 4)
                    missing.append((name, t.digest, size))
        if missing:
            context.set_trailing_metadata((("grpc-status-details-bin", _missing_detail(missing)),))
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"missing {missing}")
        resp = pb.VerifyResponse(verdict=pb.VERDICT_PASS)
        if request.output.return_outputs and self.return_input:
            x = request.op.input
            data = self.blobs[x.digest] if x.WhichOneof("source") == "digest" else x.data
            out = resp.reference.output
            out.dtype, out.shape[:] = x.dtype, x.shape
            limit = request.output.max_inline_output_bytes or 4 * MiB
            if len(data) > limit:
                self.blobs[sha256(data)] = data
                out.digest = sha256(data)
            else:
                out.data = data
        return resp


@pytest.fixture
def fake() -> Iterator[tuple[FakeStore, str]]:
    servicer = FakeStore()
    # A 4 MiB chunk plus its few header bytes is over gRPC's default 4 MiB
    # message limit; the real server allows 256 MiB.
    with serve_in_process(
        servicer, workers=8, options=[("grpc.max_receive_message_length", 64 * MiB)]
    ) as target:
        yield servicer, target


def _layer(m: int, k: int, n: int, dtype=np.float32, seed: int = 0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((m, k)).astype(dtype)
    w = (rng.standard_normal((n, k)) / np.sqrt(k)).astype(dtype)
    return x, w


def test_large_tensors_go_by_digest_and_only_missing_ones_are_uploaded(fake):
    store, target = fake
    x, w = _layer(4, 1024, 1500)  # x 16 KiB inline, w 6 MB by digest
    with tensorcheck.Client(target, timeout=60) as client:
        r1 = client.verify_linear(x, w)
        assert store.calls.count("FindMissingTensors") == 1
        assert store.calls.count("UploadTensor") == 1
        assert (r1.uploaded_bytes, r1.reused_bytes) == (w.nbytes, 0)
        req = store.verify_requests[-1]
        assert req.op.input.WhichOneof("source") == "data"
        assert req.op.weight.digest == sha256(w.tobytes())
        assert list(req.op.weight.shape) == [1500, 1024]
        assert store.blobs[req.op.weight.digest] == w.tobytes()

        store.calls.clear()
        r2 = client.verify_linear(x, w)
        assert store.calls == ["FindMissingTensors", "Verify"]
        assert (r2.uploaded_bytes, r2.reused_bytes) == (0, w.nbytes)
        # In the JSON object too, as in the CLI's --json (docs/json-report.md).
        assert (r2.to_dict()["uploaded_bytes"], r2.to_dict()["reused_bytes"]) == (0, w.nbytes)

        # Several large tensors: one FindMissingTensors, parallel uploads.
        store.calls.clear()
        x2, w2 = _layer(600, 1024, 1500, seed=1)
        y2 = np.zeros((600, 1500), np.float32)
        r3 = client.verify_linear(x2, w, observed=y2)
        assert store.calls.count("FindMissingTensors") == 1
        assert store.calls.count("UploadTensor") == 2  # x2 and y2; w is there
        assert r3.uploaded_bytes == x2.nbytes + y2.nbytes
        assert r3.reused_bytes == w.nbytes
        del w2


def test_small_tensors_stay_inline(fake):
    store, target = fake
    x, w = _layer(2, 512, 512)  # 1 MiB exactly: inline
    assert w.nbytes == MiB
    with tensorcheck.Client(target, timeout=60) as client:
        r = client.verify_linear(x, w, bias=np.zeros(512, np.float32))
    assert store.calls == ["Verify"]
    assert (r.uploaded_bytes, r.reused_bytes) == (0, 0)
    assert store.verify_requests[0].op.weight.WhichOneof("source") == "data"


def test_a_server_without_store_gets_tensors_inline(fake):
    store, target = fake
    store.has_store = False
    x, w = _layer(2, 1024, 1024)
    with tensorcheck.Client(target, timeout=60) as client:
        r = client.verify_linear(x, w)
        assert r.passed and (r.uploaded_bytes, r.reused_bytes) == (0, 0)
        assert store.verify_requests[-1].op.weight.data == w.tobytes()
        client.verify_linear(x, w)  # remembered: not asked again
        with pytest.raises(tensorcheck.UnimplementedError):
            client.upload(w)
    # The capabilities, not the UNIMPLEMENTED, said "no store".
    assert store.calls == [
        "FindMissingTensors",
        "GetCapabilities",
        "Verify",
        "Verify",
        "FindMissingTensors",
    ]


def test_an_unimplemented_from_a_server_with_a_store_is_raised_not_taken_for_no_store(fake):
    # E.g. a proxy, or a request the server could not read: the server's
    # capabilities say it has a store, so the client does not go inline.
    store, target = fake
    store.find_missing_unimplemented = True
    x, w = _layer(2, 1024, 1024)
    with tensorcheck.Client(target, timeout=60) as client:
        with pytest.raises(tensorcheck.UnimplementedError):
            client.verify_linear(x, w)
        assert not client._store_absent
    assert store.calls == ["FindMissingTensors", "GetCapabilities"]


def test_chunks_offsets_and_upload_ids(fake):
    store, target = fake
    store.chunk_bytes = MiB  # the server's StoreInfo.chunk_bytes is honoured
    a = np.arange(int(3.5 * MiB) // 4 + 3, dtype=np.float32)
    with tensorcheck.Client(target, timeout=60) as client:
        ref = client.upload(a)
        ref2 = client.upload(a[::-1].copy())
    assert ref.digest == sha256(a.tobytes()) and ref.size_bytes == a.nbytes
    assert ref2.digest != ref.digest
    # Chunks of at most chunk_bytes, in order, covering the tensor exactly.
    firsts = [i for i, (off, _) in enumerate(store.chunks) if off == 0]
    one = store.chunks[: firsts[1]]
    assert [n for _, n in one] == [MiB, MiB, MiB, a.nbytes - 3 * MiB]
    assert all(off == sum(n for _, n in one[:i]) for i, (off, _) in enumerate(one))
    ids = [m.upload_id for m in store.first_messages]
    assert len(set(ids)) == 2
    assert all(
        re.fullmatch(r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[0-9a-f]{4}-[0-9a-f]{12}", i)
        for i in ids
    )
    assert store.first_messages[0].digest.size_bytes == a.nbytes


def test_default_chunk_is_4_mib_even_if_the_server_allows_more(fake):
    store, target = fake
    store.chunk_bytes = 16 * MiB
    a = np.ones(9 * MiB // 4, dtype=np.float32)
    with tensorcheck.Client(target, timeout=60) as client:
        client.upload(a)
    assert [n for _, n in store.chunks] == [4 * MiB, 4 * MiB, MiB]


def test_a_broken_upload_resumes_from_the_committed_size(fake):
    store, target = fake
    store.chunk_bytes = MiB
    store.upload_breaks, store.break_after = 2, 2
    a = np.random.default_rng(3).standard_normal(5 * MiB // 4 + 11).astype(np.float32)
    with tensorcheck.Client(target, timeout=60) as client:
        ref = client.upload(a)
    assert store.blobs[ref.digest] == a.tobytes()
    assert store.calls.count("QueryUploadStatus") == 2
    assert store.calls.count("UploadTensor") == 3
    # Every byte crossed once: the resumed streams started where it broke.
    assert sum(n for _, n in store.chunks) == a.nbytes
    assert len({m.upload_id for m in store.first_messages}) == 1
    assert [m.offset for m in store.first_messages] == [0, 2 * MiB, 4 * MiB]


def test_resuming_is_bounded(fake):
    store, target = fake
    store.chunk_bytes = MiB
    store.upload_breaks, store.break_after = 1000, 1
    a = np.ones(3 * MiB // 4, dtype=np.float32)
    with tensorcheck.Client(target, timeout=60) as client:
        with pytest.raises(tensorcheck.UnavailableError):
            client.upload(a)
    assert store.calls.count("UploadTensor") == MAX_RESUMES + 1


def test_already_present_ends_the_upload_at_once(fake):
    store, target = fake
    a = np.ones(64 * MiB // 4, dtype=np.float32)
    store.blobs[sha256(a.tobytes())] = a.tobytes()  # e.g. another client
    with tensorcheck.Client(target, timeout=60) as client:
        ref = tensorcheck.TensorRef.of(a)
        start = time.monotonic()
        stored = client._uploader.upload(a, ref.tensor_digest(), deadline=time.monotonic() + 60)
        elapsed = time.monotonic() - start
        assert stored is False
        # The server read the first message only; the client stopped making
        # chunks (16 of them) and the call did not wait for them.
        assert len(store.first_messages) == 1 and store.chunks == []
        assert elapsed < 10
        assert client.capabilities().server_version == "fake"  # channel fine


def test_an_evicted_tensor_is_uploaded_again_and_the_request_retried_once(fake):
    store, target = fake
    x, w = _layer(4, 1024, 1024)
    with tensorcheck.Client(target, timeout=60) as client:
        client.verify_linear(x, w)
        store.calls.clear()
        store.evict_before_verify = {sha256(w.tobytes())}
        r = client.verify_linear(x, w)
    assert r.passed
    assert store.calls == ["FindMissingTensors", "Verify", "UploadTensor", "Verify"]
    assert (r.uploaded_bytes, r.reused_bytes) == (w.nbytes, 0)


def test_a_second_miss_resends_the_request_inline(fake):
    # Behind round_robin over replicas the re-upload and the resend can
    # reach different stores: the second miss sends the tensors inline.
    store, target = fake
    x, w = _layer(4, 1024, 1024)
    with tensorcheck.Client(target, timeout=60) as client:
        store.evict_before_verify = {sha256(w.tobytes())}
        store.keep_evicting = True
        r = client.verify_linear(x, w)
    assert r.passed
    assert store.calls == [
        "FindMissingTensors",
        "GetCapabilities",
        "UploadTensor",
        "Verify",  # miss
        "UploadTensor",
        "Verify",  # miss again
        "GetCapabilities",
        "Verify",  # inline
    ]
    assert store.verify_requests[1].op.weight.WhichOneof("source") == "digest"
    last = store.verify_requests[-1].op.weight
    assert last.WhichOneof("source") == "data" and last.data == w.tobytes()
    assert (r.uploaded_bytes, r.reused_bytes) == (2 * w.nbytes, 0)


def test_a_second_miss_over_the_message_limit_raises(fake):
    store, target = fake
    x, w = _layer(4, 1024, 1024)
    store.max_message_bytes = 2 * MiB  # w is 4 MiB
    with tensorcheck.Client(target, timeout=60) as client:
        store.evict_before_verify = {sha256(w.tobytes())}
        store.keep_evicting = True
        with pytest.raises(tensorcheck.FailedPreconditionError) as info:
            client.verify_linear(x, w)
    assert [m.digest for m in info.value.missing_tensors] == [sha256(w.tobytes())]
    assert store.calls.count("Verify") == 2
    assert all(v.op.weight.WhichOneof("source") == "digest" for v in store.verify_requests)


def test_a_missing_tensor_ref_raises_with_the_missing_tensors(fake):
    store, target = fake
    x, w = _layer(4, 1024, 1024)
    with tensorcheck.Client(target, timeout=60) as client:
        ref = client.upload(w)
        assert (ref.shape, ref.dtype, ref.size_bytes) == ((1024, 1024), "float32", w.nbytes)
        r = client.verify_linear(x, ref)
        assert (r.uploaded_bytes, r.reused_bytes) == (0, w.nbytes)
        assert store.verify_requests[-1].op.weight.digest == ref.digest
        store.blobs.clear()
        with pytest.raises(tensorcheck.FailedPreconditionError) as info:
            client.verify_linear(x, ref)
    err = info.value
    assert err.missing_tensors == [("op.weight", ref.digest, w.nbytes)]
    assert "Client.upload" in err.message


def test_tensor_refs_are_checked_like_arrays(offline_client):
    x = np.ones((2, 8), np.float32)
    ref = tensorcheck.TensorRef("sha256:" + "0" * 64, 4 * 3 * 9, "float32", (3, 9))
    with pytest.raises(ValueError, match=r"^weight: shape \[3, 9\] read as \[N, K\]"):
        offline_client.verify_linear(x, ref)
    bf = tensorcheck.TensorRef("sha256:" + "0" * 64, 2 * 3 * 8, "bfloat16", (3, 8))
    with pytest.raises(TypeError, match="^weight: dtype bfloat16 differs from x's float32"):
        offline_client.verify_linear(x, bf)


def test_outputs_returned_by_digest_are_read_back(fake):
    store, target = fake
    store.return_input = True
    store.chunk_bytes = 256 * 1024
    store.read_breaks = 1  # and a read that breaks resumes
    x = np.random.default_rng(4).standard_normal((300, 1000)).astype(ml_dtypes.bfloat16)
    w = np.ones((10, 1000), ml_dtypes.bfloat16)
    with tensorcheck.Client(target, timeout=60) as client:
        r = client.verify_linear(x, w, return_outputs=True, max_inline_output_bytes=1000)
        assert store.verify_requests[-1].output.max_inline_output_bytes == 1000
        out = r.reference.output
        assert out.dtype == ml_dtypes.bfloat16 and out.shape == x.shape
        assert out.tobytes() == x.tobytes()
        assert store.calls.count("ReadTensor") == 2
        out[0, 0] = 1  # writable
        back = client.read_tensor(tensorcheck.TensorRef.of(x))
        assert back.tobytes() == x.tobytes() and back.dtype == x.dtype
        store.blobs.clear()
        with pytest.raises(tensorcheck.NotFoundError):
            client.read_tensor(tensorcheck.TensorRef.of(x))


def test_assert_linear_parity_and_diagnose_go_through_the_store(fake):
    store, target = fake
    x, w = _layer(4, 1024, 1024)
    y = linear64(x, w).astype(np.float32)
    with tensorcheck.Client(target, timeout=60) as client:
        r = client.assert_linear_parity(x, w, observed=y)
        assert r.uploaded_bytes == w.nbytes
        d = client.diagnose_linear(x, w, observed=y)
        assert (d.uploaded_bytes, d.reused_bytes) == (0, w.nbytes)


# --- against the real server --------------------------------------------------------


def _store_info(client: tensorcheck.Client) -> tensorcheck.StoreInfo:
    caps = client.capabilities()
    if caps.store is None or not caps.store.present:
        pytest.skip("this tensorcheck-server has no tensor store (an older binary?)")
    return caps.store


def test_live_uploads_only_what_is_missing(client):
    before = _store_info(client)
    x, w = _layer(4, 2048, 1000, seed=11)  # w 8 MB
    r1 = client.verify_linear(x, w, configs=["cpu:fp32"])
    assert r1.passed
    mid = _store_info(client)
    assert mid.uploads - before.uploads == 1
    assert mid.uploaded_bytes - before.uploaded_bytes == w.nbytes
    assert (r1.uploaded_bytes, r1.reused_bytes) == (w.nbytes, 0)

    r2 = client.verify_linear(x, w, configs=["cpu:fp32"])
    after = _store_info(client)
    assert (after.uploads, after.uploaded_bytes) == (mid.uploads, mid.uploaded_bytes)
    assert (r2.uploaded_bytes, r2.reused_bytes) == (0, w.nbytes)
    assert r2.results[0].vs_reference == r1.results[0].vs_reference


@pytest.mark.parametrize(
    "shape, dtype",
    [
        ((0,), np.float32),
        ((0, 5), ml_dtypes.bfloat16),
        ((7,), ml_dtypes.bfloat16),
        ((3, 333), np.float16),
        ((1,), np.float64),
        ((3, 1 << 19), np.float32),  # 6 MiB: one and a half chunks
        ((1023, 1027), ml_dtypes.bfloat16),
    ],
)
def test_live_upload_and_read_round_trip(client, shape, dtype):
    _store_info(client)
    a = np.random.default_rng(5).standard_normal(shape).astype(dtype)
    ref = client.upload(a)
    assert ref.digest == sha256(a.tobytes()) and ref.size_bytes == a.nbytes
    assert ref.shape == shape and ref.dtype == np.dtype(dtype).name
    back = client.read_tensor(ref)
    assert back.dtype == a.dtype and back.shape == a.shape
    assert back.tobytes() == a.tobytes()
    assert client.upload(a) == ref  # already there


def test_live_worked_example_digest(client):
    _store_info(client)
    w = np.array([[1.0, -2.0], [0.5, 3.0]], dtype=ml_dtypes.bfloat16)
    ref = client.upload(w)
    assert ref.digest == WORKED_EXAMPLE
    assert client.read_tensor(ref).tobytes() == b"\x80\x3f\x00\xc0\x00\x3f\x40\x40"


def test_live_outputs_by_digest_are_read_back(client, monkeypatch):
    _store_info(client)
    reads = []
    real_read = client._uploader.read

    def counting_read(ref, **kw):
        reads.append(ref)
        return real_read(ref, **kw)

    monkeypatch.setattr(client._uploader, "read", counting_read)
    x, w = _layer(64, 256, 300, seed=12)  # outputs 64 x 300 fp32: 77 KB
    by_digest = client.verify_linear(
        x, w, configs=["cpu:fp32"], return_outputs=True, max_inline_output_bytes=1024
    )
    assert len(reads) == 2  # reference and cpu:fp32, both by digest
    assert all(r.shape == (64, 300) for r in reads)
    inline = client.verify_linear(x, w, configs=["cpu:fp32"], return_outputs=True)
    assert len(reads) == 2
    for a, b in [
        (by_digest.reference.output, inline.reference.output),
        (by_digest.results[0].output, inline.results[0].output),
    ]:
        assert a is not None and b is not None
        assert a.shape == (64, 300) and a.dtype == b.dtype
        np.testing.assert_array_equal(a, b)


@pytest.fixture(scope="module")
def has_store(client) -> None:
    """Skips when the binary predates the store (and its flags)."""
    _store_info(client)


@pytest.fixture(scope="module")
def small_store(has_store, start_server) -> Iterator[str]:
    srv = start_server("--store-bytes", str(24 * MiB))
    try:
        yield srv.target
    finally:
        srv.stop()


def test_live_retry_after_eviction(small_store):
    x, w = _layer(4, 2048, 1024, seed=13)  # w 8 MiB of a 24 MiB store
    with tensorcheck.Client(small_store, timeout=120) as client:
        _store_info(client)
        r1 = client.verify_linear(x, w, configs=["cpu:fp32"])
        assert r1.uploaded_bytes == w.nbytes
        # Three other 8 MiB tensors push w out (least recently used).
        for seed in (1, 2, 3):
            client.upload(_layer(1, 2048, 1024, seed=100 + seed)[1])
        info = _store_info(client)
        assert info.evictions >= 1
        r2 = client.verify_linear(x, w, configs=["cpu:fp32"])
        assert r2.passed and r2.uploaded_bytes == w.nbytes

        # Evicted between FindMissingTensors and the request: the server's
        # FAILED_PRECONDITION names it, the client uploads it, retries once.
        for seed in (4, 5, 6):
            client.upload(_layer(1, 2048, 1024, seed=100 + seed)[1])
        real_find = client._find_missing
        client._find_missing = lambda refs, deadline: []  # type: ignore[method-assign]
        try:
            r3 = client.verify_linear(x, w, configs=["cpu:fp32"])
        finally:
            client._find_missing = real_find  # type: ignore[method-assign]
        assert r3.passed and r3.uploaded_bytes == w.nbytes
        assert r3.results[0].vs_reference == r1.results[0].vs_reference

        # A TensorRef whose tensor was evicted: the error says which.
        ref = client.upload(w)
        for seed in (7, 8, 9):
            client.upload(_layer(1, 2048, 1024, seed=100 + seed)[1])
        with pytest.raises(tensorcheck.FailedPreconditionError) as e:
            client.verify_linear(x, ref, configs=["cpu:fp32"])
        assert [(m.field, m.digest) for m in e.value.missing_tensors] == [("op.weight", ref.digest)]


def test_live_server_without_store_verifies_inline(has_store, start_server):
    srv = start_server("--store-bytes", "0")
    try:
        with tensorcheck.Client(srv.target, timeout=120) as client:
            caps = client.capabilities()
            assert not caps.tensor_store
            x, w = _layer(4, 1024, 1024, seed=14)  # w 4 MiB
            r = client.verify_linear(x, w, configs=["cpu:fp32"])
            assert r.passed and (r.uploaded_bytes, r.reused_bytes) == (0, 0)
            with pytest.raises(tensorcheck.UnimplementedError):
                client.upload(w)
    finally:
        srv.stop()


# --- the big layer shapes -------------------------------------------------------------


def _bf16_weights(shape: tuple[int, int], seed: int) -> np.ndarray:
    """Random finite bf16 of moderate size, straight from uint16 bit
    patterns (sign and mantissa random, exponent 2^-6..2^-3), row block by
    row block: no float64 detour, no full-size temporaries."""
    rng = np.random.default_rng(seed)
    out = np.empty(shape, dtype=np.uint16)
    rows = max(1, (64 * MiB) // (2 * shape[1]))
    for r in range(0, shape[0], rows):
        bits = rng.integers(0, 1 << 16, size=(min(rows, shape[0] - r), shape[1]), dtype=np.uint16)
        exp = ((bits >> 7) & 3) + 121
        bits &= 0x807F
        bits |= exp.astype(np.uint16) << 7
        out[r : r + rows] = bits
    return out.view(ml_dtypes.bfloat16)


BIG = os.environ.get("TENSORCHECK_BIG_TESTS") == "1"


@pytest.mark.big
@pytest.mark.skipif(
    not BIG,
    reason="big layer shapes: set TENSORCHECK_BIG_TESTS=1 (about 3 minutes on 2 cores; "
    "scripts/test.sh --deep does)",
)
@pytest.mark.parametrize(
    "m, n, k",
    [(4, 28672, 8192), (4, 128256, 8192)],
    ids=["470MB", "2.1GB"],
)
def test_big_layers_end_to_end(has_store, start_server, m, n, k):
    # Extra server flags, if a test host needs them.
    srv = start_server(*os.environ.get("TENSORCHECK_BIG_SERVER_ARGS", "").split())
    try:
        with tensorcheck.Client(srv.target, timeout=1800) as client:
            _store_info(client)
            t0 = time.monotonic()
            w = _bf16_weights((n, k), seed=n)
            x = _bf16_weights((m, k), seed=1)
            t1 = time.monotonic()
            r = client.verify_linear(x, w, configs=["cpu:bf16:fused"])
            t2 = time.monotonic()
            assert r.uploaded_bytes == w.nbytes
            assert r.results[0].config.startswith("cpu:bf16")
            assert r.reference.vs_reference is not None
            stats = r.results[0].vs_reference
            assert stats is not None and stats.total == m * n
            r2 = client.verify_linear(x, w, configs=["cpu:bf16:fused"])
            t3 = time.monotonic()
            assert (r2.uploaded_bytes, r2.reused_bytes) == (0, w.nbytes)
            assert r2.results[0].vs_reference == stats
            print(
                f"\n[big {w.nbytes / 1e6:.0f} MB] generate {t1 - t0:.1f}s, "
                f"first verify (hash+upload+run) {t2 - t1:.1f}s, "
                f"second verify (hash+reuse+run) {t3 - t2:.1f}s, "
                f"verdict {r.verdict}, max_ulp {stats.max_ulp}"
            )
            del w
    finally:
        srv.stop()
