#!/usr/bin/env python3
"""Whole-model checks against layer-by-layer calls (docs/performance.md,
"Whole-model checks").

The model: client/python/examples/tiny_gpt.py's transformer (4 blocks,
width 256, MLP 1024, vocab 512: 17 linear layer calls, the lm_head tied to
the embedding) in PyTorch, bf16, on the CPU. Each round starts a fresh
server (an empty tensor store) and measures, one after the other:

  (a) baseline  the same Diagnose requests as sequential unary
                `Client.diagnose_linear` calls with every tensor inline
                (all are under the 1 MiB inline limit), on the captures of
                one forward pass;
  (b) first     `tensorcheck.torch.check_linears(model, ids)` end to end:
                the forward pass with its hooks, the weights into the
                store, the requests pipelined (jobs=4);
  (c) second    the same call again: the store holds the weights.

Prints the median over the rounds of (b)/(a) and (c)/(a) (target: at most
0.5) and the tensor bytes each run sent, second/first (target: at most
30%). Exit status 0 whatever the figures.

    bench/model_bench.py --server build/server/tensorcheck-server --rounds 5
    bench/model_bench.py --json
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "client" / "python" / "examples"))

import tensorcheck
import tensorcheck.torch
import torch
from tiny_gpt import TorchGPT, make_inputs


class Server:
    def __init__(self, binary: str) -> None:
        self.proc = subprocess.Popen(
            [binary, "--host", "127.0.0.1", "--port", "0"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            m = re.search(r"listening on (\S+):(\d+)", line)
            if m:
                self.target = f"127.0.0.1:{m.group(2)}"
                break
        else:
            raise RuntimeError(f"{binary} exited before listening")
        # Keep draining stdout so the server never blocks on a full pipe.
        import threading

        threading.Thread(target=self._drain, daemon=True).start()

    def _drain(self) -> None:
        assert self.proc.stdout is not None
        for _ in self.proc.stdout:
            pass

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)


def baseline(
    target: str, model: torch.nn.Module, ids: torch.Tensor
) -> tuple[float, int]:
    """Seconds and tensor bytes of the layer-by-layer unary calls."""
    captures = tensorcheck.torch.capture_linears(model, ids).items
    sent = 0
    with tensorcheck.Client(target) as client:
        start = time.perf_counter()
        for c in captures:
            client.diagnose_linear(c.input, c.weight, c.bias, observed=c.output)
            sent += sum(
                a.nbytes for a in (c.input, c.weight, c.bias, c.output) if a is not None
            )
        return time.perf_counter() - start, sent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--server", default=str(REPO / "build" / "server" / "tensorcheck-server")
    )
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--seq", type=int, default=16)
    ap.add_argument("--jobs", type=int, default=4)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    torch.manual_seed(0)
    model = TorchGPT(seed=0).to(torch.bfloat16).eval()
    ids = torch.from_numpy(make_inputs(batch=args.batch, seq=args.seq, seed=1))
    first_ratio, second_ratio, bytes_ratio = [], [], []
    rows = []
    for _ in range(args.rounds):
        server = Server(args.server)
        try:
            base_s, base_bytes = baseline(server.target, model, ids)
            runs = []
            for _ in range(2):
                start = time.perf_counter()
                report = tensorcheck.torch.check_linears(
                    model, ids, server=server.target, jobs=args.jobs, progress=False
                )
                runs.append((time.perf_counter() - start, report))
            assert all(r.passed for _, r in runs), runs[0][1].summary()
        finally:
            server.stop()
        (t1, r1), (t2, r2) = runs
        first_ratio.append(t1 / base_s)
        second_ratio.append(t2 / base_s)
        bytes_ratio.append(r2.sent_bytes / r1.sent_bytes)
        rows.append(
            {
                "layer_calls": len(r1.layers),
                "baseline_s": base_s,
                "baseline_bytes": base_bytes,
                "first_s": t1,
                "first_bytes": r1.sent_bytes,
                "second_s": t2,
                "second_bytes": r2.sent_bytes,
            }
        )
    out = {
        "rounds": rows,
        "first_vs_baseline": statistics.median(first_ratio),
        "second_vs_baseline": statistics.median(second_ratio),
        "second_vs_first_bytes": statistics.median(bytes_ratio),
    }
    if args.json:
        print(json.dumps(out, indent=2))
        return
    r = rows[len(rows) // 2]
    print(
        f"tiny GPT, bf16, batch {args.batch} x seq {args.seq}: {r['layer_calls']} layer calls, "
        f"{args.rounds} rounds (medians)"
    )
    print(
        f"  baseline (sequential unary, inline)  {statistics.median(x['baseline_s'] for x in rows):7.3f} s"
        f"  {r['baseline_bytes'] / 2**20:6.2f} MiB"
    )
    print(
        f"  check_linears, first run             {statistics.median(x['first_s'] for x in rows):7.3f} s"
        f"  {r['first_bytes'] / 2**20:6.2f} MiB"
    )
    print(
        f"  check_linears, second run            {statistics.median(x['second_s'] for x in rows):7.3f} s"
        f"  {r['second_bytes'] / 2**20:6.2f} MiB"
    )
    print(
        f"first / baseline = {out['first_vs_baseline']:.2f}, "
        f"second / baseline = {out['second_vs_baseline']:.2f} (target <= 0.5); "
        f"bytes second / first = {100 * out['second_vs_first_bytes']:.0f}% (target <= 30%)"
    )


if __name__ == "__main__":
    main()
