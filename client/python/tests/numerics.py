"""Independent numpy emulations that the tests take their expected values
from (never from the client or the server)."""

from __future__ import annotations

import math
from fractions import Fraction
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


# The sm_90 (H100, H200) tensor-core model for bfloat16 inputs with fp32
# accumulation (docs/numerics.md, "Tensor-core inner products"), redone
# here from its description in exact rational arithmetic. Normal inputs and
# sums only (no subnormals, no specials).
SM90_BLOCK = 16  # products per hardware inner product
SM90_ALIGN_BITS = 25  # fraction bits kept below the block's largest exponent
SM90_RESULT_BITS = 24  # significant bits of a block's result (fp32's)


def _floor_log2(v: Fraction) -> int:
    """floor(log2 |v|) of a nonzero rational, exactly."""
    n, d = abs(v.numerator), v.denominator
    e = n.bit_length() - d.bit_length()  # the floor, or one above it
    if (n << max(-e, 0)) < (d << max(e, 0)):  # |v| < 2^e
        e -= 1
    return e


def _truncate(v: Fraction, exponent: int) -> Fraction:
    """v truncated toward zero to a multiple of 2^exponent."""
    quantum = Fraction(2) ** exponent
    return quantum * math.trunc(v / quantum)


def sm90_bf16_dot(a: np.ndarray, b: np.ndarray) -> Fraction:
    """sum a[i] * b[i] as an H100's bf16 tensor cores compute it from a
    zero accumulator C, K walked in blocks of 16 products from k = 0. In
    each block the nonzero products and a nonzero C are aligned to the
    largest nominal exponent E among them (a product's: the sum of its two
    inputs' floor(log2|v|); C's its own), every term truncated toward zero
    to a multiple of 2^(E - 25), the terms summed exactly, and the sum
    truncated toward zero to 24 significant bits: the next C."""
    av = [Fraction(float(v)) for v in np.asarray(a, dtype=np.float64)]
    bv = [Fraction(float(v)) for v in np.asarray(b, dtype=np.float64)]
    for v in av + bv:
        assert v == 0 or abs(v) >= Fraction(2) ** -126, "normal inputs only"
    c = Fraction(0)
    for start in range(0, len(av), SM90_BLOCK):
        terms = [
            (x * y, _floor_log2(x) + _floor_log2(y))
            for x, y in zip(av[start : start + SM90_BLOCK], bv[start : start + SM90_BLOCK])
            if x != 0 and y != 0
        ]
        if c != 0:
            terms.append((c, _floor_log2(c)))
        if not terms:
            c = Fraction(0)
            continue
        e = max(exponent for _, exponent in terms)
        s = sum((_truncate(t, e - SM90_ALIGN_BITS) for t, _ in terms), Fraction(0))
        c = Fraction(0) if s == 0 else _truncate(s, _floor_log2(s) - (SM90_RESULT_BITS - 1))
        assert c == 0 or abs(c) >= Fraction(2) ** -126, "normal sums only"
    return c


def sm90_bf16_linear(x: np.ndarray, w: np.ndarray, b: np.ndarray) -> np.ndarray:
    """A bf16 layer's float32 output [M, N] as an H100's default kernel
    computes it with the bias in its fp32 epilogue: each element
    sm90_bf16_dot of x's row and w's row ([N, K], out_in), then the bias
    added with one IEEE fp32 addition (round to nearest even)."""
    x64 = np.asarray(x).astype(np.float64)
    w64 = np.asarray(w).astype(np.float64)
    b32 = np.asarray(b).astype(np.float32)
    y = np.empty((x64.shape[0], w64.shape[0]), dtype=np.float32)
    for i in range(x64.shape[0]):
        for j in range(w64.shape[0]):
            acc = np.float32(float(sm90_bf16_dot(x64[i], w64[j])))  # exact: 24 bits
            y[i, j] = acc + b32[j]  # float32 + float32: one IEEE addition
    return y
