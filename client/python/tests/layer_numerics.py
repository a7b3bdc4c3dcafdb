"""Which configuration did a framework's linear layer compute? Decided here,
in numpy float64, from the layer's own x, W, b and output, independently of
the tensorcheck client and server, so that the model tests can hold the
service's diagnosis against it.

The candidates, for a layer `y = x·Wᵀ + b` whose tensors are stored in
dtype D (the output too):

- `fused`: round_D(x·Wᵀ + b) computed exactly in float64: one rounding.
  This is what an fp32-accumulating GEMM that adds the bias to its
  accumulator gives, up to the rare element where its summation order moves
  the accumulator across a rounding boundary of D (with D = bf16 or fp16,
  about one element in a thousand or fewer at these sizes).
- `unfused`: round_D(round_D(x·Wᵀ) + b): the GEMM rounded to D, then the bias
  added and rounded again.
- `none` (no bias): round_D(x·Wᵀ).

For 16-bit D the output keeps only 8 (bf16) or 11 (fp16) significant bits,
so fp32 accumulation error hardly ever shows: the configuration is the one
whose output matches bit for bit in at least 99% of the elements.

For fp32 D the output carries the accumulation error of an fp32 GEMM (a
few ULPs), so bitwise shares are low for every candidate. What separates
them is the rounding of the *inputs*: fp32 (none), TF32 (10 mantissa bits)
or bf16 (7). Each candidate is computed exactly from its rounded inputs;
the observed output's rms distance to the right one is the accumulation
error, ~2⁻²⁴·√K·|x||w|, while the wrong ones are off by their input
rounding, hundreds of times more. The bias placement cannot be told at
fp32 (a fused and an unfused bias differ by at most one fp32 rounding,
less than the accumulation error), so both bias modes are accepted there,
as the service merges them too.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import ml_dtypes
import numpy as np

from numerics import round_bf16, round_tf32

BF16 = np.dtype(ml_dtypes.bfloat16)
_PRECISION = {BF16: "bf16", np.dtype(np.float16): "fp16", np.dtype(np.float32): "fp32"}
# A 16-bit output whose configuration is known matches it in at least this
# share of the elements (the rest: summation-order flips).
EXACT_SHARE = 0.99
# For fp32 outputs, the runner-up must be at least this much further (rms)
# than the best candidate for the data to name one input rounding.
FP32_SEPARATION = 10.0


def round_to(v: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """float64 -> dtype, round to nearest even, once (no detour through
    float32), back as float64."""
    dtype = np.dtype(dtype)
    if dtype == BF16:
        return round_bf16(v).astype(np.float64)
    # numpy converts float64 to float16 and float32 with one correct rounding.
    return np.asarray(v, dtype=np.float64).astype(dtype).astype(np.float64)


@dataclass
class Identified:
    """What a layer's output matched: `precision` ("fp32", "bf16", ...),
    `bias_modes` (those the data cannot tell apart, e.g. {"fused",
    "unfused"} at fp32), and the evidence (`shares`: bitwise-equal share per
    candidate; `rms`: rms distance per candidate)."""

    precision: Optional[str]
    bias_modes: set[str]
    shares: dict[str, float] = field(default_factory=dict)
    rms: dict[str, float] = field(default_factory=dict)

    @property
    def configs(self) -> set[str]:
        """The service's names for it: cpu:<precision>:<bias>."""
        if self.precision is None:
            return set()
        return {f"cpu:{self.precision}:{mode}" for mode in self.bias_modes}

    def __str__(self) -> str:
        evidence = ", ".join(f"{k} {v:.4f}" for k, v in self.shares.items())
        if self.rms:
            evidence += "; rms " + ", ".join(f"{k} {v:.3g}" for k, v in self.rms.items())
        return f"{sorted(self.configs) or 'nothing'} (bitwise shares: {evidence})"


def identify(x: np.ndarray, w: np.ndarray, b: Optional[np.ndarray], y: np.ndarray) -> Identified:
    """The configuration that produced `y` from `x` [..., K], `w` [N, K]
    (torch's layout: pass a Flax kernel transposed), `b` [N] or None, all in
    one storage dtype (bf16, fp16 or fp32)."""
    dtype = np.dtype(y.dtype)
    precision = _PRECISION[dtype]
    k = x.shape[-1]
    x64 = np.asarray(x).astype(np.float64).reshape(-1, k)
    w64 = np.asarray(w).astype(np.float64)
    b64 = None if b is None else np.asarray(b).astype(np.float64)
    y64 = np.asarray(y).astype(np.float64).reshape(x64.shape[0], -1)

    def outputs(xr: np.ndarray, wr: np.ndarray) -> dict[str, np.ndarray]:
        acc = xr @ wr.T
        if b64 is None:
            return {"none": round_to(acc, dtype)}
        return {
            "fused": round_to(acc + b64, dtype),
            "unfused": round_to(round_to(acc, dtype) + b64, dtype),
        }

    if precision != "fp32":
        cands = outputs(x64, w64)
        shares = {mode: float(np.mean(out == y64)) for mode, out in cands.items()}
        modes = {mode for mode, share in shares.items() if share >= EXACT_SHARE}
        return Identified(precision if modes else None, modes, shares)

    # fp32: which input rounding? Then every bias mode of it.
    def rounded(a: np.ndarray, how: str) -> np.ndarray:
        if how == "fp32":
            return a
        if how == "tf32":
            return round_tf32(a.astype(np.float32)).astype(np.float64)
        return round_bf16(a).astype(np.float64)

    rms: dict[str, float] = {}
    shares = {}
    for how in ("fp32", "tf32", "bf16"):
        for mode, out in outputs(rounded(x64, how), rounded(w64, how)).items():
            rms[f"{how}:{mode}"] = float(np.sqrt(np.mean((y64 - out) ** 2)))
            shares[f"{how}:{mode}"] = float(np.mean(out == y64))
    by_precision = {
        how: min(v for c, v in rms.items() if c.startswith(how + ":"))
        for how in ("fp32", "tf32", "bf16")
    }
    ranked = sorted(by_precision, key=by_precision.__getitem__)
    best, runner_up = ranked[0], ranked[1]
    if by_precision[runner_up] < FP32_SEPARATION * by_precision[best]:
        return Identified(None, set(), shares, rms)
    return Identified(best, {"none"} if b is None else {"fused", "unfused"}, shares, rms)


# torch.testing.assert_close's default (atol, rtol) per dtype: the server's
# "torch" tolerance preset.
TORCH_TOLERANCE = {
    np.dtype(np.float32): (1e-5, 1.3e-6),
    np.dtype(np.float16): (1e-5, 1e-3),
    BF16: (1e-5, 1.6e-2),
}


def torch_tolerance_verdict(
    x: np.ndarray, w: np.ndarray, b: Optional[np.ndarray], y: np.ndarray
) -> str:
    """ "pass" when every element of `y` is within torch's tolerance of the
    reference, x·Wᵀ + b computed exactly and rounded once to y's dtype
    (what the service's cpu:fp64 reference gives); else "fail"."""
    atol, rtol = TORCH_TOLERANCE[np.dtype(y.dtype)]
    k = x.shape[-1]
    exact = np.asarray(x).astype(np.float64).reshape(-1, k) @ np.asarray(w).astype(np.float64).T
    if b is not None:
        exact = exact + np.asarray(b).astype(np.float64)
    ref = round_to(exact, y.dtype)
    got = np.asarray(y).astype(np.float64).reshape(ref.shape)
    return "pass" if np.all(np.abs(got - ref) <= atol + rtol * np.abs(ref)) else "fail"
