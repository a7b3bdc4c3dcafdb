"""The client's per-call path (bench/client_overhead.py measures its cost):
the serialized request (`_wire`), the digest memo, the report converted
on access. Expected bytes and digests come from numpy's `tobytes` and
hashlib, never from the code under test; the server tests compare the
answers to differently laid out copies of the same values."""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import pickle

import ml_dtypes
import numpy as np
import pytest

import tensorcheck
from tensorcheck import _store
from tensorcheck._pb import pb
from tensorcheck._report import Report
from tensorcheck._store import DigestMemo, TensorRef
from tensorcheck._wire import encode_request

MiB = 1 << 20
_SHA256 = hashlib.sha256  # (the sha_calls fixture replaces hashlib's)


def _sha(raw: bytes) -> str:
    return "sha256:" + _SHA256(raw).hexdigest()


def _inline(dtype: int, shape, raw: bytes) -> pb.Tensor:
    return pb.Tensor(dtype=dtype, shape=shape, data=raw)


def _layouts():
    """(caller's array, its values as C-ordered little-endian bytes, wire dtype)."""
    rng = np.random.default_rng(7)
    base = rng.standard_normal((6, 10))
    f32 = base.astype(np.float32)
    yield f32[:, ::3], np.ascontiguousarray(f32[:, ::3]).tobytes(), pb.DTYPE_FLOAT32
    yield f32.T, np.ascontiguousarray(f32.T).tobytes(), pb.DTYPE_FLOAT32
    big = base.astype(">f8")
    yield big, base.astype("<f8").tobytes(), pb.DTYPE_FLOAT64
    bf = base.astype(ml_dtypes.bfloat16)
    yield bf[::2], np.ascontiguousarray(bf[::2]).tobytes(), pb.DTYPE_BFLOAT16
    yield np.float16(1.5) * np.ones((), np.float16), np.float16(1.5).tobytes(), pb.DTYPE_FLOAT16
    yield np.zeros((0, 4), np.float32), b"", pb.DTYPE_FLOAT32


@pytest.mark.parametrize("arr, raw, dtype", list(_layouts()))
def test_serialized_request_parses_to_the_message_protobuf_builds(arr, raw, dtype):
    options = pb.VerifyRequest(
        op=pb.LinearOp(weight_layout=pb.WEIGHT_LAYOUT_IN_OUT, activation=pb.ACTIVATION_RELU),
        configs=["cpu:fp32", "cpu:tf32"],
        reference="cpu:fp64",
    )
    options.output.top_k = 3
    a = tensorcheck._tensors.as_array(arr, "x")
    ref = TensorRef(_sha(b"w"), 16, "float32", (2, 2))
    got = pb.VerifyRequest.FromString(
        encode_request(options, [("op.input", a), ("op.weight", ref), ("observed", a)])
    )
    want = pb.VerifyRequest()
    want.CopyFrom(options)
    want.op.input.CopyFrom(_inline(dtype, arr.shape, raw))
    want.op.weight.CopyFrom(pb.Tensor(dtype=pb.DTYPE_FLOAT32, shape=[2, 2], digest=_sha(b"w")))
    want.observed.CopyFrom(_inline(dtype, arr.shape, raw))
    assert got == want
    assert got.op.input.WhichOneof("source") == "data"  # set even when empty


def test_building_a_request_leaves_the_callers_arrays_alone(offline_client):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((4, 96)).astype(">f4")  # byte-swapped
    w_full = rng.standard_normal((64, 192)).astype(np.float32)
    w = w_full[:, ::2]  # non-contiguous view
    b = rng.standard_normal(64).astype(np.float32)
    before = [(a.copy(), a.dtype, a.strides, a.flags.c_contiguous) for a in (x, w, w_full, b)]
    call = offline_client._request(x, w, b, observed=None, configs=["cpu:fp32"])
    raw = encode_request(call.request, call.tensors)
    for a, (copy_, dtype, strides, contiguous) in zip((x, w, w_full, b), before):
        assert a.dtype == dtype and a.strides == strides
        assert a.flags.c_contiguous == contiguous
        assert a.tobytes() == copy_.tobytes()
    req = pb.VerifyRequest.FromString(raw)
    assert req.op.input.data == x.astype("<f4").tobytes()
    assert req.op.weight.data == np.ascontiguousarray(w).tobytes()
    # A C-contiguous little-endian array is used in place, not copied.
    assert call.tensors[2][1] is b


def test_torch_tensors_serialize_bit_exactly(offline_client):
    torch = pytest.importorskip("torch", reason="torch is not installed")
    g = torch.Generator().manual_seed(3)
    x = torch.randn(5, 64, generator=g, dtype=torch.bfloat16)
    w = torch.randn(64, 32, generator=g, dtype=torch.bfloat16).t()  # non-contiguous [32, 64]
    call = offline_client._request(x, w, None, observed=None, configs=["cpu:bf16"])
    req = pb.VerifyRequest.FromString(encode_request(call.request, call.tensors))
    assert req.op.input.dtype == pb.DTYPE_BFLOAT16
    assert req.op.input.data == x.view(torch.int16).numpy().tobytes()
    assert req.op.weight.data == w.contiguous().view(torch.int16).numpy().tobytes()
    assert list(req.op.weight.shape) == [32, 64]


# --- DigestMemo ---------------------------------------------------------------


@pytest.fixture
def sha_calls(monkeypatch):
    """Counts SHA-256 computations made through the store module."""
    calls = []

    def counting(*args):
        calls.append(1)
        return _SHA256(*args)

    monkeypatch.setattr(_store.hashlib, "sha256", counting)
    return calls


def test_memo_hashes_a_tensor_once_and_rehashes_it_after_an_in_place_change(sha_calls):
    memo = DigestMemo()
    a = np.random.default_rng(0).standard_normal(300_000).astype(np.float32)
    first = memo.ref(a)
    assert first.digest == _sha(a.tobytes()) and first.size_bytes == a.nbytes
    assert memo.ref(a) is first and memo.ref(a.copy()) is first  # same bytes: no hash
    assert len(sha_calls) == 1
    a[123_456] += 1.0  # changed in place: the same object, new bytes
    second = memo.ref(a)
    assert second.digest == _sha(a.tobytes()) != first.digest
    assert len(sha_calls) == 2


def test_memo_tells_shapes_and_dtypes_apart():
    memo = DigestMemo()
    a = np.arange(24, dtype=np.float32)
    flat, square = memo.ref(a), memo.ref(a.reshape(4, 6))
    assert flat.digest == square.digest == _sha(a.tobytes())
    assert (flat.shape, square.shape) == ((24,), (4, 6))
    assert memo.ref(a.reshape(4, 6)).shape == (4, 6)
    h = np.arange(48, dtype=np.float16)
    assert memo.ref(h.view(np.float32)).dtype == "float32"
    assert memo.ref(h).dtype == "float16"


def test_memo_keeps_its_budget_and_skips_large_tensors():
    memo = DigestMemo(budget_bytes=3 * MiB, max_tensor_bytes=2 * MiB)
    arrays = [np.full(MiB // 4, i, np.float32) for i in range(5)]
    for a in arrays:
        memo.ref(a)
        assert memo.kept_bytes <= 3 * MiB
    assert memo.kept_bytes == 3 * MiB
    big = np.ones(3 * MiB // 4, np.float32)
    assert memo.ref(big).digest == _sha(big.tobytes())
    assert memo.kept_bytes == 3 * MiB  # not kept
    memo.clear()
    assert memo.kept_bytes == 0


# --- the report converted on access --------------------------------------------


def _stats(seed: int) -> pb.Stats:
    s = pb.Stats(total=1024, mismatched=seed, max_abs=1e-6 * seed, max_abs_index=[1, seed])
    s.max_ulp = (1 << 64) - 1  # NaN against a number
    s.bound_ratio.value = 0.5
    s.ulp_histogram.add(lo=0, hi=0, count=1000)
    s.worst.add(index=[0, seed], actual=1.0, expected=float("inf"), ulp=3)
    s.top_columns.add(index=seed, mismatched=1, share=1.0)
    return s


def _response() -> pb.VerifyResponse:
    r = pb.VerifyResponse(verdict=pb.VERDICT_FAIL, output_shape=[2, 8], notes=["n"])
    r.tolerance.preset = pb.Tolerance.PRESET_TORCH
    r.tolerance.atol.value = 1e-5
    r.observed_vs_reference.CopyFrom(_stats(1))
    c = r.results.add(config="cpu:fp32:fused", elapsed_ms=1.5, runs=1)
    c.vs_reference.CopyFrom(_stats(2))
    c.vs_observed.CopyFrom(_stats(3))
    c.details["algo"] = "blocked"
    r.reference.config = "cpu:fp64:fused"
    r.diagnosis.best = "cpu:fp32:fused"
    r.diagnosis.ranking.add(config="cpu:fp32:fused", max_ulp=2)
    r.call.explained = True
    r.call.explaining.append("cpu:fp32:fused")
    r.call.bound_threshold = 3.0
    return r


def _lazy(uploaded: int = 0, reused: int = 0) -> Report:
    return Report._of_response(_response(), None, uploaded_bytes=uploaded, reused_bytes=reused)


def test_a_report_converted_on_access_equals_the_one_converted_at_once():
    eager = Report.from_proto(_response())
    assert _lazy() == eager
    assert _lazy().to_dict() == eager.to_dict()
    assert repr(_lazy()) == repr(eager)
    lazy = _lazy()
    assert lazy.results[0].vs_observed.max_ulp == eager.results[0].vs_observed.max_ulp
    assert lazy.results is lazy.results  # converted once, then kept
    assert lazy.diagnosis.best == "cpu:fp32:fused"
    assert lazy.call == eager.call and lazy.call is not None
    assert lazy.call.explaining == ["cpu:fp32:fused"]
    assert dataclasses.asdict(_lazy()) == dataclasses.asdict(eager)
    assert dataclasses.replace(_lazy(), reused_bytes=7).reused_bytes == 7


def test_a_report_converted_on_access_pickles_and_copies_whole():
    for other in (
        pickle.loads(pickle.dumps(_lazy(3, 4))),
        copy.copy(_lazy(3, 4)),
        copy.deepcopy(_lazy(3, 4)),
    ):
        assert "_response" not in vars(other)
        assert other == dataclasses.replace(
            Report.from_proto(_response()), uploaded_bytes=3, reused_bytes=4
        )


def test_a_report_converted_on_access_has_no_other_attributes():
    lazy = _lazy()
    assert not hasattr(lazy, "nonexistent")
    with pytest.raises(AttributeError):
        lazy._response_typo  # noqa: B018
    with pytest.raises(dataclasses.FrozenInstanceError):
        lazy.verdict = "pass"  # type: ignore[misc]


def test_outputs_are_read_within_the_call():
    r = _response()
    r.results[0].output.CopyFrom(pb.Tensor(dtype=pb.DTYPE_FLOAT32, shape=[2], digest=_sha(b"o")))
    reads = []

    def read(t: pb.Tensor, name: str) -> np.ndarray:
        reads.append(name)
        return np.zeros(2, np.float32)

    report = Report._of_response(r, read, uploaded_bytes=0, reused_bytes=0)
    assert reads == ["results[0].output"]  # before anything was accessed
    assert report.results[0].output.tolist() == [0.0, 0.0]


# --- against the server ----------------------------------------------------------


def _layer(seed: int):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((2, 768)).astype(np.float32)
    w = (rng.standard_normal((512, 768)) / 28).astype(np.float32)  # 1.5 MiB: by digest
    b = rng.standard_normal(512).astype(np.float32)
    y = (x.astype(np.float64) @ w.T.astype(np.float64) + b).astype(np.float32)
    return x, w, b, y


def _untimed(report: Report) -> dict:
    """to_dict() without the timings and the store's byte counts."""
    d = report.to_dict()
    for r in [d["reference"], *d["results"]]:
        r.pop("elapsed_ms")
    d.pop("uploaded_bytes", None)
    d.pop("reused_bytes", None)
    return d


def test_other_layouts_of_the_same_values_get_the_same_report(client):
    x, w, b, y = _layer(11)
    want = client.verify_linear(x, w, b, observed=y, configs=["cpu:fp32"], top_k=3)
    wt = np.ascontiguousarray(w.T).T  # Fortran order, same values
    got = client.verify_linear(
        x.astype(">f4"), wt, b[::-1].copy()[::-1], observed=y, configs=["cpu:fp32"], top_k=3
    )
    assert _untimed(got) == _untimed(want)
    assert got.passed


def test_a_weight_changed_in_place_is_sent_anew(client):
    x, w, b, y = _layer(12)
    assert client.verify_linear(x, w, b, observed=y, configs=["cpu:fp32"]).passed
    w *= 2  # the same array object, other values: the memo must not answer
    report = client.verify_linear(x, w, b, observed=y, configs=["cpu:fp32"])
    assert not report.passed
    w /= 2
    assert client.verify_linear(x, w, b, observed=y, configs=["cpu:fp32"]).passed
