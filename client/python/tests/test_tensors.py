"""Array -> wire conversion, without a server."""

from __future__ import annotations

import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest

from tensorcheck._pb import pb
from tensorcheck._tensors import as_array, from_proto, to_proto


def _wire(value, name="x"):
    return to_proto(as_array(value, name))


@pytest.mark.parametrize(
    "dtype, enum",
    [
        (np.float64, pb.DTYPE_FLOAT64),
        (np.float32, pb.DTYPE_FLOAT32),
        (np.float16, pb.DTYPE_FLOAT16),
        (ml_dtypes.bfloat16, pb.DTYPE_BFLOAT16),
    ],
)
def test_numpy_dtypes_travel_as_little_endian_row_major_bytes(dtype, enum):
    a = (np.arange(12, dtype=np.float64).reshape(3, 4) - 5.5).astype(dtype)
    t = _wire(a)
    assert t.dtype == enum
    assert list(t.shape) == [3, 4]
    itemsize = np.dtype(dtype).itemsize
    assert len(t.data) == 12 * itemsize
    # Element (1, 2) is the 7th value, row-major.
    raw = t.data[6 * itemsize : 7 * itemsize]
    if dtype is ml_dtypes.bfloat16:
        # bf16 is the high half of the float32 pattern (exact here).
        want = np.array([0.5], "<f4").view("<u4")[0] >> 16
        assert int.from_bytes(raw, "little") == want
    else:
        assert np.frombuffer(raw, np.dtype(dtype).newbyteorder("<"))[0] == 0.5


def test_big_endian_input_is_sent_little_endian():
    a = np.array([1.0, -2.5, 3.25], dtype=">f4")
    t = _wire(a)
    assert t.data == np.array([1.0, -2.5, 3.25], dtype="<f4").tobytes()


def test_non_contiguous_input_is_sent_in_row_major_order():
    base = np.arange(6, dtype=np.float32).reshape(2, 3)
    t = _wire(base.T)  # shape (3, 2), Fortran-ordered view
    assert list(t.shape) == [3, 2]
    assert np.frombuffer(t.data, "<f4").tolist() == [0, 3, 1, 4, 2, 5]


def test_from_proto_round_trips_every_dtype():
    for dtype in (np.float64, np.float32, np.float16, ml_dtypes.bfloat16):
        a = np.linspace(-3, 3, 10).reshape(2, 5).astype(dtype)
        back = from_proto(_wire(a))
        assert back.dtype == np.dtype(dtype)
        assert back.flags.writeable
        assert back.tobytes() == a.tobytes()


def test_from_proto_rejects_wrong_byte_count():
    t = pb.Tensor(dtype=pb.DTYPE_FLOAT32, shape=[2, 2], data=b"\0" * 12)
    with pytest.raises(ValueError, match="12 bytes"):
        from_proto(t, "results[0].output")


def test_lists_are_accepted_as_float64():
    t = _wire([[1.0, 2.0], [3.0, 4.0]])
    assert t.dtype == pb.DTYPE_FLOAT64


@pytest.mark.parametrize(
    "value, what",
    [
        (np.arange(4, dtype=np.int32), "int32"),
        (np.arange(4, dtype=np.int64), "int64"),
        (np.array([1.0, None], dtype=object), "object"),
        (np.array([True, False]), "bool"),
        (np.array([1 + 2j]), "complex128"),
        # (FP8 with finite-only NaN-at-zero encodings: not a wire format.)
        (np.zeros(2, dtype=ml_dtypes.float8_e4m3fnuz), "float8_e4m3fnuz"),
        ([[1, 2], [3, 4]], "int64"),
    ],
)
def test_unsupported_dtypes_are_type_errors_naming_the_argument(value, what):
    with pytest.raises(TypeError, match=rf"^weight: dtype {what} is not supported"):
        as_array(value, "weight")


@pytest.mark.parametrize("value", ["abc", b"abc", {"a": 1}, object(), None])
def test_non_arrays_are_type_errors(value):
    with pytest.raises(TypeError, match="^bias: "):
        as_array(value, "bias")


def test_ragged_lists_are_type_errors():
    with pytest.raises(TypeError, match="^x: "):
        as_array([[1.0, 2.0], [3.0]], "x")


def test_importing_and_using_tensorcheck_loads_neither_torch_nor_jax():
    code = (
        "import sys, numpy as np, ml_dtypes, tensorcheck\n"
        "from tensorcheck._tensors import as_array, to_proto\n"
        "to_proto(as_array(np.ones((2, 2), ml_dtypes.bfloat16), 'x'))\n"
        "loaded = [m for m in ('torch', 'jax', 'jaxlib') if m in sys.modules]\n"
        "assert not loaded, loaded\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


# --- torch ----------------------------------------------------------------


def _torch():
    return pytest.importorskip("torch", reason="torch is not installed")


def test_torch_bfloat16_travels_as_its_bit_patterns():
    torch = _torch()
    t = torch.randn(5, 7).to(torch.bfloat16)
    wire = _wire(t)
    assert wire.dtype == pb.DTYPE_BFLOAT16
    # Independent path: upcast exactly to float32, keep the high 16 bits.
    want = (t.float().numpy().view(np.uint32) >> 16).astype("<u2").tobytes()
    assert wire.data == want


@pytest.mark.parametrize(
    "name, np_dtype", [("float64", "<f8"), ("float32", "<f4"), ("float16", "<f2")]
)
def test_torch_float_dtypes(name, np_dtype):
    torch = _torch()
    t = torch.linspace(-2, 2, 12, dtype=getattr(torch, name)).reshape(3, 4)
    wire = _wire(t)
    assert wire.data == np.array(t.tolist(), dtype=np_dtype).tobytes()


def test_torch_parameter_requiring_grad_and_non_contiguous_views():
    torch = _torch()
    lin = torch.nn.Linear(4, 3)
    wire = _wire(lin.weight.T)  # a Parameter view, transposed
    assert list(wire.shape) == [4, 3]
    assert wire.data == np.array(lin.weight.detach().T.tolist(), "<f4").tobytes()


def test_torch_negative_view_is_resolved():
    torch = _torch()
    t = torch.arange(4, dtype=torch.float32)
    neg = torch._neg_view(t) if hasattr(torch, "_neg_view") else -t
    assert np.frombuffer(_wire(neg).data, "<f4").tolist() == [-0.0, -1.0, -2.0, -3.0]


@pytest.mark.parametrize("dtype", ["int32", "int64", "bool", "complex64", "uint8"])
def test_torch_unsupported_dtypes_are_type_errors(dtype):
    torch = _torch()
    t = torch.zeros(3, dtype=getattr(torch, dtype))
    with pytest.raises(TypeError, match=rf"^x: dtype torch.{dtype} is not supported"):
        as_array(t, "x")


def test_torch_cuda_tensor_is_moved_to_host():
    torch = _torch()
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device for torch")
    t = torch.randn(4, 4, device="cuda", dtype=torch.bfloat16)
    assert _wire(t).data == _wire(t.cpu()).data


# --- jax ----------------------------------------------------------------------


def test_jax_arrays_including_bfloat16():
    jnp = pytest.importorskip("jax.numpy", reason="jax is not installed")
    a = np.linspace(-1, 1, 8, dtype=np.float32).reshape(2, 4)
    wire = _wire(jnp.asarray(a))
    assert wire.dtype == pb.DTYPE_FLOAT32 and wire.data == a.tobytes()
    wire = _wire(jnp.asarray(a, dtype=jnp.bfloat16))
    assert wire.dtype == pb.DTYPE_BFLOAT16
    assert wire.data == a.astype(ml_dtypes.bfloat16).tobytes()


def test_jax_integer_arrays_are_type_errors():
    jnp = pytest.importorskip("jax.numpy", reason="jax is not installed")
    with pytest.raises(TypeError, match="^x: dtype int32 is not supported"):
        as_array(jnp.arange(3, dtype=jnp.int32), "x")
