"""Shared by bench/flip_calibration.py and bench/detection_bench.py: a
tensorcheck-server on a free loopback port, seeded linear layers stored in
bf16/fp16/fp32, and independent producers of their outputs (PyTorch CPU,
Flax, numpy, and numpy loops in chosen summation orders).

Every producer here computes with numpy, torch or JAX, never with the
server's code, so that what the server diagnoses is an output it did not
make. Arrays travel as numpy arrays (bfloat16 as `ml_dtypes.bfloat16`).

    with Server() as server, tensorcheck.Client(server.target) as client:
        x, w, b = random_layer(np.random.default_rng(0), 48, 1024, 768, "bf16")
        y = torch_linear(x, w, b)
        d = client.diagnose_linear(x, w, b, observed=y).diagnosis
"""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Self

import ml_dtypes
import numpy as np

REPO = Path(__file__).resolve().parents[1]
DEFAULT_SERVER = Path(
    os.environ.get("TENSORCHECK_SERVER_BIN")
    or REPO / "build" / "server" / "tensorcheck-server"
)

# The storage dtypes the benches use, by the short names of the server's
# precisions (cpu:bf16:fused and so on).
DTYPES: dict[str, np.dtype] = {
    "bf16": np.dtype(ml_dtypes.bfloat16),
    "fp16": np.dtype(np.float16),
    "fp32": np.dtype(np.float32),
}
_LISTENING = re.compile(r"listening on (\S+):(\d+)")


class Server:
    """`tensorcheck-server --host 127.0.0.1 --port 0`, ready when it has
    printed `listening on HOST:PORT` (the readiness line the Python tests
    wait for, client/python/tests/conftest.py). Its output is drained for
    its lifetime (a full pipe would block its request logging) and kept,
    the last 200 lines, for error messages. Use as a context manager, or
    call stop()."""

    def __init__(
        self, binary: Path = DEFAULT_SERVER, *flags: str, timeout_s: float = 60.0
    ) -> None:
        if not (binary.is_file() and os.access(binary, os.X_OK)):
            raise FileNotFoundError(
                f"{binary}: no tensorcheck-server binary; build it with "
                "`cmake --build build --target tensorcheck-server` or set "
                "TENSORCHECK_SERVER_BIN"
            )
        self._tail: list[str] = []
        self._lines: queue.Queue[str | None] = queue.Queue()
        self.proc = subprocess.Popen(
            [str(binary), "--host", "127.0.0.1", "--port", "0", *flags],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            bufsize=1,
        )
        threading.Thread(target=self._read, daemon=True).start()
        self.target = self._wait_listening(timeout_s)

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._tail = [*self._tail[-199:], line.rstrip("\n")]
            self._lines.put(line)
        self._lines.put(None)

    def _wait_listening(self, timeout_s: float) -> str:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                line = self._lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                self.stop()
                raise RuntimeError(
                    f"tensorcheck-server printed no 'listening on' line within "
                    f"{timeout_s:.0f}s; output:\n" + "\n".join(self._tail)
                ) from None
            if line is None:
                self.proc.wait()
                raise RuntimeError(
                    f"tensorcheck-server exited with {self.proc.returncode} before "
                    "listening; output:\n" + "\n".join(self._tail)
                )
            m = _LISTENING.search(line)
            if m:
                return f"127.0.0.1:{m.group(2)}"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def server_stamp(binary: Path) -> str:
    """The binary and its modification time, for a bench's header: the
    numbers belong to that build of the server."""
    built = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(binary.stat().st_mtime))
    return f"`{binary}` (built {built})"


# --- layers and dtypes --------------------------------------------------------


def random_layer(
    rng: np.random.Generator, m: int, k: int, n: int, dtype: str
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """x [m, k] ~ N(0, 1), W [n, k] ~ N(0, 1/k), b [n] ~ N(0, 1), drawn in
    float64 and rounded (to nearest even) to the storage dtype `dtype`
    ("bf16", "fp16", "fp32"). The outputs are then O(1), within range of
    every dtype, and the bias is as large as x·Wᵀ, so that where it is added
    (fused or unfused) shows in bf16/fp16 outputs."""
    dt = DTYPES[dtype]
    x = rng.standard_normal((m, k)).astype(dt)
    w = (rng.standard_normal((n, k)) / np.sqrt(k)).astype(dt)
    b = rng.standard_normal(n).astype(dt)
    return x, w, b


def dtype_short(a: np.ndarray) -> str:
    """ "bf16", "fp16" or "fp32" for an array of that dtype."""
    for name, dt in DTYPES.items():
        if a.dtype == dt:
            return name
    raise ValueError(f"unsupported dtype {a.dtype}")


def ulp_of(v: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """The spacing (in float64) of `dtype`'s grid at the values v (taken
    after rounding v to dtype): 2^(e - p + 1) for |v| in [2^e, 2^(e+1)),
    the subnormal spacing below the smallest normal."""
    info = ml_dtypes.finfo(dtype) if dtype == DTYPES["bf16"] else np.finfo(dtype)
    mant = int(info.nmant)
    tiny = float(info.smallest_normal)
    a = np.abs(np.asarray(v, dtype=dtype).astype(np.float64))
    e = np.floor(np.log2(np.maximum(a, tiny)))
    return np.exp2(e - mant)


def to_torch(a: np.ndarray):  # -> torch.Tensor
    """A numpy array (bfloat16 as ml_dtypes) as a CPU torch tensor with the
    same bits."""
    import torch

    if a.dtype == DTYPES["bf16"]:
        return torch.from_numpy(np.ascontiguousarray(a).view(np.int16)).view(
            torch.bfloat16
        )
    return torch.from_numpy(np.ascontiguousarray(a))


def from_torch(t) -> np.ndarray:
    """A CPU torch tensor as a numpy array with the same bits."""
    import torch

    t = t.detach().contiguous()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16).copy()
    return t.numpy().copy()


# --- producers ------------------------------------------------------------------


def torch_linear(x: np.ndarray, w: np.ndarray, b: np.ndarray | None) -> np.ndarray:
    """`torch.nn.functional.linear(x, w, b)` on the CPU, in the storage dtype
    of the operands (PyTorch's default: output dtype = input dtype; bf16 and
    fp16 accumulate in fp32 with the bias added to the accumulator, i.e.
    `cpu:<dtype>:fused`)."""
    import torch

    with torch.no_grad():
        y = torch.nn.functional.linear(
            to_torch(x), to_torch(w), None if b is None else to_torch(b)
        )
    return from_torch(y)


def flax_dense(x: np.ndarray, w: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Flax `nn.Dense` (kernel = Wᵀ, bias b) applied to x with dtype and
    param_dtype the storage dtype, JAX's default precision, on the CPU.
    XLA rounds the dot to the output dtype before adding the bias
    (`cpu:<dtype>:unfused`; client/python/tests/test_model_checks_flax.py)."""
    import flax.linen as nn
    import jax.numpy as jnp

    dt = x.dtype
    layer = nn.Dense(features=w.shape[0], dtype=dt, param_dtype=dt)
    params = {"params": {"kernel": jnp.asarray(w.T), "bias": jnp.asarray(b)}}
    return np.asarray(layer.apply(params, jnp.asarray(x)))


def numpy_linear(x: np.ndarray, w: np.ndarray, b: np.ndarray) -> np.ndarray:
    """`x @ w.T + b` in numpy float32: the BLAS sgemm rounds the product to
    fp32, then the bias is added in fp32 (`cpu:fp32:unfused`, which with
    fp32 accumulation and output computes the same as fused)."""
    x32, w32, b32 = (a.astype(np.float32) for a in (x, w, b))
    return x32 @ w32.T + b32


LOOP_ORDERS = ("sequential", "tiled", "pairwise")


def loop_linear(
    x: np.ndarray,
    w: np.ndarray,
    b: np.ndarray | None,
    orders: tuple[str, ...] = LOOP_ORDERS,
    tile: int = 64,
) -> dict[str, np.ndarray]:
    """y = x·Wᵀ + b with fp32 accumulators in the given summation orders over
    k, each rounded once (to nearest even) to the storage dtype at the end:

      sequential  acc = ((p₀ + p₁) + p₂) + …
      tiled       tiles of `tile` consecutive k summed sequentially, the tile
                  sums added sequentially into the total
      pairwise    a balanced tree: the binary-counter form of pairwise
                  summation (for K a power of two, exactly the tree
                  ((p₀+p₁)+(p₂+p₃))+…; otherwise the leftover subtrees are
                  added smallest first)

    pₖ = xₖ·wₖ is the product rounded to fp32 (exact for bf16 and fp16
    operands). The bias is added to the fp32 accumulator before the one
    rounding to the output dtype: `cpu:<dtype>:fused`. Vectorised over rows
    and columns; loops over k only, so one pass (all orders together) costs
    about 3 µs per M·N·K / 10⁶ on one core."""
    dt = x.dtype
    xt = np.ascontiguousarray(x.astype(np.float32).T)  # [K, M]
    wt = np.ascontiguousarray(w.astype(np.float32).T)  # [K, N]
    kdim, m = xt.shape
    n = wt.shape[1]
    shape = (m, n)
    pool: list[np.ndarray] = []

    def take() -> np.ndarray:
        return pool.pop() if pool else np.empty(shape, np.float32)

    seq = np.zeros(shape, np.float32) if "sequential" in orders else None
    tiled = np.zeros(shape, np.float32) if "tiled" in orders else None
    tile_acc = np.zeros(shape, np.float32) if "tiled" in orders else None
    # (array, number of products it holds) for the pairwise binary counter.
    stack: list[tuple[np.ndarray, int]] = []
    prod = np.empty(shape, np.float32)
    for k in range(kdim):
        p = take() if "pairwise" in orders else prod
        np.multiply(xt[k][:, None], wt[k][None, :], out=p)
        if seq is not None:
            seq += p
        if tile_acc is not None:
            if k % tile == 0:
                tile_acc[...] = p
            else:
                tile_acc += p
            if k % tile == tile - 1 or k == kdim - 1:
                tiled += tile_acc
        if "pairwise" in orders:
            stack.append((p, 1))
            while len(stack) >= 2 and stack[-1][1] == stack[-2][1]:
                top, c = stack.pop()
                stack[-1][0][...] += top
                stack[-1] = (stack[-1][0], 2 * c)
                pool.append(top)
    out: dict[str, np.ndarray] = {}
    b32 = None if b is None else b.astype(np.float32)[None, :]
    sums = {"sequential": seq, "tiled": tiled}
    if "pairwise" in orders:
        total, _ = stack.pop()
        while stack:
            total += stack.pop()[0]
        sums["pairwise"] = total
    for name in orders:
        acc = sums[name]
        assert acc is not None
        if b32 is not None:
            acc = acc + b32
        out[name] = acc.astype(dt)
    return out
