#!/usr/bin/env python3
"""Bug or rounding? False alarms, power and out-of-model recipes of the
diagnosis's verdict (docs/numerics.md, "Diagnosis"), as Markdown tables.

Layers: x ~ N(0, 1), W ~ N(0, 1/K), b ~ N(0, 1), seeded, stored in bf16,
fp16 or fp32 (bench/linear_cases.py, `random_layer`), at three sizes:
S = 128×256→1024, M = 512×1024→1024, L = 1921×4096→3072. Every output is
diagnosed with the default candidates (the Diagnose RPC with none named),
and the verdict read from `diagnosis.verdict` ("rounding", "defect",
"unexplained"; "" from a server or client without it, shown as n/a).

1. False alarms. Clean outputs, in the storage dtype, from three producers
   (all `cpu:<dtype>:fused` in truth):
     torch       torch.nn.functional.linear on the CPU
     loop-tiled  a numpy loop, fp32 accumulators, K tiles of 64 summed
                 sequentially, tile sums added, bias added, one rounding
     server      the server's own `cpu:<dtype>:fused` (Verify with
                 return_outputs): the one producer that is the server's code
   A false alarm is a clean output whose verdict is not "rounding". --clean
   N layers in all (default 306; --quick 54), 9 at L and 45 at M (--quick:
   9 at M, none at L), the rest at S.

2. Power. Each trial draws a fresh layer, perturbs one value, and has the
   clean producer (torch, loop-tiled, server in turn) recompute the output
   from the perturbed operands; Diagnose then gets the clean x, W, b and
   that output. Perturbations (`perturb_*`):
     w+1ulp      one weight element, chosen uniformly at random, moved one
                 ULP of its dtype away from zero (scaled by 1 + 2^-p)
     w+1%, w+10%, w×2
                 the same element scaled by 1.01, 1.1, 2 (rounded to the
                 storage dtype)
     x+10%       one input element, at random, scaled by 1.1
     b+10%       one bias element, at random, scaled by 1.1
     b+4ulp      one bias element plus 4 ULP of the output dtype at the
                 median |y| of its column (every element of the column moves
                 by about 4 ULP, more where |y| is small)
     y+2ulp      one output element (of the clean output) moved 2 ULP away
                 from zero
   Per (dtype, size, perturbation): the detection rate (verdict not
   "rounding"), and how far the perturbation moves the output: the largest
   |perturbed − clean| over the output, both computed in fp64 from the
   stored operands, in ULP of the output dtype at the clean value (a
   one-rounding output); `moved ≥ 2` counts the trials where that reaches
   2 ULP. `rows` is the number of rows of the perturbed output column (M;
   for x+10% the perturbed row has N columns). Goals: ≥ 95% detection over
   the trials that move some element ≥ 2 ULP; for w+1%, ≥ 95% of all trials
   whenever the column has ≥ 64 rows (every size here).

3. Not offered. Recipes no default candidate computes, each from its own
   numpy code (`produce_*`): per-tensor FP8 E4M3 quantisation of bf16 x and
   W (torchao-style amax scaling, fp32 matmul of the dequantised values,
   bias in fp32, bf16 output); a bf16 3-pass product on fp32 operands
   (hi·hi + hi·lo + lo·hi, fp32 sums, fp32 output); per-output-channel
   symmetric int8 weights (dequantised, fp32 matmul, output in the storage
   dtype). Goal: verdict "unexplained", never "rounding" with confidence
   > 0.5.

Runtime on 2 cores: --quick (S and M; 6 and 2 trials per perturbation;
54 clean layers, 45 at S) about 75 s; the full run (S, M, L; 20, 6 and 1
trials; 306 clean layers: 252 at S, 45 at M, 9 at L) about 17 minutes
(1036 s measured), about half of it at L (20 s per diagnosis there).

    .venv/bin/python bench/detection_bench.py --quick
    .venv/bin/python bench/detection_bench.py --out /tmp/detection.md
"""

from __future__ import annotations

import argparse
import collections
import shlex
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import ml_dtypes
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import tensorcheck
from linear_cases import (
    DEFAULT_SERVER,
    DTYPES,
    Server,
    dtype_short,
    loop_linear,
    random_layer,
    server_stamp,
    torch_linear,
    ulp_of,
)

SIZES = {"S": (128, 256, 1024), "M": (512, 1024, 1024), "L": (1921, 4096, 3072)}
DTYPE_NAMES = ("bf16", "fp16", "fp32")
PRODUCERS = ("torch", "loop-tiled", "server")
Layer = tuple[np.ndarray, np.ndarray, np.ndarray]


# --- producers of clean outputs -----------------------------------------------


def produce_loop_tiled(x: np.ndarray, w: np.ndarray, b: np.ndarray) -> np.ndarray:
    """x·Wᵀ + b by a numpy loop over k: fp32 accumulators, K tiles of 64
    summed sequentially, tile sums added in order, the bias added to the
    accumulator and one rounding to the storage dtype (cpu:<dtype>:fused in
    an order the server does not use)."""
    return loop_linear(x, w, b, orders=("tiled",), tile=64)["tiled"]


def produce_server(
    client: tensorcheck.Client, x: np.ndarray, w: np.ndarray, b: np.ndarray
) -> np.ndarray:
    """The server's own CPU backend: Verify of `cpu:<dtype>:fused` with
    return_outputs, its output (in the storage dtype)."""
    config = f"cpu:{dtype_short(x)}:fused"
    report = client.verify_linear(
        x, w, b, configs=[config], return_outputs=True, timeout=600
    )
    (result,) = [r for r in report.results if r.config == config]
    assert result.output is not None
    return np.asarray(result.output)


def producer(name: str, client: tensorcheck.Client) -> Callable[..., np.ndarray]:
    """The clean producer `name` ("torch", "loop-tiled", "server") as a
    function of (x, W, b)."""
    if name == "torch":
        return torch_linear
    if name == "loop-tiled":
        return produce_loop_tiled
    if name == "server":
        return lambda x, w, b: produce_server(client, x, w, b)
    raise ValueError(name)


# --- perturbations ---------------------------------------------------------------


@dataclass
class Perturbed:
    """Perturbed operands (or, for an output perturbation, the perturbed
    output itself) and the fp64 output line that moved: `clean64` and
    `moved64` are the affected column (or row) of x·Wᵀ + b computed in fp64
    from the stored operands before and after."""

    x: np.ndarray
    w: np.ndarray
    b: np.ndarray
    clean64: np.ndarray
    moved64: np.ndarray
    rows: int
    where: str


def _column64(x: np.ndarray, w: np.ndarray, b: np.ndarray, j: int) -> np.ndarray:
    """Column j of x·Wᵀ + b in fp64 (exact products, fp64 sums)."""
    return x.astype(np.float64) @ w[j].astype(np.float64) + float(b[j])


def _row64(x: np.ndarray, w: np.ndarray, b: np.ndarray, i: int) -> np.ndarray:
    """Row i of x·Wᵀ + b in fp64."""
    return w.astype(np.float64) @ x[i].astype(np.float64) + b.astype(np.float64)


def _away_from_zero(v: np.ndarray, steps: int) -> np.ndarray:
    """v (a 0-d or 1-d array of bf16/fp16/fp32) moved `steps` representable
    values away from zero: its bit pattern's magnitude plus `steps`."""
    uint = {2: np.uint16, 4: np.uint32}[v.dtype.itemsize]
    bits = np.ascontiguousarray(v).view(uint).copy()
    bits += uint(steps)
    return bits.view(v.dtype)


def perturb_weight(
    rng: np.random.Generator, x: np.ndarray, w: np.ndarray, b: np.ndarray, r: float
) -> Perturbed:
    """One weight element W[j, k], chosen uniformly at random, scaled by
    1 + r and rounded to the storage dtype; r = 0 means one ULP of the
    dtype away from zero (the smallest change there is). It moves output
    column j (M rows)."""
    j, k = int(rng.integers(w.shape[0])), int(rng.integers(w.shape[1]))
    w2 = w.copy()
    if r == 0:
        w2[j, k] = _away_from_zero(w[j, k : k + 1], 1)[0]
    else:
        w2[j, k] = np.asarray(float(w[j, k]) * (1 + r)).astype(w.dtype)
    return Perturbed(
        x,
        w2,
        b,
        _column64(x, w, b, j),
        _column64(x, w2, b, j),
        x.shape[0],
        f"W[{j},{k}]",
    )


def perturb_input(
    rng: np.random.Generator, x: np.ndarray, w: np.ndarray, b: np.ndarray, r: float
) -> Perturbed:
    """One input element x[i, k], at random, scaled by 1 + r (rounded to the
    storage dtype). It moves output row i (N columns)."""
    i, k = int(rng.integers(x.shape[0])), int(rng.integers(x.shape[1]))
    x2 = x.copy()
    x2[i, k] = np.asarray(float(x[i, k]) * (1 + r)).astype(x.dtype)
    return Perturbed(
        x2, w, b, _row64(x, w, b, i), _row64(x2, w, b, i), w.shape[0], f"x[{i},{k}]"
    )


def perturb_bias_scale(
    rng: np.random.Generator, x: np.ndarray, w: np.ndarray, b: np.ndarray, r: float
) -> Perturbed:
    """One bias element b[j], at random, scaled by 1 + r (rounded to the
    storage dtype). It moves output column j by the same amount everywhere."""
    j = int(rng.integers(b.shape[0]))
    b2 = b.copy()
    b2[j] = np.asarray(float(b[j]) * (1 + r)).astype(b.dtype)
    return Perturbed(
        x, w, b2, _column64(x, w, b, j), _column64(x, w, b2, j), x.shape[0], f"b[{j}]"
    )


def perturb_bias_ulp(
    rng: np.random.Generator, x: np.ndarray, w: np.ndarray, b: np.ndarray, ulps: float
) -> Perturbed:
    """One bias element b[j], at random, plus `ulps` ULP of the output dtype
    at the median |y| of column j (y in fp64), rounded to the storage dtype."""
    j = int(rng.integers(b.shape[0]))
    clean = _column64(x, w, b, j)
    step = float(ulp_of(np.median(np.abs(clean)), x.dtype))
    b2 = b.copy()
    b2[j] = np.asarray(float(b[j]) + ulps * step).astype(b.dtype)
    return Perturbed(x, w, b2, clean, _column64(x, w, b2, j), x.shape[0], f"b[{j}]")


def perturb_output(
    rng: np.random.Generator, y: np.ndarray, steps: int
) -> tuple[np.ndarray, int, int]:
    """The clean output y with one element, at random, moved `steps`
    representable values away from zero; returns (y', i, j)."""
    i, j = int(rng.integers(y.shape[0])), int(rng.integers(y.shape[1]))
    y2 = y.copy()
    y2[i, j] = _away_from_zero(y[i, j : j + 1], steps)[0]
    return y2, i, j


PERTURBATIONS: dict[str, Callable[..., Perturbed] | None] = {
    "w+1ulp": lambda rng, x, w, b: perturb_weight(rng, x, w, b, 0.0),
    "w+1%": lambda rng, x, w, b: perturb_weight(rng, x, w, b, 0.01),
    "w+10%": lambda rng, x, w, b: perturb_weight(rng, x, w, b, 0.1),
    "w×2": lambda rng, x, w, b: perturb_weight(rng, x, w, b, 1.0),
    "x+10%": lambda rng, x, w, b: perturb_input(rng, x, w, b, 0.1),
    "b+10%": lambda rng, x, w, b: perturb_bias_scale(rng, x, w, b, 0.1),
    "b+4ulp": lambda rng, x, w, b: perturb_bias_ulp(rng, x, w, b, 4.0),
    "y+2ulp": None,  # perturb_output, on the clean output
}


def max_move_ulp(p: Perturbed, dtype: np.dtype) -> float:
    """The largest |moved − clean| (fp64) in ULP of `dtype` at the clean
    value."""
    return float(np.max(np.abs(p.moved64 - p.clean64) / ulp_of(p.clean64, dtype)))


# --- out-of-model recipes ---------------------------------------------------------


def produce_fp8_tensorwise(x: np.ndarray, w: np.ndarray, b: np.ndarray) -> np.ndarray:
    """torchao-style dynamic per-tensor FP8 E4M3: s = 448 / amax (fp64, then
    fp32), q = saturate(round_e4m3(fl32(v)·s)), dequantised v' = q·fl32(1/s);
    y = fl32(x'·W'ᵀ) (numpy sgemm) + b in fp32, rounded to bf16."""

    def quant(v: np.ndarray) -> np.ndarray:
        v32 = v.astype(np.float32)
        s = np.float32(448.0 / max(float(np.max(np.abs(v32))), 1e-12))
        q = np.clip(v32 * s, -448, 448).astype(ml_dtypes.float8_e4m3fn)
        return q.astype(np.float32) * np.float32(1 / s)

    y = quant(x) @ quant(w).T + b.astype(np.float32)
    return y.astype(ml_dtypes.bfloat16)


def produce_bf16x3(x: np.ndarray, w: np.ndarray, b: np.ndarray) -> np.ndarray:
    """A bf16 3-pass product of fp32 operands: v = hi + lo with hi =
    bf16(v), lo = bf16(v − hi); y = hi·hiᵀ + hi·loᵀ + lo·hiᵀ as three fp32
    sgemms summed in fp32 (lo·lo dropped), + b in fp32; fp32 output."""

    def split(v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        v32 = v.astype(np.float32)
        hi = v32.astype(ml_dtypes.bfloat16).astype(np.float32)
        lo = (v32 - hi).astype(ml_dtypes.bfloat16).astype(np.float32)
        return hi, lo

    (xh, xl), (wh, wl) = split(x), split(w)
    y = xh @ wh.T + xh @ wl.T + xl @ wh.T + b.astype(np.float32)
    return y.astype(np.float32)


def produce_int8_weights(x: np.ndarray, w: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Per-output-channel symmetric int8 weights: s_j = amax|W_j| / 127,
    q = clip(rint(W/s), −127, 127), W' = q·s in fp32; y = x·W'ᵀ (numpy
    sgemm) + b in fp32, rounded to the storage dtype."""
    w32 = w.astype(np.float32)
    s = np.maximum(np.max(np.abs(w32), axis=1, keepdims=True), 1e-12) / np.float32(127)
    wq = np.clip(np.rint(w32 / s), -127, 127) * s
    y = x.astype(np.float32) @ wq.T + b.astype(np.float32)
    return y.astype(x.dtype)


RECIPES: list[tuple[str, str, Callable[..., np.ndarray]]] = [
    ("fp8-e4m3-tensorwise", "bf16", produce_fp8_tensorwise),
    ("bf16x3", "fp32", produce_bf16x3),
    ("int8-weights", "bf16", produce_int8_weights),
    ("int8-weights", "fp16", produce_int8_weights),
    ("int8-weights", "fp32", produce_int8_weights),
]


# --- the bench ----------------------------------------------------------------------


@dataclass
class Verdict:
    verdict: str
    confidence: float
    best: str
    tied: list[str]
    equivalent: list[str]
    candidates: int

    @property
    def detected(self) -> bool:
        return self.verdict not in ("rounding", "")


def diagnose(client: tensorcheck.Client, layer: Layer, y: np.ndarray) -> Verdict:
    """The verdict of Diagnose on (x, W, b) and observed y, default
    candidates."""
    x, w, b = layer
    d = client.diagnose_linear(x, w, b, observed=y, timeout=900).diagnosis
    assert d is not None, "the server sent no diagnosis"
    return Verdict(
        getattr(d, "verdict", "") or "",
        d.confidence,
        d.best or "none",
        list(d.tied),
        list(d.equivalent),
        len(d.ranking),
    )


@dataclass
class Plan:
    sizes: list[str]
    clean: dict[str, int]  # layers per (dtype, producer) at each size
    trials: dict[str, int]  # trials per (dtype, perturbation) at each size
    recipe_seeds: dict[str, int]


def make_plan(args: argparse.Namespace) -> Plan:
    if args.quick:
        sizes = ["S", "M"]
        t = args.trials or 6
        trials = {"S": t, "M": max(1, round(t / 3))}
        recipe_seeds = {"S": 2, "M": 1}
        big: dict[str, int] = {"M": 1}
    else:
        sizes = ["S", "M", "L"]
        t = args.trials or 20
        trials = {"S": t, "M": max(1, round(t * 0.3)), "L": 1}
        recipe_seeds = {"S": 2, "M": 2, "L": 1}
        big = {"M": 5, "L": 1}
    combos = len(DTYPE_NAMES) * len(PRODUCERS)
    clean = dict(big)
    rest = max(0, args.clean - combos * sum(big.values()))
    clean["S"] = max(1, -(-rest // combos))
    return Plan(sizes, {s: clean[s] for s in sizes}, trials, recipe_seeds)


@dataclass
class Tally:
    verdicts: collections.Counter = field(default_factory=collections.Counter)
    best: collections.Counter = field(default_factory=collections.Counter)
    truth_named: int = 0
    min_conf: float = 1.0
    n: int = 0

    def add(self, v: Verdict, truth: str) -> None:
        self.n += 1
        self.verdicts[v.verdict or "n/a"] += 1
        self.best[v.best] += 1
        self.truth_named += truth in (v.best, *v.tied, *v.equivalent)
        self.min_conf = min(self.min_conf, v.confidence)


def pct(k: int, n: int) -> str:
    return f"{100 * k / n:.0f}% ({k}/{n})" if n else "-"


def fmt_best(c: collections.Counter) -> str:
    best, count = c.most_common(1)[0]
    return f"`{best}` ({count})"


def verdict_counts(c: collections.Counter) -> str:
    order = ("rounding", "defect", "unexplained", "n/a")
    return ", ".join(f"{k} {c[k]}" for k in order if c[k])


def bench_clean(
    client: tensorcheck.Client,
    plan: Plan,
    seed: int,
    log: Callable[[str], None],
) -> list[str]:
    tallies: dict[tuple[str, str, str], Tally] = {}
    for size in plan.sizes:
        m, k, n = SIZES[size]
        for di, dtype in enumerate(DTYPE_NAMES):
            truth = f"cpu:{dtype}:fused"
            for pi, pname in enumerate(PRODUCERS):
                produce = producer(pname, client)
                tally = tallies.setdefault((size, dtype, pname), Tally())
                for t in range(plan.clean[size]):
                    rng = np.random.default_rng(
                        [seed, 1, di, pi, list(SIZES).index(size), t]
                    )
                    layer = random_layer(rng, m, k, n, dtype)
                    v = diagnose(client, layer, produce(*layer))
                    tally.add(v, truth)
                log(f"clean {size} {dtype} {pname}: {verdict_counts(tally.verdicts)}")
    total = sum(t.n for t in tallies.values())
    alarms = sum(
        t.n - t.verdicts["rounding"] - t.verdicts["n/a"] for t in tallies.values()
    )
    unknown = sum(t.verdicts["n/a"] for t in tallies.values())
    out = [
        "## False alarms on clean outputs",
        "",
        (
            "Goal: 0 false alarms (verdict not `rounding`) in at least 300 clean layers. "
            "`truth named`: the true configuration (`cpu:<dtype>:fused`) is best, tied "
            "or equivalent."
        ),
        "",
        (
            "| size | dtype | producer | layers | verdicts | false alarms | best (most common) "
            "| truth named | min confidence |"
        ),
        "|---|---|---|---:|---|---:|---|---:|---:|",
    ]
    for (size, dtype, pname), t in tallies.items():
        m, k, n = SIZES[size]
        fa = t.n - t.verdicts["rounding"] - t.verdicts["n/a"]
        out.append(
            f"| {m}×{k}→{n} | {dtype} | {pname} | {t.n} | {verdict_counts(t.verdicts)} | "
            f"{'n/a' if t.verdicts['n/a'] == t.n else fa} | {fmt_best(t.best)} | "
            f"{pct(t.truth_named, t.n)} | {t.min_conf:.2f} |"
        )
    out += [
        "",
        f"**{total} clean layers: {alarms} false alarms"
        + (f" ({unknown} without a verdict: n/a)" if unknown else "")
        + ".**",
        "",
    ]
    return out


def bench_power(
    client: tensorcheck.Client,
    plan: Plan,
    seed: int,
    log: Callable[[str], None],
) -> list[str]:
    out = [
        "## Power: one perturbed value",
        "",
        (
            "Detection: verdict not `rounding`. `moved ≥ 2 ULP`: trials whose perturbation "
            "moves some output element by ≥ 2 ULP of a one-rounding output (fp64, ULP at "
            "the clean value); `median max move`: the median over trials of the largest "
            "move, in ULP. Goal: ≥ 95% detection over the trials moving ≥ 2 ULP; for "
            "w+1% over all trials (every column here has ≥ 64 rows)."
        ),
        "",
        (
            "| size | dtype | perturbation | trials | rows of column | moved ≥ 2 ULP "
            "| median max move (ULP) | detected | detected when moved ≥ 2 ULP | verdicts "
            "| best (most common) | goal |"
        ),
        "|---|---|---|---:|---:|---:|---:|---:|---:|---|---|---|",
    ]
    for size in plan.sizes:
        m, k, n = SIZES[size]
        for di, dtype in enumerate(DTYPE_NAMES):
            dt = DTYPES[dtype]
            for qi, (pert, fn) in enumerate(PERTURBATIONS.items()):
                moves: list[float] = []
                hits, hits_moved, n_moved = 0, 0, 0
                counts: collections.Counter = collections.Counter()
                rows = f"{n} (a row)" if pert.startswith("x") else str(m)
                bests: collections.Counter = collections.Counter()
                for t in range(plan.trials[size]):
                    rng = np.random.default_rng(
                        [seed, 2, di, qi, list(SIZES).index(size), t]
                    )
                    layer = random_layer(rng, m, k, n, dtype)
                    produce = producer(PRODUCERS[t % len(PRODUCERS)], client)
                    if fn is None:
                        y, _, _ = perturb_output(rng, produce(*layer), 2)
                        move = 2.0
                    else:
                        p = fn(rng, *layer)
                        y = produce(p.x, p.w, p.b)
                        move = max_move_ulp(p, dt)
                    v = diagnose(client, layer, y)
                    counts[v.verdict or "n/a"] += 1
                    bests[v.best] += 1
                    moves.append(move)
                    hits += v.detected
                    if move >= 2:
                        n_moved += 1
                        hits_moved += v.detected
                trials = len(moves)
                known = counts["n/a"] == 0
                if pert == "w+1%":
                    rate, goal_n = hits / trials, trials
                else:
                    rate = hits_moved / n_moved if n_moved else float("nan")
                    goal_n = n_moved
                if not known:
                    goal = "n/a"
                elif goal_n == 0:
                    goal = "- (no trial moved ≥ 2 ULP)"
                else:
                    goal = "met" if rate >= 0.95 else f"**not met** ({100 * rate:.0f}%)"
                line = (
                    f"| {m}×{k}→{n} | {dtype} | {pert} | {trials} | {rows} | "
                    f"{n_moved} | {np.median(moves):.3g} | "
                    f"{pct(hits, trials) if known else 'n/a'} | "
                    f"{pct(hits_moved, n_moved) if known else 'n/a'} | "
                    f"{verdict_counts(counts)} | {fmt_best(bests)} | {goal} |"
                )
                out.append(line)
                log(f"power {size} {dtype} {pert}: {verdict_counts(counts)}")
    out.append("")
    return out


def bench_recipes(
    client: tensorcheck.Client,
    plan: Plan,
    seed: int,
    log: Callable[[str], None],
) -> list[str]:
    out = [
        "## Not offered: recipes no default candidate computes",
        "",
        "Goal: verdict `unexplained`; never `rounding` with confidence > 0.5.",
        "",
        "| recipe | dtype | size | seed | verdict | confidence | best | tied | goal |",
        "|---|---|---|---:|---|---:|---|---|---|",
    ]
    for size in plan.sizes:
        m, k, n = SIZES[size]
        for ri, (name, dtype, produce) in enumerate(RECIPES):
            for s in range(plan.recipe_seeds[size]):
                rng = np.random.default_rng([seed, 3, ri, list(SIZES).index(size), s])
                layer = random_layer(rng, m, k, n, dtype)
                v = diagnose(client, layer, produce(*layer))
                if not v.verdict:
                    goal = "n/a"
                elif v.verdict == "unexplained":
                    goal = "met"
                elif v.verdict == "rounding" and v.confidence > 0.5:
                    goal = "**violated**"
                else:
                    goal = f"not met ({v.verdict})"
                tied = ", ".join(f"`{c}`" for c in v.tied) or "-"
                out.append(
                    f"| {name} | {dtype} | {m}×{k}→{n} | {s} | {v.verdict or 'n/a'} | "
                    f"{v.confidence:.2f} | `{v.best}` | {tied} | {goal} |"
                )
                log(
                    f"recipe {size} {name} {dtype} seed {s}: {v.verdict or 'n/a'} {v.best}"
                )
    out.append("")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--server", default=str(DEFAULT_SERVER))
    ap.add_argument("--quick", action="store_true", help="S only, few trials")
    ap.add_argument(
        "--clean", type=int, help="clean layers in all (default 306, --quick 54)"
    )
    ap.add_argument(
        "--trials",
        type=int,
        help="trials per perturbation at S (default 20, --quick 6)",
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", help="also write the Markdown to this file")
    ap.add_argument(
        "--only",
        default="clean,power,recipes",
        help="sections to run (comma-separated: clean, power, recipes)",
    )
    args = ap.parse_args()
    if args.clean is None:
        args.clean = 54 if args.quick else 306
    plan = make_plan(args)
    sections = set(args.only.split(","))
    start = time.perf_counter()
    stamp = server_stamp(Path(args.server))  # before a rebuild can replace it

    def log(line: str) -> None:
        print(
            f"[{time.perf_counter() - start:7.1f}s] {line}", file=sys.stderr, flush=True
        )

    body: list[str] = []
    with (
        Server(Path(args.server)) as server,
        tensorcheck.Client(server.target) as client,
    ):
        if "clean" in sections:
            body += bench_clean(client, plan, args.seed, log)
        if "power" in sections:
            body += bench_power(client, plan, args.seed, log)
        if "recipes" in sections:
            body += bench_recipes(client, plan, args.seed, log)
    elapsed = time.perf_counter() - start
    head = [
        "# Detection bench: bug or rounding?",
        "",
        f"Command: `{shlex.join([Path(sys.argv[0]).as_posix(), *sys.argv[1:]])}`  ",
        f"Server: {stamp}  ",
        f"Total runtime: {elapsed:.0f} s; seed {args.seed}; sizes "
        + ", ".join(
            f"{'×'.join(map(str, SIZES[s][:2]))}→{SIZES[s][2]}" for s in plan.sizes
        )
        + "; clean layers per (dtype, producer): "
        + ", ".join(f"{s} {plan.clean[s]}" for s in plan.sizes)
        + "; trials per perturbation: "
        + ", ".join(f"{s} {plan.trials[s]}" for s in plan.sizes)
        + ".",
        "",
    ]
    text = "\n".join(head + body)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
