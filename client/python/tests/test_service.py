"""Against a live tensorcheck-server (see conftest.py). Expected numbers come
from independent numpy float64 computations (tests/numerics.py)."""

from __future__ import annotations

import json
import math
import os
import subprocess
from pathlib import Path

import grpc
import numpy as np
import pytest

import tensorcheck
from numerics import BF16, linear64, round_bf16, round_tf32
from tensorcheck._pb import pb
from tensorcheck._report import format_mismatch

REPORT_KEYS = {
    "verdict",
    "tolerance",
    "observed_vs_reference",
    "reference",
    "results",
    "output_shape",
    "notes",
    "diagnosis",
    "uploaded_bytes",
    "reused_bytes",
}
CONFIG_RESULT_KEYS = {
    "config",
    "vs_reference",
    "vs_observed",
    "elapsed_ms",
    "details",
    "deterministic",
    "runs",
    "shared_computation",
    "batch_invariance",
}
STATS_KEYS = {
    "total",
    "mismatched",
    "max_abs",
    "max_abs_index",
    "max_rel",
    "max_rel_index",
    "mean_abs",
    "rms",
    "rel_l2",
    "cosine",
    "max_ulp",
    "mean_ulp",
    "bitwise_equal",
    "bitwise_equal_count",
    "ulp_histogram",
    "nan_actual",
    "nan_expected",
    "inf_actual",
    "inf_expected",
    "nan_mismatch",
    "worst",
    "top_columns",
    "top_rows",
    "bound_ratio",
    "bound_precision",
    "compared_dtype",
    "passed",
    "negligible",
}
TOLERANCE_KEYS = {"preset", "atol", "rtol", "max_ulp", "bound_factor", "nan_equal"}


def cli_bin() -> Path:
    """The C++ CLI, for comparing its --json with Report.to_dict()."""
    repo = Path(__file__).resolve().parents[3]
    return Path(
        os.environ.get("TENSORCHECK_CLI_BIN") or repo / "build" / "client" / "cli" / "tensorcheck"
    )


def _data(m, k, n, dtype, seed=0, w_scale=None):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((m, k)).astype(dtype)
    w = (rng.standard_normal((n, k)) * (w_scale or 1 / math.sqrt(k))).astype(dtype)
    b = rng.standard_normal(n).astype(dtype)
    return x, w, b


# --- numpy storage dtypes ------------------------------------------------------


def test_fp64_outputs_match_an_independent_float64_computation(client):
    x, w, b = _data(4, 32, 16, np.float64)
    want = linear64(x, w, b)
    report = client.verify_linear(x, w, b, observed=want, configs=["cpu:fp64"], return_outputs=True)
    assert report.passed and report.verdict == "pass"
    assert report.output_shape == (4, 16)
    assert len(report.results) == 1
    r = report.results[0]
    assert r.config.startswith("cpu:fp64:")
    assert r.output.dtype == np.float64 and r.output.shape == (4, 16)
    np.testing.assert_allclose(r.output, want, rtol=1e-13, atol=1e-13)
    np.testing.assert_allclose(report.reference.output, want, rtol=1e-13, atol=1e-13)
    ovr = report.observed_vs_reference
    assert ovr.total == 64 and ovr.mismatched == 0 and ovr.max_abs < 1e-13
    assert ovr.compared_dtype == "float64"


def test_fp32_one_corrupted_element_is_found_where_it_is(client):
    x, w, b = _data(8, 64, 32, np.float32)
    exact = linear64(x, w, b)
    observed = exact.astype(np.float32)  # the reference rounds to fp32 too
    observed[3, 5] += np.float32(0.25)
    want_abs = abs(float(observed[3, 5]) - float(exact.astype(np.float32)[3, 5]))

    report = client.verify_linear(
        x, w, b, observed=observed, configs=["cpu:fp32"], return_outputs=True
    )
    assert not report.passed and report.verdict == "fail"
    ovr = report.observed_vs_reference
    assert ovr.total == 256 and ovr.mismatched == 1 and not ovr.passed
    assert ovr.max_abs_index == (3, 5)
    assert ovr.max_abs == pytest.approx(want_abs, rel=1e-6)
    assert ovr.worst[0].index == (3, 5)
    assert ovr.compared_dtype == "float32"
    # The server's fp32 run itself is close to the float64 truth.
    r = report.result("cpu:fp32")
    assert r.output.dtype == np.float32
    np.testing.assert_allclose(r.output, exact, rtol=1e-5, atol=1e-5)
    assert r.vs_reference.passed
    assert r.vs_observed.mismatched >= 1
    assert report.tolerance.preset == "torch"
    assert report.tolerance.atol == pytest.approx(1e-5)
    assert report.tolerance.rtol == pytest.approx(1.3e-6)


def test_elements_near_zero_are_left_out_of_the_headline_ulp_figure(client):
    # y = x W^T exactly: 4, 2^-12 and 1. The largest |y| is 4, so "near
    # zero" is |y| < 4 * 2^-10 = 2^-8, which 2^-12 is.
    x = np.array([[1.0, 0.0]], np.float32)
    w = np.array([[4.0, 0.0], [2.0**-12, 0.0], [1.0, 0.0]], np.float32)
    observed = np.array(
        [[4.0, -(2.0**-12), np.nextafter(np.float32(1), np.float32(2))]], np.float32
    )
    report = client.verify_linear(x, w, observed=observed, configs=["cpu:fp32"])
    ovr = report.observed_vs_reference
    # +-2^-12 are 2 * (115 << 23) fp32 values apart (biased exponent 115).
    assert ovr.max_ulp == 2 * (115 << 23)
    n = ovr.negligible
    assert n is not None
    assert (n.below, n.differing, n.max_abs, n.significant_max_ulp) == (2.0**-8, 1, 2.0**-11, 1)
    assert ovr.headline_max_ulp == 1
    assert n.note == (
        "leaving out 1 element near zero (|expected| < 3.9e-03, 2^-10 of the largest), "
        "which differs by at most 4.9e-04"
    )
    assert "max 1 (1 near 0) ULP" in str(report)
    assert f"Greatest ULP distance: 1 in float32, {n.note}" in format_mismatch(report)


def test_fp16_observed_rounded_from_float64_is_bitwise_the_reference(client):
    x, w, b = _data(8, 64, 16, np.float16, seed=1)
    exact = linear64(x, w, b)
    observed = exact.astype(np.float16)  # numpy rounds float64 -> float16 once (RNE)
    report = client.verify_linear(
        x,
        w,
        b,
        observed=observed,
        configs=["cpu:fp16:fused", "cpu:fp32:fused"],
        return_outputs=True,
    )
    assert report.passed
    ovr = report.observed_vs_reference
    assert ovr.bitwise_equal and ovr.max_ulp == 0 and ovr.compared_dtype == "float16"
    assert [r.config for r in report.results] == ["cpu:fp16:fused", "cpu:fp32:fused"]
    for r in report.results:
        assert r.output.dtype == np.float16
        assert r.vs_reference.max_ulp <= 1 and r.vs_reference.passed
        assert np.mean(r.output == observed) > 0.9


def test_bf16_fused_and_unfused_bias_match_independent_emulations(client):
    x, w, b = _data(16, 128, 64, BF16, seed=2, w_scale=1.0)
    acc = linear64(x, w)  # exact products, exact sum
    b64 = b.astype(np.float64)
    fused = round_bf16(acc + b64)  # PyTorch/cuBLASLt epilogue
    unfused = round_bf16(round_bf16(acc).astype(np.float64) + b64)  # candle: two roundings
    assert np.mean(fused != unfused) > 0.01, "test data do not separate the bias modes"

    report = client.verify_linear(
        x,
        w,
        b,
        observed=unfused,
        configs=["cpu:bf16:fused", "cpu:bf16:unfused"],
        return_outputs=True,
    )
    r_fused, r_unfused = report.results
    assert (r_fused.config, r_unfused.config) == ("cpu:bf16:fused", "cpu:bf16:unfused")
    assert r_fused.output.dtype == BF16 and r_unfused.output.dtype == BF16
    # fp32 vs float64 accumulation may flip a rare rounding; nothing more.
    assert np.mean(r_fused.output.view(np.uint16) == fused.view(np.uint16)) > 0.97
    assert np.mean(r_unfused.output.view(np.uint16) == unfused.view(np.uint16)) > 0.97
    total = 16 * 64
    assert r_unfused.vs_observed.bitwise_equal_count > r_fused.vs_observed.bitwise_equal_count
    assert r_unfused.vs_observed.bitwise_equal_count > 0.97 * total
    ovr = report.observed_vs_reference
    assert ovr.compared_dtype == "bfloat16" and ovr.total == total
    # The float64 reference rounds like its own bias mode.
    like = fused if report.reference.config.endswith(":fused") else unfused
    agree = int(np.sum(unfused.view(np.uint16) == like.view(np.uint16)))
    assert abs(ovr.bitwise_equal_count - agree) <= 0.01 * total


def test_in_out_layout_batch_dims_and_relu(client):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 3, 16))
    kernel = rng.standard_normal((16, 8)) / 4  # flax nn.Dense kernel [K, N]
    b = rng.standard_normal(8)
    want = np.maximum(linear64(x, kernel, b, layout="in_out"), 0.0)
    report = client.verify_linear(
        x,
        kernel,
        b,
        observed=want,
        weight_layout="in_out",
        activation="relu",
        configs=["cpu:fp64"],
        return_outputs=True,
    )
    assert report.passed
    assert report.output_shape == (2, 3, 8)
    assert report.results[0].output.shape == (2, 3, 8)
    np.testing.assert_allclose(report.results[0].output, want, rtol=1e-13, atol=1e-13)
    assert len(report.observed_vs_reference.max_abs_index) == 3


def test_verify_without_observed_checks_every_configuration(client):
    x, w, b = _data(4, 32, 8, np.float32, seed=4)
    report = client.verify_linear(x, w, b, configs=["cpu:fp32", "cpu:fp64"])
    assert report.observed_vs_reference is None
    assert all(r.vs_observed is None for r in report.results)
    assert report.passed == all(r.vs_reference.passed for r in report.results)
    d = report.to_dict()
    assert d["observed_vs_reference"] is None
    assert all(r["vs_observed"] is None for r in d["results"])


# --- torch and jax --------------------------------------------------------------


def test_torch_tensors_fp32_and_bf16(client):
    torch = pytest.importorskip("torch", reason="torch is not installed")
    torch.manual_seed(0)
    lin = torch.nn.Linear(64, 32)  # weight requires grad
    x = torch.randn(2, 5, 64)
    y = lin(x)  # what the framework produced, fp32
    report = client.verify_linear(x, lin.weight, lin.bias, observed=y, configs=["cpu:fp32"])
    assert report.passed, report.failure_message()
    assert report.output_shape == (2, 5, 32)

    xb, wb, bb = (
        x.to(torch.bfloat16),
        lin.weight.detach().to(torch.bfloat16),
        lin.bias.detach().to(torch.bfloat16),
    )
    # Independent expectation from the exactly upcast values.
    exact = linear64(xb.double().numpy(), wb.double().numpy(), bb.double().numpy())
    observed = torch.from_numpy(round_bf16(exact).view(np.int16)).view(torch.bfloat16)
    report = client.verify_linear(
        xb, wb.t(), bb, observed=observed, weight_layout="in_out", configs=["cpu:bf16:fused"]
    )
    assert report.passed
    assert report.observed_vs_reference.bitwise_equal
    assert report.observed_vs_reference.compared_dtype == "bfloat16"


def test_torch_cuda_tensors(client):
    torch = pytest.importorskip("torch", reason="torch is not installed")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA device here")
    x = torch.randn(4, 32, device="cuda")
    w = torch.randn(8, 32, device="cuda")
    report = client.verify_linear(x, w, observed=x @ w.T, configs=["cpu:tf32"])
    assert report.output_shape == (4, 8)


def test_jax_arrays_fp32_and_bf16(client):
    jnp = pytest.importorskip("jax.numpy", reason="jax is not installed")
    x, w, b = _data(4, 32, 8, np.float32, seed=5)
    exact = linear64(x, w, b)
    report = client.verify_linear(
        jnp.asarray(x),
        jnp.asarray(w.T),
        jnp.asarray(b),
        observed=exact.astype(np.float32),
        weight_layout="in_out",
        configs=["cpu:fp32"],
    )
    assert report.passed and report.observed_vs_reference.max_ulp <= 1

    xb, wb, bb = (a.astype(BF16) for a in (x, w, b))
    observed = round_bf16(linear64(xb, wb, bb))
    report = client.verify_linear(
        jnp.asarray(xb),
        jnp.asarray(wb),
        jnp.asarray(bb),
        observed=jnp.asarray(observed),
        configs=["cpu:bf16"],
    )
    assert report.passed and report.observed_vs_reference.bitwise_equal


# --- errors -------------------------------------------------------------------


def test_wrong_data_length_is_invalid_argument(client):
    # Only a hand-made request can get past the client's own checks.
    x = pb.Tensor(dtype=pb.DTYPE_FLOAT32, shape=[2, 4], data=b"\0" * 31)
    w = pb.Tensor(dtype=pb.DTYPE_FLOAT32, shape=[3, 4], data=b"\0" * 48)
    req = pb.VerifyRequest(op=pb.LinearOp(input=x, weight=w))
    with pytest.raises(tensorcheck.InvalidArgumentError) as info:
        client._rpc("Verify", req, None)
    assert info.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert "input" in info.value.message
    assert client.capabilities().backends  # and the server keeps serving


def test_unknown_precision_is_invalid_argument(client):
    x, w, b = _data(2, 8, 4, np.float32)
    with pytest.raises(tensorcheck.InvalidArgumentError) as info:
        client.verify_linear(x, w, b, configs=["cpu:fp99"])
    assert "fp99" in info.value.message


def test_unknown_backend_is_not_found(client):
    x, w, b = _data(2, 8, 4, np.float32)
    with pytest.raises(tensorcheck.NotFoundError) as info:
        client.verify_linear(x, w, b, configs=["nosuchbackend:fp32"])
    assert info.value.code == grpc.StatusCode.NOT_FOUND
    assert isinstance(info.value, tensorcheck.Error)


def test_expired_deadline_is_deadline_exceeded(target):
    x, w, b = _data(64, 256, 64, np.float32)
    with tensorcheck.Client(target, timeout=1e-6) as c:
        with pytest.raises(tensorcheck.DeadlineExceededError) as info:
            c.verify_linear(x, w, b, configs=["cpu:fp32"])
    assert info.value.code == grpc.StatusCode.DEADLINE_EXCEEDED


def test_an_expired_deadline_raises_before_any_call():
    # grpcio lets some calls with a zero timeout through; the client must not
    # send one (the test above failed now and then when it did).
    import time

    from tensorcheck._errors import time_left

    with pytest.raises(tensorcheck.DeadlineExceededError) as info:
        time_left(time.monotonic() - 1e-9, "Verify")
    assert info.value.code == grpc.StatusCode.DEADLINE_EXCEEDED
    assert time_left(None) is None
    assert 0 < time_left(time.monotonic() + 60) <= 60


def test_every_status_code_has_its_error_class():
    from tensorcheck._errors import error_for

    for code in grpc.StatusCode:
        if code == grpc.StatusCode.OK:
            continue
        err = error_for(code, "m")
        assert isinstance(err, tensorcheck.Error) and err.code == code
        assert type(err) is not tensorcheck.Error, code


# --- assert_linear_parity ----------------------------------------------------------


def test_assert_linear_parity_raises_a_torch_style_message_and_diagnosis(client):
    x, w, b = _data(8, 64, 32, np.float32)
    observed = linear64(x, w, b).astype(np.float32)
    observed[3, 5] += np.float32(0.25)
    with pytest.raises(AssertionError) as info:
        client.assert_linear_parity(x, w, b, observed=observed, candidates=["cpu:fp32", "cpu:tf32"])
    msg = str(info.value)
    # The server's answer first (from a server that has one), then the
    # torch-style summary.
    d = client.diagnose_linear(
        x, w, b, observed=observed, candidates=["cpu:fp32", "cpu:tf32"]
    ).diagnosis
    assert d is not None
    if d.lead:
        assert msg.startswith(d.lead + "\n")
        assert "\nTensor-likes are not close!\n\n" in msg
    else:
        assert msg.startswith("Tensor-likes are not close!\n\n")
    assert len(msg.splitlines()) <= 25
    assert "Mismatched elements: 1 / 256 (0.4%)" in msg
    assert "Greatest absolute difference: " in msg and "at index (3, 5)" in msg
    assert "(up to 1e-05 allowed)" in msg
    assert "Greatest relative difference: " in msg
    assert "Best match: " in msg


def test_assert_linear_parity_passes_and_returns_the_report(client, target):
    x, w, b = _data(4, 32, 8, np.float32, seed=6)
    observed = linear64(x, w, b).astype(np.float32)
    report = client.assert_linear_parity(x, w, b, observed=observed)
    assert report.passed
    report = tensorcheck.assert_linear_parity(x, w, b, observed=observed, server=target)
    assert report.passed
    with pytest.raises(AssertionError, match="^Tensor-likes are not close!"):
        tensorcheck.assert_linear_parity(
            x, w, b, observed=observed * 1.01, server=target, tolerance="numpy", diagnose=False
        )


# --- diagnose ---------------------------------------------------------------------


def test_diagnose_flax_case_names_tf32(client):
    """The Flax case: JAX computes fp32 matmuls in TF32 on Ampere+."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 768)).astype(np.float32)
    w = (rng.standard_normal((512, 768)) / math.sqrt(768)).astype(np.float32)
    b = np.zeros(512, np.float32)
    # Independent emulation: TF32 (RNE) inputs, float64 sum, one rounding.
    observed = linear64(round_tf32(x), round_tf32(w), b).astype(np.float32)
    try:
        report = client.diagnose_linear(
            x, w, b, observed=observed, candidates=["cpu:fp32", "cpu:tf32"]
        )
    except tensorcheck.UnimplementedError as e:
        pytest.skip(f"server has no Diagnose yet: {e}")
    d = report.diagnosis
    assert d is not None
    assert d.best is not None and d.best.startswith("cpu:tf32"), d.explanation
    # README's Flax case is rounding (docs/numerics.md, "Verdict").
    assert d.verdict == "rounding", d.verdict_reason
    assert 0.0 <= d.confidence <= 1.0
    assert {r.config.rsplit(":", 1)[0] for r in d.ranking} >= {"cpu:fp32", "cpu:tf32"}
    assert d.explanation
    dd = report.to_dict()["diagnosis"]
    assert set(dd) == {
        "best",
        "equivalent",
        "tied",
        "confidence",
        "ranking",
        "framework_hint",
        "localization",
        "explanation",
        "verdict",
        "verdict_reason",
        "defect",
        "headline",
        "advice",
        "accepted",
        "accepted_as",
        "candidate_tiers",
    }
    # Candidates named by the request: no tier of the default ones ran.
    assert dd["candidate_tiers"] == []
    json.dumps(report.to_dict(), allow_nan=False)


# --- JSON -----------------------------------------------------------------------


def test_to_dict_has_the_documented_keys(client):
    x, w, b = _data(4, 32, 8, np.float32, seed=8)
    observed = linear64(x, w, b).astype(np.float32)
    report = client.verify_linear(
        x, w, b, observed=observed, configs=["cpu:fp32", "cpu:tf32"], return_outputs=True
    )
    d = report.to_dict()
    assert set(d) == REPORT_KEYS
    assert d["verdict"] in ("pass", "fail")
    assert set(d["tolerance"]) == TOLERANCE_KEYS
    assert d["tolerance"]["preset"] == "torch"
    assert set(d["observed_vs_reference"]) == STATS_KEYS
    assert d["output_shape"] == [4, 8]
    assert d["diagnosis"] is None
    for r in [d["reference"]] + d["results"]:
        assert set(r) == CONFIG_RESULT_KEYS  # no output tensor in the JSON
        assert set(r["vs_reference"]) == STATS_KEYS
    for r in d["results"]:
        assert set(r["vs_observed"]) == STATS_KEYS
    assert [r["config"] for r in d["results"]] == [r.config for r in report.results]
    assert d["observed_vs_reference"]["max_abs"] == report.observed_vs_reference.max_abs
    json.dumps(d, allow_nan=False)


def test_non_finite_observed_values_are_strings_in_json(client):
    x, w, b = _data(2, 16, 4, np.float32, seed=9)
    observed = linear64(x, w, b).astype(np.float32)
    observed[0, 0] = np.nan
    observed[1, 2] = np.inf
    report = client.verify_linear(x, w, b, observed=observed)
    ovr = report.observed_vs_reference
    assert ovr.nan_actual == 1 and ovr.inf_actual == 1 and ovr.nan_mismatch == 1
    assert not report.passed
    assert ovr.max_ulp == math.inf  # NaN against a number
    d = report.to_dict()["observed_vs_reference"]
    assert d["max_ulp"] == "inf"
    for key in ("max_abs", "max_rel", "mean_abs", "rms"):
        v = getattr(ovr, key)
        if not math.isfinite(v):
            assert d[key] in ("inf", "-inf", "nan")
    json.dumps(report.to_dict(), allow_nan=False)


def test_capabilities(client):
    caps = client.capabilities()
    cpu = caps.backend("cpu")
    assert cpu is not None and cpu.available
    assert "fp32" in cpu.precisions and "tf32" in cpu.precisions
    assert any(c.startswith("cpu:fp64") for c in cpu.configs)
    assert caps.default_reference == "cpu:fp64"
    assert "torch" in caps.tolerance_presets
    assert isinstance(caps.tensor_store, bool)
    assert caps.limits is not None and caps.limits.max_configs > 0
    json.dumps(caps.to_dict(), allow_nan=False)


def test_token_is_sent_as_bearer_metadata(target):
    # A server without auth ignores it; the call must still succeed.
    with tensorcheck.Client(target, token="secret", timeout=30) as c:
        assert c.capabilities().backends


# --- the CLI's --json ---------------------------------------------------------------


def test_to_dict_equals_the_cli_json(target, tmp_path):
    """docs/json-report.md: the CLI's `verify --json` and Report.to_dict()
    are the same object (timings and backend details aside)."""
    cli = cli_bin()
    if not (cli.is_file() and os.access(cli, os.X_OK)):
        pytest.skip(f"tensorcheck CLI not found at {cli}: build it or set TENSORCHECK_CLI_BIN")
    x, w, b = _data(4, 32, 8, np.float32, seed=10)
    observed = linear64(x, w, b).astype(np.float32)
    observed[1, 2] = np.float32(0.5)
    paths = {}
    for name, a in (("x", x), ("w", w), ("b", b), ("y", observed)):
        paths[name] = tmp_path / f"{name}.npy"
        np.save(paths[name], a)
    proc = subprocess.run(
        [
            str(cli),
            "--server",
            target,
            "verify",
            "--input",
            str(paths["x"]),
            "--weight",
            str(paths["w"]),
            "--bias",
            str(paths["b"]),
            "--observed",
            str(paths["y"]),
            "--config",
            "cpu:fp32",
            "--config",
            "cpu:tf32",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1, proc.stderr  # parity failure
    from_cli = json.loads(proc.stdout)

    with tensorcheck.Client(target, timeout=120) as c:
        from_client = c.verify_linear(
            x, w, b, observed=observed, configs=["cpu:fp32", "cpu:tf32"]
        ).to_dict()

    def strip(d):
        for r in [d["reference"]] + d["results"]:
            r.pop("elapsed_ms")
            r.pop("details")
        return d

    assert strip(from_client) == strip(from_cli)
