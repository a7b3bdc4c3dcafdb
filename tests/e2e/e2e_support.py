"""What the end-to-end tests share: the binaries, a server process on a free
loopback port, and running the CLI."""

from __future__ import annotations

import json
import math
import os
import re
import signal
import socket
import struct
import subprocess
import threading
import time
import urllib.request
from collections.abc import Callable
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
SERVER_BIN = Path(
    os.environ.get("TENSORCHECK_SERVER_BIN", REPO / "build/server/tensorcheck-server")
)
CLI_BIN = Path(os.environ.get("TENSORCHECK_CLI_BIN", REPO / "build/client/cli/tensorcheck"))


def need_cli() -> None:
    if not CLI_BIN.is_file():
        pytest.skip(f"CLI binary not built: {CLI_BIN} (set TENSORCHECK_CLI_BIN)")


class ServerProcess:
    """tensorcheck-server on 127.0.0.1 with --port 0, its stdout and stderr
    collected line by line (so logs never fill a pipe)."""

    def __init__(self, *flags: str) -> None:
        if not SERVER_BIN.is_file():
            pytest.skip(f"server binary not built: {SERVER_BIN} (set TENSORCHECK_SERVER_BIN)")
        self.proc = subprocess.Popen(
            [str(SERVER_BIN), "--host", "127.0.0.1", "--port", "0", *flags],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.stdout: list[str] = []
        self.stderr: list[str] = []
        self.address = ""
        ready = threading.Event()

        def read(stream, sink, watch):
            for line in stream:
                sink.append(line.rstrip("\n"))
                m = re.match(r"listening on (\S+:\d+)$", line.strip())
                if watch and m:
                    self.address = m.group(1)
                    ready.set()
            ready.set()

        for stream, sink, watch in ((self.proc.stdout, self.stdout, True),
                                    (self.proc.stderr, self.stderr, False)):
            threading.Thread(target=read, args=(stream, sink, watch), daemon=True).start()
        if not ready.wait(60) or not self.address:
            self.proc.kill()
            self.proc.wait()
            pytest.fail(f"server did not print 'listening on HOST:PORT': {self.stderr[-5:]}")

    def stop(self) -> int:
        """SIGTERM, then the exit code (killed after 60 s)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()


def free_port() -> int:
    """A loopback port that nothing listens on now (--metrics-port has no 0)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def gauge(port: int, name: str) -> float:
    """The unlabelled sample `name` of http://127.0.0.1:PORT/metrics (a server
    started with --metrics-port PORT); 0 when it is absent."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as reply:
        text = reply.read().decode()
    for line in text.splitlines():
        fields = line.split()
        if len(fields) == 2 and fields[0] == name:
            return float(fields[1])
    return 0.0


def running(port: int, count: int = 1) -> bool:
    """`count` requests accepted and none of them waiting for a worker: with
    --threads 1 and count 1, the one request is computing."""
    return (gauge(port, "tensorcheck_requests_in_flight") == count
            and gauge(port, "tensorcheck_requests_queued") == 0)


def wait_until(condition: Callable[[], bool], what: str, guard_s: float = 300) -> None:
    """Polls `condition` until it holds. The tests wait on what the server
    reports, never on a time: `guard_s` only ends a hang, failing the test
    with `what`."""
    end = time.monotonic() + guard_s
    while not condition():
        if time.monotonic() > end:
            pytest.fail(f"not seen within {guard_s:.0f} s: {what}")
        time.sleep(0.02)


def run_cli(*args: str, env: dict[str, str] | None = None,
            timeout: float = 180) -> subprocess.CompletedProcess:
    need_cli()
    full_env = dict(os.environ)
    full_env.pop("GITHUB_STEP_SUMMARY", None)
    if env:
        full_env.update(env)
    return subprocess.run([str(CLI_BIN), *args], capture_output=True, text=True,
                          timeout=timeout, env=full_env)


def write_safetensors(path: Path, tensors: dict[str, tuple[str, np.ndarray]]) -> None:
    """A safetensors file: 8-byte little-endian header length, the JSON
    header (padded to 8 bytes), the tensors' data in the order given, each
    tensor given as (safetensors dtype, array of its bytes' layout)."""
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    blobs = []
    offset = 0
    for name, (dtype, arr) in tensors.items():
        data = np.ascontiguousarray(arr).tobytes()
        header[name] = {"dtype": dtype, "shape": list(arr.shape),
                        "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
        blobs.append(data)
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + b"".join(blobs))


# Narrow formats decoded by hand from their definitions (OCP FP8, OCP MX):
# the tests' expected values never come from the server or the CLI.

def e4m3fn_value(bits: int) -> float:
    """float8_e4m3fn: 1 sign, 4 exponent (bias 7), 3 mantissa; no infinities."""
    sign = -1.0 if bits & 0x80 else 1.0
    exp, man = (bits >> 3) & 0xF, bits & 0x7
    if exp == 0xF and man == 0x7:
        return float("nan")
    if exp == 0:
        return sign * man / 8 * 2.0 ** -6
    return sign * (1 + man / 8) * 2.0 ** (exp - 7)


def e5m2_value(bits: int) -> float:
    """float8_e5m2: 1 sign, 5 exponent (bias 15), 2 mantissa; IEEE specials."""
    sign = -1.0 if bits & 0x80 else 1.0
    exp, man = (bits >> 2) & 0x1F, bits & 0x3
    if exp == 0x1F:
        return sign * float("inf") if man == 0 else float("nan")
    if exp == 0:
        return sign * man / 4 * 2.0 ** -14
    return sign * (1 + man / 4) * 2.0 ** (exp - 15)


def e2m1_value(code: int) -> float:
    """float4_e2m1fn (the low 4 bits): 1 sign, 2 exponent (bias 1), 1 mantissa."""
    return (-1.0 if code & 8 else 1.0) * [0, 0.5, 1, 1.5, 2, 3, 4, 6][code & 7]


# The sm_90 (H100, H200) tensor-core model for bfloat16 inputs with fp32
# accumulation (docs/numerics.md, "Tensor-core inner products"), redone
# here from its description in exact rational arithmetic. Normal inputs and
# sums only (no subnormals, no specials).
SM90_BLOCK = 16  # products per hardware inner product
SM90_ALIGN_BITS = 25  # fraction bits kept below the block's largest exponent
SM90_RESULT_BITS = 24  # significant bits of a block's result (fp32's)


def _floor_log2(v: Fraction) -> int:
    """floor(log2 |v|) of a nonzero rational, exactly."""
    n, d = abs(v.numerator), v.denominator
    e = n.bit_length() - d.bit_length()  # the floor, or one above it
    if (n << max(-e, 0)) < (d << max(e, 0)):  # |v| < 2^e
        e -= 1
    return e


def _truncate(v: Fraction, exponent: int) -> Fraction:
    """v truncated toward zero to a multiple of 2^exponent."""
    quantum = Fraction(2) ** exponent
    return quantum * math.trunc(v / quantum)


def sm90_bf16_dot(a: np.ndarray, b: np.ndarray) -> Fraction:
    """sum a[i] * b[i] as an H100's bf16 tensor cores compute it from a
    zero accumulator C, K walked in blocks of 16 products from k = 0. In
    each block the nonzero products and a nonzero C are aligned to the
    largest nominal exponent E among them (a product's: the sum of its two
    inputs' floor(log2|v|); C's its own), every term truncated toward zero
    to a multiple of 2^(E - 25), the terms summed exactly, and the sum
    truncated toward zero to 24 significant bits: the next C."""
    av = [Fraction(float(v)) for v in np.asarray(a, dtype=np.float64)]
    bv = [Fraction(float(v)) for v in np.asarray(b, dtype=np.float64)]
    for v in av + bv:
        assert v == 0 or abs(v) >= Fraction(2) ** -126, "normal inputs only"
    c = Fraction(0)
    for start in range(0, len(av), SM90_BLOCK):
        terms = [
            (x * y, _floor_log2(x) + _floor_log2(y))
            for x, y in zip(av[start : start + SM90_BLOCK], bv[start : start + SM90_BLOCK])
            if x != 0 and y != 0
        ]
        if c != 0:
            terms.append((c, _floor_log2(c)))
        if not terms:
            c = Fraction(0)
            continue
        e = max(exponent for _, exponent in terms)
        s = sum((_truncate(t, e - SM90_ALIGN_BITS) for t, _ in terms), Fraction(0))
        c = Fraction(0) if s == 0 else _truncate(s, _floor_log2(s) - (SM90_RESULT_BITS - 1))
        assert c == 0 or abs(c) >= Fraction(2) ** -126, "normal sums only"
    return c


def sm90_bf16_linear(x: np.ndarray, w: np.ndarray, b: np.ndarray) -> np.ndarray:
    """A bf16 layer's float32 output [M, N] as an H100's default kernel
    computes it with the bias in its fp32 epilogue: each element
    sm90_bf16_dot of x's row and w's row ([N, K], out_in), then the bias
    added with one IEEE fp32 addition (round to nearest even)."""
    x64 = np.asarray(x).astype(np.float64)
    w64 = np.asarray(w).astype(np.float64)
    b32 = np.asarray(b).astype(np.float32)
    y = np.empty((x64.shape[0], w64.shape[0]), dtype=np.float32)
    for i in range(x64.shape[0]):
        for j in range(w64.shape[0]):
            acc = np.float32(float(sm90_bf16_dot(x64[i], w64[j])))  # exact: 24 bits
            y[i, j] = acc + b32[j]  # float32 + float32: one IEEE addition
    return y
