#!/usr/bin/env python3
"""The 2x768 -> 512 Flax case end to end through the CLI on a GPU host
(docs/performance.md, "GPU", 2c): `tensorcheck diagnose` of an fp32
`nn.Dense`-shaped layer (kernel [K, N], in_out) with the server's default
candidates and reference (all on the GPU), against the same diagnosis over
the CPU backend's candidates and `cpu:fp64` on the same server; medians of
--runs wall times of the CLI process, and their ratio.

    bench/gpu_cli_case.py --target 127.0.0.1:50051 --cli build-cuda/client/cli/tensorcheck

The observed output is numpy's fp32 x @ W + b (not Flax's: the figure is
the time, not the verdict).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

PRECISIONS = ["fp64", "fp32", "tf32", "tf32rna", "tf32trunc", "bf16", "fp16", "fp16acc"]


def median_ms(cmd: list[str], runs: int) -> float:
    times = []
    for i in range(runs + 1):
        start = time.monotonic()
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
        elapsed = (time.monotonic() - start) * 1000
        if done.returncode not in (0, 1):  # 1: the verdict failed, still a run
            sys.exit(
                f"gpu_cli_case: {' '.join(cmd)}: exit {done.returncode}\n{done.stderr}"
            )
        if i > 0:  # the first warms the server up
            times.append(elapsed)
    return statistics.median(times)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--target", required=True)
    p.add_argument("--cli", required=True, help="the tensorcheck CLI binary")
    p.add_argument("--runs", type=int, default=5)
    args = p.parse_args()
    rng = np.random.default_rng(7)
    x = rng.standard_normal((2, 768), dtype=np.float32)
    w = (rng.standard_normal((768, 512)) / np.sqrt(768)).astype(np.float32)
    b = (0.1 * rng.standard_normal(512)).astype(np.float32)
    y = (x @ w + b).astype(np.float32)
    with tempfile.TemporaryDirectory() as d:
        files = {}
        for name, a in {"x": x, "w": w, "b": b, "y": y}.items():
            files[name] = str(Path(d) / f"{name}.npy")
            np.save(files[name], a)
        base = [
            args.cli,
            "--server",
            args.target,
            "diagnose",
            "--input",
            files["x"],
            "--weight",
            files["w"],
            "--bias",
            files["b"],
            "--observed",
            files["y"],
            "--weight-layout",
            "in_out",
        ]
        gpu = median_ms(base, args.runs)
        cpu_configs = [
            f"--config=cpu:{p}:{b}" for p in PRECISIONS for b in ("fused", "unfused")
        ]
        cpu = median_ms([*base, "--reference", "cpu:fp64", *cpu_configs], args.runs)
    print("| candidates | CLI wall ms (median) | ratio |")
    print("|---|---|---|")
    print(f"| cpu backend, reference cpu:fp64 (baseline) | {cpu:.1f} | 1.00 |")
    print(f"| server defaults (the GPU's) | {gpu:.1f} | {gpu / cpu:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
