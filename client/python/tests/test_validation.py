"""Bad inputs are rejected on the client, naming the argument, before any
RPC: the client here points at a closed port, so a call that got as far as
the network would raise UnavailableError instead."""

from __future__ import annotations

import grpc
import ml_dtypes
import numpy as np
import pytest

import tensorcheck

rng = np.random.default_rng(7)
X = rng.standard_normal((4, 8)).astype(np.float32)
W = rng.standard_normal((6, 8)).astype(np.float32)  # [N, K]
B = rng.standard_normal(6).astype(np.float32)
Y = np.zeros((4, 6), np.float32)

CASES = [
    # (kwargs overriding a valid call, exception, message regex)
    (dict(x=X.astype(np.int32)), TypeError, r"^x: dtype int32 is not supported"),
    (dict(x=np.array([[1.0, None]], dtype=object)), TypeError, r"^x: dtype object"),
    (dict(weight=W.astype(np.int64)), TypeError, r"^weight: dtype int64"),
    (dict(bias=B.astype(np.uint8)), TypeError, r"^bias: dtype uint8"),
    (dict(observed=Y.astype(np.complex64)), TypeError, r"^observed: dtype complex64"),
    (dict(x="not an array"), TypeError, r"^x: expected a numpy array"),
    (dict(weight=None), TypeError, r"^weight: expected an array, got None"),
    (dict(x=np.float32(1.0)), ValueError, r"^x: expected shape \[\.\.\., K\]"),
    (dict(weight=W[0]), ValueError, r"^weight: expected a 2-D \[N, K\] matrix, got shape \[8\]"),
    (dict(weight=W[None]), ValueError, r"^weight: expected a 2-D"),
    (
        dict(weight=W.astype(np.float64)),
        TypeError,
        r"^weight: dtype float64 differs from x's float32",
    ),
    (dict(weight=W[:, :7]), ValueError, r"^weight: shape \[6, 7\] .* K=7, but x has K=8"),
    (
        dict(weight=W, weight_layout="in_out"),
        ValueError,
        r"^weight: shape \[6, 8\] read as \[K, N\]",
    ),
    (dict(bias=B[:5]), ValueError, r"^bias: expected shape \[6\] \(N\), got \[5\]"),
    (dict(bias=B[None]), ValueError, r"^bias: expected shape \[6\]"),
    (dict(observed=Y.T), ValueError, r"^observed: expected shape \[4, 6\]"),
    (dict(observed=Y[None]), ValueError, r"^observed: expected shape \[4, 6\]"),
    (dict(weight_layout="nk"), ValueError, r"^weight_layout: unknown value 'nk'"),
    (dict(activation="swish"), ValueError, r"^activation: unknown value 'swish'"),
    (dict(activation=1), TypeError, r"^activation: expected one of"),
    (dict(configs=["cpu"]), ValueError, r"^configs\[0\]: 'cpu' is not of the form"),
    (dict(configs=["cpu:fp32", "cpu::fused"]), ValueError, r"^configs\[1\]: 'cpu::fused'"),
    (dict(configs=[42]), TypeError, r"^configs\[0\]: expected a string"),
    (dict(configs="cpu:fp32:fused:extra"), ValueError, r"^configs: 'cpu:fp32:fused:extra'"),
    (dict(reference="fp64"), ValueError, r"^reference: 'fp64' is not of the form"),
    (dict(tolerance="strict"), ValueError, r"^tolerance: unknown value 'strict'"),
    (dict(tolerance="explicit", atol=1e-3), ValueError, r"^atol: tolerance='explicit' needs both"),
    (dict(tolerance="ulp"), ValueError, r"^max_ulp: tolerance='ulp' needs max_ulp="),
    (dict(atol=-1.0), ValueError, r"^atol: expected a non-negative value"),
    (dict(rtol=float("nan")), ValueError, r"^rtol: expected a finite number"),
    (dict(atol="1e-3"), TypeError, r"^atol: expected a number"),
    (dict(max_ulp=1.5, tolerance="ulp"), TypeError, r"^max_ulp: expected a non-negative integer"),
    (dict(top_k=-1), ValueError, r"^top_k: expected a non-negative value"),
    (dict(output_dtype="int8"), ValueError, r"^output_dtype: unknown dtype 'int8'"),
    (dict(output_dtype=np.int32), ValueError, r"^output_dtype: dtype int32 is not supported"),
]


def _call(method, **overrides):
    args = dict(x=X, weight=W, bias=B, observed=Y)
    args.update(overrides)
    x, weight, bias = args.pop("x"), args.pop("weight"), args.pop("bias")
    return method(x, weight, bias, **args)


@pytest.mark.parametrize(
    "overrides, exc, pattern", CASES, ids=[f"{i}-{next(iter(c[0]))}" for i, c in enumerate(CASES)]
)
def test_verify_rejects_bad_input_before_any_rpc(offline_client, overrides, exc, pattern):
    with pytest.raises(exc, match=pattern):
        _call(offline_client.verify_linear, **overrides)


@pytest.mark.parametrize(
    "overrides, exc, pattern",
    CASES[:12],
    ids=[f"{i}-{next(iter(c[0]))}" for i, c in enumerate(CASES[:12])],
)
def test_diagnose_rejects_bad_input_before_any_rpc(offline_client, overrides, exc, pattern):
    with pytest.raises(exc, match=pattern):
        _call(offline_client.diagnose_linear, **overrides)


def test_diagnose_needs_observed(offline_client):
    with pytest.raises(ValueError, match=r"^observed: diagnose_linear needs"):
        offline_client.diagnose_linear(X, W, B)


def test_diagnose_takes_candidates_or_configs_not_both(offline_client):
    with pytest.raises(TypeError, match="candidates"):
        offline_client.diagnose_linear(
            X, W, B, observed=Y, candidates=["cpu:fp32"], configs=["cpu:tf32"]
        )
    with pytest.raises(ValueError, match=r"^candidates\[0\]"):
        offline_client.diagnose_linear(X, W, B, observed=Y, candidates=["tf32"])


def test_assert_linear_parity_rejects_unknown_options(offline_client):
    with pytest.raises(TypeError, match="unexpected keyword arguments \\['tolerence'\\]"):
        offline_client.assert_linear_parity(X, W, B, observed=Y, tolerence="numpy")


def test_bf16_x_with_fp32_weight_is_a_type_error(offline_client):
    with pytest.raises(TypeError, match="^weight: dtype float32 differs from x's bfloat16"):
        offline_client.verify_linear(X.astype(ml_dtypes.bfloat16), W)


@pytest.mark.parametrize(
    "kwargs, exc, pattern",
    [
        (dict(server=""), ValueError, "^server"),
        (dict(timeout=0), ValueError, "^timeout"),
        (dict(timeout=-1), ValueError, "^timeout"),
        (dict(tls="yes"), TypeError, "^tls"),
        (dict(token="a\nb"), ValueError, "^token"),
    ],
)
def test_client_constructor_rejects_bad_options(kwargs, exc, pattern):
    with pytest.raises(exc, match=pattern):
        tensorcheck.Client(**kwargs)


def test_unreachable_server_is_unavailable(offline_client):
    with pytest.raises(tensorcheck.UnavailableError) as info:
        offline_client.verify_linear(X, W, B)
    err = info.value
    assert isinstance(err, tensorcheck.Error)
    assert err.code == grpc.StatusCode.UNAVAILABLE
    assert err.method == "Verify" and err.message
    assert str(err).startswith("UNAVAILABLE (Verify): ")


def test_unreachable_server_for_capabilities_and_module_level_assert():
    with tensorcheck.Client("127.0.0.1:1", timeout=10) as c:
        with pytest.raises(tensorcheck.UnavailableError):
            c.capabilities()
    with pytest.raises(tensorcheck.UnavailableError):
        tensorcheck.assert_linear_parity(X, W, B, observed=Y, server="127.0.0.1:1", timeout=10)
