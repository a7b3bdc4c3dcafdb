#!/usr/bin/env python3
"""The Python client's own cost per call (docs/performance.md, "Python
client overhead"): `Client.verify_linear` against the bare generated stub
sending the same request, on loopback.

The case: x [2, 768], W [512, 768], b [512], an observed y [2, 512], fp32,
random (seeded), one configuration (cpu:fp32) against the default
reference (cpu:fp64). Measured, after a warm-up, in rounds that interleave
the two (the order alternating round by round, so that drift of the
machine falls on both alike):

  (a) client  `Client.verify_linear(x, w, b, observed=y, configs=["cpu:fp32"])`,
              everything it does included: checking the arguments, building
              the request, the tensor store (W is 1.5 MiB, above the 1 MiB
              inline limit: hashed, and sent by digest), the RPC, the Report;
  (b) stub    `TensorCheckStub(channel).Verify(request)` with a request built
              once beforehand, every tensor inline, the same fields;
  (c) stub, same RPCs (when the client sent W by digest): the RPCs the
              client makes, prebuilt: `FindMissingTensors` for W's digest,
              then `Verify` naming W by digest. (a) over (c) is the
              client's own Python cost alone; (b) differs from (c) by
              moving 1.5 MiB through gRPC and the server's parser.

Prints p50 and p90 of each, the ratio client / stub at p50 (the issue's
target: at most 1.2) and the server's own time (`elapsed_ms` of the
reference and the configuration, as the response reports them).

    bench/client_overhead.py                          # starts build/server/tensorcheck-server
    bench/client_overhead.py --server build-lead/server/tensorcheck-server --calls 300
    bench/client_overhead.py --target 127.0.0.1:50051 # a running server
    bench/client_overhead.py --profile 200            # cProfile of 200 client calls, no timing

The `tensorcheck` package must be importable (pip install ./client/python,
or PYTHONPATH=client/python/src with its generated stubs). Exit status 0
whatever the ratio: the figures are for reading, not for asserting.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import re
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Optional

import grpc
import numpy as np

try:
    import tensorcheck
    from tensorcheck._pb import pb, pb_grpc
except ImportError as e:  # pragma: no cover - environment
    sys.exit(
        f"client_overhead: the tensorcheck package is needed (pip install ./client/python): {e}"
    )

REPO = Path(__file__).resolve().parents[1]
DEFAULT_SERVER_BIN = REPO / "build" / "server" / "tensorcheck-server"
_LISTENING = re.compile(r"listening on (\S+):(\d+)")
TARGET_RATIO = 1.2
CONFIG = "cpu:fp32"


class Server:
    """A tensorcheck-server on 127.0.0.1 and a free port; its output is
    drained for its lifetime (a full pipe would block its logging)."""

    def __init__(self, binary: str, extra: list[str]) -> None:
        self.proc = subprocess.Popen(
            [binary, "--host", "127.0.0.1", "--port", "0", *extra],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.target = ""
        self.tail: list[str] = []
        ready = threading.Event()

        def read() -> None:
            assert self.proc.stdout is not None
            for line in self.proc.stdout:
                if not self.target:
                    self.tail = (self.tail + [line.rstrip()])[-20:]
                    m = _LISTENING.search(line)
                    if m:
                        host = m.group(1)
                        host = "127.0.0.1" if host in ("0.0.0.0", "") else host
                        self.target = f"{host}:{m.group(2)}"
                        ready.set()
            ready.set()

        threading.Thread(target=read, daemon=True).start()
        if not ready.wait(60) or not self.target:
            self.stop()
            sys.exit("client_overhead: the server did not start:\n" + "\n".join(self.tail))

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def tensors(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((2, 768), dtype=np.float32)
    w = (rng.standard_normal((512, 768), dtype=np.float32) / np.float32(28)).astype(np.float32)
    b = rng.standard_normal(512, dtype=np.float32)
    # What a framework would produce: the fp32 product, in numpy's order.
    y = (x @ w.T + b).astype(np.float32)
    return {"x": x, "w": w, "b": b, "y": y}


def _inline(a: np.ndarray) -> pb.Tensor:
    return pb.Tensor(dtype=pb.DTYPE_FLOAT32, shape=a.shape, data=a.tobytes())


def stub_request(t: dict[str, np.ndarray]) -> pb.VerifyRequest:
    """The request verify_linear sends, with every tensor inline."""
    return pb.VerifyRequest(
        op=pb.LinearOp(
            input=_inline(t["x"]),
            weight=_inline(t["w"]),
            bias=_inline(t["b"]),
            weight_layout=pb.WEIGHT_LAYOUT_OUT_IN,
            activation=pb.ACTIVATION_NONE,
        ),
        observed=_inline(t["y"]),
        configs=[CONFIG],
        reference="cpu:fp64",
        tolerance=pb.Tolerance(preset=pb.Tolerance.PRESET_TORCH),
        output=pb.OutputOptions(),
    )


def percentile(values: list[float], q: float) -> float:
    s = sorted(values)
    if not s:
        return float("nan")
    pos = (len(s) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def server_ms(resp: pb.VerifyResponse) -> float:
    """The compute time the server reports: the reference's run and the
    configuration's."""
    total = resp.reference.elapsed_ms if resp.HasField("reference") else 0.0
    return total + sum(r.elapsed_ms for r in resp.results)


def run(args: argparse.Namespace, target: str) -> dict[str, Any]:
    t = tensors(args.seed)
    options = [
        ("grpc.max_send_message_length", tensorcheck.MAX_MESSAGE_BYTES),
        ("grpc.max_receive_message_length", tensorcheck.MAX_MESSAGE_BYTES),
    ]
    channel = grpc.insecure_channel(target, options=options)
    stub = pb_grpc.TensorCheckStub(channel)
    request = stub_request(t)
    client = tensorcheck.Client(target, timeout=60)

    def call_client() -> float:
        t0 = time.perf_counter()
        client.verify_linear(t["x"], t["w"], t["b"], observed=t["y"], configs=[CONFIG])
        return time.perf_counter() - t0

    server_times: list[float] = []
    # (c): the client's own RPCs, prebuilt.
    w_ref = tensorcheck.TensorRef.of(t["w"])
    find = pb.FindMissingTensorsRequest(digests=[w_ref.tensor_digest()])
    by_digest = pb.VerifyRequest()
    by_digest.CopyFrom(request)
    by_digest.op.weight.CopyFrom(w_ref.to_proto())

    def call_same_rpcs() -> float:
        t0 = time.perf_counter()
        stub.FindMissingTensors(find, timeout=60)
        stub.Verify(by_digest, timeout=60)
        return time.perf_counter() - t0

    def call_stub() -> float:
        t0 = time.perf_counter()
        resp = stub.Verify(request, timeout=60)
        elapsed = time.perf_counter() - t0
        server_times.append(server_ms(resp))
        return elapsed

    try:
        # Both verdicts agree, and the client's answer is what the stub got.
        report = client.verify_linear(t["x"], t["w"], t["b"], observed=t["y"], configs=[CONFIG])
        direct = stub.Verify(request, timeout=60)
        if report.verdict != {pb.VERDICT_PASS: "pass", pb.VERDICT_FAIL: "fail"}.get(direct.verdict):
            sys.exit(f"client_overhead: verdicts differ: {report.verdict} vs {direct.verdict}")

        if args.profile:
            prof = cProfile.Profile()
            prof.enable()
            for _ in range(args.profile):
                call_client()
            prof.disable()
            pstats.Stats(prof).sort_stats("cumulative").print_stats(args.profile_lines)
            return {}

        by_store = report.reused_bytes + report.uploaded_bytes > 0
        arms: list[tuple[list[float], Callable[[], float]]] = [([], call_client), ([], call_stub)]
        if by_store:
            arms.append(([], call_same_rpcs))
        for _ in range(args.warmup):
            for _, call in arms:
                call()
        server_times.clear()
        for i in range(args.calls):
            # Each round starts with another arm: none always runs first.
            for k in range(len(arms)):
                times, call = arms[(i + k) % len(arms)]
                times.append(call())
        a, b = arms[0][0], arms[1][0]
        c = arms[2][0] if by_store else []
    finally:
        client.close()
        channel.close()

    ms = 1e3
    out = {
        "case": "verify_linear 2x768 -> 512 fp32, bias, observed, configs=[cpu:fp32]",
        "calls": args.calls,
        "warmup": args.warmup,
        "client_p50_ms": percentile(a, 0.5) * ms,
        "client_p90_ms": percentile(a, 0.9) * ms,
        "stub_p50_ms": percentile(b, 0.5) * ms,
        "stub_p90_ms": percentile(b, 0.9) * ms,
        "server_elapsed_p50_ms": statistics.median(server_times) if server_times else None,
        "weight_by_digest": by_store,
    }
    out["ratio_p50"] = out["client_p50_ms"] / out["stub_p50_ms"]
    out["ratio_p90"] = out["client_p90_ms"] / out["stub_p90_ms"]
    if c:
        out["same_rpcs_p50_ms"] = percentile(c, 0.5) * ms
        out["same_rpcs_p90_ms"] = percentile(c, 0.9) * ms
        out["ratio_same_rpcs_p50"] = out["client_p50_ms"] / out["same_rpcs_p50_ms"]
    return out


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--target", help="a running server (host:port); default: start one")
    p.add_argument(
        "--server",
        default=os.environ.get("TENSORCHECK_SERVER_BIN") or str(DEFAULT_SERVER_BIN),
        help="server binary to start (default: $TENSORCHECK_SERVER_BIN or %(default)s)",
    )
    p.add_argument(
        "--server-arg", action="append", default=[], help="extra server flag (repeatable)"
    )
    p.add_argument("--calls", type=int, default=300, help="measured calls of each kind")
    p.add_argument("--warmup", type=int, default=30, help="unmeasured calls of each kind first")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", metavar="PATH", help="also write the figures as JSON here")
    p.add_argument(
        "--profile",
        type=int,
        default=0,
        metavar="N",
        help="instead of timing: cProfile N client calls and print the top functions",
    )
    p.add_argument("--profile-lines", type=int, default=40)
    args = p.parse_args(argv)
    if args.calls < 1 or args.warmup < 0:
        p.error("--calls must be positive and --warmup non-negative")

    server = None
    target = args.target
    if not target:
        if not (os.path.isfile(args.server) and os.access(args.server, os.X_OK)):
            p.error(f"no server binary at {args.server}: build it, or pass --server / --target")
        server = Server(args.server, args.server_arg)
        target = server.target
    try:
        out = run(args, target)
    finally:
        if server is not None:
            server.stop()
    if not out:
        return 0

    print(out["case"], f"({args.calls} calls each after {args.warmup} warm-up, interleaved)")
    print(f"  client  p50 {out['client_p50_ms']:7.3f} ms   p90 {out['client_p90_ms']:7.3f} ms")
    print(f"  stub    p50 {out['stub_p50_ms']:7.3f} ms   p90 {out['stub_p90_ms']:7.3f} ms")
    if out["server_elapsed_p50_ms"] is not None:
        print(
            f"  server  p50 {out['server_elapsed_p50_ms']:7.3f} ms (elapsed_ms: reference + config)"
        )
    if out["weight_by_digest"]:
        print("  (the client sent W by digest through the tensor store; the stub inline)")
        print(
            f"  stub, same RPCs  p50 {out['same_rpcs_p50_ms']:7.3f} ms   "
            f"p90 {out['same_rpcs_p90_ms']:7.3f} ms  (FindMissingTensors + Verify by digest)"
        )
        print(f"client/(stub, same RPCs) = {out['ratio_same_rpcs_p50']:.2f}")
    print(
        f"client/stub = {out['ratio_p50']:.2f} (p90: {out['ratio_p90']:.2f}), "
        f"target <= {TARGET_RATIO}"
    )
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
