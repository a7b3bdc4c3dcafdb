"""`gpu=` against a live server (docs/numerics.md, "Kernel K order"): a
diagnosis that names the GPU also ranks the CPU replays of its default
kernels, and finds the one an H100's output came from bit for bit.

The observed output is computed here by numerics.sm90_bf16_linear, the
sm_90 tensor-core model redone in exact rational arithmetic from its
description (never from the server): a bf16 layer with float32 output,
each element the tensor cores' blocked, truncating inner product, the bias
added in fp32. A few inputs are x4096, so that the truncation shows
against fp32 accumulation."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import tensorcheck
from numerics import BF16, sm90_bf16_linear


def _layer() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """x [4, 64], w [8, 64], b [8] in bfloat16, and the H100's float32 y."""
    rng = np.random.default_rng(90)
    x = rng.standard_normal((4, 64))
    x.reshape(-1)[::7] *= 4096
    xb = x.astype(BF16)
    wb = (rng.standard_normal((8, 64)) * 0.05).astype(BF16)
    bb = rng.standard_normal(8).astype(BF16)
    return xb, wb, bb, sm90_bf16_linear(xb, wb, bb)


def test_naming_the_gpu_finds_its_kernel_bit_for_bit(client):
    x, w, b, y = _layer()
    # Plain fp32 accumulation of the same products, left to right, gives
    # other bits: the layer tells the two apart.
    x64, w64 = x.astype(np.float64), w.astype(np.float64)
    acc = np.zeros(y.shape, np.float32)
    for k in range(x.shape[1]):
        acc = acc + np.outer(x64[:, k], w64[:, k]).astype(np.float32)
    assert not np.array_equal(acc + b.astype(np.float32), y)

    # Without the GPU no candidate reproduces it.
    plain = client.diagnose_linear(x, w, b, observed=y, output_dtype="float32")
    assert plain.diagnosis is not None
    assert plain.diagnosis.ranking, plain.diagnosis
    assert not plain.diagnosis.ranking[0].exact, plain.diagnosis.ranking[0]

    report = client.diagnose_linear(x, w, b, observed=y, output_dtype="float32", gpu="h100")
    d = report.diagnosis
    assert d is not None
    assert d.best == "cpu:bf16:fused@mma=sm90", str(report)
    assert d.ranking[0].config == "cpu:bf16:fused@mma=sm90", d.ranking[0]
    assert d.ranking[0].exact, d.ranking[0]
    assert any("h100" in note for note in report.notes), report.notes


def test_an_unknown_gpu_is_invalid_argument_naming_the_field(client):
    x, w, b, y = _layer()
    with pytest.raises(tensorcheck.InvalidArgumentError, match=r"gpu: unknown GPU 'tpu'"):
        client.diagnose_linear(x, w, b, observed=y, output_dtype="float32", gpu="tpu")


def test_the_model_is_exact_where_nothing_is_truncated():
    # Small integers: every product and partial sum fits in 24 bits, so the
    # model is the exact sum (a check of the test's own model).
    x = np.arange(1, 65, dtype=np.float64).reshape(1, 64).astype(ml_dtypes.bfloat16)
    w = np.ones((2, 64)).astype(ml_dtypes.bfloat16)
    b = np.array([0.5, -3.0]).astype(ml_dtypes.bfloat16)
    np.testing.assert_array_equal(
        sm90_bf16_linear(x, w, b), np.array([[2080.5, 2077.0]], np.float32)
    )
