"""algorithm_sweep and batch_invariance: the request the client builds, the
report objects it makes of the new result fields, and both against a real
server's CPU backend (one algorithm; batch invariant by construction: every
row is computed by the same scalar loop whatever the batch)."""

from __future__ import annotations

import math

import numpy as np
import pytest

import tensorcheck
from tensorcheck._pb import pb
from tensorcheck._wire import encode_request


def _layer(m: int = 5, k: int = 8, n: int = 4) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(7)
    x = rng.integers(-4, 5, size=(m, k)).astype(np.float32)
    w = rng.integers(-4, 5, size=(n, k)).astype(np.float32)
    return x, w


# --- the request ----------------------------------------------------------------


def test_sweep_and_batch_invariance_reach_the_request(offline_client) -> None:
    x, w = _layer()
    call = offline_client._request(
        x,
        w,
        None,
        observed=None,
        configs=["cpu:fp32"],
        algorithm_sweep=3,
        batch_invariance=True,
        batch_sizes=[2, np.int64(4)],
    )
    req = pb.VerifyRequest.FromString(encode_request(call.request, call.tensors))
    assert req.algorithm_sweep == 3
    assert req.batch_invariance.enabled
    assert list(req.batch_invariance.batch_sizes) == [2, 4]


def test_defaults_leave_the_new_fields_unset(offline_client) -> None:
    x, w = _layer()
    call = offline_client._request(x, w, None, observed=None, configs=["cpu:fp32"])
    req = pb.VerifyRequest.FromString(encode_request(call.request, call.tensors))
    assert req.algorithm_sweep == 0
    assert not req.HasField("batch_invariance")


def test_batch_invariance_without_sizes_runs_single_rows(offline_client) -> None:
    x, w = _layer()
    call = offline_client._request(
        x, w, None, observed=None, configs=["cpu:fp32"], batch_invariance=True
    )
    assert call.request.batch_invariance.enabled
    assert list(call.request.batch_invariance.batch_sizes) == []


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"algorithm_sweep": -1}, ValueError, "algorithm_sweep"),
        ({"algorithm_sweep": 1.5}, TypeError, "algorithm_sweep"),
        ({"algorithm_sweep": True}, TypeError, "algorithm_sweep"),
        ({"batch_invariance": True, "batch_sizes": [-2]}, ValueError, "batch_sizes"),
        ({"batch_invariance": True, "batch_sizes": [0]}, ValueError, "batch_sizes"),
        ({"batch_invariance": True, "batch_sizes": [2.0]}, TypeError, "batch_sizes"),
        ({"batch_invariance": True, "batch_sizes": 4}, TypeError, "batch_sizes"),
        ({"batch_sizes": [4]}, ValueError, "batch_invariance=True"),
    ],
)
def test_bad_options_are_refused_before_any_call(offline_client, kwargs, error, message) -> None:
    x, w = _layer()
    with pytest.raises(error, match=message):
        offline_client.verify_linear(x, w, configs=["cpu:fp32"], **kwargs)
    with pytest.raises(error, match=message):
        offline_client.diagnose_linear(x, w, observed=x @ w.T, **kwargs)


# --- the report objects ---------------------------------------------------------


def _response() -> pb.VerifyResponse:
    r = pb.VerifyResponse(verdict=pb.VERDICT_PASS)
    c = r.results.add(config="cublaslt:fp32:fused@algo=1", runs=1)
    bi = c.batch_invariance
    bi.invariant = False
    bi.rows = 10
    bi.rows_differing = 3
    bi.max_ulp = 2
    bi.full_batch_details["algo"] = "1"
    sb = bi.sub_batches.add(batch_size=1, runs=10, rows_differing=3, max_ulp=2)
    sb.details["algo"] = "4"
    sb = bi.sub_batches.add(batch_size=4, runs=3, tail_rows=2)
    sb.details["algo"] = "1"
    sb.tail_details["algo"] = "2"
    r.results.add(config="cpu:fp32:none", runs=1)
    cand = r.diagnosis.ranking.add(config="cublaslt:fp32:fused@algo=1", exact=True)
    cand.details["algo"] = "1"
    r.diagnosis.ranking.add(config="cpu:fp32:none")
    return r


def test_batch_invariance_becomes_report_objects() -> None:
    report = tensorcheck.Report.from_proto(_response())
    bi = report.results[0].batch_invariance
    assert isinstance(bi, tensorcheck.BatchInvariance)
    assert (bi.invariant, bi.rows, bi.rows_differing, bi.max_ulp) == (False, 10, 3, 2)
    assert bi.full_batch_details == {"algo": "1"}
    assert [s.batch_size for s in bi.sub_batches] == [1, 4]
    single, four = bi.sub_batches
    assert isinstance(single, tensorcheck.SubBatch)
    assert (single.runs, single.rows_differing, single.max_ulp) == (10, 3, 2)
    assert single.details == {"algo": "4"}
    assert (four.runs, four.tail_rows, four.tail_details) == (3, 2, {"algo": "2"})
    assert report.results[1].batch_invariance is None


def test_ranked_candidates_carry_exact_and_details() -> None:
    report = tensorcheck.Report.from_proto(_response())
    assert report.diagnosis is not None
    first, second = report.diagnosis.ranking
    assert first.exact and first.details == {"algo": "1"}
    assert not second.exact and second.details == {}


def test_to_dict_has_the_batch_invariance_object() -> None:
    d = tensorcheck.Report.from_proto(_response()).to_dict()
    bi = d["results"][0]["batch_invariance"]
    assert list(bi) == [
        "invariant",
        "rows",
        "rows_differing",
        "max_ulp",
        "full_batch_details",
        "sub_batches",
    ]
    assert list(bi["sub_batches"][1]) == [
        "batch_size",
        "runs",
        "rows_differing",
        "max_ulp",
        "details",
        "tail_rows",
        "tail_details",
    ]
    assert bi["sub_batches"][1]["tail_details"] == {"algo": "2"}
    assert d["results"][1]["batch_invariance"] is None
    ranked = d["diagnosis"]["ranking"][0]
    assert ranked["exact"] is True and ranked["details"] == {"algo": "1"}


# --- against a server -------------------------------------------------------------


def test_sweep_runs_each_cpu_configuration_once(client: tensorcheck.Client) -> None:
    # Small integers: every partial sum is exact in fp32, so every fp32-class
    # candidate reproduces x w^T bit for bit.
    x, w = _layer()
    observed = (x.astype(np.float64) @ w.astype(np.float64).T).astype(np.float32)
    configs = ["cpu:fp32", "cpu:tf32", "cpu:bf16"]
    report = client.diagnose_linear(x, w, observed=observed, candidates=configs, algorithm_sweep=3)
    names = [r.config for r in report.results]
    assert sorted(names) == ["cpu:bf16:none", "cpu:fp32:none", "cpu:tf32:none"]
    assert not any("@algo" in n for n in names)
    assert report.diagnosis is not None
    ranking = {c.config: c for c in report.diagnosis.ranking}
    # cpu:fp32 reproduces the output exactly (tf32/bf16 round these small
    # integers exactly too, so they may tie; fp32 must be among the exact).
    assert ranking["cpu:fp32:none"].exact
    assert ranking["cpu:fp32:none"].bitwise_equal_fraction == 1.0


@pytest.mark.parametrize("config", ["cpu:fp16acc", "cpu:fp16acc:none@algo=0"])
def test_cpu_is_batch_invariant(client: tensorcheck.Client, config: str) -> None:
    rng = np.random.default_rng(11)
    m = 7
    x = rng.standard_normal((m, 16)).astype(np.float16)
    w = rng.standard_normal((6, 16)).astype(np.float16)
    report = client.verify_linear(x, w, configs=[config], batch_invariance=True, batch_sizes=[3])
    result = report.results[0]
    assert "@algo=0" in result.config or "@algo" not in config
    bi = result.batch_invariance
    assert bi is not None
    assert bi.invariant
    assert (bi.rows, bi.rows_differing, bi.max_ulp) == (m, 0, 0)
    assert [s.batch_size for s in bi.sub_batches] == [1, 3]
    for s in bi.sub_batches:
        assert s.runs == math.ceil(m / s.batch_size)
        assert s.rows_differing == 0
    three = bi.sub_batches[1]
    assert three.tail_rows == m % 3
    # The reference ran on sub-batches too.
    assert report.reference is not None
    assert report.reference.batch_invariance is not None
    assert report.reference.batch_invariance.invariant
