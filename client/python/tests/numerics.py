"""Independent numpy emulations that the tests take their expected values
from (never from the client or the server)."""

from __future__ import annotations

from typing import Optional

import ml_dtypes
import numpy as np

BF16 = np.dtype(ml_dtypes.bfloat16)


def linear64(
    x: np.ndarray, w: np.ndarray, b: Optional[np.ndarray] = None, *, layout: str = "out_in"
) -> np.ndarray:
    """act-free x W^T + b in float64 from the exactly upcast stored values."""
    x64 = np.asarray(x).astype(np.float64)
    w64 = np.asarray(w).astype(np.float64)
    y = x64 @ (w64.T if layout == "out_in" else w64)
    if b is not None:
        y = y + np.asarray(b).astype(np.float64)
    return y


def round_bf16(v: np.ndarray) -> np.ndarray:
    """float64 -> bfloat16, round to nearest even, in one step (no detour
    through float32, which could round twice). Normal range only."""
    v = np.asarray(v, dtype=np.float64)
    m, e = np.frexp(v)  # v = m * 2**e, 0.5 <= |m| < 1: 8 significant bits -> m * 2**8
    r = np.ldexp(np.rint(np.ldexp(m, 8)), e - 8)  # np.rint: ties to even
    return r.astype(BF16)  # exact: r is representable


def round_tf32(v: np.ndarray) -> np.ndarray:
    """float32 -> TF32 (10 mantissa bits), round to nearest even, as float32."""
    u = np.ascontiguousarray(v, dtype=np.float32).view(np.uint32).astype(np.uint64)
    u = (u + 0x0FFF + ((u >> 13) & 1)) & ~np.uint64(0x1FFF)
    return u.astype(np.uint32).view(np.float32)


def bf16_ulp_distance(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """|ordinal(a) - ordinal(b)| for bfloat16 arrays (finite values)."""

    def ordinal(x: np.ndarray) -> np.ndarray:
        bits = np.asarray(x, dtype=BF16).view(np.uint16).astype(np.int64)
        return np.where(bits & 0x8000, -(bits & 0x7FFF), bits)

    return np.abs(ordinal(a) - ordinal(b))


def e4m3_value(bits: int) -> float:
    """float8_e4m3fn by its definition: 1 sign, 4 exponent (bias 7), 3
    mantissa bits (finite codes)."""
    sign = -1.0 if bits & 0x80 else 1.0
    exp, man = (bits >> 3) & 0xF, bits & 0x7
    if exp == 0:
        return sign * man / 8 * 2.0**-6
    return sign * (1 + man / 8) * 2.0 ** (exp - 7)


def e2m1_value(code: int) -> float:
    """float4_e2m1fn by its definition: 1 sign, 2 exponent (bias 1), 1
    mantissa bit."""
    sign = -1.0 if code & 0x8 else 1.0
    e, m = (code >> 1) & 0x3, code & 0x1
    if e == 0:
        return sign * (m / 2)
    return sign * 2.0 ** (e - 1) * (1 + m / 2)
