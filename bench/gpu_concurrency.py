#!/usr/bin/env python3
"""Concurrent verifications on a GPU host over loopback (docs/performance.md,
"GPU", part 4): the candle case (1921x4096 -> 3072, bf16) sent by digest,
first from one client, then from eight at once, each for --seconds; the
verifications per second of each, their ratio, and the GPU's busy share
while they ran (nvidia-smi's utilization.gpu, sampled every 100 ms: the
share of time one or more kernels was running). Target: at least 60% busy
with eight clients.

    bench/gpu_concurrency.py --target 127.0.0.1:50051           # a running server
    bench/gpu_concurrency.py --server build-cuda/server/tensorcheck-server

Without nvidia-smi the busy share is reported as unknown.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import threading
import time

import ml_dtypes
import numpy as np
import tensorcheck


def bf16(shape: tuple[int, ...], scale: float, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (rng.uniform(-scale, scale, size=shape)).astype(ml_dtypes.bfloat16)


class BusySampler:
    """nvidia-smi's utilization.gpu every 100 ms while running."""

    def __init__(self) -> None:
        self.samples: list[float] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.available = shutil.which("nvidia-smi") is not None

    def __enter__(self) -> BusySampler:  # noqa: PYI034 (final class)
        if self.available:
            self._thread = threading.Thread(target=self._run, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _run(self) -> None:
        proc = subprocess.Popen(
            [
                "nvidia-smi",
                "--query-gpu=utilization.gpu",
                "--format=csv,noheader,nounits",
                "-lms",
                "100",
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert proc.stdout is not None
        try:
            for line in proc.stdout:
                if self._stop.is_set():
                    break
                m = re.match(r"\s*(\d+)", line)
                if m:
                    self.samples.append(float(m.group(1)))
        finally:
            proc.terminate()

    def busy(self) -> str:
        if not self.available:
            return "unknown (no nvidia-smi)"
        if not self.samples:
            return "unknown (no samples)"
        return f"{np.mean(self.samples):.0f}%"


def run_phase(
    target: str, refs: dict, clients: int, seconds: float
) -> tuple[int, float]:
    """Verifications completed by `clients` threads in `seconds`."""
    done = [0] * clients
    errors: list[Exception] = []
    stop_at = time.monotonic() + seconds

    def worker(i: int) -> None:
        try:
            with tensorcheck.Client(target, timeout=600) as client:
                while time.monotonic() < stop_at:
                    client.verify_linear(
                        refs["x"],
                        refs["w"],
                        refs["b"],
                        observed=refs["y"],
                        configs="cublaslt:bf16:fused",
                    )
                    done[i] += 1
        except Exception as e:  # noqa: BLE001 (re-raised by the caller)
            errors.append(e)

    start = time.monotonic()
    threads = [threading.Thread(target=worker, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return sum(done), time.monotonic() - start


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--target", help="a running server")
    p.add_argument("--server", help="start this server binary on a free port instead")
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--clients", type=int, default=8)
    args = p.parse_args()
    proc = None
    target = args.target
    if target is None:
        binary = args.server or "build/server/tensorcheck-server"
        proc = subprocess.Popen(
            [
                binary,
                "--host",
                "127.0.0.1",
                "--port",
                "0",
                "--threads",
                str(args.clients),
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert proc.stdout is not None
        for line in proc.stdout:
            m = re.search(r"listening on (\S+:\d+)", line)
            if m:
                target = m.group(1)
                break
        if target is None:
            print("gpu_concurrency: the server did not start", file=sys.stderr)
            return 1
    try:
        with tensorcheck.Client(target, timeout=600) as client:
            caps = client.capabilities()
            lt = caps.backend("cublaslt")
            if lt is None or not lt.available:
                print(f"gpu_concurrency: no cublaslt on {target}; nothing measured")
                return 0
            x, w, b = (
                bf16((1921, 4096), 1.0, 1),
                bf16((3072, 4096), 1 / 64, 2),
                bf16((3072,), 2, 3),
            )
            observed = (
                client.verify_linear(
                    x, w, b, configs="cublas:bf16:unfused", return_outputs=True
                )
                .results[0]
                .output
            )
            refs = {
                k: client.upload(v)
                for k, v in {"x": x, "w": w, "b": b, "y": observed}.items()
            }
        run_phase(target, refs, 1, 1.0)  # warm-up: resident weights, lanes' handles
        with BusySampler() as one_busy:
            one, one_s = run_phase(target, refs, 1, args.seconds)
        with BusySampler() as many_busy:
            many, many_s = run_phase(target, refs, args.clients, args.seconds)
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(30)
    one_rate, many_rate = one / one_s, many / many_s
    print("| clients | verifications | seconds | per second | GPU busy |")
    print("|---|---|---|---|---|")
    print(
        f"| 1 (baseline) | {one} | {one_s:.1f} | {one_rate:.1f} | {one_busy.busy()} |"
    )
    print(
        f"| {args.clients} | {many} | {many_s:.1f} | {many_rate:.1f} | {many_busy.busy()} "
        f"(target >= 60%) |"
    )
    print(f"throughput ratio {args.clients} clients / 1: {many_rate / one_rate:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
