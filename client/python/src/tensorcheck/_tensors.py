"""Array conversion: numpy / torch / JAX in, `tensorcheck.v1.Tensor` out.

Every conversion is whole-buffer: torch tensors are detached, moved to the
CPU and made contiguous by torch itself; bfloat16 travels as its 16-bit
patterns (torch int16 view -> numpy uint16 -> ml_dtypes.bfloat16 view);
bytes are little-endian and row-major. torch and jax are never imported
here: an object is treated as a torch tensor or JAX array only when its type
comes from those modules, which are then already loaded.
"""

from __future__ import annotations

import sys
from typing import Any, Callable, Optional

import ml_dtypes
import numpy as np

from ._pb import pb

__all__ = [
    "as_array",
    "to_proto",
    "fill_proto",
    "from_proto",
    "dtype_name",
    "dtype_enum",
    "numpy_dtype",
    "DTYPES",
    "ReadTensor",
]

# numpy scalar type -> (wire enum, JSON name)
_NP_TO_PB: dict[type[np.generic], tuple[pb.DType, str]] = {
    np.float64: (pb.DTYPE_FLOAT64, "float64"),
    np.float32: (pb.DTYPE_FLOAT32, "float32"),
    np.float16: (pb.DTYPE_FLOAT16, "float16"),
    ml_dtypes.bfloat16: (pb.DTYPE_BFLOAT16, "bfloat16"),
}
_PB_TO_NP: dict[int, np.dtype[Any]] = {
    pb.DTYPE_FLOAT64: np.dtype("<f8"),
    pb.DTYPE_FLOAT32: np.dtype("<f4"),
    pb.DTYPE_FLOAT16: np.dtype("<f2"),
    pb.DTYPE_BFLOAT16: np.dtype(ml_dtypes.bfloat16),
}
_PB_NAMES: dict[int, str] = {enum: name for enum, name in _NP_TO_PB.values()}
DTYPES = ("float64", "float32", "float16", "bfloat16")
_BIG_ENDIAN_HOST = sys.byteorder == "big"
_SUPPORTED = "float64, float32, float16 or bfloat16"

# Names users write for an output dtype.
_DTYPE_ALIASES = {
    "float64": pb.DTYPE_FLOAT64,
    "f64": pb.DTYPE_FLOAT64,
    "fp64": pb.DTYPE_FLOAT64,
    "double": pb.DTYPE_FLOAT64,
    "float32": pb.DTYPE_FLOAT32,
    "f32": pb.DTYPE_FLOAT32,
    "fp32": pb.DTYPE_FLOAT32,
    "float": pb.DTYPE_FLOAT32,
    "float16": pb.DTYPE_FLOAT16,
    "f16": pb.DTYPE_FLOAT16,
    "fp16": pb.DTYPE_FLOAT16,
    "half": pb.DTYPE_FLOAT16,
    "bfloat16": pb.DTYPE_BFLOAT16,
    "bf16": pb.DTYPE_BFLOAT16,
}


def dtype_name(enum_value: int) -> Optional[str]:
    """JSON name of a wire dtype ("float32", ...); None when unspecified."""
    return _PB_NAMES.get(enum_value)


def dtype_enum(dtype: Any) -> pb.DType:
    """The wire dtype of a supported numpy dtype or JSON name ("bfloat16")."""
    if isinstance(dtype, str):
        return _DTYPE_ALIASES[dtype]
    return _NP_TO_PB[np.dtype(dtype).type][0]


def numpy_dtype(dtype: Any) -> np.dtype[Any]:
    """The little-endian numpy dtype of a wire dtype or JSON name."""
    enum = dtype_enum(dtype) if isinstance(dtype, str) else dtype
    return _PB_TO_NP[enum]


def parse_dtype(value: Any, name: str) -> pb.DType:
    """A wire dtype from "bf16"/"bfloat16"/np.float32/torch.float16/..."""
    if isinstance(value, str):
        key = value.lower()
        if key.startswith("torch."):
            key = key[len("torch.") :]
        if key in _DTYPE_ALIASES:
            return _DTYPE_ALIASES[key]
        raise ValueError(f"{name}: unknown dtype {value!r}; expected {_SUPPORTED}")
    if type(value).__module__ == "torch":  # torch.dtype
        return parse_dtype(str(value), name)
    try:
        dt = np.dtype(value)
    except TypeError:
        raise TypeError(
            f"{name}: expected a dtype name such as 'bfloat16', got {type(value).__name__}"
        ) from None
    if dt.type not in _NP_TO_PB:
        raise ValueError(f"{name}: dtype {dt} is not supported; expected {_SUPPORTED}")
    return _NP_TO_PB[dt.type][0]


def _module_of(value: Any) -> str:
    return type(value).__module__ or ""


def _is_from(module: str, *roots: str) -> bool:
    return any(module == r or module.startswith(r + ".") for r in roots)


def _from_torch(t: Any, name: str) -> np.ndarray:
    torch = sys.modules["torch"]  # loaded: the object came from it
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a tensor, got {type(t).__qualname__}")
    if t.layout != torch.strided:
        raise TypeError(
            f"{name}: {t.layout} tensors are not supported; pass a dense tensor (.to_dense())"
        )
    supported = (torch.float64, torch.float32, torch.float16, torch.bfloat16)
    if t.dtype not in supported:  # checked before any copy to the host
        raise TypeError(
            f"{name}: dtype {t.dtype} is not supported; expected "
            "torch.float64, torch.float32, torch.float16 or torch.bfloat16"
        )
    t = t.detach()
    if t.is_neg():
        t = t.resolve_neg()
    t = t.cpu().contiguous()
    # torch comes from sys.modules, so mypy sees its API as Any: the
    # annotations below state what Tensor.numpy() returns.
    if t.dtype == torch.bfloat16:
        # numpy has no bfloat16: move the bit patterns.
        bits: np.ndarray = t.view(torch.int16).numpy()
        return bits.view(ml_dtypes.bfloat16)
    arr: np.ndarray = t.numpy()
    return arr


def as_array(value: Any, name: str) -> np.ndarray:
    """A C-contiguous, little-endian numpy array of a supported dtype.

    Raises TypeError (naming `name`) for anything that is not a float64,
    float32, float16 or bfloat16 array-like.
    """
    if value is None:
        raise TypeError(f"{name}: expected an array, got None")
    module = _module_of(value)
    if isinstance(value, np.ndarray):
        arr = value
    elif _is_from(module, "torch"):
        arr = _from_torch(value, name)
    elif _is_from(module, "jax", "jaxlib"):
        arr = np.asarray(value)  # device -> host; keeps bfloat16 as ml_dtypes
    elif isinstance(value, (str, bytes, dict, set)) or not (
        isinstance(value, (list, tuple, np.generic))
        or hasattr(value, "__array__")
        or hasattr(value, "__array_interface__")
    ):
        raise TypeError(
            f"{name}: expected a numpy array, torch tensor or JAX array, "
            f"got {type(value).__qualname__}"
        )
    else:
        try:
            arr = np.asarray(value)
        except (ValueError, TypeError) as e:
            raise TypeError(f"{name}: cannot be converted to an array: {e}") from None
    dt = arr.dtype
    if dt.type not in _NP_TO_PB:
        what = "object" if dt.kind == "O" else str(dt)
        raise TypeError(f"{name}: dtype {what} is not supported; expected {_SUPPORTED}")
    if dt.byteorder == ">" or (dt.byteorder == "=" and _BIG_ENDIAN_HOST):
        # One copy, straight into little-endian C order.
        return arr.astype(dt.newbyteorder("<"), order="C")
    # (np.ascontiguousarray would turn a 0-d array into 1-d.) The caller's
    # array itself when it is already C-contiguous: no copy.
    return arr if arr.flags.c_contiguous else arr.copy(order="C")


def fill_proto(t: pb.Tensor, arr: np.ndarray) -> None:
    """Writes an array from `as_array` into `t`, a Tensor field of the
    request being built, inline: its bytes are taken once (`tobytes`) and
    set in place, with no intermediate message to copy from."""
    t.dtype = _NP_TO_PB[arr.dtype.type][0]
    t.shape.extend(arr.shape)
    t.data = arr.tobytes()


def to_proto(arr: np.ndarray) -> pb.Tensor:
    """The inline wire form of an array from `as_array`.

    Tensors that go by digest are `TensorRef.to_proto()` instead (the
    Client decides which, see `Client._prepare`, which fills the request's
    own fields with `fill_proto`).
    """
    t = pb.Tensor()
    fill_proto(t, arr)
    return t


# Reads a tensor the server returned by digest (the Client's ReadTensor).
ReadTensor = Callable[[pb.Tensor, str], np.ndarray]


def from_proto(t: pb.Tensor, name: str = "tensor", read: Optional[ReadTensor] = None) -> np.ndarray:
    """A writable numpy array from a wire tensor: inline data, or a digest
    that `read` fetches from the server's store."""
    if t.WhichOneof("source") == "digest":
        if read is None:
            raise ValueError(
                f"{name}: the server returned a tensor by digest; read it with "
                "Client.read_tensor(TensorRef.from_proto(...))"
            )
        return read(t, name)
    dt = _PB_TO_NP.get(t.dtype)
    if dt is None:
        raise ValueError(f"{name}: unknown dtype {t.dtype} in the response")
    shape: tuple[int, ...] = tuple(t.shape)
    count = int(np.prod(shape, dtype=np.int64)) if shape else 1
    if len(t.data) != count * dt.itemsize:
        raise ValueError(
            f"{name}: {len(t.data)} bytes for shape {list(shape)} of "
            f"{_PB_NAMES[t.dtype]} (expected {count * dt.itemsize})"
        )
    return np.frombuffer(t.data, dtype=dt).reshape(shape).copy()
