#!/usr/bin/env python3
"""Load generator for tensorcheck-server: is a shared server safe from any
one request?

Runs, on loopback only, a bounded mixed workload from N concurrent clients,
then a phase of long requests that are all cancelled or expire, and reports
what a server operator cares about:

- throughput (requests/s) and p50/p99 latency per request class;
- counts by status code, and how many refusals carried the retry hint
  (`grpc-retry-pushback-ms`);
- the server's memory: VmRSS when idle (after one warm-up request), after
  the load, and its peak VmHWM (all from /proc/PID/status);
- the server's CPU time (utime + stime from /proc/PID/stat) in a quiet
  window right after the last cancellation, above its idle rate, per
  cancelled request: a server that stops computing for a cancelled or
  expired request spends ~0 there; one that runs it to the end spends the
  rest of its compute time.

    bench/loadgen.py                                   # starts build/server/tensorcheck-server
    bench/loadgen.py --server-arg=--threads=2 --server-arg=--max-queue=4 --json out.json
    bench/loadgen.py --address 127.0.0.1:50051 --server-pid 1234   # a running server

Request classes of the mixed phase (weights: --mix):
  small     8x64 -> 32 Verify, fp32 and bf16 alternately (--small-shape);
  large     512x2048 -> 2048 fp32 Verify over cpu:fp32, cpu:tf32, cpu:bf16
            (--large-shape);
  cancel    a large request the client cancels after a random delay
            (--cancel-after, seconds);
  deadline  a large request with a short deadline (--deadline, seconds).
With --big-requests N, a first phase sends N Verify requests of about
--big-request-mib MiB each (almost all of it the weight) at once; a request
refused with a retry hint is sent again after the hint, until it passes or
--big-seconds run out. The phase reports the server's peak RSS (VmHWM) over
idle right after it: the arithmetic of --max-inflight-bytes, receive
buffers included (docs/operations.md). --requests 0 or --cancel-requests 0
skips the mixed or the cancellation phase.
The cancellation phase sends --cancel-requests "long" requests at once
(Diagnose over every candidate on the large shape), cancelling half after
--cancel-after and giving the other half a --deadline, then measures the
server's CPU over --quiet-seconds after the last one ended.

Requests are built with the generated protobuf types of the Python client
(the `tensorcheck` package must be installed: pip install ./client/python),
serialized once, and sent as bytes on the generated service's method paths
over a grpc.aio channel; never through `tensorcheck.Client`: the load
generator cancels and sets deadlines itself and does not retry. (Encoding a
24 MiB request per call would hold the client's event loop for tens of
milliseconds on a busy host and delay the very cancellations being
measured.) A client refused with
UNAVAILABLE or RESOURCE_EXHAUSTED pauses for the retry hint (else
--refusal-pause) before its next request, as a well-behaved client would, but never sends the
refused request again.

Bounded: at most --requests mixed requests, none started after --seconds,
every one with a deadline by --seconds + --drain-seconds; the cancellation
phase is bounded by --cancel-after/--deadline, --settle-seconds and
--quiet-seconds. Exit status: 0 when the run completed (whatever the status
codes), 1 when the server failed to start, died, or did not answer the
warm-up request, 2 for bad arguments.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import re
import resource
import signal
import subprocess
import sys
import threading
import time
from collections import Counter, deque
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import grpc
import grpc.aio
import ml_dtypes
import numpy as np

try:
    from tensorcheck._pb import pb
except ImportError as e:  # pragma: no cover - environment
    sys.exit(f"loadgen: the tensorcheck package is needed (pip install ./client/python): {e}")

REPO = Path(__file__).resolve().parents[1]
DEFAULT_SERVER_BIN = REPO / "build" / "server" / "tensorcheck-server"
PUSHBACK_KEY = "grpc-retry-pushback-ms"
MAX_MESSAGE_BYTES = 1 << 30
_LISTENING = re.compile(r"listening on (\S+):(\d+)")
_CLK_TCK = os.sysconf("SC_CLK_TCK")
MiB = 1 << 20
_REFUSALS = ("UNAVAILABLE", "RESOURCE_EXHAUSTED")


# --- the server's process ---------------------------------------------------


def proc_memory(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM of a process, in bytes."""
    out: dict[str, int] = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                out[key] = int(value.split()[0]) * 1024  # kB
    return out


def proc_cpu_seconds(pid: int) -> float:
    """utime + stime of a process (all its threads), in seconds."""
    with open(f"/proc/{pid}/stat") as f:
        # The command name, field 2, is in parentheses and may hold spaces.
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _CLK_TCK


class Server:
    """A tensorcheck-server this program started (on 127.0.0.1, port 0), or
    one it attached to by address and pid."""

    def __init__(self, address: str, pid: Optional[int], proc: Optional[subprocess.Popen[str]]):
        self.address = address
        self.pid = pid
        self.proc = proc
        self.log: deque[str] = deque(maxlen=50)

    @classmethod
    def start(cls, binary: Path, extra_args: Sequence[str], timeout_s: float = 60.0) -> Server:
        proc = subprocess.Popen(
            [str(binary), "--host", "127.0.0.1", "--port", "0", *extra_args],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        server = cls("", proc.pid, proc)
        found = threading.Event()

        def drain(stream: Any, watch: bool) -> None:
            # Read to the end: a full pipe would block the server's logging.
            for line in stream:
                server.log.append(line.rstrip("\n"))
                m = _LISTENING.search(line) if watch and not found.is_set() else None
                if m:
                    host = "127.0.0.1" if m.group(1) in ("0.0.0.0", "") else m.group(1)
                    server.address = f"{host}:{m.group(2)}"
                    found.set()
            if watch:
                found.set()  # exited before listening

        for stream, watch in ((proc.stdout, True), (proc.stderr, False)):
            threading.Thread(target=drain, args=(stream, watch), daemon=True).start()
        if not found.wait(timeout_s) or not server.address:
            server.stop()
            tail = "\n  ".join(server.log)
            raise RuntimeError(
                f"{binary} did not print 'listening on HOST:PORT' within {timeout_s:.0f} s "
                f"(exit status {proc.poll()}); its last output:\n  {tail}"
            )
        return server

    def alive(self) -> bool:
        if self.proc is not None:
            return self.proc.poll() is None
        if self.pid is None:
            return True
        return os.path.exists(f"/proc/{self.pid}")

    def stop(self) -> Optional[int]:
        """SIGTERM to a server this program started; its exit status."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()


# --- the workload -----------------------------------------------------------


class Methods:
    """The service's unary methods on a channel, taking serialized requests."""

    def __init__(self, channel: grpc.aio.Channel) -> None:
        service = pb.DESCRIPTOR.services_by_name["TensorCheck"]
        self._calls = {
            name: channel.unary_unary(
                f"/{service.full_name}/{name}",
                request_serializer=None,
                response_deserializer=pb.VerifyResponse.FromString,
            )
            for name in ("Verify", "Diagnose")
        }

    def __call__(self, method: str, request: bytes, timeout: float) -> Any:
        # The size declared, as the clients do (docs/api.md, "Request size").
        metadata = (("tensorcheck-request-bytes", str(len(request))),)
        return self._calls[method](request, timeout=timeout, metadata=metadata)


def _tensor(a: np.ndarray, dtype: pb.DType) -> Any:
    return pb.Tensor(dtype=dtype, shape=list(a.shape), data=a.tobytes())


def _parse_shape(text: str, name: str) -> tuple[int, int, int]:
    parts = text.lower().split("x")
    if len(parts) != 3 or not all(p.isdigit() and int(p) > 0 for p in parts):
        raise argparse.ArgumentTypeError(f"{name}: expected MxKxN (e.g. 8x64x32), got {text!r}")
    m, k, n = (int(p) for p in parts)
    return m, k, n


def _linear_request(
    rng: np.random.Generator, shape: tuple[int, int, int], dtype: str, configs: Sequence[str]
) -> Any:
    """A VerifyRequest for y = x W^T + b with y as the observed output."""
    m, k, n = shape
    x = rng.standard_normal((m, k), dtype=np.float32)
    w = (rng.standard_normal((n, k), dtype=np.float32) / np.float32(math.sqrt(k))).astype(
        np.float32
    )
    b = rng.standard_normal(n, dtype=np.float32)
    if dtype == "bf16":
        xs, ws, bs = (a.astype(ml_dtypes.bfloat16) for a in (x, w, b))
        y = (xs.astype(np.float32) @ ws.astype(np.float32).T + bs.astype(np.float32)).astype(
            ml_dtypes.bfloat16
        )
        code = pb.DTYPE_BFLOAT16
    else:
        xs, ws, bs = x, w, b
        y = (x @ w.T + b).astype(np.float32)
        code = pb.DTYPE_FLOAT32
    op = pb.LinearOp(input=_tensor(xs, code), weight=_tensor(ws, code), bias=_tensor(bs, code))
    return pb.VerifyRequest(op=op, observed=_tensor(y, code), configs=list(configs))


@dataclass
class Workload:
    """Serialized VerifyRequests."""

    small_fp32: bytes
    small_bf16: bytes
    large: bytes  # Verify over several configurations
    long: bytes  # Diagnose over every candidate: the cancellation phase's request

    @classmethod
    def build(cls, small: tuple[int, int, int], large: tuple[int, int, int], seed: int) -> Workload:
        rng = np.random.default_rng(seed)
        big = _linear_request(rng, large, "fp32", ["cpu:fp32", "cpu:tf32", "cpu:bf16"])
        long = pb.VerifyRequest()
        long.CopyFrom(big)
        del long.configs[:]  # Diagnose: the server's default candidates, all of them
        return cls(
            small_fp32=_linear_request(rng, small, "fp32", ["cpu:fp32"]).SerializeToString(),
            small_bf16=_linear_request(rng, small, "bf16", ["cpu:bf16"]).SerializeToString(),
            large=big.SerializeToString(),
            long=long.SerializeToString(),
        )


@dataclass
class Outcome:
    cls: str
    code: str
    latency_s: float
    ended: float  # time.monotonic() when the client saw the end
    pushback_ms: Optional[int] = None


def _pushback_ms(metadata: Any) -> Optional[int]:
    for key, value in metadata or ():
        if key == PUSHBACK_KEY:
            text = value.decode() if isinstance(value, bytes) else str(value)
            return int(text) if text.strip().isdigit() else None
    return None


async def send(
    stub: Methods,
    method: str,
    request: bytes,
    cls: str,
    timeout: float,
    cancel_after: Optional[float] = None,
) -> Outcome:
    """One call; a CANCELLED outcome when `cancel_after` fired first."""
    start = time.monotonic()
    call = stub(method, request, timeout)
    cancelled = False
    handle = None
    if cancel_after is not None:

        def cancel() -> None:
            nonlocal cancelled
            cancelled = call.cancel()

        handle = asyncio.get_running_loop().call_later(cancel_after, cancel)
    try:
        await call
        code, pushback = "OK", None
    except grpc.aio.AioRpcError as e:
        code = e.code().name
        pushback = _pushback_ms(e.trailing_metadata())
    except asyncio.CancelledError:
        if not cancelled:
            raise  # the load generator itself is being cancelled
        code, pushback = "CANCELLED", None
    finally:
        if handle is not None:
            handle.cancel()
    end = time.monotonic()
    return Outcome(cls, code, end - start, end, pushback)


def _percentile(values: Sequence[float], q: float) -> Optional[float]:
    """Nearest-rank percentile; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100.0 * len(ordered)))
    return ordered[rank - 1]


def _ms(value: Optional[float]) -> Optional[float]:
    return None if value is None else round(value * 1000.0, 2)


def summarize(outcomes: Sequence[Outcome]) -> dict[str, Any]:
    by_class: dict[str, Any] = {}
    for cls in sorted({o.cls for o in outcomes}):
        mine = [o for o in outcomes if o.cls == cls]
        ok = [o.latency_s for o in mine if o.code == "OK"]
        by_class[cls] = {
            "count": len(mine),
            "codes": dict(Counter(o.code for o in mine)),
            "p50_ms": _ms(_percentile([o.latency_s for o in mine], 50)),
            "p99_ms": _ms(_percentile([o.latency_s for o in mine], 99)),
            "ok_p50_ms": _ms(_percentile(ok, 50)),
            "ok_p99_ms": _ms(_percentile(ok, 99)),
        }
    refusals = [o for o in outcomes if o.code in _REFUSALS]
    return {
        "by_class": by_class,
        "codes": dict(Counter(o.code for o in outcomes)),
        "refusals_with_pushback": dict(
            Counter(o.code for o in refusals if o.pushback_ms is not None)
        ),
        "refusals_without_pushback": dict(
            Counter(o.code for o in refusals if o.pushback_ms is None)
        ),
    }


# --- the phases -------------------------------------------------------------


@dataclass
class Settings:
    clients: int
    requests: int
    seconds: float
    drain_seconds: float
    request_timeout: float
    refusal_pause: float
    mix: dict[str, float]
    cancel_after: tuple[float, float]
    deadline: tuple[float, float]
    cancel_requests: int
    quiet_seconds: float
    settle_seconds: float
    seed: int
    big_requests: int = 0
    big_request_bytes: int = 0
    big_seconds: float = 120.0


async def _small_ok(stub: Methods, workload: Workload, timeout: float = 60.0) -> Outcome:
    return await send(stub, "Verify", workload.small_fp32, "small", timeout)


class LoopLag:
    """The longest the event loop was late for a 10 ms tick: how far the
    client-side timings (cancel delays, latencies) can be off, since sending
    a large request holds the loop while gRPC copies it."""

    def __init__(self) -> None:
        self.worst = 0.0
        self._task: Optional[asyncio.Task[None]] = None

    async def _tick(self) -> None:
        last = time.monotonic()
        while True:
            await asyncio.sleep(0.01)
            now = time.monotonic()
            self.worst = max(self.worst, now - last - 0.01)
            last = now

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._tick())

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()


async def answer_after(
    stub: Methods, workload: Workload, refusal_pause: float, within_s: float = 10.0
) -> dict[str, Any]:
    """Does the server answer a small request after the load? Refusals are
    tried again (after the hint, else refusal_pause) for up to within_s: a
    server still busy with cancelled work refuses for a while; one that is
    wedged never answers."""
    start = time.monotonic()
    codes: list[str] = []
    while True:
        o = await send(stub, "Verify", workload.small_fp32, "after", 30.0)
        codes.append(o.code)
        waited = time.monotonic() - start
        if o.code not in _REFUSALS or waited >= within_s:
            break
        pause = refusal_pause if o.pushback_ms is None else o.pushback_ms / 1e3
        await asyncio.sleep(min(pause, max(0.0, within_s - waited)))
    return {
        "answers_after": codes[-1] == "OK",
        "answer_after_codes": codes,
        "answer_after_seconds": round(time.monotonic() - start, 3),
    }


async def _cpu_rate(pid: int, seconds: float) -> float:
    """The server's CPU seconds per second over a window."""
    c0, t0 = proc_cpu_seconds(pid), time.monotonic()
    await asyncio.sleep(seconds)
    return (proc_cpu_seconds(pid) - c0) / (time.monotonic() - t0)


async def mixed_phase(stub: Methods, workload: Workload, s: Settings, rng: random.Random) -> Any:
    classes = list(s.mix)
    plan = rng.choices(classes, weights=[s.mix[c] for c in classes], k=s.requests)
    delays = [rng.uniform(*s.cancel_after) for _ in plan]
    deadlines = [rng.uniform(*s.deadline) for _ in plan]
    start = time.monotonic()
    stop_issuing = start + s.seconds
    hard_end = stop_issuing + s.drain_seconds
    next_index = 0
    outcomes: list[Outcome] = []

    async def client() -> None:
        nonlocal next_index
        while next_index < len(plan) and time.monotonic() < stop_issuing:
            i = next_index
            next_index += 1
            cls = plan[i]
            # Every request ends by hard_end, whatever its class.
            left = max(0.001, hard_end - time.monotonic())
            timeout = min(s.request_timeout, left)
            if cls == "small":
                req = workload.small_fp32 if i % 2 == 0 else workload.small_bf16
                o = await send(stub, "Verify", req, cls, timeout)
            elif cls == "large":
                o = await send(stub, "Verify", workload.large, cls, timeout)
            elif cls == "cancel":
                o = await send(stub, "Verify", workload.large, cls, timeout, delays[i])
            else:  # deadline
                o = await send(stub, "Verify", workload.large, cls, min(deadlines[i], timeout))
            outcomes.append(o)
            if o.code in _REFUSALS:
                pause = s.refusal_pause if o.pushback_ms is None else o.pushback_ms / 1e3
                await asyncio.sleep(min(pause, max(0.0, stop_issuing - time.monotonic())))

    await asyncio.gather(*(client() for _ in range(s.clients)))
    wall = time.monotonic() - start
    summary = summarize(outcomes)
    ok = sum(1 for o in outcomes if o.code == "OK")
    summary.update(
        {
            "requests": len(outcomes),
            "wall_seconds": round(wall, 3),
            "throughput_rps": round(len(outcomes) / wall, 3) if wall > 0 else None,
            "ok_rps": round(ok / wall, 3) if wall > 0 else None,
        }
    )
    return outcomes, summary


def big_request(megabytes: float, seed: int) -> bytes:
    """A serialized fp32 Verify over cpu:fp32 of about `megabytes` MiB,
    almost all of it the weight (8 x 4096 -> N): cheap to compute, large
    to receive."""
    k = 4096
    n = max(1, int(megabytes * MiB) // (4 * k))
    rng = np.random.default_rng(seed)
    return _linear_request(rng, (8, k, n), "fp32", ["cpu:fp32"]).SerializeToString()


async def big_phase(stub: Methods, request: bytes, s: Settings, pid: Optional[int]) -> Any:
    """--big-requests clients send one large request each, at once; a
    refusal with a retry hint is retried after it until --big-seconds."""
    start = time.monotonic()
    end = start + s.big_seconds
    attempts = 0
    refused: list[Outcome] = []

    async def client() -> Outcome:
        nonlocal attempts
        while True:
            attempts += 1
            left = max(0.001, end - time.monotonic())
            o = await send(stub, "Verify", request, "big", min(s.request_timeout, left))
            if o.code not in _REFUSALS or o.pushback_ms is None:
                return o
            refused.append(o)
            if time.monotonic() + o.pushback_ms / 1e3 >= end:
                return o
            await asyncio.sleep(o.pushback_ms / 1e3)

    outcomes = list(await asyncio.gather(*(client() for _ in range(s.big_requests))))
    summary = summarize(outcomes)
    summary.update(
        {
            "requests": len(outcomes),
            "request_bytes": len(request),
            "attempts": attempts,
            "refusals_retried": dict(Counter(o.code for o in refused)),
            "wall_seconds": round(time.monotonic() - start, 3),
        }
    )
    mem = _memory(pid)
    if mem is not None:
        summary["hwm_bytes"] = mem["VmHWM"]
    return outcomes, summary


def _skipped_phase() -> dict[str, Any]:
    summary = summarize([])
    summary.update({"requests": 0, "wall_seconds": 0.0, "throughput_rps": 0.0, "ok_rps": 0.0})
    summary["cancelled_or_expired"] = 0
    return summary


async def settle(pid: int, idle_rate: float, max_seconds: float) -> tuple[float, bool]:
    """Waits until the server's CPU rate over 0.5 s is back near idle (work
    left over from the mixed phase would count against the cancellation
    phase); returns the time waited and whether it settled."""
    start = time.monotonic()
    threshold = max(2.0 * idle_rate, 0.05)
    while time.monotonic() - start < max_seconds:
        if await _cpu_rate(pid, 0.5) <= threshold:
            return time.monotonic() - start, True
    return time.monotonic() - start, False


async def cancel_phase(
    stub: Methods,
    workload: Workload,
    s: Settings,
    rng: random.Random,
    pid: Optional[int],
    idle_rate: Optional[float],
) -> Any:
    """Long requests only, each cancelled or expiring; then the server's CPU
    over a quiet window from the moment the last one ended."""
    calls = []
    for i in range(s.cancel_requests):
        if i % 2 == 0:
            calls.append(
                send(
                    stub,
                    "Diagnose",
                    workload.long,
                    "long-cancel",
                    s.request_timeout,
                    rng.uniform(*s.cancel_after),
                )
            )
        else:
            calls.append(
                send(stub, "Diagnose", workload.long, "long-deadline", rng.uniform(*s.deadline))
            )
    outcomes = list(await asyncio.gather(*calls))
    last_end = max(o.ended for o in outcomes)
    stopped = [o for o in outcomes if o.code in ("CANCELLED", "DEADLINE_EXCEEDED")]
    summary = summarize(outcomes)
    summary.update({"requests": len(outcomes), "cancelled_or_expired": len(stopped)})
    if pid is not None:
        c0, t0 = proc_cpu_seconds(pid), time.monotonic()
        await asyncio.sleep(s.quiet_seconds)
        c1, t1 = proc_cpu_seconds(pid), time.monotonic()
        window = t1 - t0
        used = c1 - c0
        idle = (idle_rate or 0.0) * window
        excess = max(0.0, used - idle)
        summary.update(
            {
                "window_start_after_last_end_s": round(t0 - last_end, 4),
                "window_seconds": round(window, 3),
                "server_cpu_seconds": round(used, 3),
                "idle_cpu_seconds": round(idle, 3),
                "cpu_seconds_per_cancelled": (round(excess / len(stopped), 4) if stopped else None),
            }
        )
    return outcomes, summary


# --- the run ----------------------------------------------------------------


def _memory(pid: Optional[int]) -> Optional[dict[str, int]]:
    if pid is None:
        return None
    try:
        return proc_memory(pid)
    except OSError:
        return None


async def run(server: Server, workload: Workload, s: Settings) -> dict[str, Any]:
    rng = random.Random(s.seed)
    pid = server.pid
    options = [
        ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ]
    report: dict[str, Any] = {
        "server": {"address": server.address, "pid": pid, "started": server.proc is not None},
        "settings": {
            "clients": s.clients,
            "requests": s.requests,
            "seconds": s.seconds,
            "drain_seconds": s.drain_seconds,
            "refusal_pause": s.refusal_pause,
            "mix": s.mix,
            "cancel_after": list(s.cancel_after),
            "deadline": list(s.deadline),
            "cancel_requests": s.cancel_requests,
            "quiet_seconds": s.quiet_seconds,
            "seed": s.seed,
            "big_requests": s.big_requests,
        },
        "workload": {
            "small_request_bytes": len(workload.small_fp32),
            "large_request_bytes": len(workload.large),
            "long_request_bytes": len(workload.long),
        },
    }
    async with grpc.aio.insecure_channel(server.address, options=options) as channel:
        stub = Methods(channel)
        warm = await _small_ok(stub, workload)
        if warm.code != "OK":
            raise RuntimeError(f"the warm-up request failed: {warm.code}")
        idle_rate: Optional[float] = None
        memory: dict[str, Any] = {}
        if pid is not None:
            await asyncio.sleep(0.5)
            memory["idle_rss_bytes"] = proc_memory(pid)["VmRSS"]
            idle_rate = await _cpu_rate(pid, s.quiet_seconds)
            memory["idle_cpu_rate"] = round(idle_rate, 4)

        big: list[Outcome] = []
        if s.big_requests:
            request = big_request(s.big_request_bytes / MiB, s.seed)
            big, report["big_phase"] = await big_phase(stub, request, s, pid)
            if "hwm_bytes" in report["big_phase"] and "idle_rss_bytes" in memory:
                report["big_phase"]["hwm_over_idle_bytes"] = (
                    report["big_phase"]["hwm_bytes"] - memory["idle_rss_bytes"]
                )
            del request

        mixed: list[Outcome] = []
        if s.requests:
            lag = LoopLag()
            lag.start()
            mixed, report["mixed"] = await mixed_phase(stub, workload, s, rng)
            lag.stop()
            report["mixed"]["loadgen_max_loop_lag_ms"] = _ms(lag.worst)
        else:
            report["mixed"] = _skipped_phase()
        mem = _memory(pid)
        if mem is not None:
            memory["after_load_rss_bytes"] = mem["VmRSS"]

        cancel_summary: dict[str, Any] = {}
        cancelled: list[Outcome] = []
        if s.cancel_requests:
            if pid is not None:
                waited, settled = await settle(pid, idle_rate or 0.0, s.settle_seconds)
                cancel_summary.update({"settle_seconds": round(waited, 3), "settled": settled})
            lag = LoopLag()
            lag.start()
            cancelled, phase = await cancel_phase(stub, workload, s, rng, pid, idle_rate)
            lag.stop()
            cancel_summary.update(phase)
            cancel_summary["loadgen_max_loop_lag_ms"] = _ms(lag.worst)
        else:
            cancel_summary = _skipped_phase()
        report["cancel_phase"] = cancel_summary

        report.update(await answer_after(stub, workload, s.refusal_pause))
        mem = _memory(pid)
        if mem is not None:
            memory["end_rss_bytes"] = mem["VmRSS"]
            memory["hwm_bytes"] = mem["VmHWM"]
            memory["hwm_over_idle_bytes"] = mem["VmHWM"] - memory["idle_rss_bytes"]
        report["memory"] = memory or None
        report["codes"] = dict(Counter(o.code for o in big + mixed + cancelled))
        report["server_alive"] = server.alive()
    return report


def _mib(n: Optional[int]) -> str:
    return "-" if n is None else f"{n / MiB:.0f} MiB"


def _fmt_ms(v: Optional[float]) -> str:
    return "-" if v is None else f"{v:.0f}"


def format_report(r: dict[str, Any]) -> str:
    lines = []
    srv = r["server"]
    st = r["settings"]
    lines.append(
        f"tensorcheck loadgen: server pid {srv['pid']} at {srv['address']}, "
        f"{st['clients']} clients, up to {st['requests']} requests in {st['seconds']:g} s"
    )
    b = r.get("big_phase")
    if b:
        lines.append(
            f"big phase: {b['requests']} requests of {_mib(b['request_bytes'])} at once, "
            f"{b['attempts']} attempts in {b['wall_seconds']:.1f} s: "
            + ", ".join(f"{c} {n}" for c, n in sorted(b["codes"].items()))
            + f"; peak (VmHWM) {_mib(b.get('hwm_bytes'))} "
            f"({_mib(b.get('hwm_over_idle_bytes'))} over idle)"
        )
    m = r["mixed"]
    lines.append(
        f"mixed phase: {m['requests']} requests in {m['wall_seconds']:.1f} s: "
        f"{m['throughput_rps']:.1f} req/s ({m['ok_rps']:.1f} OK req/s)"
    )
    codes = sorted(
        {c for v in m["by_class"].values() for c in v["codes"]} | set((b or {}).get("codes", {}))
    )
    head = f"  {'class':<14}{'n':>4}  " + "".join(f"{c[:12]:>13}" for c in codes)
    lines.append(head + f"{'p50 ms':>9}{'p99 ms':>9}{'OK p50':>9}{'OK p99':>9}")
    classes = list((b or {}).get("by_class", {}).items()) + list(m["by_class"].items())
    for cls, v in classes + list(r["cancel_phase"]["by_class"].items()):
        cells = "".join(f"{v['codes'].get(c, 0):>13}" for c in codes)
        extra = {c: n for c, n in v["codes"].items() if c not in codes}
        lines.append(
            f"  {cls:<14}{v['count']:>4}  {cells}{_fmt_ms(v['p50_ms']):>9}{_fmt_ms(v['p99_ms']):>9}"
            f"{_fmt_ms(v['ok_p50_ms']):>9}{_fmt_ms(v['ok_p99_ms']):>9}"
            + (f"  also {extra}" if extra else "")
        )
    lines.append("status codes: " + ", ".join(f"{c} {n}" for c, n in sorted(r["codes"].items())))
    with_pb = Counter(m["refusals_with_pushback"]) + Counter(
        r["cancel_phase"]["refusals_with_pushback"]
    )
    without = Counter(m["refusals_without_pushback"]) + Counter(
        r["cancel_phase"]["refusals_without_pushback"]
    )
    if with_pb or without:
        lines.append(
            "refusals: "
            + ", ".join(
                f"{c} {with_pb.get(c, 0)} with retry hint, {without.get(c, 0)} without"
                for c in sorted(set(with_pb) | set(without))
            )
        )
    mem = r.get("memory")
    if mem:
        lines.append(
            f"memory: idle RSS {_mib(mem.get('idle_rss_bytes'))}, after the load "
            f"{_mib(mem.get('after_load_rss_bytes'))}, "
            f"at the end {_mib(mem.get('end_rss_bytes'))}, "
            f"peak (VmHWM) {_mib(mem.get('hwm_bytes'))} "
            f"({_mib(mem.get('hwm_over_idle_bytes'))} over idle)"
        )
    c = r["cancel_phase"]
    line = (
        f"cancellation phase: {c['requests']} long requests, "
        f"{c['cancelled_or_expired']} cancelled or expired"
    )
    if "server_cpu_seconds" in c:
        per = c["cpu_seconds_per_cancelled"]
        line += (
            f"; server CPU in the {c['window_seconds']:.1f} s after the last: "
            f"{c['server_cpu_seconds']:.2f} s (idle {c['idle_cpu_seconds']:.2f} s) = "
            + ("-" if per is None else f"{per:.3f} s")
            + " per cancelled request"
        )
        if not c.get("settled", True):
            line += (
                f" (the server was still busy {c['settle_seconds']:.0f} s after the mixed phase)"
            )
    lines.append(line)
    codes_after = r["answer_after_codes"]
    refused = len(codes_after) - 1
    lines.append(
        f"after: the server {'answered' if r['answers_after'] else 'did NOT answer'} a small "
        f"request ({codes_after[-1]} in {r['answer_after_seconds']:.2f} s"
        + (f", after {refused} refusals" if refused else "")
        + f"); {'alive' if r['server_alive'] else 'EXITED'}"
    )
    if "loadgen_cpu_seconds" in r:
        lines.append(
            f"load generator: CPU {r['loadgen_cpu_seconds']:.1f} s; its event loop ran up to "
            f"{_fmt_ms(m.get('loadgen_max_loop_lag_ms'))} ms late in the mixed phase, "
            f"{_fmt_ms(c.get('loadgen_max_loop_lag_ms'))} ms in the cancellation phase "
            "(client-side timings are that coarse)"
        )
    return "\n".join(lines)


# --- command line -----------------------------------------------------------


def _range(text: str) -> tuple[float, float]:
    parts = text.split(",")
    try:
        lo, hi = (float(p) for p in parts)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected LO,HI seconds, got {text!r}") from None
    if not (0 < lo <= hi):
        raise argparse.ArgumentTypeError(f"expected 0 < LO <= HI, got {text!r}")
    return lo, hi


def _mix(text: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for item in text.split(","):
        name, _, weight = item.partition("=")
        if name not in ("small", "large", "cancel", "deadline"):
            raise argparse.ArgumentTypeError(
                f"unknown class {name!r}: expected small, large, cancel, deadline"
            )
        try:
            out[name] = float(weight)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name}: weight {weight!r} is not a number") from None
        if out[name] < 0:
            raise argparse.ArgumentTypeError(f"{name}: negative weight")
    if not any(out.values()):
        raise argparse.ArgumentTypeError("every weight is 0")
    return out


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    g = p.add_argument_group("server")
    g.add_argument(
        "--server-bin",
        type=Path,
        default=DEFAULT_SERVER_BIN,
        help="tensorcheck-server to start (default: %(default)s)",
    )
    g.add_argument(
        "--server-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="extra server flag, repeatable; write --server-arg=--threads=2",
    )
    g.add_argument("--address", help="HOST:PORT of a running server instead of starting one")
    g.add_argument(
        "--server-pid",
        type=int,
        help="its pid, for memory and CPU figures (without it they are skipped)",
    )
    g = p.add_argument_group("workload")
    g.add_argument("--clients", type=int, default=8, help="concurrent clients (default 8)")
    g.add_argument(
        "--requests", type=int, default=200, help="mixed-phase requests in total (default 200)"
    )
    g.add_argument(
        "--seconds",
        type=float,
        default=60.0,
        help="no mixed-phase request starts after this (default 60)",
    )
    g.add_argument(
        "--drain-seconds",
        type=float,
        default=30.0,
        help="every mixed-phase request ends by --seconds plus this (default 30)",
    )
    g.add_argument(
        "--request-timeout",
        type=float,
        default=60.0,
        help="deadline of small and large requests (default 60)",
    )
    g.add_argument(
        "--refusal-pause",
        type=float,
        default=0.25,
        help="a client refused without a retry hint waits this long before its "
        "next request (default 0.25 s); with a hint it waits the hint",
    )
    default_mix = "small=0.5,large=0.2,cancel=0.15,deadline=0.15"
    g.add_argument(
        "--mix", type=_mix, default=_mix(default_mix), help=f"class weights (default {default_mix})"
    )
    g.add_argument("--small-shape", default="8x64x32", help="MxKxN (default %(default)s)")
    g.add_argument("--large-shape", default="512x2048x2048", help="MxKxN (default %(default)s)")
    g.add_argument(
        "--cancel-after",
        type=_range,
        default=(0.05, 0.5),
        metavar="LO,HI",
        help="a cancelled request is cancelled after U(LO,HI) s (default 0.05,0.5)",
    )
    g.add_argument(
        "--deadline",
        type=_range,
        default=(0.05, 0.5),
        metavar="LO,HI",
        help="a short deadline is U(LO,HI) s (default 0.05,0.5)",
    )
    g.add_argument(
        "--cancel-requests",
        type=int,
        default=None,
        help="long requests of the cancellation phase (default: --clients)",
    )
    g.add_argument(
        "--quiet-seconds",
        type=float,
        default=2.0,
        help="CPU windows: idle rate, and after the last cancellation (default 2)",
    )
    g.add_argument(
        "--settle-seconds",
        type=float,
        default=30.0,
        help="most time to wait for the server to go quiet before the "
        "cancellation phase (default 30)",
    )
    g.add_argument(
        "--big-requests",
        type=int,
        default=0,
        help="a first phase of this many large Verify requests at once (default 0: none)",
    )
    g.add_argument(
        "--big-request-mib",
        type=float,
        default=200.0,
        help="size of each big request, in MiB (default 200)",
    )
    g.add_argument(
        "--big-seconds",
        type=float,
        default=120.0,
        help="the big phase retries refusals with a hint until this (default 120)",
    )
    g.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", type=Path, help="write the report as JSON to this file")
    args = p.parse_args(argv)
    if args.address and args.server_arg:
        p.error("--server-arg applies to a server this program starts, not to --address")
    if args.clients < 1:
        p.error("--clients must be at least 1")
    for name in ("requests", "big_requests"):
        if getattr(args, name) < 0:
            p.error(f"--{name.replace('_', '-')} must be 0 or more")
    if args.cancel_requests is not None and args.cancel_requests < 0:
        p.error("--cancel-requests must be 0 or more")
    for name in ("seconds", "quiet_seconds", "request_timeout", "big_request_mib", "big_seconds"):
        if not getattr(args, name) > 0:
            p.error(f"--{name.replace('_', '-')} must be positive")
    try:
        args.small = _parse_shape(args.small_shape, "--small-shape")
        args.large = _parse_shape(args.large_shape, "--large-shape")
    except argparse.ArgumentTypeError as e:
        p.error(str(e))
    if args.cancel_requests is None:
        args.cancel_requests = args.clients
    return args


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    settings = Settings(
        clients=args.clients,
        requests=args.requests,
        seconds=args.seconds,
        drain_seconds=args.drain_seconds,
        request_timeout=args.request_timeout,
        refusal_pause=args.refusal_pause,
        mix=args.mix,
        cancel_after=args.cancel_after,
        deadline=args.deadline,
        cancel_requests=args.cancel_requests,
        quiet_seconds=args.quiet_seconds,
        settle_seconds=args.settle_seconds,
        seed=args.seed,
        big_requests=args.big_requests,
        big_request_bytes=int(args.big_request_mib * MiB),
        big_seconds=args.big_seconds,
    )
    workload = Workload.build(args.small, args.large, args.seed)
    if args.address:
        server = Server(args.address, args.server_pid, None)
    else:
        try:
            server = Server.start(args.server_bin, args.server_arg)
        except (OSError, RuntimeError) as e:
            print(f"loadgen: cannot start the server: {e}", file=sys.stderr)
            return 1
    cpu0 = resource.getrusage(resource.RUSAGE_SELF)
    try:
        report = asyncio.run(run(server, workload, settings))
    except (RuntimeError, OSError) as e:
        # OSError: /proc/PID vanished, the server died.
        print(f"loadgen: {e}", file=sys.stderr)
        if server.log:
            print("server output (last lines):\n  " + "\n  ".join(server.log), file=sys.stderr)
        server.stop()
        return 1
    cpu1 = resource.getrusage(resource.RUSAGE_SELF)
    report["loadgen_cpu_seconds"] = round(
        (cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime), 2
    )
    exit_status = server.stop()
    if exit_status is not None:
        report["server"]["exit_status"] = exit_status
    print(format_report(report))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
