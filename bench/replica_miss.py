#!/usr/bin/env python3
"""What a tensor-store miss on another replica costs (docs/operations.md,
"Several replicas"): each replica has its own store, so the first call
that reaches a replica with a weight it never saw uploads the weight
again. Measured on loopback with the Python client against two servers
started here:

  (a) hit   the server already holds the weights (uploaded beforehand, not
            timed): `verify_linear(x, W)` hashes W, asks
            FindMissingTensors (nothing missing) and sends Verify naming W
            by digest;
  (b) miss  a fresh replica that never saw these weights, the same calls:
            FindMissingTensors names W, the client uploads it (4 MiB
            chunks), then Verify.

Per weight shape (default 4096x4096 bf16, 32 MiB, and 1024x1024 bf16,
2 MiB): in each round, --weights new random weights are uploaded to the
warm server, then one call per weight goes to each server (which server
first alternates round by round, so that drift of the machine falls on
both alike). x is [--m, K] bf16, one configuration (cpu:bf16:fused)
against the default reference (cpu:fp64 on a host without a GPU, cheap
for a small M; the server's work is the same in both). Prints the median
per-call time of hits and misses, the ratio miss / hit (the baseline is
the hit, measured in the same run) and what the miss adds (ms and MB/s of
the re-upload).

    bench/replica_miss.py                                  # build/server/tensorcheck-server
    bench/replica_miss.py --server build-lead/server/tensorcheck-server
    bench/replica_miss.py --shapes 4096x4096,8192x4096 --rounds 5

A miss that the store reports only at the Verify (the request reached a
replica other than the one FindMissingTensors asked, behind round_robin)
costs one more round trip of a small request on top: the refused Verify
does no work. Exit status 0 whatever the figures: they are for reading.
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import ml_dtypes
import numpy as np

try:
    import tensorcheck
except ImportError as e:  # pragma: no cover - environment
    sys.exit(f"replica_miss: the tensorcheck package is needed (pip install ./client/python): {e}")

REPO = Path(__file__).resolve().parents[1]
MiB = 1 << 20
CONFIG = "cpu:bf16:fused"


class Server:
    """The server on a free loopback port; its output drained for its
    lifetime (a full pipe would block its logging)."""

    def __init__(self, binary: str, *flags: str) -> None:
        self.proc = subprocess.Popen(
            [binary, "--host", "127.0.0.1", "--port", "0", *flags],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.address = ""
        self.tail: list[str] = []
        ready = threading.Event()

        def read() -> None:
            assert self.proc.stdout is not None
            for line in self.proc.stdout:
                self.tail = (self.tail + [line])[-20:]
                m = re.match(r"listening on (\S+:\d+)$", line.strip())
                if m:
                    self.address = m.group(1)
                    ready.set()
            ready.set()

        threading.Thread(target=read, daemon=True).start()
        if not ready.wait(60) or not self.address:
            sys.exit(f"server did not start: {self.tail[-5:]}")

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(60)


def bf16(shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """Random finite bf16 of moderate size from bit patterns."""
    bits = rng.integers(0, 1 << 16, size=int(np.prod(shape)), dtype=np.uint16)
    exp = ((bits >> 7) & 3) + 121
    return ((bits & 0x807F) | (exp.astype(np.uint16) << 7)).reshape(shape).view(ml_dtypes.bfloat16)


def timed_call(client: tensorcheck.Client, x: np.ndarray, w: np.ndarray) -> tuple[float, int]:
    t0 = time.perf_counter()
    r = client.verify_linear(x, w, configs=[CONFIG])
    return time.perf_counter() - t0, r.uploaded_bytes


def measure(binary: str, shape: tuple[int, int], args: argparse.Namespace) -> dict[str, float]:
    n, k = shape
    store = str(max(1 << 30, 4 * args.weights * n * k * 2))
    flags = ("--store-bytes", store, *args.server_arg)
    warm_server, fresh_server = Server(binary, *flags), Server(binary, *flags)
    rng = np.random.default_rng(n * 7919 + k)
    x = bf16((args.m, k), rng)
    hits: list[float] = []
    misses: list[float] = []
    uploaded: list[int] = []
    try:
        warm = tensorcheck.Client(warm_server.address, timeout=600)
        fresh = tensorcheck.Client(fresh_server.address, timeout=600)
        with warm, fresh:
            # Warm-up: connections, the first GEMM, the store's first chunk.
            w0 = bf16((n, k), rng)
            timed_call(warm, x, w0)
            timed_call(fresh, x, w0)
            for rnd in range(args.rounds):
                weights = [bf16((n, k), rng) for _ in range(args.weights)]
                for w in weights:
                    warm.upload(w)
                order = [("hit", warm), ("miss", fresh)]
                if rnd % 2:
                    order.reverse()
                for label, client in order:
                    for w in weights:
                        seconds, up = timed_call(client, x, w)
                        if label == "hit":
                            hits.append(seconds)
                            if up:
                                sys.exit("a hit uploaded: the warm server lost a weight")
                        else:
                            misses.append(seconds)
                            uploaded.append(up)
    finally:
        warm_server.stop()
        fresh_server.stop()
    hit, miss = statistics.median(hits), statistics.median(misses)
    size = n * k * 2
    return {
        "size": size,
        "hit_ms": hit * 1e3,
        "miss_ms": miss * 1e3,
        "ratio": miss / hit,
        "extra_ms": (miss - hit) * 1e3,
        "upload_mb_s": size / 1e6 / max(miss - hit, 1e-9),
        "uploaded_per_miss": statistics.mean(uploaded),
        "calls": len(hits),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--server", default=str(REPO / "build/server/tensorcheck-server"))
    p.add_argument("--shapes", default="4096x4096,1024x1024", help="NxK weights, comma-separated")
    p.add_argument("--m", type=int, default=16, help="rows of x")
    p.add_argument("--weights", type=int, default=4, help="distinct weights per round")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument(
        "--server-arg", action="append", default=[], help="an extra server flag (repeatable)"
    )
    args = p.parse_args()
    shapes = [tuple(int(v) for v in s.lower().split("x")) for s in args.shapes.split(",")]
    print(
        f"{CONFIG}, x [{args.m}, K] bf16, {args.weights} weights x {args.rounds} rounds per shape"
    )
    for shape in shapes:
        r = measure(args.server, shape, args)  # type: ignore[arg-type]
        assert r["uploaded_per_miss"] == r["size"], r
        print(
            f"W {shape[0]}x{shape[1]} bf16 ({r['size'] / MiB:.0f} MiB), {r['calls']} calls each: "
            f"hit {r['hit_ms']:.1f} ms/call, miss {r['miss_ms']:.1f} ms/call, "
            f"miss/hit = {r['ratio']:.2f} (+{r['extra_ms']:.1f} ms: the re-upload, "
            f"{r['upload_mb_s']:.0f} MB/s)"
        )


if __name__ == "__main__":
    main()
