"""The tensor store end to end (docs/api.md): the server binary on loopback,
driven by the Python client. The digest any client can compute, a restart
with --store-dir, a tensor over 2 GiB round trip with the server's memory
measured, and the 2.1 GB lm_head layer verified within 4x its weight.

The RPC-level error table (bad chunks, resume, budget, missing digests) is
tested in process by server/service/store_calls_test.cc."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import time
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
import tensorcheck
from e2e_support import ServerProcess
from tensorcheck._pb import pb

MiB = 1 << 20
# The multi-GB tests: marked big, they run in the deep check
# (TENSORCHECK_BIG_TESTS=1, scripts/test.sh --deep); the sanitizer run
# leaves them out (TENSORCHECK_SKIP_LARGE: same code paths as the small
# ones, minutes longer under ASan).
BIG = os.environ.get("TENSORCHECK_BIG_TESTS") == "1"


def large(test):
    skip_large = pytest.mark.skipif(
        bool(os.environ.get("TENSORCHECK_SKIP_LARGE")), reason="TENSORCHECK_SKIP_LARGE is set"
    )
    skip_big = pytest.mark.skipif(
        not BIG, reason="multi-GB layer: set TENSORCHECK_BIG_TESTS=1 (scripts/test.sh --deep does)"
    )
    return pytest.mark.big(skip_big(skip_large(test)))

# docs/api.md's worked example: bf16 [[1, -2], [0.5, 3]].
WORKED_BYTES = bytes.fromhex("803f00c0003f4040")
WORKED_HASH = "f3ae939bfe8dd5d00cb5acc191fd33b1a8c456d6af1341923d47b08db0719406"


def status_kib(pid: int, key: str) -> int:
    """A /proc/PID/status field in KiB (VmRSS, VmHWM)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise KeyError(key)


def reset_peak(pid: int) -> bool:
    """Resets VmHWM to the current RSS (Linux 4.0+: writing 5 to
    clear_refs); False where that is not allowed."""
    try:
        Path(f"/proc/{pid}/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def store_info(client: tensorcheck.Client) -> pb.StoreInfo:
    stub = client._stub  # the raw capabilities, counters included
    info: pb.StoreInfo = stub.GetCapabilities(pb.GetCapabilitiesRequest(), timeout=30).store
    return info


def bf16_weights(shape: tuple[int, int], seed: int) -> np.ndarray:
    """Random finite bf16 of moderate size from uint16 bit patterns, a row
    block at a time (no float64 detour, no full-size temporaries)."""
    rng = np.random.default_rng(seed)
    out = np.empty(shape, dtype=np.uint16)
    rows = max(1, (64 * MiB) // (2 * shape[1]))
    for r in range(0, shape[0], rows):
        bits = rng.integers(0, 1 << 16, size=(min(rows, shape[0] - r), shape[1]), dtype=np.uint16)
        exp = ((bits >> 7) & 3) + 121  # 2^-6 .. 2^-3
        bits &= 0x807F
        bits |= exp.astype(np.uint16) << 7
        out[r : r + rows] = bits
    return out.view(ml_dtypes.bfloat16)


def test_worked_example_digest():
    """sha256sum, hashlib and the server agree on docs/api.md's example."""
    a = np.array([[1.0, -2.0], [0.5, 3.0]], dtype=ml_dtypes.bfloat16)
    assert a.tobytes() == WORKED_BYTES
    assert hashlib.sha256(WORKED_BYTES).hexdigest() == WORKED_HASH
    if shutil.which("sha256sum"):
        out = subprocess.run(["sha256sum"], input=WORKED_BYTES, capture_output=True, check=True)
        assert out.stdout.split()[0].decode() == WORKED_HASH
    server = ServerProcess()
    try:
        with tensorcheck.Client(server.address) as client:
            ref = client.upload(a)
            assert ref.digest == "sha256:" + WORKED_HASH
            assert ref.size_bytes == 8
            back = client.read_tensor(ref)
            assert back.dtype == a.dtype and back.tobytes() == WORKED_BYTES
            missing = client._stub.FindMissingTensors(
                pb.FindMissingTensorsRequest(
                    digests=[pb.TensorDigest(hash="sha256:" + WORKED_HASH, size_bytes=8)]
                ),
                timeout=30,
            )
            assert list(missing.missing_digests) == []
    finally:
        server.stop()


def blob_file(store_dir: Path, ref: tensorcheck.TensorRef) -> Path:
    return store_dir / f"sha256-{ref.digest.removeprefix('sha256:')}-{ref.size_bytes}"


def find_missing(client: tensorcheck.Client, refs) -> list[str]:
    missing = client._stub.FindMissingTensors(
        pb.FindMissingTensorsRequest(
            digests=[pb.TensorDigest(hash=r.digest, size_bytes=r.size_bytes) for r in refs]
        ),
        timeout=30,
    )
    return [d.hash for d in missing.missing_digests]


def test_restart_with_store_dir_keeps_tensors_and_drops_a_corrupt_file(tmp_path):
    """A restart lists the directory without reading it; a corrupt file is
    found at its tensor's first use, deleted, logged, never served, and a
    request naming it gets the missing-tensors error the clients answer by
    uploading it again (docs/api.md, "The store itself")."""
    store_dir = tmp_path / "store"
    a = bf16_weights((512, 1024), seed=1)  # 1 MiB each
    b = bf16_weights((512, 1024), seed=2)
    w = bf16_weights((1024, 1024), seed=3)  # 2 MiB: goes by digest
    x = bf16_weights((4, 1024), seed=4)
    server = ServerProcess("--store-dir", str(store_dir))
    try:
        with tensorcheck.Client(server.address) as client:
            ra, rb, rw = client.upload(a), client.upload(b), client.upload(w)
            assert store_info(client).persistent
    finally:
        assert server.stop() == 0
    # A flipped byte in b's and w's files: dropped at first use, never served.
    for ref in (rb, rw):
        f = blob_file(store_dir, ref)
        assert f.is_file(), sorted(p.name for p in store_dir.iterdir())
        data = bytearray(f.read_bytes())
        data[12345] ^= 1
        f.write_bytes(bytes(data))
    server = ServerProcess("--store-dir", str(store_dir))
    try:
        with tensorcheck.Client(server.address) as client:
            assert store_info(client).tensor_count == 3  # listed, not read yet
            assert np.array_equal(client.read_tensor(ra).view(np.uint16), a.view(np.uint16))
            with pytest.raises(tensorcheck.NotFoundError):
                client.read_tensor(rb)
            assert find_missing(client, (ra, rb)) == [rb.digest]
            # w: "present", then missing when the request reads it; the
            # client uploads it again and the request goes through.
            r = client.verify_linear(x, w, configs=["cpu:bf16:fused"])
            assert r.uploaded_bytes == w.nbytes
            assert r.results[0].vs_reference.total == 4 * 1024
        dropped = [line for line in server.stderr + server.stdout if "store file dropped" in line]
        assert len(dropped) == 2, dropped
    finally:
        server.stop()
    assert not blob_file(store_dir, rb).exists()
    assert blob_file(store_dir, rw).is_file()  # the good bytes, uploaded again


def test_restart_with_a_smaller_budget_keeps_the_most_recently_used(tmp_path):
    """Four tensors used in a known order; restarted with --store-bytes for
    two, the two used last stay and the others' files are deleted."""
    store_dir = tmp_path / "store"
    arrays = [bf16_weights((512, 1024), seed=10 + i) for i in range(4)]  # 1 MiB each
    use = [2, 0, 3, 1]  # least recently used first
    server = ServerProcess("--store-dir", str(store_dir), "--store-bytes", str(4 * MiB))
    try:
        with tensorcheck.Client(server.address) as client:
            refs = [client.upload(arr) for arr in arrays]
            for i in use:
                client.read_tensor(refs[i])
    finally:
        assert server.stop() == 0
    server = ServerProcess("--store-dir", str(store_dir), "--store-bytes", str(2 * MiB))
    try:
        with tensorcheck.Client(server.address) as client:
            missing = set(find_missing(client, refs))
            kept = [i for i in range(4) if refs[i].digest not in missing]
            assert sorted(kept) == sorted(use[-2:])
            for i in kept:
                back = client.read_tensor(refs[i]).view(np.uint16)
                assert np.array_equal(back, arrays[i].view(np.uint16))
        evicted = [line for line in server.stderr + server.stdout if "evicted at start" in line]
        assert len(evicted) == 2, evicted
    finally:
        server.stop()
    on_disk = [i for i in range(4) if blob_file(store_dir, refs[i]).exists()]
    assert sorted(on_disk) == sorted(use[-2:])


@large
def test_a_tensor_over_2_gib_round_trips_in_bounded_server_memory():
    """2 GiB + 1 KiB up and back, the bytes checked by hash; the server's
    peak RSS during the upload at most 1.25x the tensor over its idle RSS
    (the bytes are held once: no copy for the message, none for the
    store)."""
    size = (2 << 30) + 1024
    # Any bit patterns: the store keeps bytes (NaNs included).
    data = np.frombuffer(np.random.default_rng(3).bytes(size), dtype=np.float32)
    server = ServerProcess("--store-bytes", str(3 << 30))
    try:
        pid = server.proc.pid
        with tensorcheck.Client(server.address, timeout=600) as client:
            store_info(client)  # the server has started every thread it keeps
            idle = status_kib(pid, "VmRSS")
            exact_peak = reset_peak(pid)
            ref = client.upload(data)
            peak = status_kib(pid, "VmHWM")
            assert ref.size_bytes == size
            assert ref.digest == "sha256:" + hashlib.sha256(data).hexdigest()
            if exact_peak:
                assert (peak - idle) * 1024 <= 1.25 * size, (idle, peak)
            back = client.read_tensor(ref)
            assert back.nbytes == size
            assert hashlib.sha256(back).hexdigest() == ref.digest.removeprefix("sha256:")
    finally:
        server.stop()


@large
def test_lm_head_verifies_within_four_times_its_weight():
    """Llama-3-70B's lm_head (8192 -> 128256, bf16: 2.1 GB), M = 4, against
    the default cpu:fp64 reference on the CPU backend: the server's peak
    RSS at most 4x the weight's bytes (docs/performance.md)."""
    m, n, k = 4, 128256, 8192
    server = ServerProcess()
    try:
        pid = server.proc.pid
        with tensorcheck.Client(server.address, timeout=1800) as client:
            w = bf16_weights((n, k), seed=n)
            x = bf16_weights((m, k), seed=1)
            b = bf16_weights((1, n), seed=2)[0]
            t0 = time.monotonic()
            r = client.verify_linear(x, w, b, configs=["cpu:bf16:fused"])
            t1 = time.monotonic()
            assert r.uploaded_bytes == w.nbytes  # x (64 KiB) and b (250 KiB) go inline
            stats = r.results[0].vs_reference
            assert stats is not None and stats.total == m * n
            peak = status_kib(pid, "VmHWM") * 1024
            print(
                f"\n[lm_head {w.nbytes / 1e9:.2f} GB] verify {t1 - t0:.1f}s, "
                f"server peak RSS {peak / 1e9:.2f} GB = {peak / w.nbytes:.2f}x the weight"
            )
            assert peak <= 4 * w.nbytes
    finally:
        server.stop()


def test_no_store_server_still_verifies_inline():
    server = ServerProcess("--store-bytes", "0")
    try:
        with tensorcheck.Client(server.address) as client:
            x = bf16_weights((4, 1024), seed=5)
            w = bf16_weights((1024, 1024), seed=6)  # 2 MiB: would go by digest
            r = client.verify_linear(x, w, configs=["cpu:bf16:fused"])
            assert r.uploaded_bytes == 0
            assert r.results[0].vs_reference.total == 4 * 1024
            assert not store_info(client).present
    finally:
        server.stop()
