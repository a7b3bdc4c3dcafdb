"""FP4 (float4_e2m1fn) operands, float8_e8m0fnu block scales and NVFP4's
global scales in the Python client, without the server binary.

Expected values never come from the code under test: the 16 FP4 codes are
decoded here by the formula (1 sign, 2 exponent bits of bias 1, 1 mantissa
bit: (-1)^s * 2^(e - 1) * (1 + m / 2), subnormal (-1)^s * m / 2), the 256
E8M0 patterns as 2^(bits - 127) with 0xff NaN, and the packing of two
codes per byte (element 2i in the low nibble) is written out here with
plain integers. Requests are checked as the server receives them: the
serialized bytes parsed back by protobuf, or what an in-process fake
server got.
"""

from __future__ import annotations

import hashlib
import math
import re
import struct
from collections.abc import Iterator

import ml_dtypes
import numpy as np
import pytest

import tensorcheck
from in_process_server import BlobStore, RecordingServicer, serve_in_process
from numerics import e2m1_value
from tensorcheck._pb import pb
from tensorcheck._store import digest_of
from tensorcheck._tensors import (
    as_array,
    dtype_name,
    from_proto,
    numpy_dtype,
    parse_dtype,
    to_proto,
)
from tensorcheck._wire import encode_request


def pack_by_hand(codes: list[int]) -> bytes:
    """Two codes per byte, element 2i in the low nibble; an odd count's
    last high nibble 0."""
    out = []
    for i in range(0, len(codes), 2):
        lo = codes[i]
        hi = codes[i + 1] if i + 1 < len(codes) else 0
        out.append(lo | (hi << 4))
    return bytes(out)


def fp4(codes: list[int], shape: tuple[int, ...]) -> np.ndarray:
    """An ml_dtypes float4_e2m1fn array (one element per byte) holding
    `codes`, built from the values the formula gives."""
    return (
        np.array([e2m1_value(c) for c in codes], np.float64)
        .astype(ml_dtypes.float4_e2m1fn)
        .reshape(shape)
    )


ALL_CODES = list(range(16))


def test_the_formula_gives_e2m1s_values():
    assert [e2m1_value(c) for c in range(8)] == [0, 0.5, 1, 1.5, 2, 3, 4, 6]
    assert [e2m1_value(c) for c in range(8, 16)][1:] == [-0.5, -1, -1.5, -2, -3, -4, -6]
    assert math.copysign(1, e2m1_value(8)) == -1.0


def test_ml_dtypes_holds_each_code_in_its_own_byte():
    a = fp4(ALL_CODES, (16,))
    assert a.view(np.uint8).tolist() == ALL_CODES


@pytest.mark.parametrize(
    "shape", [(4, 16), (2, 2, 8), (16, 4), (1, 2)], ids=lambda s: "x".join(map(str, s))
)
def test_fp4_is_sent_packed_two_per_byte_with_its_own_shape(shape):
    n = int(np.prod(shape))
    codes = [(7 * i + 3) % 16 for i in range(n)]  # every code, in no simple order
    t = to_proto(as_array(fp4(codes, shape), "x"))
    assert t.dtype == pb.DTYPE_FLOAT4_E2M1FN == 7
    assert list(t.shape) == list(shape)  # elements, not bytes
    assert t.data == pack_by_hand(codes)
    assert len(t.data) == n // 2


def test_an_odd_count_of_fp4_takes_ceil_half_the_bytes():
    t = to_proto(as_array(fp4([1, 2, 3], (3,)), "x"))
    assert list(t.shape) == [3] and t.data == bytes([0x21, 0x03])


def test_non_contiguous_fp4_is_packed_in_row_major_order():
    a = fp4(ALL_CODES, (4, 4)).T  # element (i, j) is code 4 * j + i
    t = to_proto(as_array(a, "x"))
    assert t.data == pack_by_hand([4 * j + i for i in range(4) for j in range(4)])


def test_packed_fp4_comes_back_unpacked():
    wire = pb.Tensor(dtype=pb.DTYPE_FLOAT4_E2M1FN, shape=[2, 8], data=pack_by_hand(ALL_CODES))
    back = from_proto(wire, "results[0].output")
    assert back.dtype == np.dtype(ml_dtypes.float4_e2m1fn) and back.shape == (2, 8)
    assert back.flags.writeable
    assert back.view(np.uint8).ravel().tolist() == ALL_CODES
    assert back.astype(np.float64).ravel().tolist() == [e2m1_value(c) for c in ALL_CODES]
    short = pb.Tensor(dtype=pb.DTYPE_FLOAT4_E2M1FN, shape=[2, 8], data=b"\x00" * 16)
    with pytest.raises(
        ValueError, match=r"16 bytes for shape \[2, 8\] of float4_e2m1fn \(expected 8\)"
    ):
        from_proto(short, "out")


def test_fp4_digest_and_ref_are_of_the_packed_bytes():
    a = fp4([(5 * i) % 16 for i in range(64)], (4, 16))
    packed = pack_by_hand([(5 * i) % 16 for i in range(64)])
    assert digest_of(as_array(a, "w")) == "sha256:" + hashlib.sha256(packed).hexdigest()
    ref = tensorcheck.TensorRef.of(as_array(a, "w"))
    assert (ref.dtype, ref.size_bytes, ref.shape) == ("float4_e2m1fn", 32, (4, 16))
    assert ref.to_proto().dtype == pb.DTYPE_FLOAT4_E2M1FN
    with pytest.raises(ValueError, match=r"TensorRef.size_bytes: 64 .* \(expected 32\)"):
        tensorcheck.TensorRef(ref.digest, 64, "float4_e2m1fn", (4, 16))


def test_a_stored_fp4_tensor_reads_back_unpacked():
    store = BlobStore(chunk=3)
    packed = pack_by_hand(ALL_CODES)
    digest = "sha256:" + hashlib.sha256(packed).hexdigest()
    store.blobs[digest] = packed
    ref = tensorcheck.TensorRef(digest, 8, "float4_e2m1fn", (4, 4))
    with serve_in_process(store) as target, tensorcheck.Client(target, timeout=30) as client:
        back = client.read_tensor(ref)
    assert back.shape == (4, 4) and back.view(np.uint8).ravel().tolist() == ALL_CODES


# --- float8_e8m0fnu -------------------------------------------------------------------


def decode_e8m0(bits: int) -> float:
    return math.nan if bits == 0xFF else 2.0 ** (bits - 127)


def test_all_256_e8m0_patterns_travel_unchanged_and_mean_their_powers_of_two():
    a = np.frombuffer(bytes(range(256)), np.uint8).view(ml_dtypes.float8_e8m0fnu)
    for bits, got in enumerate(a.astype(np.float64).tolist()):
        want = decode_e8m0(bits)
        assert (math.isnan(got) and math.isnan(want)) or got == want, hex(bits)
    t = to_proto(as_array(a.reshape(16, 16), "x_scale"))
    assert t.dtype == pb.DTYPE_FLOAT8_E8M0FNU == 8
    assert list(t.shape) == [16, 16] and t.data == bytes(range(256))


# --- names ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value, enum",
    [
        ("float4_e2m1fn", pb.DTYPE_FLOAT4_E2M1FN),
        ("e2m1", pb.DTYPE_FLOAT4_E2M1FN),
        ("torch.float4_e2m1fn_x2", pb.DTYPE_FLOAT4_E2M1FN),
        (ml_dtypes.float4_e2m1fn, pb.DTYPE_FLOAT4_E2M1FN),
        ("float8_e8m0fnu", pb.DTYPE_FLOAT8_E8M0FNU),
        ("E8M0", pb.DTYPE_FLOAT8_E8M0FNU),
        (np.dtype(ml_dtypes.float8_e8m0fnu), pb.DTYPE_FLOAT8_E8M0FNU),
    ],
)
def test_fp4_and_e8m0_names_parse(value, enum):
    assert parse_dtype(value, "output_dtype") == enum


@pytest.mark.parametrize(
    "name, scalar",
    [("float4_e2m1fn", ml_dtypes.float4_e2m1fn), ("float8_e8m0fnu", ml_dtypes.float8_e8m0fnu)],
)
def test_fp4_and_e8m0_names_and_numpy_dtypes_round_trip(name, scalar):
    enum = parse_dtype(name, "dtype")
    assert dtype_name(enum) == name
    assert numpy_dtype(name) == np.dtype(scalar)
    assert name in tensorcheck._tensors.DTYPES


# --- torch ----------------------------------------------------------------------------


def _torch(dtype: str):
    torch = pytest.importorskip("torch", reason="torch is not installed")
    if not hasattr(torch, dtype):
        pytest.skip(f"torch {torch.__version__} has no {dtype}")
    return torch


def test_torch_float4_x2_is_packed_already_its_last_dim_counting_pairs():
    torch = _torch("float4_e2m1fn_x2")
    packed = pack_by_hand([(3 * i + 1) % 16 for i in range(24)])  # 12 bytes
    t = torch.tensor(list(packed), dtype=torch.uint8).view(torch.float4_e2m1fn_x2).reshape(2, 6)
    a = as_array(t, "x")
    assert a.dtype == np.dtype(ml_dtypes.float4_e2m1fn) and a.shape == (2, 12)
    assert a.view(np.uint8).ravel().tolist() == [(3 * i + 1) % 16 for i in range(24)]
    wire = to_proto(a)
    assert list(wire.shape) == [2, 12] and wire.data == packed


def test_torch_float4_x2_views_are_sent_row_major():
    torch = _torch("float4_e2m1fn_x2")
    base = torch.arange(16, dtype=torch.uint8).view(torch.float4_e2m1fn_x2).reshape(4, 4)
    t = base.t()  # pairs transposed: row i holds the pairs 4 * j + i
    assert not t.is_contiguous()
    want = bytes(4 * j + i for i in range(4) for j in range(4))
    assert to_proto(as_array(t, "x")).data == want


def test_torch_e8m0_travels_as_its_bytes():
    torch = _torch("float8_e8m0fnu")
    t = torch.arange(256, dtype=torch.uint8).view(torch.float8_e8m0fnu).reshape(16, 16)
    wire = to_proto(as_array(t, "x_scale"))
    assert wire.dtype == pb.DTYPE_FLOAT8_E8M0FNU and wire.data == bytes(range(256))


# --- scales in the request ------------------------------------------------------------

M, K, N = 2, 32, 3


def _nvfp4_layer() -> tuple[np.ndarray, np.ndarray, list[int], list[int]]:
    xc = [(i * 5 + 1) % 16 for i in range(M * K)]
    wc = [(i * 3 + 2) % 16 for i in range(N * K)]
    return fp4(xc, (M, K)), fp4(wc, (N, K)), xc, wc


def _f32_bytes(values: list[float]) -> bytes:
    return struct.pack(f"<{len(values)}f", *values)


def _sent(client, x, w, **kwargs) -> pb.VerifyRequest:
    call = client._request(x, w, None, observed=None, configs=[], **kwargs)
    return pb.VerifyRequest.FromString(encode_request(call.request, call.tensors))


def test_an_nvfp4_request_carries_packed_operands_e4m3_block_scales_and_global_scales(
    offline_client,
):
    x, w, xc, wc = _nvfp4_layer()
    # UE4M3 block scales [M, K/16], [N, K/16]: their bytes as given.
    xs = np.frombuffer(bytes([0x38, 0x40, 0x30, 0x48]), np.uint8).view(ml_dtypes.float8_e4m3fn)
    ws = np.frombuffer(bytes(range(0x30, 0x36)), np.uint8).view(ml_dtypes.float8_e4m3fn)
    req = _sent(
        offline_client,
        x,
        w,
        x_scale=xs.reshape(M, K // 16),
        w_scale=ws.reshape(N, K // 16),
        x_global_scale=0.25,
        w_global_scale=[3.0],
    )
    assert req.op.input.dtype == req.op.weight.dtype == pb.DTYPE_FLOAT4_E2M1FN
    assert list(req.op.input.shape) == [M, K] and list(req.op.weight.shape) == [N, K]
    assert req.op.input.data == pack_by_hand(xc)
    assert req.op.weight.data == pack_by_hand(wc)
    s, t = req.op.input_scale, req.op.weight_scale
    assert (s.dtype, list(s.shape), s.data) == (pb.DTYPE_FLOAT8_E4M3FN, [M, 2], xs.tobytes())
    assert (t.dtype, list(t.shape), t.data) == (pb.DTYPE_FLOAT8_E4M3FN, [N, 2], ws.tobytes())
    g, h = req.op.input_global_scale, req.op.weight_global_scale
    assert (g.dtype, list(g.shape), g.data) == (pb.DTYPE_FLOAT32, [], _f32_bytes([0.25]))
    assert (h.dtype, list(h.shape), h.data) == (pb.DTYPE_FLOAT32, [1], _f32_bytes([3.0]))


def test_mxfp8_e8m0_block_scales_are_sent_as_their_bytes(offline_client):
    x = np.zeros((M, K), ml_dtypes.float8_e4m3fn)
    w = np.zeros((N, K), ml_dtypes.float8_e4m3fn)
    xs = np.frombuffer(bytes([127, 130]), np.uint8).view(ml_dtypes.float8_e8m0fnu).reshape(M, 1)
    ws = np.frombuffer(bytes([120, 127, 134]), np.uint8).view(ml_dtypes.float8_e8m0fnu)
    req = _sent(offline_client, x, w, x_scale=xs, w_scale=ws.reshape(N, 1))
    assert req.op.input_scale.dtype == req.op.weight_scale.dtype == pb.DTYPE_FLOAT8_E8M0FNU
    assert req.op.input_scale.data == bytes([127, 130])
    assert list(req.op.weight_scale.shape) == [N, 1]
    assert req.op.weight_scale.data == bytes([120, 127, 134])
    assert not req.op.HasField("input_global_scale")
    assert not req.op.HasField("weight_global_scale")


def test_torch_block_scales_are_sent_as_their_bytes(offline_client):
    torch = _torch("float8_e8m0fnu")
    x = np.zeros((M, K), ml_dtypes.float8_e4m3fn)
    xs = torch.tensor([[127], [128]], dtype=torch.uint8).view(torch.float8_e8m0fnu)
    ws = torch.tensor([[0x38], [0x40], [0x48]], dtype=torch.uint8).view(torch.float8_e4m3fn)
    req = _sent(
        offline_client, x, np.zeros((N, K), ml_dtypes.float8_e4m3fn), x_scale=xs, w_scale=ws
    )
    assert req.op.input_scale.dtype == pb.DTYPE_FLOAT8_E8M0FNU
    assert req.op.input_scale.data == bytes([127, 128])
    assert req.op.weight_scale.dtype == pb.DTYPE_FLOAT8_E4M3FN
    assert req.op.weight_scale.data == bytes([0x38, 0x40, 0x48])


def test_a_global_scale_travels_as_float32_whatever_its_dtype(offline_client):
    x, w, _, _ = _nvfp4_layer()
    e4m3 = np.array([2.0], ml_dtypes.float8_e4m3fn)  # a value, not a block scale
    req = _sent(offline_client, x, w, x_global_scale=e4m3, w_global_scale=np.float16(0.5))
    assert req.op.input_global_scale.dtype == pb.DTYPE_FLOAT32
    assert req.op.input_global_scale.data == _f32_bytes([2.0])
    assert req.op.weight_global_scale.data == _f32_bytes([0.5])


@pytest.mark.parametrize(
    "value, where, shown",
    [(math.nan, "", "NaN"), (0.0, "", "0"), ([-2.0], "[0]", "-2"), (math.inf, "", r"\+Inf")],
)
@pytest.mark.parametrize("arg", ["x_global_scale", "w_global_scale"])
def test_a_global_scale_not_finite_and_positive_is_a_value_error_naming_it(
    offline_client, arg, value, where, shown
):
    x, w, _, _ = _nvfp4_layer()
    message = rf"^{arg}{re.escape(where)}: a finite, positive float32 scale expected, got {shown}$"
    with pytest.raises(ValueError, match=message):
        offline_client.verify_linear(x, w, **{arg: value})
    with pytest.raises(ValueError, match=message):
        tensorcheck.VerifyOptions(**{arg: value})


@pytest.mark.parametrize("arg", ["x_global_scale", "w_global_scale"])
def test_a_global_scale_that_is_not_real_numbers_is_a_type_error_naming_it(offline_client, arg):
    x, w, _, _ = _nvfp4_layer()
    with pytest.raises(TypeError, match=rf"^{arg}: expected real numbers"):
        offline_client.verify_linear(x, w, **{arg: "1"})


# --- through every call, to a fake server ---------------------------------------------


@pytest.fixture
def recorder() -> Iterator[tuple[RecordingServicer, str]]:
    servicer = RecordingServicer(total=M * N, best="cpu:nvfp4:fused", candidate_tiers=[1, 2])
    with serve_in_process(servicer) as target:
        yield servicer, target


def test_every_call_sends_the_global_scales_and_diagnose_reports_the_tiers(recorder):
    servicer, target = recorder
    x, w, xc, _ = _nvfp4_layer()
    y = np.zeros((M, N), ml_dtypes.bfloat16)
    xs = np.full((M, K // 16), 1.0, ml_dtypes.float8_e4m3fn)
    ws = np.full((N, K // 16), 2.0, ml_dtypes.float8_e4m3fn)
    opts = tensorcheck.VerifyOptions(x_scale=xs, w_scale=ws, x_global_scale=0.5)
    with tensorcheck.Client(target, timeout=30) as client:
        client.verify_linear(x, w, observed=y, options=opts, w_global_scale=4.0)
        report = client.diagnose_linear(x, w, observed=y, options=opts, w_global_scale=4.0)
    assert report.diagnosis is not None and report.diagnosis.candidate_tiers == [1, 2]
    assert report.to_dict()["diagnosis"]["candidate_tiers"] == [1, 2]
    assert [m for m, _ in servicer.requests] == ["Verify", "Diagnose"]
    for method, req in servicer.requests:
        assert req.op.input.data == pack_by_hand(xc), method
        assert req.op.input_scale.data == bytes([0x38] * (M * 2)), method  # 1.0 in e4m3
        assert req.op.weight_scale.data == bytes([0x40] * (N * 2)), method  # 2.0 in e4m3
        assert req.op.input_global_scale.data == _f32_bytes([0.5]), method
        assert req.op.weight_global_scale.data == _f32_bytes([4.0]), method
