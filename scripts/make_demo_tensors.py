"""Writes the Flax-vs-PyTorch demo tensors (README.md's first case) as .npy files.

    python scripts/make_demo_tensors.py DIR

x [2, 768] ~ N(0, 1), a flax kernel [768, 512] ~ N(0, 1/768), a small bias,
and flax_y: what Flax nn.Dense computes on an Ampere+ GPU at its defaults
(inputs rounded to TF32, fp32 accumulation, bias added as its own op),
emulated here with numpy alone.
"""
import sys
from pathlib import Path

import numpy as np


def round_tf32(a: np.ndarray) -> np.ndarray:
    """Rounds float32 values to TF32 (10-bit mantissa), nearest even."""
    bits = a.astype(np.float32).view(np.uint32).astype(np.uint64)
    bits = (bits + 0xFFF + ((bits >> 13) & 1)) & 0xFFFFE000
    return bits.astype(np.uint32).view(np.float32)


def main() -> None:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 768), dtype=np.float32)
    kernel = (rng.standard_normal((768, 512)) / np.sqrt(768)).astype(np.float32)
    bias = (0.1 * rng.standard_normal(512)).astype(np.float32)
    y = (round_tf32(x) @ round_tf32(kernel)).astype(np.float32) + bias
    np.save(out / "x.npy", x)
    np.save(out / "kernel.npy", kernel)
    np.save(out / "bias.npy", bias)
    np.save(out / "flax_y.npy", y.astype(np.float32))


if __name__ == "__main__":
    main()
