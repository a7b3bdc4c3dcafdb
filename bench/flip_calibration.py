#!/usr/bin/env python3
"""Calibration of the diagnosis's flip model (docs/numerics.md, "Diagnosis",
rule 4): for clean outputs whose configuration is known, how many elements
differ in bits from that configuration's candidate (`disagreements`, what
another summation order really flipped) against how many the error model
predicts (`expected_disagreements`, λ = Σ p)?

Cases, per size (x ~ N(0, 1), W ~ N(0, 1/K), b ~ N(0, 1), seeded, stored in
the case's dtype; outputs in that dtype):

  torch      torch.nn.functional.linear on the CPU, bf16 / fp16 / fp32
             (true configuration cpu:<dtype>:fused)
  flax       flax.linen.Dense, JAX's default precision on the CPU, fp32 / bf16
             (cpu:<dtype>:unfused: XLA rounds the dot before the bias)
  numpy      x @ W.T + b in float32 (cpu:fp32:unfused)
  loop-*     numpy loops over k with fp32 accumulators, bias added to the
             accumulator, one rounding to the output dtype at the end, in
             three orders: sequential, K-tiled (tiles of 64) and pairwise
             (cpu:<dtype>:fused), for each of --loop-dtypes

Each output goes to the Diagnose RPC with the true configuration as the only
candidate (its `disagreements` and `expected_disagreements` do not depend on
the other candidates; --default-candidates sends none and reads the true one
from the full ranking). Prints a Markdown table: case, dtype, M×K→N, true
configuration, observed disagreements D, expected λ, λ/D and the Poisson
plausibility p; then the median λ/D and the worst factor max(λ/D, D/λ) over
the rows where D > 0 and max(D, λ) ≥ 10 (fewer counts are Poisson noise;
D = 0 means the producer summed in the candidate's own order), and
leaving out the producers that sum in the server's own order (numpy's
sgemm is the server's OpenBLAS; at K ≤ 256 Flax's dot and a sequential
loop of exact products sum as that sgemm's one pass does), which the
model of two different orders does not describe.

Sizes: 2×768→512, 48×1024→768, 128×256→1024 (--quick: only these, about
10 s on 2 cores), then 512×1024→1024 and 1921×4096→3072; the full run
takes about 3 minutes (190 s) on 2 cores, most of it at the largest size:
the three loop orders (one pass over k, about 25 s per loop dtype),
PyTorch's fp16 matmul and the server's diagnoses.

    .venv/bin/python bench/flip_calibration.py --quick
    .venv/bin/python bench/flip_calibration.py --out /tmp/flip_calibration.md
"""

from __future__ import annotations

import argparse
import math
import shlex
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import tensorcheck
from linear_cases import (
    DEFAULT_SERVER,
    LOOP_ORDERS,
    Server,
    flax_dense,
    loop_linear,
    numpy_linear,
    random_layer,
    server_stamp,
    torch_linear,
)

QUICK_SIZES = [(2, 768, 512), (48, 1024, 768), (128, 256, 1024)]
FULL_SIZES = [*QUICK_SIZES, (512, 1024, 1024), (1921, 4096, 3072)]
# Rows with fewer counts than this on both sides are left out of the summary.
MIN_COUNT = 10


@dataclass
class Row:
    case: str
    dtype: str
    size: tuple[int, int, int]
    config: str
    observed: int
    expected: float
    plausibility_p: float
    compared: int
    seconds: float

    @property
    def ratio(self) -> float:
        if self.observed == 0:
            return float("inf") if self.expected > 0 else float("nan")
        return self.expected / self.observed


Producer = Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]


def framework_cases(dtype: str) -> list[tuple[str, str, Producer]]:
    """(case name, true configuration, producer) of the frameworks for one
    storage dtype."""
    cases: list[tuple[str, str, Producer]] = [
        ("torch", f"cpu:{dtype}:fused", torch_linear)
    ]
    if dtype in ("fp32", "bf16"):
        cases.append(("flax", f"cpu:{dtype}:unfused", flax_dense))
    if dtype == "fp32":
        cases.append(("numpy", "cpu:fp32:unfused", numpy_linear))
    return cases


def diagnose(
    client: tensorcheck.Client,
    x: np.ndarray,
    w: np.ndarray,
    b: np.ndarray,
    y: np.ndarray,
    config: str,
    default_candidates: bool,
) -> tuple[int, float, float, int]:
    """(disagreements, expected_disagreements, plausibility_p,
    compared_elements) of `config` in the diagnosis of y."""
    report = client.diagnose_linear(
        x,
        w,
        b,
        observed=y,
        candidates=None if default_candidates else [config],
        timeout=600,
    )
    d = report.diagnosis
    assert d is not None, "the server sent no diagnosis"
    for c in d.ranking:
        if c.config == config:
            return (
                c.disagreements,
                c.expected_disagreements,
                c.plausibility_p,
                c.compared_elements,
            )
    raise RuntimeError(
        f"{config} is not in the ranking: {[c.config for c in d.ranking]}"
    )


def run(args: argparse.Namespace, emit: Callable[[str], None]) -> list[Row]:
    sizes = QUICK_SIZES if args.quick else FULL_SIZES
    rows: list[Row] = []
    with (
        Server(Path(args.server)) as server,
        tensorcheck.Client(server.target) as client,
    ):
        for si, (m, k, n) in enumerate(sizes):
            for di, dtype in enumerate(("bf16", "fp16", "fp32")):
                rng = np.random.default_rng([args.seed, si, di])
                x, w, b = random_layer(rng, m, k, n, dtype)
                outputs: list[tuple[str, str, np.ndarray, float]] = []
                for name, config, produce in framework_cases(dtype):
                    t = time.perf_counter()
                    y = produce(x, w, b)
                    outputs.append((name, config, y, time.perf_counter() - t))
                if dtype in args.loop_dtypes:
                    t = time.perf_counter()
                    loops = loop_linear(x, w, b, LOOP_ORDERS, tile=args.tile)
                    s = (time.perf_counter() - t) / len(loops)
                    for order, y in loops.items():
                        outputs.append((f"loop-{order}", f"cpu:{dtype}:fused", y, s))
                for name, config, y, s in outputs:
                    assert y.dtype == x.dtype and y.shape == (m, n), (name, y.dtype)
                    got = diagnose(client, x, w, b, y, config, args.default_candidates)
                    rows.append(Row(name, dtype, (m, k, n), config, *got, seconds=s))
                    emit(format_row(rows[-1]))
    return rows


def fmt_ratio(r: float) -> str:
    if math.isnan(r):
        return "-"
    return "∞" if r == float("inf") else f"{r:.3g}"


HEADER = (
    "| case | dtype | M×K→N | true configuration | disagreements D | "
    "expected λ | λ/D | plausibility p | compared |\n"
    "|---|---|---|---|---:|---:|---:|---:|---:|"
)


def format_row(r: Row) -> str:
    m, k, n = r.size
    return (
        f"| {r.case} | {r.dtype} | {m}×{k}→{n} | `{r.config}` | {r.observed} | "
        f"{r.expected:.4g} | {fmt_ratio(r.ratio)} | {r.plausibility_p:.3g} | "
        f"{r.compared} |"
    )


# OpenBLAS's sgemm (the CPU backend's, and numpy's) sums a reduction this
# short in one sequential pass over k with fused multiply-adds; so does
# XLA's CPU dot (Flax). Measured at 128×256→1024: Flax flips 0 (bf16) and
# 4% (fp32) of the elements, a sequential loop of exact 16-bit products 0
# and 9 (λ 22 and 252); a loop of fp32 products rounds each product, which
# the fused sgemm does not, and so sums in another order (68%).
OPENBLAS_ONE_PASS_K = 256


def server_order(r: Row) -> bool:
    """Whether the producer sums in the server's own order (numpy's matmul is
    OpenBLAS's sgemm; Flax and a sequential loop of exact products sum a
    short reduction as that sgemm does): the flip model's hypothesis, two
    different orders, does not describe such a row."""
    short = r.size[1] <= OPENBLAS_ONE_PASS_K
    return (
        r.case == "numpy"
        or (r.case == "flax" and short)
        or (r.case == "loop-sequential" and short and r.dtype != "fp32")
    )


def summary(rows: list[Row]) -> str:
    own = [r for r in rows if server_order(r)]
    counted = [
        r
        for r in rows
        if not server_order(r)
        and r.observed > 0
        and max(r.observed, r.expected) >= MIN_COUNT
    ]
    same = sum(
        r.observed == 0 and r.expected >= MIN_COUNT for r in rows if not server_order(r)
    )
    if not counted:
        return f"No row has D > 0 and max(D, λ) ≥ {MIN_COUNT}: nothing to summarise."
    ratios = [r.ratio for r in counted]
    worst = max(counted, key=lambda r: max(r.ratio, 1 / r.ratio))
    wf = max(worst.ratio, 1 / worst.ratio)
    lines = [
        (
            f"Over the {len(counted)} of {len(rows)} rows with D > 0 and "
            f"max(D, λ) ≥ {MIN_COUNT}, leaving out the {len(own)} rows whose "
            "producer sums in the server's own order (numpy's sgemm is the "
            "server's OpenBLAS; Flax and a sequential loop of exact products "
            f"with K ≤ {OPENBLAS_ONE_PASS_K} sum as that sgemm does), which the "
            "model's "
            f"hypothesis of another order does not describe ({same} other rows "
            f"have D = 0 although λ ≥ {MIN_COUNT}: flipped nothing by chance or "
            "summed in the candidate's order too; the rest have too few counts "
            "to tell)."
        ),
        f"- median λ/D: {fmt_ratio(statistics.median(ratios))}",
        (
            f"- worst factor max(λ/D, D/λ): {fmt_ratio(wf)} "
            f"({worst.case} {worst.dtype} {'×'.join(map(str, worst.size[:2]))}→"
            f"{worst.size[2]}: D = {worst.observed}, λ = {worst.expected:.4g})"
        ),
    ]
    for dtype in ("bf16", "fp16", "fp32"):
        rs = [r.ratio for r in counted if r.dtype == dtype]
        if rs:
            lines.append(
                f"- {dtype}: median λ/D {fmt_ratio(statistics.median(rs))} "
                f"over {len(rs)} rows, range {fmt_ratio(min(rs))} .. "
                f"{fmt_ratio(max(rs))}"
            )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--server", default=str(DEFAULT_SERVER))
    ap.add_argument("--quick", action="store_true", help="only the small sizes")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tile", type=int, default=64, help="K tile of loop-tiled")
    ap.add_argument(
        "--loop-dtypes",
        default="bf16,fp16,fp32",
        type=lambda s: [d for d in s.split(",") if d],
        help="dtypes of the loop cases (comma-separated; empty: none)",
    )
    ap.add_argument(
        "--default-candidates",
        action="store_true",
        help="diagnose against the default candidates instead of the true one",
    )
    ap.add_argument("--out", help="also write the Markdown to this file")
    args = ap.parse_args()

    start = time.perf_counter()
    lines = [
        "# Flip calibration: observed vs expected disagreements",
        "",
        f"Command: `{shlex.join([Path(sys.argv[0]).as_posix(), *sys.argv[1:]])}`  ",
        f"Server: {server_stamp(Path(args.server))}",  # before it starts
        "",
        HEADER,
    ]
    print("\n".join(lines), flush=True)

    def emit(line: str) -> None:
        lines.append(line)
        print(line, flush=True)

    rows = run(args, emit)
    tail = [
        "",
        summary(rows),
        "",
        f"Total runtime: {time.perf_counter() - start:.1f} s",
    ]
    print("\n".join(tail))
    lines += tail
    if args.out:
        Path(args.out).write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
