"""FP8 layers against a real server (docs/numerics.md, "FP8"): outputs
computed here in numpy, independently of the server, from the formats, the
scaling recipe and the fast-accumulation model as the docs define them;
the server must pass them, and its diagnosis must name the precision, the
scaling and the accumulation that produced each."""

from __future__ import annotations

import math
import re

import grpc
import ml_dtypes
import numpy as np
import pytest

import tensorcheck
from tensorcheck._pb import pb, pb_grpc

E4M3 = np.dtype(ml_dtypes.float8_e4m3fn)


def fp8_values(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """e4m3fn values 2^-3 .. 1.875 with random signs: multiples of 2^-6,
    so products are multiples of 2^-12 below 4 and every partial sum of
    K <= 512 of them is exact in fp32 (at most 23 significant bits): any
    summation order of a split accumulator gives the exact sum."""
    exponent = rng.integers(4, 8, size=shape)  # biased 4..7: 2^-3 .. 2^0
    mantissa = rng.integers(0, 8, size=shape)
    sign = rng.integers(0, 2, size=shape)
    bits = (sign << 7) | (exponent << 3) | mantissa
    return bits.astype(np.uint8).view(E4M3)


def exact_dot(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    return x.astype(np.float64) @ w.astype(np.float64).T


def fast_accum_dot(a: np.ndarray, b: np.ndarray, bits: int = 13, group: int = 32) -> float:
    """The documented fast-accumulation model, written out: per group the
    accumulator and the products truncated toward zero to multiples of
    2^(E - bits), E the largest exponent among them, summed exactly, and
    the sum truncated to bits + 1 significant bits."""
    acc = 0.0
    products = a.astype(np.float64) * b.astype(np.float64)
    for start in range(0, len(products), group):
        terms = [acc, *products[start : start + group]]
        nonzero = [abs(t) for t in terms if t != 0]
        if not nonzero:
            continue
        e = max(math.frexp(t)[1] - 1 for t in nonzero)  # t in [2^e, 2^(e+1))
        quantum = 2.0 ** (e - bits)
        total = sum(np.trunc(t / quantum) * quantum for t in terms)
        if total != 0:
            q2 = 2.0 ** (math.frexp(abs(total))[1] - 1 - bits)
            total = np.trunc(total / q2) * q2
        acc = float(total)
    return acc


def scaled(acc: np.ndarray, sx: np.ndarray, sw: np.ndarray, row_wise: bool) -> np.ndarray:
    """The dequantisation in fp32: per tensor acc * fl32(sx * sw); row-wise
    (acc * sx[i]) * sw[j]."""
    a = acc.astype(np.float32)
    if row_wise:
        return (a * sx.reshape(-1, 1).astype(np.float32)) * sw.reshape(1, -1).astype(np.float32)
    return a * np.float32(np.float32(sx.item()) * np.float32(sw.item()))


@pytest.mark.parametrize("row_wise", [False, True], ids=["per_tensor", "row_wise"])
def test_split_and_fast_accumulation_are_named(client: tensorcheck.Client, row_wise: bool) -> None:
    rng = np.random.default_rng(3 + row_wise)
    m, n, k = 6, 8, 512
    x, w = fp8_values(rng, (m, k)), fp8_values(rng, (n, k))
    sx = rng.uniform(0.01, 0.02, size=(m,) if row_wise else ()).astype(np.float32)
    sw = rng.uniform(0.01, 0.02, size=(n,) if row_wise else ()).astype(np.float32)
    split = scaled(exact_dot(x, w), sx, sw, row_wise)
    fast_acc = np.array(
        [
            [fast_accum_dot(x[i].astype(np.float32), w[j].astype(np.float32)) for j in range(n)]
            for i in range(m)
        ]
    )
    fast = scaled(fast_acc, sx, sw, row_wise)
    assert not np.array_equal(split, fast), "the model must lose bits on these values"
    scaling = "row" if row_wise else "tensor"
    for observed, want in [
        (split, f"cpu:fp8e4m3:none@scaling={scaling}"),
        (fast, f"cpu:fp8e4m3:none@scaling={scaling},fast_accum"),
    ]:
        report = client.diagnose_linear(
            x, w, observed=observed, x_scale=sx, w_scale=sw, output_dtype="float32"
        )
        assert report.reference is not None and report.reference.config == "cpu:fp64:none"
        assert report.diagnosis is not None
        assert report.diagnosis.best == want, report.diagnosis.explanation
        best = next(r for r in report.results if r.config == want)
        assert best.vs_observed is not None and best.vs_observed.max_abs == 0.0


def test_bf16_output_of_the_dequantised_layer_passes(client: tensorcheck.Client) -> None:
    rng = np.random.default_rng(5)
    x, w = fp8_values(rng, (4, 64)), fp8_values(rng, (3, 64))
    sx, sw = np.float32(0.03125), np.float32(0.0625)
    y = (exact_dot(x, w) * float(sx) * float(sw)).astype(ml_dtypes.bfloat16)
    report = client.verify_linear(x, w, observed=y, x_scale=sx, w_scale=sw, configs=["cpu:fp8e4m3"])
    assert report.passed
    assert report.results[0].config == "cpu:fp8e4m3:none@scaling=tensor"


def test_which_recipe_quantised_wide_operands(client: tensorcheck.Client) -> None:
    """bf16 operands quantised by torchao's current scaling, written out
    here: amax, s = fl32(448 / amax), q = saturate(fl32(v) * s), 1 / s."""
    rng = np.random.default_rng(7)
    m, n, k = 8, 6, 128
    x = rng.normal(size=(m, k)).astype(ml_dtypes.bfloat16)
    x[1::2] = (x[1::2].astype(np.float32) / 64).astype(ml_dtypes.bfloat16)  # rows apart
    w = (rng.normal(size=(n, k)) * 0.1).astype(ml_dtypes.bfloat16)

    def quantise(v: np.ndarray, row_wise: bool) -> tuple[np.ndarray, np.ndarray]:
        v32 = v.astype(np.float32)
        amax = np.abs(v32.astype(np.float64)).max(axis=1 if row_wise else None, keepdims=row_wise)
        s = (448.0 / np.maximum(amax, 1e-12)).astype(np.float32)
        q = np.clip(v32 * s, -448, 448).astype(E4M3)
        return q, (np.float32(1) / s).astype(np.float32)

    candidates = [
        f"cpu:fp8e4m3@scaling={s}{a}" for s in ("tensor", "row") for a in ("", ",fast_accum")
    ]
    for row_wise in (False, True):
        qx, sx = quantise(x, row_wise)
        qw, sw = quantise(w, row_wise)
        y = scaled(exact_dot(qx, qw), sx, sw, row_wise).astype(np.float32)
        report = client.diagnose_linear(
            x, w, observed=y, candidates=candidates, output_dtype="float32"
        )
        assert report.diagnosis is not None
        want = f"cpu:fp8e4m3:none@scaling={'row' if row_wise else 'tensor'}"
        # The exact sum and the server's fp32 split accumulator may differ
        # by summation order only; the recipe and the accumulation are named.
        assert report.diagnosis.best == want or want in report.diagnosis.equivalent, (
            report.diagnosis.explanation
        )


def test_fp8_rules_are_invalid_argument_naming_the_field(client: tensorcheck.Client) -> None:
    rng = np.random.default_rng(1)
    x, w = fp8_values(rng, (2, 16)), fp8_values(rng, (3, 16))
    one = np.float32(1)
    with pytest.raises(tensorcheck.InvalidArgumentError, match="op.weight_scale"):
        client.verify_linear(x, w, x_scale=one)
    with pytest.raises(tensorcheck.InvalidArgumentError, match="op.input_scale.shape"):
        client.verify_linear(x, w, x_scale=np.ones(3, np.float32), w_scale=one)
    with pytest.raises(tensorcheck.InvalidArgumentError, match="configs"):
        client.verify_linear(x, w, x_scale=one, w_scale=one, configs=["cpu:bf16"])


def test_a_nan_in_one_row_wise_scale_is_refused_by_the_server_in_the_clients_words(
    client: tensorcheck.Client, target: str
) -> None:
    """The server refuses a NaN scale sent on the wire (raw gRPC, which the
    client's own check cannot stop) with INVALID_ARGUMENT naming the
    element; the client refuses the same scale before sending it, in the
    same words (docs/numerics.md, "FP8"); and the server keeps serving."""
    rng = np.random.default_rng(11)
    x, w = fp8_values(rng, (2, 16)), fp8_values(rng, (3, 16))
    sx = np.array([0.5, 0.25], np.float32)
    sw = np.array([0.5, math.nan, 2.0], np.float32)  # W's row 1, output column 1
    rule = ": a finite, positive float32 scale expected, got NaN"

    def wire(a: np.ndarray, dtype: int) -> pb.Tensor:
        return pb.Tensor(dtype=dtype, shape=list(a.shape), data=a.tobytes())

    request = pb.VerifyRequest(
        op=pb.LinearOp(
            input=wire(x, pb.DTYPE_FLOAT8_E4M3FN),
            weight=wire(w, pb.DTYPE_FLOAT8_E4M3FN),
            input_scale=wire(sx, pb.DTYPE_FLOAT32),
            weight_scale=wire(sw, pb.DTYPE_FLOAT32),
        ),
        configs=["cpu:fp8e4m3"],
    )
    with grpc.insecure_channel(target) as channel:
        stub = pb_grpc.TensorCheckStub(channel)
        for call in (stub.Verify, stub.Diagnose):
            request.observed.CopyFrom(wire(np.zeros((2, 3), np.float32), pb.DTYPE_FLOAT32))
            with pytest.raises(grpc.RpcError) as caught:
                call(request, timeout=60)
            assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert caught.value.details() == "op.weight_scale[1]" + rule
    with pytest.raises(ValueError, match=r"^w_scale\[1\]" + re.escape(rule) + "$"):
        client.verify_linear(x, w, x_scale=sx, w_scale=sw)
    sw[1] = 0.25
    y = exact_dot(x, w) * sx.astype(np.float64)[:, None] * sw.astype(np.float64)[None, :]
    report = client.verify_linear(
        x,
        w,
        observed=y.astype(np.float32),
        x_scale=sx,
        w_scale=sw,
        output_dtype="float32",
        configs=["cpu:fp8e4m3"],
    )
    assert report.passed
