"""Block-wise FP8, MXFP8 and NVFP4 through the Python client against a live
server (docs/numerics.md, "Block-wise FP8", "MXFP8 and NVFP4"): narrow
operands with their block scales, and a default diagnosis of wide operands
whose output is torchao's MX recipe.

Expected outputs are computed here in float64 from values decoded by hand
from the OCP definitions, on layers chosen so that every sum is exact in
float32 and the result exact in bfloat16 (the default output of narrow
operands), so they compare bit for bit.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import tensorcheck
from numerics import e2m1_value, e4m3_value

M, N, K = 2, 4, 64


def _codes(rng: np.random.Generator, shape, lo: int, hi: int) -> np.ndarray:
    return rng.integers(lo, hi + 1, size=shape).astype(np.uint8)


def test_mxfp8_operands_with_e8m0_scales_give_the_dequantised_layer(client):
    rng = np.random.default_rng(3)
    # Values 1 .. 3.75 (codes 0x38..0x47) and one sign bit, scales 2^-1 ..
    # 2^1: products on a 2^-6 grid, sums of 64 below 2^10: exact in fp32,
    # and in bf16 only where the sum has 8 significant bits, so the
    # expected output is compared after the same bf16 rounding.
    xc = _codes(rng, (M, K), 0x38, 0x47) | (_codes(rng, (M, K), 0, 1) << 7)
    wc = _codes(rng, (N, K), 0x38, 0x47)
    xs = _codes(rng, (M, K // 32), 126, 128)
    ws = _codes(rng, (N, K // 32), 126, 128)
    dx = np.vectorize(e4m3_value)(xc) * np.exp2(np.repeat(xs.astype(np.float64) - 127, 32, 1))
    dw = np.vectorize(e4m3_value)(wc) * np.exp2(np.repeat(ws.astype(np.float64) - 127, 32, 1))
    y = (dx @ dw.T).astype(ml_dtypes.bfloat16)
    report = client.verify_linear(
        xc.view(ml_dtypes.float8_e4m3fn),
        wc.view(ml_dtypes.float8_e4m3fn),
        observed=y,
        configs=["cpu:mxfp8e4m3"],
        x_scale=xs.view(ml_dtypes.float8_e8m0fnu),
        w_scale=ws.view(ml_dtypes.float8_e8m0fnu),
        tolerance="ulp",
        max_ulp=0,
    )
    assert [r.config for r in report.results] == ["cpu:mxfp8e4m3:none@scaling=floor"]
    assert report.passed, str(report)


def test_nvfp4_operands_with_e4m3_and_global_scales_give_the_dequantised_layer(client):
    rng = np.random.default_rng(4)
    xc = _codes(rng, (M, K), 0, 15)
    wc = _codes(rng, (N, K), 0, 15)
    # E4M3 block scales 1 .. 1.875, global scales powers of two: exact.
    xs = _codes(rng, (M, K // 16), 0x38, 0x3F)
    ws = _codes(rng, (N, K // 16), 0x38, 0x3F)
    dx = np.vectorize(e2m1_value)(xc) * np.repeat(np.vectorize(e4m3_value)(xs), 16, 1)
    dw = np.vectorize(e2m1_value)(wc) * np.repeat(np.vectorize(e4m3_value)(ws), 16, 1)
    y = ((dx @ dw.T) * 0.25 * 2.0).astype(ml_dtypes.bfloat16)
    report = client.diagnose_linear(
        xc.view(ml_dtypes.float4_e2m1fn),
        wc.view(ml_dtypes.float4_e2m1fn),
        observed=y,
        x_scale=xs.view(ml_dtypes.float8_e4m3fn),
        w_scale=ws.view(ml_dtypes.float8_e4m3fn),
        x_global_scale=0.25,
        w_global_scale=2.0,
    )
    # Narrow operands: their own precision is the one default candidate.
    assert report.diagnosis.best == "cpu:nvfp4:none", str(report)
    assert report.diagnosis.candidate_tiers == [1]


def test_block128_fp32_scales_are_the_block_wise_configuration(client):
    rng = np.random.default_rng(5)
    k = 256  # two 128-wide slices
    xc = _codes(rng, (M, k), 0x38, 0x3F)
    wc = _codes(rng, (N, k), 0x38, 0x3F)
    xs = np.array([[0.5, 0.25], [1.0, 2.0]], np.float32)  # [M, ceil(K/128)]
    ws = np.array([[0.125, 4.0]], np.float32)  # [ceil(N/128), ceil(K/128)]
    dx, dw = np.vectorize(e4m3_value)(xc), np.vectorize(e4m3_value)(wc)
    # Each slice's exact sum times its two scales (powers of two: exact).
    y = sum(
        (dx[:, s * 128 : (s + 1) * 128] @ dw[:, s * 128 : (s + 1) * 128].T)
        * xs[:, s : s + 1]
        * ws[0, s]
        for s in range(2)
    ).astype(ml_dtypes.bfloat16)
    report = client.verify_linear(
        xc.view(ml_dtypes.float8_e4m3fn),
        wc.view(ml_dtypes.float8_e4m3fn),
        observed=y,
        configs=["cpu:fp8e4m3"],
        x_scale=xs,
        w_scale=ws,
        tolerance="ulp",
        max_ulp=0,
    )
    assert [r.config for r in report.results] == ["cpu:fp8e4m3:none@scaling=block128"]
    assert report.passed, str(report)


@pytest.mark.parametrize("bad", ["x_global_scale", "w_global_scale"])
def test_an_nvfp4_request_without_a_global_scale_is_refused_naming_it(client, bad):
    x = np.zeros((M, K), ml_dtypes.float4_e2m1fn)
    w = np.zeros((N, K), ml_dtypes.float4_e2m1fn)
    scales = dict(
        x_scale=np.ones((M, K // 16), ml_dtypes.float8_e4m3fn),
        w_scale=np.ones((N, K // 16), ml_dtypes.float8_e4m3fn),
        x_global_scale=1.0,
        w_global_scale=1.0,
    )
    del scales[bad]
    field = "op.input_global_scale" if bad == "x_global_scale" else "op.weight_global_scale"
    with pytest.raises(tensorcheck.InvalidArgumentError, match=field):
        client.verify_linear(x, w, configs=["cpu:nvfp4"], **scales)
