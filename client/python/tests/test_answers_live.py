"""The server's answers through the client, against the real server: the
Flax case (README) as two outputs compared, accepted as TF32, and a
wrong weight whose assertion opens with the server's headline. Expected
values from independent numpy emulations (numerics.py). Skipped, with the
reason, against a server that predates headlines, accept= and Compare."""

from __future__ import annotations

import math

import numpy as np
import pytest

import tensorcheck
from numerics import linear64, round_tf32


def _flax_case() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """2x768 -> 512 fp32: torch's output (fp32 arithmetic: the float64 sum
    rounded once) and Flax's on Ampere (TF32 inputs, then the same)."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 768)).astype(np.float32)
    w = (rng.standard_normal((512, 768)) / math.sqrt(768)).astype(np.float32)
    b = np.zeros(512, np.float32)
    y_torch = linear64(x, w, b).astype(np.float32)
    y_flax = linear64(round_tf32(x), round_tf32(w), b).astype(np.float32)
    return x, w, b, y_torch, y_flax


def _needs_headlines(client: tensorcheck.Client, x, w, b, y) -> tensorcheck.Diagnosis:
    d = client.diagnose_linear(x, w, b, observed=y, candidates=["cpu:fp32", "cpu:tf32"]).diagnosis
    assert d is not None
    if not d.headline:
        pytest.skip("this server predates Diagnosis.headline")
    return d


def test_the_flax_case_compared_names_each_output_and_calls_the_difference_rounding(
    client: tensorcheck.Client,
) -> None:
    x, w, b, y_torch, y_flax = _flax_case()
    _needs_headlines(client, x, w, b, y_flax)
    try:
        result = client.compare_outputs(
            x, w, b, {"torch": y_torch, "flax": y_flax}, candidates=["cpu:fp32", "cpu:tf32"]
        )
    except tensorcheck.UnimplementedError as e:
        pytest.skip(f"this server has no Compare: {e}")
    diff = np.abs(y_torch.astype(np.float64) - y_flax.astype(np.float64))
    assert result.pair is not None and result.pair.stats is not None
    assert (result.pair.a, result.pair.b) == ("torch", "flax")
    assert result.pair.stats.max_abs == pytest.approx(diff.max(), rel=1e-12)
    assert result.pair.rounding
    assert result.pair.stats.max_abs <= result.pair.expected_max_abs
    best = {name: d.best for name, d in result.diagnoses.items() if d is not None}
    assert best["torch"].startswith("cpu:fp32:") and best["flax"].startswith("cpu:tf32:"), best
    assert result.headline and str(result).splitlines()[0] == result.headline
    assert [o.name for o in result.outputs] == ["torch", "flax"]
    assert result.passed is None


def test_the_flax_output_passes_when_tf32_is_accepted_and_fails_for_fp32(
    client: tensorcheck.Client,
) -> None:
    x, w, b, _, y_flax = _flax_case()
    d = _needs_headlines(client, x, w, b, y_flax)
    # Every element outside torch's fp32 tolerance? Not needed: accept= is
    # the server's acceptance, not the tolerance's.
    report = client.assert_linear_parity(x, w, b, observed=y_flax, accept=["tf32"])
    assert report.passed and report.diagnosis is not None
    assert report.diagnosis.accepted and report.diagnosis.accepted_as.startswith("cpu:tf32:")
    with pytest.raises(AssertionError) as e:
        client.assert_linear_parity(x, w, b, observed=y_flax, accept=["fp32"])
    lines = str(e.value).splitlines()
    refused = client.verify_linear(x, w, b, observed=y_flax, accept=["fp32"])
    assert refused.verdict == "fail" and refused.diagnosis is not None
    assert not refused.diagnosis.accepted
    # The message leads with the answer over every candidate: what the
    # output is, that it is not accepted, and how to get fp32.
    wider = client.diagnose_linear(x, w, b, observed=y_flax, accept=["fp32"]).diagnosis
    assert wider is not None and not wider.accepted and wider.best.startswith("cpu:tf32:")
    assert lines[0] == wider.headline
    if wider.advice:
        assert lines[1] == f"Advice: {wider.advice}"
    assert "Verdict: FAIL (accept fp32)" in lines
    assert len(lines) <= 25
    assert d.lead  # the same diagnosis without accept= has its answer too


def test_a_wrong_weight_fails_with_the_servers_headline_first(client: tensorcheck.Client) -> None:
    rng = np.random.default_rng(5)
    x = rng.standard_normal((64, 96)).astype(np.float32)
    w = (rng.standard_normal((48, 96)) / math.sqrt(96)).astype(np.float32)
    b = rng.standard_normal(48).astype(np.float32)
    bad = w.copy()
    bad[7] *= 2  # weight row 7 doubled: output column 7 is wrong
    y = linear64(x, bad, b).astype(np.float32)
    d = _needs_headlines(client, x, w, b, y)
    assert d.verdict in ("defect", "unexplained"), d.lead
    with pytest.raises(AssertionError) as e:
        client.assert_linear_parity(x, w, b, observed=y, candidates=["cpu:fp32", "cpu:tf32"])
    lines = str(e.value).splitlines()
    assert lines[0] == d.headline
    assert len(lines) <= 25
    assert "Tensor-likes are not close!" in lines
