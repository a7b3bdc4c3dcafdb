#!/usr/bin/env python3
"""What naming a GPU adds to a diagnosis (docs/performance.md, "Kernel
replay vs one sgemm"): the candle layer (x [1921, 4096], W [3072, 4096],
b [3072], bf16, seeded), its output in numpy's fp32 order rounded to bf16
as the observed output, diagnosed over the default candidates without a
GPU and with `gpu="h100"` (the CPU replays of the H100's default kernels
join the first tier), alternately, `--rounds` times each.

    bench/replay_diagnose.py                       # starts build/server/tensorcheck-server
    bench/replay_diagnose.py --server build-lead/server/tensorcheck-server --rounds 3

Prints each call's time, the best configuration each named, and the ratio
of the medians (with a GPU over without). Exit status 0 whatever the
ratio: the figures are for reading.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from client_overhead import DEFAULT_SERVER_BIN, Server, tensorcheck

try:
    import ml_dtypes
except ImportError:  # pragma: no cover - environment
    sys.exit("replay_diagnose: ml_dtypes is needed (pip install ml_dtypes)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--server", default=str(DEFAULT_SERVER_BIN))
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--gpu", default="h100")
    args = ap.parse_args()

    rng = np.random.default_rng(2026)
    m, k, n = 1921, 4096, 3072
    x = rng.standard_normal((m, k)).astype(ml_dtypes.bfloat16)
    w = (rng.standard_normal((n, k)) / 64).astype(ml_dtypes.bfloat16)
    b = rng.standard_normal(n).astype(ml_dtypes.bfloat16)
    y = (x.astype(np.float32) @ w.astype(np.float32).T + b.astype(np.float32)).astype(
        ml_dtypes.bfloat16
    )

    server = Server(args.server, ["--max-work-gmacs", "4096"])
    try:
        client = tensorcheck.Client(server.target)
        times: dict[str, list[float]] = {"none": [], args.gpu: []}
        for _ in range(args.rounds):
            for gpu in (None, args.gpu):
                start = time.perf_counter()
                report = client.diagnose_linear(x, w, b, observed=y, gpu=gpu)
                seconds = time.perf_counter() - start
                times[gpu or "none"].append(seconds)
                print(
                    f"gpu={gpu or '-':5} {seconds:6.1f} s  best {report.diagnosis.best}"
                )
        without = statistics.median(times["none"])
        with_gpu = statistics.median(times[args.gpu])
        print(
            f"median without a GPU {without:.1f} s, with {args.gpu} {with_gpu:.1f} s: "
            f"ratio {with_gpu / without:.2f}"
        )
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
