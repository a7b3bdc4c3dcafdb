"""candle's bf16 Linear vs PyTorch's: one-ULP differences, and where from.

The candle case (the repository's README): 1921x4096 -> 3072 in bf16. PyTorch adds the bias
inside the cuBLASLt epilogue in fp32 and rounds once; candle stores the GEMM
result as bf16, then adds the bias in bf16 (two roundings). The outputs
differ by exactly one bf16 ULP in a few places. This script produces both
outputs in numpy, as the two frameworks compute them, and asks a tensorcheck
server which bias mode each one matches.

    python examples/candle_bf16.py [--server HOST:PORT] [--full]   # default $TENSORCHECK_SERVER

Without --full it runs a 256x1024 -> 768 layer (seconds on a CPU server);
--full is the original size.
"""

from __future__ import annotations

import argparse

import ml_dtypes
import numpy as np

import tensorcheck

bf16 = ml_dtypes.bfloat16


def candle_linear(x, w, b):
    """candle: matmul (fp32 accumulate) -> bf16 tensor, then bf16 + bias."""
    t = (x.astype(np.float32) @ w.astype(np.float32).T).astype(bf16)
    return (t.astype(np.float32) + b.astype(np.float32)).astype(bf16)


def torch_linear(x, w, b):
    """PyTorch/cuBLASLt: bias added to the fp32 accumulator, one rounding."""
    acc = x.astype(np.float32) @ w.astype(np.float32).T
    return (acc + b.astype(np.float32)).astype(bf16)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--server",
        default=None,
        help="tensorcheck server host:port (default: $TENSORCHECK_SERVER, else localhost:50051)",
    )
    parser.add_argument("--full", action="store_true", help="1921x4096 -> 3072")
    args = parser.parse_args()
    m, k, n = (1921, 4096, 3072) if args.full else (256, 1024, 768)

    rng = np.random.default_rng(0)
    x = rng.standard_normal((m, k)).astype(bf16)
    w = (rng.standard_normal((n, k)) / np.sqrt(k)).astype(bf16)
    b = (rng.standard_normal(n) * 2).astype(bf16)

    y_candle = candle_linear(x, w, b)
    y_torch = torch_linear(x, w, b)
    differ = y_candle != y_torch
    print(
        f"{m}x{k} -> {n} bf16: candle and torch differ in {differ.sum()} of "
        f"{differ.size} elements, max abs "
        f"{np.abs(y_candle.astype(np.float32) - y_torch.astype(np.float32)).max()}\n"
    )

    with tensorcheck.Client(args.server, timeout=600) as client:
        # Which bias mode does each framework's output match?
        for name, y in (("candle", y_candle), ("torch", y_torch)):
            report = client.verify_linear(
                x, w, b, observed=y, configs=["cpu:bf16:fused", "cpu:bf16:unfused"]
            )
            print(
                f"{name}: {report.verdict.upper()} against the fp64 reference "
                f"(max {report.observed_vs_reference.max_ulp} ULP)"
            )
            for r in report.results:
                s = r.vs_observed
                print(
                    f"  {r.config:<18} bitwise equal {s.bitwise_equal_count / s.total:7.2%}"
                    f"  max {s.max_ulp} ULP  mismatched {s.mismatched}"
                )

        # The diagnosis says it in words, with the columns that hold the
        # differences.
        report = client.diagnose_linear(
            x, w, b, observed=y_candle, candidates=["cpu:bf16:fused", "cpu:bf16:unfused"]
        )
        d = report.diagnosis
        print(f"\ncandle: {d.headline or d.best}")  # the server's answer in one sentence
        if d.advice:
            print(f"  {d.advice}")
        if d.framework_hint:
            print(f"  {d.framework_hint}")
        cols = d.localization.columns
        if cols and sum(g.share for g in cols) >= 0.5:
            print(
                "  differences concentrate in columns "
                + ", ".join(f"{g.index} ({g.share:.0%})" for g in cols)
            )
        elif cols:
            print(
                f"  differences are spread out: the top {len(cols)} columns hold "
                f"{sum(g.share for g in cols):.1%} of them"
            )

        # Both outputs at once: what each is and what to change in candle to
        # match PyTorch, in the server's words.
        print()
        print(client.compare_outputs(x, w, b, {"torch": y_torch, "candle": y_candle}))


if __name__ == "__main__":
    main()
