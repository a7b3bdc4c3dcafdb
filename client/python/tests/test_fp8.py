"""FP8 storage dtypes and dequantisation scales in the Python client,
without the server binary.

Expected values never come from the code under test (nor from ml_dtypes
alone): the 256 bit patterns of each format are decoded here by the
formula, (-1)^s * 2^(e - bias) * (1 + m / 2^M) with subnormals
2^(1 - bias) * (m / 2^M), and the NaN / infinity rules of each format
(e4m3fn: no infinities, only S.1111.111 is NaN, largest 448; e5m2:
IEEE-like, largest 57344); the bytes a float32 scale should travel as come
from `struct`. Requests are checked as the server would receive them: the
serialized bytes parsed back by protobuf, or what an in-process fake server
got.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import struct
from collections.abc import Iterator
from typing import NamedTuple

import ml_dtypes
import numpy as np
import pytest

import tensorcheck
from in_process_server import BlobStore, RecordingServicer, serve_in_process
from tensorcheck._model import write_safetensors
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


class Format(NamedTuple):
    name: str  # the JSON name
    scalar: type  # the ml_dtypes type
    enum: int  # the wire dtype
    exponent_bits: int
    mantissa_bits: int
    bias: int
    ieee: bool  # an all-ones exponent holds infinities and NaNs
    largest: float


E4M3FN = Format(
    "float8_e4m3fn", ml_dtypes.float8_e4m3fn, pb.DTYPE_FLOAT8_E4M3FN, 4, 3, 7, False, 448
)
E5M2 = Format("float8_e5m2", ml_dtypes.float8_e5m2, pb.DTYPE_FLOAT8_E5M2, 5, 2, 15, True, 57344)
FORMATS = [E4M3FN, E5M2]
IDS = [f.name for f in FORMATS]

ALL_PATTERNS = bytes(range(256))


def decode(fmt: Format, bits: int) -> float:
    """The value of an 8-bit pattern, by the formula."""
    sign = -1.0 if bits & 0x80 else 1.0
    e = (bits >> fmt.mantissa_bits) & ((1 << fmt.exponent_bits) - 1)
    m = bits & ((1 << fmt.mantissa_bits) - 1)
    top = (1 << fmt.exponent_bits) - 1
    if fmt.ieee and e == top:
        return sign * math.inf if m == 0 else math.nan
    if not fmt.ieee and e == top and m == (1 << fmt.mantissa_bits) - 1:
        return math.nan  # e4m3fn: S.1111.111 only; S.1111.000-110 are normal
    if e == 0:
        return sign * 2.0 ** (1 - fmt.bias) * (m / 2**fmt.mantissa_bits)
    return sign * 2.0 ** (e - fmt.bias) * (1 + m / 2**fmt.mantissa_bits)


def decoded(fmt: Format) -> list[float]:
    return [decode(fmt, b) for b in range(256)]


def patterns(fmt: Format, shape: tuple[int, ...] = (256,)) -> np.ndarray:
    """The 256 bit patterns, in order, as an array of the format."""
    return np.frombuffer(ALL_PATTERNS, dtype=np.uint8).view(fmt.scalar).reshape(shape)


def same_value(got: float, want: float) -> bool:
    """Equal, NaN to NaN, and zeros with their signs."""
    if math.isnan(want):
        return math.isnan(got)
    return got == want and math.copysign(1, got) == math.copysign(1, want)


# --- the formats themselves ----------------------------------------------------


@pytest.mark.parametrize("fmt", FORMATS, ids=IDS)
def test_the_formula_gives_each_formats_landmarks(fmt):
    values = decoded(fmt)
    finite = [v for v in values if math.isfinite(v)]
    assert max(finite) == fmt.largest and min(finite) == -fmt.largest
    nans = [b for b, v in enumerate(values) if math.isnan(v)]
    infs = [b for b, v in enumerate(values) if math.isinf(v)]
    if fmt is E4M3FN:
        assert nans == [0x7F, 0xFF] and infs == []
        assert values[0x7E] == 448 and values[0x01] == 2.0**-9  # smallest subnormal
    else:
        assert nans == [0x7D, 0x7E, 0x7F, 0xFD, 0xFE, 0xFF]
        assert (values[0x7C], values[0xFC]) == (math.inf, -math.inf)
        assert values[0x7B] == 57344 and values[0x01] == 2.0**-16
    assert same_value(values[0x80], -0.0) and same_value(values[0x00], 0.0)


@pytest.mark.parametrize("fmt", FORMATS, ids=IDS)
def test_ml_dtypes_agrees_with_the_formula_on_all_256_patterns(fmt):
    got = patterns(fmt).astype(np.float64).tolist()
    for bits, (g, want) in enumerate(zip(got, decoded(fmt))):
        assert same_value(g, want), f"0x{bits:02x}: ml_dtypes {g}, formula {want}"
    assert float(ml_dtypes.finfo(fmt.scalar).max) == fmt.largest


# --- all 256 patterns through the client --------------------------------------------


@pytest.mark.parametrize("fmt", FORMATS, ids=IDS)
def test_all_256_patterns_travel_unchanged(fmt):
    a = patterns(fmt, (16, 16))
    t = to_proto(as_array(a, "x"))
    assert t.dtype == fmt.enum
    assert list(t.shape) == [16, 16]
    assert t.data == ALL_PATTERNS == a.tobytes()


@pytest.mark.parametrize("fmt", FORMATS, ids=IDS)
def test_all_256_patterns_decode_to_the_same_bits_and_values(fmt):
    wire = pb.Tensor(dtype=fmt.enum, shape=[256], data=ALL_PATTERNS)
    back = from_proto(wire, "results[0].output")
    assert back.dtype == np.dtype(fmt.scalar)
    assert back.flags.writeable
    assert back.view(np.uint8).tolist() == list(range(256))  # NaN payloads included
    for bits, (g, want) in enumerate(zip(back.astype(np.float64).tolist(), decoded(fmt))):
        assert same_value(g, want), f"0x{bits:02x}"


@pytest.mark.parametrize("fmt", FORMATS, ids=IDS)
def test_non_contiguous_fp8_is_sent_in_row_major_order(fmt):
    t = to_proto(as_array(patterns(fmt, (16, 16)).T, "x"))
    # Element (i, j) of the transpose is pattern 16 * j + i.
    assert t.data == bytes(16 * j + i for i in range(16) for j in range(16))


@pytest.mark.parametrize("fmt", FORMATS, ids=IDS)
def test_a_request_carries_fp8_input_and_weight_bytes_as_given(offline_client, fmt):
    x = patterns(fmt, (4, 64))  # M=4, K=64: all 256 patterns
    w = patterns(fmt, (256,))[::-1].reshape(4, 64)  # [N, K], the patterns reversed
    call = offline_client._request(x, w, None, observed=None, configs=[], x_scale=1.0, w_scale=1.0)
    req = pb.VerifyRequest.FromString(encode_request(call.request, call.tensors))
    assert (req.op.input.dtype, req.op.weight.dtype) == (fmt.enum, fmt.enum)
    assert (list(req.op.input.shape), list(req.op.weight.shape)) == ([4, 64], [4, 64])
    assert req.op.input.data == ALL_PATTERNS
    assert req.op.weight.data == ALL_PATTERNS[::-1]


def test_mixed_fp8_formats_are_accepted_and_others_are_not(offline_client):
    x = patterns(E4M3FN, (4, 64))
    w = patterns(E5M2, (4, 64))
    call = offline_client._request(x, w, None, observed=None, configs=[], x_scale=1, w_scale=1)
    req = pb.VerifyRequest.FromString(encode_request(call.request, call.tensors))
    assert (req.op.input.dtype, req.op.weight.dtype) == (E4M3FN.enum, E5M2.enum)
    wb = np.ones((4, 64), ml_dtypes.bfloat16)
    with pytest.raises(TypeError, match="^weight: dtype bfloat16 differs from x's float8_e4m3fn"):
        offline_client.verify_linear(x, wb, x_scale=1.0, w_scale=1.0)
    with pytest.raises(TypeError, match="^weight: dtype float8_e5m2 differs from x's float32"):
        offline_client.verify_linear(np.ones((4, 64), np.float32), w)


@pytest.mark.parametrize("fmt", FORMATS, ids=IDS)
def test_fp8_tensor_refs_name_the_format(fmt):
    a = patterns(fmt, (16, 16))
    ref = tensorcheck.TensorRef.of(as_array(a, "w"))
    assert (ref.dtype, ref.size_bytes, ref.shape) == (fmt.name, 256, (16, 16))
    assert ref.to_proto().dtype == fmt.enum
    back = tensorcheck.TensorRef.from_proto(
        pb.Tensor(dtype=fmt.enum, shape=[16, 16], digest=ref.digest), "w"
    )
    assert back == ref
    with pytest.raises(ValueError, match=r"TensorRef.size_bytes: 512"):
        tensorcheck.TensorRef(ref.digest, 512, fmt.name, (16, 16))


def test_safetensors_names_the_fp8_formats(tmp_path):
    a = patterns(E4M3FN, (16, 16))
    b = patterns(E5M2, (2, 128))
    path = tmp_path / "fp8.safetensors"
    write_safetensors(path, {"a": a, "b": b})
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    assert header["a"] == {"dtype": "F8_E4M3", "shape": [16, 16], "data_offsets": [0, 256]}
    assert header["b"] == {"dtype": "F8_E5M2", "shape": [2, 128], "data_offsets": [256, 512]}
    assert raw[8 + n :] == ALL_PATTERNS + ALL_PATTERNS


# --- ReadTensor of a stored fp8 tensor -------------------------------------------------


@pytest.mark.parametrize("fmt", FORMATS, ids=IDS)
def test_a_stored_fp8_tensor_reads_back_as_ml_dtypes_bit_for_bit(fmt):
    store = BlobStore(chunk=100)
    digest = "sha256:" + hashlib.sha256(ALL_PATTERNS).hexdigest()
    store.blobs[digest] = ALL_PATTERNS
    ref = tensorcheck.TensorRef(digest, 256, fmt.name, (16, 16))
    with serve_in_process(store) as target, tensorcheck.Client(target, timeout=30) as client:
        back = client.read_tensor(ref)
    assert back.dtype == np.dtype(fmt.scalar) and back.shape == (16, 16)
    assert back.tobytes() == ALL_PATTERNS
    for bits, (g, want) in enumerate(zip(back.astype(np.float64).ravel().tolist(), decoded(fmt))):
        assert same_value(g, want), f"0x{bits:02x}"


# --- torch -----------------------------------------------------------------------


def _torch():
    torch = pytest.importorskip("torch", reason="torch is not installed")
    if not hasattr(torch, "float8_e4m3fn"):
        pytest.skip(f"torch {torch.__version__} has no float8 dtypes")
    return torch


def _torch_dtype(torch, fmt: Format):
    return getattr(torch, fmt.name)


@pytest.mark.parametrize("fmt", FORMATS, ids=IDS)
def test_torch_fp8_bit_patterns_travel_like_ml_dtypes(fmt):
    torch = _torch()
    t = torch.tensor(list(range(256)), dtype=torch.uint8).view(_torch_dtype(torch, fmt))
    wire = to_proto(as_array(t.reshape(16, 16), "x"))
    assert wire.dtype == fmt.enum and list(wire.shape) == [16, 16]
    assert wire.data == ALL_PATTERNS == to_proto(as_array(patterns(fmt), "x")).data


@pytest.mark.parametrize("fmt", FORMATS, ids=IDS)
def test_torch_fp8_values_travel_like_ml_dtypes_holding_them(fmt):
    torch = _torch()
    # Every non-NaN value of the format (infinities too for e5m2), by the
    # formula; converting an exactly representable value is exact.
    bits = [b for b, v in enumerate(decoded(fmt)) if not math.isnan(v)]
    values = [decode(fmt, b) for b in bits]
    t = torch.tensor(values, dtype=torch.float32).to(_torch_dtype(torch, fmt))
    a = np.array(values, dtype=np.float64).astype(fmt.scalar)
    wire_t = to_proto(as_array(t, "x")).data
    assert wire_t == to_proto(as_array(a, "x")).data == bytes(bits)


@pytest.mark.parametrize("fmt", FORMATS, ids=IDS)
def test_torch_fp8_views_are_sent_row_major(fmt):
    torch = _torch()
    base = torch.tensor(list(range(256)), dtype=torch.uint8).view(_torch_dtype(torch, fmt))
    t = base.reshape(16, 16).t()  # non-contiguous
    assert not t.is_contiguous()
    want = bytes(16 * j + i for i in range(16) for j in range(16))
    assert to_proto(as_array(t, "x")).data == want
    w = torch.nn.Parameter(base.reshape(16, 16).clone(), requires_grad=False)
    assert to_proto(as_array(w, "w")).data == ALL_PATTERNS


def test_torch_fp8_cuda_tensor_is_moved_to_host():
    torch = _torch()
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device for torch")
    t = torch.tensor(list(range(256)), dtype=torch.uint8, device="cuda").view(torch.float8_e5m2)
    assert to_proto(as_array(t, "x")).data == ALL_PATTERNS


@pytest.mark.parametrize("dtype", ["float8_e4m3fnuz", "float8_e5m2fnuz"])
def test_torch_fp8_formats_without_a_wire_dtype_are_type_errors(dtype):
    torch = _torch()
    if not hasattr(torch, dtype):
        pytest.skip(f"torch {torch.__version__} has no {dtype}")
    t = torch.zeros(3, dtype=getattr(torch, dtype))
    with pytest.raises(TypeError, match=rf"^x: dtype torch.{dtype} is not supported"):
        as_array(t, "x")


def test_torch_model_checks_map_fp8_dtypes():
    torch = _torch()
    tt = pytest.importorskip("tensorcheck.torch")
    assert tt._np_dtype(torch.float8_e4m3fn) == np.dtype(ml_dtypes.float8_e4m3fn)
    assert tt._np_dtype(torch.float8_e5m2) == np.dtype(ml_dtypes.float8_e5m2)
    assert tt._np_dtype(torch.bfloat16) == np.dtype(ml_dtypes.bfloat16)
    assert tt._np_dtype(torch.int8) is None


# --- jax ---------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", FORMATS, ids=IDS)
def test_jax_fp8_arrays_travel_like_ml_dtypes(fmt):
    jnp = pytest.importorskip("jax.numpy", reason="jax is not installed")
    j = jnp.asarray(patterns(fmt, (16, 16)))
    wire = to_proto(as_array(j, "x"))
    assert wire.dtype == fmt.enum
    assert wire.data == ALL_PATTERNS


# --- names ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value, fmt",
    [
        ("float8_e4m3fn", E4M3FN),
        ("fp8e4m3", E4M3FN),
        ("e4m3", E4M3FN),
        ("E4M3", E4M3FN),
        ("FP8E4M3", E4M3FN),
        ("torch.float8_e4m3fn", E4M3FN),
        (ml_dtypes.float8_e4m3fn, E4M3FN),
        (np.dtype(ml_dtypes.float8_e4m3fn), E4M3FN),
        ("float8_e5m2", E5M2),
        ("fp8e5m2", E5M2),
        ("e5m2", E5M2),
        ("Float8_E5M2", E5M2),
        ("torch.float8_e5m2", E5M2),
        (ml_dtypes.float8_e5m2, E5M2),
        (np.dtype(ml_dtypes.float8_e5m2), E5M2),
    ],
)
def test_fp8_dtype_names_parse(value, fmt):
    assert parse_dtype(value, "output_dtype") == fmt.enum


@pytest.mark.parametrize("fmt", FORMATS, ids=IDS)
def test_torch_fp8_dtype_objects_parse(fmt):
    torch = _torch()
    assert parse_dtype(_torch_dtype(torch, fmt), "output_dtype") == fmt.enum


@pytest.mark.parametrize("fmt", FORMATS, ids=IDS)
def test_fp8_names_and_numpy_dtypes_round_trip(fmt):
    assert dtype_name(fmt.enum) == fmt.name
    assert numpy_dtype(fmt.name) == np.dtype(fmt.scalar)
    assert numpy_dtype(fmt.enum) == np.dtype(fmt.scalar)
    assert fmt.name in tensorcheck._tensors.DTYPES


@pytest.mark.parametrize(
    "value", ["fp8", "float8", "e4m3fnuz", "f8e4m3", ml_dtypes.float8_e4m3fnuz]
)
def test_other_fp8_names_are_refused_listing_the_supported_ones(value):
    with pytest.raises(
        ValueError,
        match=r"^output_dtype: .*float8_e4m3fn, float8_e5m2, float4_e2m1fn or float8_e8m0fnu",
    ):
        parse_dtype(value, "output_dtype")


def test_an_fp8_output_dtype_is_sent_for_the_server_to_judge(offline_client):
    x = np.ones((2, 8), np.float32)
    call = offline_client._request(x, x, None, observed=None, configs=[], output_dtype="e5m2")
    assert call.request.op.output_dtype == pb.DTYPE_FLOAT8_E5M2


# --- scales ---------------------------------------------------------------------------

M, K, N = 3, 32, 5


def _fp8_layer(layout: str = "out_in"):
    x = patterns(E4M3FN)[: M * K].reshape(M, K)  # 96 patterns, NaNs not among them
    w = patterns(E4M3FN)[M * K : M * K + N * K].reshape(N, K)
    return x, (w if layout == "out_in" else np.ascontiguousarray(w.T))


def _f32_bytes(values: list[float]) -> bytes:
    return struct.pack(f"<{len(values)}f", *values)


def _sent(client, x_scale, w_scale, layout="out_in") -> pb.VerifyRequest:
    x, w = _fp8_layer(layout)
    call = client._request(
        x,
        w,
        None,
        observed=None,
        configs=[],
        weight_layout=layout,
        x_scale=x_scale,
        w_scale=w_scale,
    )
    return pb.VerifyRequest.FromString(encode_request(call.request, call.tensors))


# (value, shape sent, float32 values sent: struct rounds them independently)
SCALES = [
    (0.5, [], [0.5]),
    (0.1, [], [0.1]),  # rounded to float32 once
    (3, [], [3.0]),  # an int is a real number
    (np.float32(0.25), [], [0.25]),
    (np.float64(1e-3), [], [1e-3]),
    (ml_dtypes.bfloat16(0.75), [], [0.75]),
    ([2.0], [1], [2.0]),
    (np.array([0.5], np.float16), [1], [0.5]),
    (np.arange(1, M + 1, dtype=np.float64) / 7, [M], [i / 7 for i in range(1, M + 1)]),
    (np.full((M, 1), 2.0**-10, np.float32), [M, 1], [2.0**-10] * M),
    ([[1.5]] * M, [M, 1], [1.5] * M),
    (float(np.finfo(np.float32).max), [], [float(np.finfo(np.float32).max)]),
]


@pytest.mark.parametrize("value, shape, values", SCALES)
def test_x_scale_is_sent_as_float32_in_the_shape_given(offline_client, value, shape, values):
    req = _sent(offline_client, value, 1.0)
    s = req.op.input_scale
    assert s.dtype == pb.DTYPE_FLOAT32
    assert list(s.shape) == shape
    assert s.data == _f32_bytes(values)


@pytest.mark.parametrize(
    "layout, value, shape",
    [
        ("out_in", np.linspace(0.5, 2.5, N), [N]),
        ("out_in", np.linspace(0.5, 2.5, N).reshape(N, 1), [N, 1]),
        ("in_out", np.linspace(0.5, 2.5, N).reshape(1, N), [1, N]),
        ("in_out", 0.125, []),
        ("out_in", [0.125], [1]),
    ],
)
def test_w_scale_is_sent_as_float32_in_the_shape_given(offline_client, layout, value, shape):
    req = _sent(offline_client, 1.0, value, layout)
    s = req.op.weight_scale
    assert s.dtype == pb.DTYPE_FLOAT32
    assert list(s.shape) == shape
    assert s.data == _f32_bytes(np.asarray(value, np.float64).ravel().tolist())
    assert req.op.input_scale.data == _f32_bytes([1.0])


def test_scales_of_other_shapes_are_sent_for_the_server_to_judge(offline_client):
    req = _sent(offline_client, np.ones((2, 2, 2)), np.ones(N + 1))
    assert list(req.op.input_scale.shape) == [2, 2, 2]
    assert list(req.op.weight_scale.shape) == [N + 1]


def test_no_scales_means_none_sent(offline_client):
    x, w = _fp8_layer()
    call = offline_client._request(x, w, None, observed=None, configs=[])
    req = pb.VerifyRequest.FromString(encode_request(call.request, call.tensors))
    assert not req.op.HasField("input_scale") and not req.op.HasField("weight_scale")


def test_scales_leave_the_callers_arrays_alone(offline_client):
    xs = np.array([[0.5], [0.25], [2.0]], dtype=">f8")[::-1]  # big-endian view
    before = xs.copy()
    req = _sent(offline_client, xs, 1.0)
    assert req.op.input_scale.data == _f32_bytes([2.0, 0.25, 0.5])
    assert xs.dtype == np.dtype(">f8") and np.array_equal(xs, before)


def test_torch_scales_from_any_dtype_are_sent_as_float32(offline_client):
    torch = _torch()
    xs = torch.tensor([[0.5], [0.25], [0.125]], dtype=torch.float32, requires_grad=True)
    ws = torch.tensor([1.0, 2.0, 4.0, 8.0, 16.0], dtype=torch.bfloat16)
    req = _sent(offline_client, xs, ws)
    assert list(req.op.input_scale.shape) == [M, 1]
    assert req.op.input_scale.data == _f32_bytes([0.5, 0.25, 0.125])
    assert list(req.op.weight_scale.shape) == [N]
    assert req.op.weight_scale.data == _f32_bytes([1.0, 2.0, 4.0, 8.0, 16.0])
    req = _sent(offline_client, torch.tensor(0.5), torch.tensor([3], dtype=torch.int32))
    assert list(req.op.input_scale.shape) == [] and req.op.input_scale.data == _f32_bytes([0.5])
    assert req.op.weight_scale.data == _f32_bytes([3.0])


def test_jax_scales_are_sent_as_float32(offline_client):
    jnp = pytest.importorskip("jax.numpy", reason="jax is not installed")
    req = _sent(offline_client, jnp.asarray([[0.5]] * M), jnp.asarray(0.25))
    assert list(req.op.input_scale.shape) == [M, 1]
    assert req.op.input_scale.data == _f32_bytes([0.5] * M)
    assert list(req.op.weight_scale.shape) == [] and req.op.weight_scale.data == _f32_bytes([0.25])


@pytest.mark.parametrize(
    "value, what",
    [
        ("0.5", "str"),
        (b"\x00", "bytes"),
        (1j, "complex"),
        (np.complex64(1), "complex64"),
        ([1.0, 2j], "complex values"),
        (np.array([1 + 0j]), "complex values"),
        (True, "bool"),
        (np.array([True, False]), "boolean values"),
        (["a", "b"], "string values"),
        ([1.0, None], "Python object values"),
        ({"scale": 1.0}, "dict"),
        (object(), "Python object values"),
    ],
)
@pytest.mark.parametrize("arg", ["x_scale", "w_scale"])
def test_a_scale_that_is_not_real_numbers_is_a_type_error_naming_it(
    offline_client, arg, value, what
):
    x, w = _fp8_layer()
    with pytest.raises(TypeError, match=rf"^{arg}: expected real numbers.*{what}"):
        offline_client.verify_linear(x, w, **{arg: value})


@pytest.mark.parametrize(
    "value, message",
    [
        (1e39, r": 1e\+39 is beyond float32's range"),
        ([-4e38], r": -4e\+38 is beyond float32's range"),
    ],
)
@pytest.mark.parametrize("arg", ["x_scale", "w_scale"])
def test_a_scale_beyond_float32_is_a_value_error_naming_it(offline_client, arg, value, message):
    x, w = _fp8_layer()
    with pytest.raises(ValueError, match=rf"^{arg}{message}"):
        offline_client.diagnose_linear(x, w, observed=np.zeros((M, N), np.float32), **{arg: value})


# The server's rule and words (docs/numerics.md, "FP8"): every element
# finite and positive in float32, the element named by its index.
@pytest.mark.parametrize(
    "value, where, shown",
    [
        (math.nan, "", "NaN"),
        (math.inf, "", r"\+Inf"),
        ([1.0, -math.inf], "[1]", "-Inf"),
        (np.array([np.nan], np.float32), "[0]", "NaN"),
        (0.0, "", "0"),
        (-0.0, "", "-0"),
        (-1, "", "-1"),
        ([0.5, 0.25, -0.5], "[2]", "-0.5"),
        ([[1.0], [2.0], [0.0]], "[2]", "0"),
        (1e-60, "", r"0 \(0 in float32\)"),  # below float32's 2^-149
    ],
)
@pytest.mark.parametrize("arg", ["x_scale", "w_scale"])
def test_a_scale_not_finite_and_positive_is_a_value_error_in_the_servers_words(
    offline_client, arg, value, where, shown
):
    x, w = _fp8_layer()
    message = rf"^{arg}{re.escape(where)}: a finite, positive float32 scale expected, got {shown}$"
    with pytest.raises(ValueError, match=message):
        offline_client.diagnose_linear(x, w, observed=np.zeros((M, N), np.float32), **{arg: value})


def test_torch_complex_and_bool_scales_are_type_errors(offline_client):
    torch = _torch()
    x, w = _fp8_layer()
    with pytest.raises(TypeError, match=r"^w_scale: expected real numbers, got complex"):
        offline_client.verify_linear(
            x, w, x_scale=1.0, w_scale=torch.ones(N, dtype=torch.complex64)
        )
    with pytest.raises(TypeError, match=r"^x_scale: expected real numbers, got boolean"):
        offline_client.verify_linear(x, w, x_scale=torch.ones(1, dtype=torch.bool), w_scale=1.0)


# --- scales through every call that builds a LinearOp -----------------------------------


@pytest.fixture
def recorder() -> Iterator[tuple[RecordingServicer, str]]:
    servicer = RecordingServicer(total=M * N, best="cpu:fp8:fused")
    with serve_in_process(servicer) as target:
        yield servicer, target


def _scales_of(req: pb.VerifyRequest) -> tuple[tuple[list[int], bytes], tuple[list[int], bytes]]:
    s, w = req.op.input_scale, req.op.weight_scale
    assert s.dtype == w.dtype == pb.DTYPE_FLOAT32
    return (list(s.shape), s.data), (list(w.shape), w.data)


def test_every_call_sends_the_scales(recorder):
    servicer, target = recorder
    x, w = _fp8_layer()
    y = np.zeros((M, N), ml_dtypes.bfloat16)
    xs, ws = np.full((M, 1), 0.5), np.linspace(1, 2, N)
    want = (([M, 1], _f32_bytes([0.5] * M)), ([N], _f32_bytes(np.linspace(1, 2, N).tolist())))
    with tensorcheck.Client(target, timeout=30) as client:
        client.verify_linear(x, w, observed=y, x_scale=xs, w_scale=ws)
        client.diagnose_linear(x, w, observed=y, x_scale=xs, w_scale=ws)
        client.assert_linear_parity(x, w, observed=y, x_scale=xs, w_scale=ws)
        servicer.fail = True
        with pytest.raises(AssertionError, match="Tensor-likes are not close"):
            client.assert_linear_parity(x, w, observed=y, x_scale=xs, w_scale=ws)
    with pytest.raises(AssertionError, match="Tensor-likes are not close"):
        tensorcheck.assert_linear_parity(
            x, w, observed=y, server=target, timeout=30, x_scale=xs, w_scale=ws
        )
    methods = [m for m, _ in servicer.requests]
    assert methods == ["Verify", "Diagnose", "Verify", "Verify", "Diagnose", "Verify", "Diagnose"]
    for method, req in servicer.requests:
        assert _scales_of(req) == want, method
        assert req.op.input.data == x.tobytes() and req.op.input.dtype == E4M3FN.enum


def test_digest_of_fp8_is_that_of_its_bytes():
    a = patterns(E5M2, (16, 16))
    assert digest_of(as_array(a, "w")) == "sha256:" + hashlib.sha256(ALL_PATTERNS).hexdigest()
