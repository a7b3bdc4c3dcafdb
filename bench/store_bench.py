#!/usr/bin/env python3
"""The tensor store's memory and reuse figures (docs/performance.md,
"Tensor store"), each measured against the server binary on loopback with
the Python client:

- upload RSS: the server's peak RSS (VmHWM, reset to the current RSS just
  before) while a 1 GiB tensor is uploaded, over its idle RSS, divided by
  the tensor's bytes (target: at most 1.25);
- candle reuse: the candle case (x [1921, 4096], W [3072, 4096], b [3072],
  bf16, observed y [1921, 3072]) verified twice with the same weight; bytes
  the server received the second time (Verify message plus uploads, from
  its JSON log) over the first (target: at most 0.40). Two second runs: a
  CI re-check (same inputs, a new observed output: the code changed) and a
  new batch (new x and observed);
- lm_head: Llama-3-70B's lm_head (8192 -> 128256, bf16: 2.1 GB), M = 4,
  against the default cpu:fp64 reference: the server's peak RSS over the
  weight's bytes (target: at most 4).

    bench/store_bench.py                      # build/server/tensorcheck-server
    bench/store_bench.py --server build-lead/server/tensorcheck-server --skip-lm-head
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import ml_dtypes
import numpy as np
import tensorcheck

REPO = Path(__file__).resolve().parents[1]
MiB = 1 << 20


class Server:
    """The server on a free loopback port with JSON logs collected."""

    def __init__(self, binary: str, *flags: str) -> None:
        self.proc = subprocess.Popen(
            [binary, "--host", "127.0.0.1", "--port", "0", "--log-format", "json", *flags],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.lines: list[str] = []
        self.address = ""
        ready = threading.Event()

        def read() -> None:
            assert self.proc.stdout is not None
            for line in self.proc.stdout:
                self.lines.append(line)
                m = re.match(r"listening on (\S+:\d+)$", line.strip())
                if m:
                    self.address = m.group(1)
                    ready.set()
            ready.set()

        threading.Thread(target=read, daemon=True).start()
        if not ready.wait(60) or not self.address:
            sys.exit(f"server did not start: {self.lines[-5:]}")

    def status_kib(self, key: str) -> int:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1])
        raise KeyError(key)

    def reset_peak(self) -> None:
        Path(f"/proc/{self.proc.pid}/clear_refs").write_text("5")

    def received_bytes(self, since: int) -> int:
        """Bytes of Verify/Diagnose messages and uploads logged after line
        `since`."""
        total = 0
        for line in self.lines[since:]:
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if event.get("msg") == "request":
                total += int(event.get("request_bytes", 0))
            elif event.get("msg") == "upload":
                total += int(event.get("received_bytes", 0))
        return total

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(60)


def bf16(shape: tuple[int, ...], seed: int) -> np.ndarray:
    """Random finite bf16 of moderate size from bit patterns, 64 MiB at a time."""
    rng = np.random.default_rng(seed)
    flat = np.empty(int(np.prod(shape)), dtype=np.uint16)
    step = 32 * MiB
    for i in range(0, flat.size, step):
        bits = rng.integers(0, 1 << 16, size=min(step, flat.size - i), dtype=np.uint16)
        exp = ((bits >> 7) & 3) + 121
        flat[i : i + step] = (bits & 0x807F) | (exp.astype(np.uint16) << 7)
    return flat.reshape(shape).view(ml_dtypes.bfloat16)


def upload_rss(binary: str) -> None:
    size = 1 << 30
    data = np.frombuffer(np.random.default_rng(1).bytes(size), dtype=np.float32)
    server = Server(binary, "--store-bytes", str(2 << 30))
    try:
        with tensorcheck.Client(server.address, timeout=600) as client:
            client.capabilities()
            time.sleep(0.5)
            idle = server.status_kib("VmRSS") * 1024
            server.reset_peak()
            t0 = time.monotonic()
            client.upload(data)
            seconds = time.monotonic() - t0
            peak = server.status_kib("VmHWM") * 1024
    finally:
        server.stop()
    print(
        f"upload RSS   1 GiB: idle {idle / MiB:.0f} MiB, peak {peak / MiB:.0f} MiB, "
        f"(peak - idle) / size = {(peak - idle) / size:.3f}   ({seconds:.1f} s, target <= 1.25)"
    )


def candle_reuse(binary: str) -> None:
    m, n, k = 1921, 3072, 4096
    server = Server(binary)
    try:
        with tensorcheck.Client(server.address, timeout=600) as client:
            x, w, b = bf16((m, k), 1), bf16((n, k), 2), bf16((n,), 3)
            y1, y2, y3 = bf16((m, n), 4), bf16((m, n), 5), bf16((m, n), 6)
            x2 = bf16((m, k), 7)
            # A second layer for the pair without an observed output.
            x3, x4, w2, b2 = bf16((m, k), 8), bf16((m, k), 9), bf16((n, k), 10), bf16((n,), 11)
            runs = []
            for label, xi, wi, bi, yi in (
                ("first (with observed y)", x, w, b, y1),
                ("re-check (same x, new y)", x, w, b, y2),
                ("new batch (new x and y)", x2, w, b, y3),
                ("first (no observed)", x3, w2, b2, None),
                ("new x (no observed)", x4, w2, b2, None),
            ):
                since = len(server.lines)
                r = client.verify_linear(xi, wi, bi, observed=yi, configs=["cpu:bf16:fused"])
                time.sleep(0.2)  # the log line of the request follows its answer
                runs.append((label, server.received_bytes(since), r))
    finally:
        server.stop()
    for i, (label, sent, r) in enumerate(runs):
        # Each second run against its own first: with and without observed.
        first = runs[0][1] if i < 3 else runs[3][1]
        print(
            f"candle reuse {label:26s}: {sent / 1e6:6.1f} MB received "
            f"(uploaded {r.uploaded_bytes / 1e6:.1f} MB, reused {r.reused_bytes / 1e6:.1f} MB)"
            f"  ratio {sent / first:.2f}"
        )
    print("             target: second / first <= 0.40")


def lm_head(binary: str) -> None:
    m, n, k = 4, 128256, 8192
    server = Server(binary)
    try:
        with tensorcheck.Client(server.address, timeout=1800) as client:
            w, x = bf16((n, k), n), bf16((m, k), 1)
            t0 = time.monotonic()
            r = client.verify_linear(x, w, configs=["cpu:bf16:fused"])
            seconds = time.monotonic() - t0
            peak = server.status_kib("VmHWM") * 1024
    finally:
        server.stop()
    print(
        f"lm_head      {w.nbytes / 1e9:.2f} GB weight: verify {seconds:.1f} s "
        f"(hash, upload, run), verdict {r.verdict}, server peak RSS {peak / 1e9:.2f} GB = "
        f"{peak / w.nbytes:.2f}x the weight (target <= 4)"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--server", default=str(REPO / "build/server/tensorcheck-server"))
    p.add_argument("--skip-lm-head", action="store_true")
    args = p.parse_args()
    upload_rss(args.server)
    candle_reuse(args.server)
    if not args.skip_lm_head:
        lm_head(args.server)


if __name__ == "__main__":
    main()
