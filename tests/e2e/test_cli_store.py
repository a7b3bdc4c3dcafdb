"""The CLI and the tensor store (docs/api.md, "How the clients use it").

Tensors above 1 MiB go by digest: hashed, FindMissingTensors asked once, only
the missing ones uploaded; `tensorcheck upload` prints `sha256:` arguments;
a FAILED_PRECONDITION naming evicted tensors is retried once after uploading
them again; a server without a store gets everything inline. The retry and
the resumption of a broken upload are driven by a fake server (a Python
grpcio subprocess), everything else by the real one. The last two tests
verify a 470 MB and a 2.1 GB bf16 layer through the CLI on the CPU backend
(marked big: they run with TENSORCHECK_BIG_TESTS=1, as the deep check,
scripts/test.sh --deep, does; TENSORCHECK_SKIP_LARGE=1 leaves them out
even then).

Binaries: TENSORCHECK_SERVER_BIN and TENSORCHECK_CLI_BIN (see e2e_support.py).
"""

from __future__ import annotations

import hashlib
import json
import os
import pty
import re
import select
import shutil
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from e2e_support import CLI_BIN, REPO, ServerProcess, need_cli, run_cli

REF = re.compile(r"^sha256:([0-9a-f]{64}):(\w+):([0-9x]*)$")
MiB = 1 << 20


@pytest.fixture()
def start_server() -> Iterator:
    """Starts servers with the given flags; stops them after the test."""
    started: list[ServerProcess] = []

    def start(*flags: str) -> str:
        need_cli()
        s = ServerProcess(*flags)
        started.append(s)
        return s.address

    yield start
    for s in started:
        s.stop()


def sha256(a: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()


def store_info(addr: str) -> dict:
    r = run_cli("--server", addr, "capabilities", "--json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)["store"]


def verify_json(addr: str, *args: str, timeout: float = 180) -> dict:
    r = run_cli("--server", addr, "verify", *args, "--json", timeout=timeout)
    assert r.returncode == 0, r.stderr
    assert r.stderr == ""
    return json.loads(r.stdout)


@pytest.fixture()
def layer(tmp_path: Path) -> dict:
    """x [4, 1024] (16 KiB: inline), W [600, 1024] (2.4 MB: by digest),
    W2 and W3 alike, float32."""
    rng = np.random.default_rng(11)
    arrays = {
        "x": rng.standard_normal((4, 1024)).astype(np.float32),
        "w": (rng.standard_normal((600, 1024)) / 32).astype(np.float32),
        "w2": (rng.standard_normal((600, 1024)) / 32).astype(np.float32),
        "w3": (rng.standard_normal((600, 1024)) / 32).astype(np.float32),
    }
    files = {}
    for name, a in arrays.items():
        files[name] = str(tmp_path / f"{name}.npy")
        np.save(files[name], a)
    return {"arrays": arrays, "files": files}


def test_second_run_of_the_same_check_uploads_nothing(start_server, layer) -> None:
    addr = start_server("--store-bytes", str(64 * MiB))
    f, w = layer["files"], layer["arrays"]["w"]
    args = ("--input", f["x"], "--weight", f["w"], "--config", "cpu:fp32")
    first = verify_json(addr, *args)
    assert first["verdict"] == "pass"
    assert list(first)[-2:] == ["uploaded_bytes", "reused_bytes"]
    assert first["uploaded_bytes"] == w.nbytes  # x is 16 KiB: inline
    assert first["reused_bytes"] == 0
    info = store_info(addr)
    assert (info["uploads"], info["uploaded_bytes"]) == (1, w.nbytes)

    second = verify_json(addr, *args)
    assert second["uploaded_bytes"] == 0
    assert second["reused_bytes"] == w.nbytes
    info = store_info(addr)
    assert (info["uploads"], info["uploaded_bytes"]) == (1, w.nbytes)
    # Same tensors, same numbers, whichever way they travelled.
    assert second["results"][0]["vs_reference"] == first["results"][0]["vs_reference"]


def test_upload_prints_arguments_that_a_check_accepts(start_server, layer) -> None:
    addr = start_server("--store-bytes", str(64 * MiB))
    f, a = layer["files"], layer["arrays"]
    r = run_cli("--server", addr, "upload", f["w"], f["x"])
    assert r.returncode == 0, r.stderr
    assert r.stderr == ""
    lines = r.stdout.splitlines()
    assert len(lines) == 2
    for line, name in zip(lines, ("w", "x")):
        m = REF.match(line)
        assert m, line
        assert m.group(1) == sha256(a[name])
        assert m.group(2) == "fp32"
        assert m.group(3) == "x".join(str(d) for d in a[name].shape)
    info = store_info(addr)
    assert info["uploads"] == 2  # upload sends small tensors too

    by_digest = verify_json(addr, "--input", lines[1], "--weight", lines[0],
                            "--config", "cpu:fp32")
    assert by_digest["uploaded_bytes"] == 0
    assert by_digest["reused_bytes"] == a["w"].nbytes + a["x"].nbytes
    inline = verify_json(addr, "--input", f["x"], "--weight", f["w"], "--config", "cpu:fp32")
    assert by_digest["results"][0]["vs_reference"] == inline["results"][0]["vs_reference"]

    # Uploading again sends nothing: the store already holds both.
    again = run_cli("--server", addr, "upload", f["x"], f["w"])
    assert again.returncode == 0, again.stderr
    assert again.stdout.splitlines() == [lines[1], lines[0]]
    assert store_info(addr)["uploads"] == 2


def test_upload_of_bf16_bits_needs_dtype_and_prints_bf16(start_server, tmp_path) -> None:
    addr = start_server("--store-bytes", str(64 * MiB))
    bits = np.arange(0x3f00, 0x3f00 + 3 * 5, dtype="<u2").reshape(3, 5)
    np.save(tmp_path / "b.npy", bits)
    plain = run_cli("--server", addr, "upload", str(tmp_path / "b.npy"))
    assert plain.returncode == 2
    assert "b.npy" in plain.stderr
    r = run_cli("--server", addr, "upload", "--dtype", "bf16", str(tmp_path / "b.npy"))
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == f"sha256:{sha256(bits)}:bf16:3x5"


def test_digest_arguments_are_validated_naming_the_flag(start_server, layer) -> None:
    addr = start_server("--store-bytes", str(64 * MiB))
    f = layer["files"]
    h = "0" * 64
    cases = {
        f"sha256:{h}": "dtype and shape are missing",
        f"sha256:{h}:bf16": "shape is missing",
        f"sha256:{h[:10]}:bf16:2x2": "10 digits, not 64",
        f"sha256:{h.upper()[:-1]}A:bf16:2x2": "not lowercase hex",
        f"sha256:{h}:int8:2x2": "int8",
        f"sha256:{h}:bf16:2x-2": "shape: dimension '-2'",
    }
    for arg, why in cases.items():
        r = run_cli("--server", addr, "verify", "--input", f["x"], "--weight", arg)
        assert r.returncode == 2, (arg, r.stderr)
        assert r.stderr.startswith("tensorcheck: --weight: "), r.stderr
        assert why in r.stderr, (arg, r.stderr)
        assert "sha256:<64 lowercase hex digits>:<dtype>:<d0>x<d1>" in r.stderr

    mismatch = run_cli("--server", addr, "verify", "--input", f["x"], "--weight",
                       f"sha256:{h}:bf16:5x1024", "--dtype", "weight=fp32")
    assert mismatch.returncode == 2
    assert "--weight: the digest argument says bf16 but --dtype weight=fp32" in mismatch.stderr

    # Well formed, but never uploaded: named, with what to do.
    absent = run_cli("--server", addr, "verify", "--input", f["x"], "--weight",
                     f"sha256:{h}:fp32:5x1024")
    assert absent.returncode == 2
    assert "--weight: the server's store does not hold sha256:" + h in absent.stderr
    assert "tensorcheck upload" in absent.stderr

    up = run_cli("--server", addr, "upload", f"sha256:{h}:fp32:5x1024")
    assert up.returncode == 2
    assert "already a digest" in up.stderr


def test_evicted_tensors_are_uploaded_again(start_server, layer) -> None:
    # Room for two 2.4 MB weights, not three: the third evicts the first.
    addr = start_server("--store-bytes", str(6 * MiB))
    f, a = layer["files"], layer["arrays"]
    for name in ("w", "w2", "w3"):
        j = verify_json(addr, "--input", f["x"], "--weight", f[name])
        assert j["uploaded_bytes"] == a[name].nbytes
    info = store_info(addr)
    assert info["evictions"] >= 1
    assert info["uploads"] == 3
    j = verify_json(addr, "--input", f["x"], "--weight", f["w"])
    assert j["verdict"] == "pass"
    assert (j["uploaded_bytes"], j["reused_bytes"]) == (a["w"].nbytes, 0)
    assert store_info(addr)["uploads"] == 4


def test_server_without_a_store_gets_tensors_inline(start_server, layer) -> None:
    addr = start_server("--store-bytes", "0")
    f = layer["files"]
    info = store_info(addr)
    assert info is None or not info["present"]
    j = verify_json(addr, "--input", f["x"], "--weight", f["w"], "--config", "cpu:fp32")
    assert j["verdict"] == "pass"
    assert (j["uploaded_bytes"], j["reused_bytes"]) == (0, 0)

    up = run_cli("--server", addr, "upload", f["w"])
    assert up.returncode == 2
    assert "no tensor store" in up.stderr
    ref = f"sha256:{sha256(layer['arrays']['w'])}:fp32:600x1024"
    by_digest = run_cli("--server", addr, "verify", "--input", f["x"], "--weight", ref)
    assert by_digest.returncode == 2
    assert "--weight: a sha256: argument needs a server with a tensor store" in by_digest.stderr


def test_outputs_that_come_back_by_digest_are_read(start_server, layer, tmp_path) -> None:
    # Every output above 1 KiB comes back by digest.
    addr = start_server("--store-bytes", str(64 * MiB), "--inline-output-bytes", "1024")
    f, a = layer["files"], layer["arrays"]
    out = tmp_path / "out"
    j = verify_json(addr, "--input", f["x"], "--weight", f["w"], "--config", "cpu:fp32",
                    "--save-outputs", str(out))
    assert j["verdict"] == "pass"
    expected = a["x"].astype(np.float64) @ a["w"].astype(np.float64).T
    for name in ("cpu_fp64_none.npy", "cpu_fp32_none.npy"):
        y = np.load(out / name)
        assert y.shape == (4, 600)
        np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-5)


def test_stderr_stays_clean_when_it_is_not_a_terminal(start_server, layer) -> None:
    addr = start_server("--store-bytes", str(64 * MiB))
    f = layer["files"]
    check = ("verify", "--input", f["x"], "--weight", f["w"], "--config", "cpu:fp32")
    # An upload, a check that uploads, the same check reusing the store.
    for args in (("upload", f["w2"]), check, check):
        r = run_cli("--server", addr, *args)
        assert r.returncode == 0, r.stderr
        assert r.stderr == ""


# ---- a fake server for what a real one does not do on demand: drop an
# upload's connection half-way, evict between FindMissingTensors and Verify.

FAKE_SERVER = textwrap.dedent('''
    import hashlib, json, sys
    from concurrent import futures
    sys.path.insert(0, sys.argv[1])
    import grpc
    from google.rpc import status_pb2
    from tensorcheck.v1 import tensorcheck_pb2 as pb, tensorcheck_pb2_grpc as svc

    LOG = sys.argv[2]
    events = []

    def log(**e):
        events.append(e)
        with open(LOG, "w") as f:
            json.dump(events, f)

    class Fake(svc.TensorCheckServicer):
        def __init__(self):
            self.blobs, self.partial = {}, {}
            self.dropped = self.evicted = False

        def FindMissingTensors(self, req, ctx):
            log(rpc="find", hashes=[d.hash for d in req.digests])
            return pb.FindMissingTensorsResponse(
                missing_digests=[d for d in req.digests if d.hash not in self.blobs])

        def UploadTensor(self, it, ctx):
            digest = buf = None
            for m in it:
                if digest is None:
                    digest, uid = m.digest, m.upload_id
                    buf = self.partial.setdefault(uid, bytearray())
                    log(rpc="upload", upload_id=uid, offset=m.offset, hash=digest.hash)
                if m.offset != len(buf) or len(m.data) > 4 << 20:
                    ctx.abort(grpc.StatusCode.INVALID_ARGUMENT, "bad chunk")
                buf += m.data
                if not self.dropped and 0 < len(buf) < digest.size_bytes:
                    self.dropped = True  # the connection drops after one chunk
                    ctx.abort(grpc.StatusCode.UNAVAILABLE, "connection dropped")
            if "sha256:" + hashlib.sha256(buf).hexdigest() != digest.hash:
                ctx.abort(grpc.StatusCode.INVALID_ARGUMENT, "hash mismatch")
            self.blobs[digest.hash] = bytes(buf)
            return pb.UploadTensorResponse(digest=digest, committed_size=len(buf))

        def QueryUploadStatus(self, req, ctx):
            held = len(self.partial.get(req.upload_id, b""))
            log(rpc="query", upload_id=req.upload_id, committed=held)
            return pb.QueryUploadStatusResponse(committed_size=held)

        def Verify(self, req, ctx):
            fields = {"op.input": req.op.input, "op.weight": req.op.weight}
            by_digest = {k: t.digest for k, t in fields.items() if t.WhichOneof("source") == "digest"}
            log(rpc="verify", by_digest=by_digest)
            if by_digest and not self.evicted:
                self.evicted = True  # evicted since FindMissingTensors
                self.blobs.clear()
            missing = pb.MissingTensors()
            for k, d in by_digest.items():
                if d not in self.blobs:
                    size = 4 * fields[k].shape[0] * fields[k].shape[1]  # float32
                    missing.digests.add(hash=d, size_bytes=size)
                    missing.fields.append(k)
            if missing.fields:
                st = status_pb2.Status(code=9, message="missing")
                st.details.add().Pack(missing)
                ctx.set_trailing_metadata((("grpc-status-details-bin", st.SerializeToString()),))
                ctx.abort(grpc.StatusCode.FAILED_PRECONDITION, "missing: " + ",".join(missing.fields))
            r = pb.VerifyResponse(verdict=pb.VERDICT_PASS, output_shape=[4, 1200])
            r.reference.config = "cpu:fp64:none"
            r.reference.vs_reference.passed = True
            return r

    server = grpc.server(futures.ThreadPoolExecutor(4))
    svc.add_TensorCheckServicer_to_server(Fake(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    print(f"listening on 127.0.0.1:{port}", flush=True)
    server.wait_for_termination()
''')


@pytest.fixture(scope="module")
def fake_stubs(tmp_path_factory) -> Path:
    """Python stubs of the API and google.rpc.Status in their own directory
    (imported only by the fake server's process: an installed client of
    another version cannot clash with them)."""
    protoc = pytest.importorskip("grpc_tools.protoc")
    pytest.importorskip("grpc")
    out = tmp_path_factory.mktemp("stubs")
    include = Path(protoc.__file__).parent / "_proto"
    rc = protoc.main(["grpc_tools.protoc", f"-I{REPO / 'proto'}", f"-I{include}",
                      f"--python_out={out}", f"--grpc_python_out={out}",
                      str(REPO / "proto/tensorcheck/v1/tensorcheck.proto"),
                      str(REPO / "proto/google/rpc/status.proto")])
    assert rc == 0
    for pkg in ("tensorcheck", "tensorcheck/v1"):
        (out / pkg / "__init__.py").touch()  # regular packages shadow an installed one
    return out


def test_broken_upload_resumes_and_eviction_is_retried_once(fake_stubs, tmp_path) -> None:
    need_cli()
    script = tmp_path / "fake_server.py"
    script.write_text(FAKE_SERVER)
    log = tmp_path / "events.json"
    proc = subprocess.Popen([sys.executable, str(script), str(fake_stubs), str(log)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert line.startswith("listening on "), proc.stderr.read()
        addr = line.split()[-1]
        rng = np.random.default_rng(5)
        x = rng.standard_normal((4, 1024)).astype(np.float32)
        w = rng.standard_normal((1200, 1024)).astype(np.float32)  # 4.9 MB: two chunks
        np.save(tmp_path / "x.npy", x)
        np.save(tmp_path / "w.npy", w)
        r = run_cli("--server", addr, "verify", "--input", str(tmp_path / "x.npy"),
                    "--weight", str(tmp_path / "w.npy"), "--json")
        assert r.returncode == 0, r.stderr
        assert r.stderr == ""
        j = json.loads(r.stdout)
        events = json.loads(log.read_text())
    finally:
        proc.kill()
        proc.wait()
    digest = "sha256:" + sha256(w)
    assert [e["rpc"] for e in events] == [
        "find", "upload", "query", "upload", "verify", "upload", "verify"]
    assert events[0]["hashes"] == [digest]  # x is inline: only W is asked about
    first, query, resumed = events[1:4]
    assert query["upload_id"] == first["upload_id"] == resumed["upload_id"]
    # One chunk arrived before the drop: the resumed stream starts after it.
    # (The fake keeps gRPC's default 4 MiB message limit: each message,
    # chunk and header, fits in it.)
    assert first["offset"] == 0
    assert 4 * MiB - 64 * 1024 <= query["committed"] == resumed["offset"] < 4 * MiB
    assert events[4]["by_digest"] == {"op.weight": digest}
    # The re-upload after the eviction is a new upload, under a new id.
    assert events[5]["offset"] == 0 and events[5]["upload_id"] != first["upload_id"]
    assert len(first["upload_id"]) >= 16
    assert (j["uploaded_bytes"], j["reused_bytes"]) == (2 * w.nbytes, 0)


def test_progress_goes_to_a_terminal_and_no_progress_turns_it_off(start_server,
                                                                    layer) -> None:
    # A fake terminal on stderr; the phases of this small check are too short
    # to draw, so the check is that nothing breaks and stdout stays JSON.
    addr = start_server("--store-bytes", str(64 * MiB))
    f = layer["files"]
    for extra in ((), ("--no-progress",)):
        out, err = run_with_tty_stderr(
            [str(CLI_BIN), "--server", addr, "verify", "--input", f["x"], "--weight", f["w"],
             "--json", *extra])
        assert json.loads(out)["verdict"] == "pass"
        if extra:
            assert err == ""


def run_with_tty_stderr(argv: list[str], timeout: float = 900) -> tuple[str, str]:
    """Runs argv with stderr on a pseudo-terminal; its stdout and stderr."""
    master, slave = pty.openpty()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=slave)
    os.close(slave)
    err = b""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([master], [], [], 0.5)
        if ready:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # the terminal closed: the process ended
                break
            if not chunk:
                break
            err += chunk
        elif proc.poll() is not None:
            break
    out = proc.stdout.read()
    proc.wait(timeout=60)
    os.close(master)
    return out.decode(), err.decode(errors="replace")


# ---- the layers of a large model, verified through the CLI on the CPU.

def write_bf16_npy(path: Path, shape: tuple[int, int], seed: int) -> None:
    """Random finite bf16 bit patterns of moderate size (|v| in [2^-8, 2^3),
    random sign), written as a <u2 .npy in blocks of rows."""
    rng = np.random.default_rng(seed)
    with open(path, "wb") as f:
        np.lib.format.write_array_header_1_0(
            f, {"descr": "<u2", "fortran_order": False, "shape": shape})
        rows = max(1, (64 * MiB) // (2 * shape[1]))
        for start in range(0, shape[0], rows):
            n = min(rows, shape[0] - start)
            r = rng.integers(0, 1 << 16, size=(n, shape[1]), dtype=np.uint16)
            exponent = (r & np.uint16(0x7)) + np.uint16(127 - 8)  # 2^-8 .. 2^-1
            exponent += (r >> np.uint16(3)) & np.uint16(0x3)       # .. 2^2, mantissa < 2
            bits = (r & np.uint16(0x807f)) | (exponent << np.uint16(7))
            f.write(bits.tobytes())


def bf16_to_f64(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)


def available_memory() -> int:
    """MemAvailable (free memory and the page cache the kernel can drop)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def check_large_layer(start_server, tmp_path: Path, n: int, m: int = 4,
                      k: int = 8192) -> dict:
    if os.environ.get("TENSORCHECK_SKIP_LARGE"):
        pytest.skip("TENSORCHECK_SKIP_LARGE is set")
    w_bytes = 2 * n * k
    if shutil.disk_usage(tmp_path).free < 2 * w_bytes:
        pytest.skip("not enough disk for the weight file")
    if available_memory() < 3 * w_bytes:
        pytest.skip(f"{3 * w_bytes} bytes of available memory needed (the server stores the "
                    "weight, the CLI maps its file)")
    times = {}
    t = time.monotonic()
    write_bf16_npy(tmp_path / "x.npy", (m, k), seed=1)
    write_bf16_npy(tmp_path / "w.npy", (n, k), seed=2)
    times["generate_s"] = time.monotonic() - t
    addr = start_server("--store-bytes", str(w_bytes + 512 * MiB))
    # cpu:fp32 against the fp64 reference: sums of 8192 products of size ~1
    # cancel to near 0 in a few hundred of the outputs, where fp32's
    # accumulation error (~0.05) exceeds the torch preset's atol of 1e-5;
    # --atol 0.25 still catches anything wrong with outputs of size ~100.
    out = tmp_path / "out"
    args = ["--server", addr, "verify", "--input", str(tmp_path / "x.npy"),
            "--weight", str(tmp_path / "w.npy"), "--dtype", "input=bf16",
            "--dtype", "weight=bf16", "--config", "cpu:fp32", "--atol", "0.25", "--json"]
    t = time.monotonic()
    # First run: stderr on a terminal, so the progress line is exercised.
    stdout, stderr = run_with_tty_stderr(
        [str(CLI_BIN), *args, "--save-outputs", str(out), "--timeout", "1200"])
    times["first_run_s"] = time.monotonic() - t
    assert stdout.strip(), stderr.rsplit("\033[K", 1)[-1]  # the last line, not the progress
    first = json.loads(stdout)
    assert first["uploaded_bytes"] == w_bytes, stderr
    assert first["output_shape"] == [m, n]
    assert first["results"][0]["vs_reference"]["total"] == m * n
    assert first["verdict"] == "pass", stderr
    t = time.monotonic()
    second = verify_json(addr, *args[3:], "--timeout", "1200", timeout=1200)
    times["second_run_s"] = time.monotonic() - t
    assert (second["uploaded_bytes"], second["reused_bytes"]) == (0, w_bytes)
    assert second["results"][0]["vs_reference"] == first["results"][0]["vs_reference"]

    # The reference output, against numpy in float64 for a few columns.
    x = bf16_to_f64(np.load(tmp_path / "x.npy"))
    w = np.load(tmp_path / "w.npy", mmap_mode="r")
    cols = np.linspace(0, n - 1, 64).astype(int)
    expected = x @ bf16_to_f64(np.asarray(w[cols])).T
    y = np.load(out / "cpu_fp64_none.npy")
    assert y.shape == (m, n)
    np.testing.assert_allclose(y[:, cols], expected, rtol=2**-8, atol=1e-3)
    print(f"\n[{n}x{k} bf16, {w_bytes / 1e9:.2f} GB] " +
          ", ".join(f"{k} {v:.1f}" for k, v in times.items()))
    return times


big = pytest.mark.skipif(
    os.environ.get("TENSORCHECK_BIG_TESTS") != "1",
    reason="multi-GB layer: set TENSORCHECK_BIG_TESTS=1 (scripts/test.sh --deep does)",
)


@pytest.mark.big
@big
def test_470_mb_layer_is_verified_by_digest(start_server, tmp_path) -> None:
    check_large_layer(start_server, tmp_path, n=28672)


@pytest.mark.big
@big
def test_2_1_gb_layer_is_verified_by_digest(start_server, tmp_path) -> None:
    check_large_layer(start_server, tmp_path, n=128256)
