"""Array conversion: numpy / torch / JAX in, `tensorcheck.v1.Tensor` out.

Every conversion is whole-buffer: torch tensors are detached, moved to the
CPU and made contiguous by torch itself; bfloat16 travels as its 16-bit
patterns (torch int16 view -> numpy uint16 -> ml_dtypes.bfloat16 view), the
FP8 formats as their bytes (torch uint8 view -> numpy uint8 ->
ml_dtypes.float8_e4m3fn / float8_e5m2 / float8_e8m0fnu view), so that NaN
payloads and negative zeros arrive as they were; bytes are little-endian
and row-major.

FP4 (float4_e2m1fn) is held here as ml_dtypes holds it, one element per
byte in the tensor's own (logical) shape, and packed two per byte on the
wire (`wire_bytes`): element 2i in the low nibble, 2i+1 in the high one,
ceil(numel / 2) bytes (the wire format of docs/api.md and cuBLASLt's
CUDA_R_4F_E2M1). A torch.float4_e2m1fn_x2 tensor is packed already: each
of its elements is a pair, so its last dimension counts pairs and the
tensor it holds has that dimension doubled; it is unpacked on the way in.
torch and jax are never imported here: an object is treated as a torch
tensor or JAX array only when its type comes from those modules, which are
then already loaded.

The storage dtypes, by JSON name (the names the server and the other
clients use): float64, float32, float16, bfloat16, float8_e4m3fn,
float8_e5m2, float4_e2m1fn, float8_e8m0fnu. The FP8 and FP4 formats are
for a layer's input and weight, float8_e8m0fnu (and float8_e4m3fn) for
block scales (`as_scale`); which goes where is the server's rule: it
answers INVALID_ARGUMENT, naming the field, for an FP8 bias, observed
output or output_dtype, an e8m0 input, ...
"""

from __future__ import annotations

import math
import numbers
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
    "parse_dtype",
    "as_scale",
    "wire_bytes",
    "wire_nbytes",
    "wire_size",
    "from_wire",
    "pack_fp4",
    "unpack_fp4",
    "DTYPES",
    "FP8_DTYPES",
    "ReadTensor",
]

# numpy scalar type -> (wire enum, JSON name)
_NP_TO_PB: dict[type[np.generic], tuple[pb.DType, str]] = {
    np.float64: (pb.DTYPE_FLOAT64, "float64"),
    np.float32: (pb.DTYPE_FLOAT32, "float32"),
    np.float16: (pb.DTYPE_FLOAT16, "float16"),
    ml_dtypes.bfloat16: (pb.DTYPE_BFLOAT16, "bfloat16"),
    ml_dtypes.float8_e4m3fn: (pb.DTYPE_FLOAT8_E4M3FN, "float8_e4m3fn"),
    ml_dtypes.float8_e5m2: (pb.DTYPE_FLOAT8_E5M2, "float8_e5m2"),
    ml_dtypes.float4_e2m1fn: (pb.DTYPE_FLOAT4_E2M1FN, "float4_e2m1fn"),
    ml_dtypes.float8_e8m0fnu: (pb.DTYPE_FLOAT8_E8M0FNU, "float8_e8m0fnu"),
}
_PB_TO_NP: dict[int, np.dtype[Any]] = {
    pb.DTYPE_FLOAT64: np.dtype("<f8"),
    pb.DTYPE_FLOAT32: np.dtype("<f4"),
    pb.DTYPE_FLOAT16: np.dtype("<f2"),
    pb.DTYPE_BFLOAT16: np.dtype(ml_dtypes.bfloat16),
    pb.DTYPE_FLOAT8_E4M3FN: np.dtype(ml_dtypes.float8_e4m3fn),
    pb.DTYPE_FLOAT8_E5M2: np.dtype(ml_dtypes.float8_e5m2),
    pb.DTYPE_FLOAT4_E2M1FN: np.dtype(ml_dtypes.float4_e2m1fn),
    pb.DTYPE_FLOAT8_E8M0FNU: np.dtype(ml_dtypes.float8_e8m0fnu),
}
_PB_NAMES: dict[int, str] = {enum: name for enum, name in _NP_TO_PB.values()}
DTYPES = (
    "float64",
    "float32",
    "float16",
    "bfloat16",
    "float8_e4m3fn",
    "float8_e5m2",
    "float4_e2m1fn",
    "float8_e8m0fnu",
)
# The one-byte formats: a weight may be in the other one than the input
# (the mixed fp8 precisions, fp8e4m3e5m2 and fp8e5m2e4m3).
FP8_DTYPES = ("float8_e4m3fn", "float8_e5m2")
_BIG_ENDIAN_HOST = sys.byteorder == "big"
_SUPPORTED = (
    "float64, float32, float16, bfloat16, float8_e4m3fn, float8_e5m2, float4_e2m1fn "
    "or float8_e8m0fnu"
)
_FP4 = np.dtype(ml_dtypes.float4_e2m1fn)
# Block scales that travel in their own dtype (`as_scale`): MXFP8's
# float8_e8m0fnu and NVFP4's float8_e4m3fn.
_BLOCK_SCALE_TYPES: tuple[type[np.generic], ...] = (
    ml_dtypes.float8_e8m0fnu,
    ml_dtypes.float8_e4m3fn,
)

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
    "float8_e4m3fn": pb.DTYPE_FLOAT8_E4M3FN,
    "fp8e4m3": pb.DTYPE_FLOAT8_E4M3FN,
    "e4m3": pb.DTYPE_FLOAT8_E4M3FN,
    "float8_e5m2": pb.DTYPE_FLOAT8_E5M2,
    "fp8e5m2": pb.DTYPE_FLOAT8_E5M2,
    "e5m2": pb.DTYPE_FLOAT8_E5M2,
    "float4_e2m1fn": pb.DTYPE_FLOAT4_E2M1FN,
    # torch's name: its elements are pairs, its values this format's.
    "float4_e2m1fn_x2": pb.DTYPE_FLOAT4_E2M1FN,
    "fp4e2m1": pb.DTYPE_FLOAT4_E2M1FN,
    "e2m1": pb.DTYPE_FLOAT4_E2M1FN,
    "float8_e8m0fnu": pb.DTYPE_FLOAT8_E8M0FNU,
    "e8m0": pb.DTYPE_FLOAT8_E8M0FNU,
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
    """A wire dtype from "bf16"/"bfloat16"/"e4m3"/np.float32/torch.float16/
    ml_dtypes.float8_e5m2/... (names in any case, "torch." prefix allowed)."""
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


def _torch_fp8(torch: Any) -> dict[Any, type[np.generic]]:
    """torch's one-byte float dtypes -> their ml_dtypes types (none before
    torch 2.1; float8_e8m0fnu from torch 2.7)."""
    pairs = (
        ("float8_e4m3fn", ml_dtypes.float8_e4m3fn),
        ("float8_e5m2", ml_dtypes.float8_e5m2),
        ("float8_e8m0fnu", ml_dtypes.float8_e8m0fnu),
    )
    return {getattr(torch, n): t for n, t in pairs if hasattr(torch, n)}


def _from_torch(t: Any, name: str) -> np.ndarray:
    torch = sys.modules["torch"]  # loaded: the object came from it
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a tensor, got {type(t).__qualname__}")
    if t.layout != torch.strided:
        raise TypeError(
            f"{name}: {t.layout} tensors are not supported; pass a dense tensor (.to_dense())"
        )
    fp8 = _torch_fp8(torch)
    fp4 = getattr(torch, "float4_e2m1fn_x2", None)  # torch 2.8 on
    supported = (torch.float64, torch.float32, torch.float16, torch.bfloat16, *fp8)
    if t.dtype not in supported and (fp4 is None or t.dtype != fp4):
        # Checked before any copy to the host.
        raise TypeError(
            f"{name}: dtype {t.dtype} is not supported; expected "
            "torch.float64, torch.float32, torch.float16, torch.bfloat16, "
            "torch.float8_e4m3fn, torch.float8_e5m2, torch.float4_e2m1fn_x2 "
            "or torch.float8_e8m0fnu"
        )
    t = t.detach()
    if t.is_neg():
        t = t.resolve_neg()
    # torch comes from sys.modules, so mypy sees its API as Any: the
    # annotations below state what Tensor.numpy() returns.
    if t.dtype in fp8:
        # numpy has no FP8: move the bytes. A same-size view works on any
        # device and any strides, so the copies (to the host, into row-major
        # order) are of uint8, which every torch build can copy.
        raw: np.ndarray = t.view(torch.uint8).cpu().contiguous().numpy()
        return raw.view(fp8[t.dtype])
    if fp4 is not None and t.dtype == fp4:
        # Each element a pair, packed (element 2i in the low nibble): the
        # tensor they hold has the last dimension doubled.
        packed: np.ndarray = t.view(torch.uint8).cpu().contiguous().numpy()
        pairs = packed.shape or (1,)
        return unpack_fp4(packed, (*pairs[:-1], 2 * pairs[-1]))
    t = t.cpu().contiguous()
    if t.dtype == torch.bfloat16:
        # numpy has no bfloat16: move the bit patterns.
        bits: np.ndarray = t.view(torch.int16).numpy()
        return bits.view(ml_dtypes.bfloat16)
    arr: np.ndarray = t.numpy()
    return arr


def as_array(value: Any, name: str) -> np.ndarray:
    """A C-contiguous, little-endian numpy array of a supported dtype.

    Raises TypeError (naming `name`) for anything that is not a float64,
    float32, float16, bfloat16, float8_e4m3fn, float8_e5m2, float4_e2m1fn
    or float8_e8m0fnu array-like. A float4_e2m1fn array is one element per
    byte (ml_dtypes' layout, a torch.float4_e2m1fn_x2 tensor unpacked);
    `wire_bytes` packs it.
    """
    if value is None:
        raise TypeError(f"{name}: expected an array, got None")
    module = _module_of(value)
    if isinstance(value, np.ndarray):
        arr = value
    elif _is_from(module, "torch"):
        arr = _from_torch(value, name)
    elif _is_from(module, "jax", "jaxlib"):
        arr = np.asarray(value)  # device -> host; bfloat16, FP8 as ml_dtypes
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


_FLOAT32_MAX = float(np.finfo(np.float32).max)


def as_scale(value: Any, name: str, *, block_scales: bool = True) -> np.ndarray:
    """A dequantisation scale (`x_scale`, `w_scale`, `x_global_scale`,
    `w_global_scale`) as the array the request carries, in the shape it
    was given: float32, or, with `block_scales`, a float8_e8m0fnu or
    float8_e4m3fn array (numpy, torch, JAX) in its own dtype, its bytes as
    they are (MXFP8's and NVFP4's block scales: docs/numerics.md, "MXFP8
    and NVFP4"; the server judges their dtype, shape and values).

    `value` is a real number (Python or numpy; shape []) or an array-like
    of them: numpy (any real dtype, bfloat16 and FP8 included), a torch
    tensor on any device, a JAX array, a (nested) list. Shapes are not
    checked here: which ones fit the layer ([] or [1] per tensor, [M] /
    [M, 1] and [N] / [N, 1] / [1, N] row-wise, the block-wise shapes, a
    swizzled 1-D block scale) is the server's rule.

    Raises TypeError naming `name` for what is not real numbers (None, a
    string, a complex or boolean value, Python objects) and ValueError for
    magnitudes beyond float32's largest (3.4028235e38) and for an element
    that is not finite and positive in float32 (NaN, infinities, zero,
    negative, or so small it rounds to 0), worded as the server words its
    own refusal (docs/numerics.md, "FP8"): "w_scale[17]: a finite,
    positive float32 scale expected, got NaN".
    """
    if (
        value is None
        or isinstance(value, (bool, np.bool_, str, bytes, bytearray, dict, set))
        or (isinstance(value, numbers.Number) and not isinstance(value, numbers.Real))
    ):
        raise TypeError(
            f"{name}: expected real numbers (a number or an array of them), "
            f"got {type(value).__name__}"
        )
    if _is_from(_module_of(value), "torch"):
        if block_scales and _is_torch_block_scale(value):
            return as_array(value, name)
        arr = _torch_scale(value, name)
    else:
        try:
            arr = np.asarray(value)
        except (ValueError, TypeError) as e:
            raise TypeError(f"{name}: cannot be converted to an array: {e}") from None
    dt = arr.dtype
    if block_scales and dt.type in _BLOCK_SCALE_TYPES:
        return as_array(arr, name)
    if not (dt.kind in "fiu" or dt.type in _NP_TO_PB):
        what = {"c": "complex", "b": "boolean", "O": "Python object", "U": "string"}
        raise TypeError(
            f"{name}: expected real numbers, got {what.get(dt.kind, 'dtype ' + str(dt))} values"
        )
    # Through float64, which holds every value of these dtypes but the
    # largest 64-bit integers exactly: one rounding, to float32.
    wide = arr.astype(np.float64)
    big = np.isfinite(wide) & (np.abs(wide) > _FLOAT32_MAX)
    if big.any():  # refused, not rounded: float32 would make most infinite
        raise ValueError(
            f"{name}: {wide[big].flat[0]} is beyond float32's range "
            f"(largest finite {_FLOAT32_MAX:.8g})"
        )
    f32 = wide.astype("<f4", order="C")
    # The rule is the server's (it refuses such a scale with
    # INVALID_ARGUMENT in these words); checked here because the values
    # are converted here, so that the argument is named as the caller
    # wrote it.
    bad = np.flatnonzero(~(np.isfinite(f32) & (f32 > 0)))
    if bad.size:
        i = int(bad[0])
        v = float(f32.flat[i])
        if math.isnan(v):
            shown = "NaN"
        elif math.isinf(v):
            shown = "+Inf" if v > 0 else "-Inf"
        else:
            shown = f"{v:g}"
        where = name if f32.ndim == 0 else f"{name}[{i}]"
        underflow = " (0 in float32)" if v == 0 and wide.flat[i] > 0 else ""
        raise ValueError(
            f"{where}: a finite, positive float32 scale expected, got {shown}{underflow}"
        )
    return f32


def _is_torch_block_scale(t: Any) -> bool:
    """A torch tensor in a block scale's dtype (float8_e8m0fnu,
    float8_e4m3fn)."""
    torch = sys.modules["torch"]  # loaded: the object came from it
    return isinstance(t, torch.Tensor) and _torch_fp8(torch).get(t.dtype) in _BLOCK_SCALE_TYPES


def _torch_scale(t: Any, name: str) -> np.ndarray:
    """A torch tensor of real numbers, on the host as float64."""
    torch = sys.modules["torch"]  # loaded: the object came from it
    if not isinstance(t, torch.Tensor):
        raise TypeError(
            f"{name}: expected real numbers (a number or an array of them), "
            f"got {type(t).__qualname__}"
        )
    if t.is_complex() or t.dtype == torch.bool:
        kind = "complex" if t.is_complex() else "boolean"
        raise TypeError(f"{name}: expected real numbers, got {kind} values ({t.dtype})")
    if t.layout != torch.strided:
        raise TypeError(
            f"{name}: {t.layout} tensors are not supported; pass a dense tensor (.to_dense())"
        )
    t = t.detach()
    if t.is_neg():
        t = t.resolve_neg()
    # To the host first (not every device has float64), then widened:
    # exact for every real dtype torch has, FP8 included.
    wide: np.ndarray = t.cpu().to(dtype=torch.float64).contiguous().numpy()
    return wide


def pack_fp4(arr: np.ndarray) -> np.ndarray:
    """The wire bytes of a float4_e2m1fn array (one element per byte, as
    ml_dtypes holds it): two per byte in row-major order, element 2i in the
    low nibble, 2i+1 in the high one; an odd count's last high nibble 0."""
    codes = np.ascontiguousarray(arr).reshape(-1).view(np.uint8) & 0x0F
    if codes.size % 2:
        codes = np.append(codes, np.uint8(0))
    packed: np.ndarray = codes[0::2] | (codes[1::2] << 4)
    return packed


def unpack_fp4(packed: Any, shape: tuple[int, ...]) -> np.ndarray:
    """A float4_e2m1fn array of `shape` (one element per byte) from its
    packed wire bytes (`pack_fp4`'s layout)."""
    raw = (
        np.frombuffer(packed, dtype=np.uint8) if isinstance(packed, (bytes, memoryview)) else packed
    )
    raw = np.asarray(raw, dtype=np.uint8).reshape(-1)
    count = int(np.prod(shape, dtype=np.int64)) if shape else 1
    codes = np.empty(2 * raw.size, dtype=np.uint8)
    codes[0::2] = raw & 0x0F
    codes[1::2] = raw >> 4
    out: np.ndarray = codes[:count].view(ml_dtypes.float4_e2m1fn).reshape(shape)
    return out


def wire_size(dtype: Any, shape: tuple[int, ...]) -> int:
    """The bytes a tensor of `dtype` (a JSON name or wire enum) and `shape`
    is on the wire and in the store: numel * itemsize, ceil(numel / 2) for
    float4_e2m1fn."""
    dt = numpy_dtype(dtype)
    count = int(np.prod(shape, dtype=np.int64)) if shape else 1
    return (count + 1) // 2 if dt == _FP4 else count * dt.itemsize


def wire_nbytes(arr: np.ndarray) -> int:
    """The bytes of an array from `as_array` on the wire: its nbytes, half
    of them (rounded up) for float4_e2m1fn."""
    return (arr.size + 1) // 2 if arr.dtype == _FP4 else int(arr.nbytes)


def wire_bytes(arr: np.ndarray) -> memoryview:
    """The wire bytes of a C-contiguous array from `as_array`: its own
    buffer, without a copy; float4_e2m1fn packed (a new buffer of half the
    size)."""
    if arr.dtype == _FP4:
        packed: memoryview = pack_fp4(arr).data
        return packed
    if not arr.flags.c_contiguous:  # as_array guarantees it; be safe anyway
        arr = np.ascontiguousarray(arr)
    view: memoryview = arr.reshape(-1).view(np.uint8).data
    return view


def from_wire(buf: Any, dtype: Any, shape: tuple[int, ...]) -> np.ndarray:
    """An array of `dtype` (a JSON name or wire enum) and `shape` from its
    wire bytes (a numpy uint8 buffer or bytes of `wire_size`): a view of
    them, or, for float4_e2m1fn, a new array unpacked."""
    dt = numpy_dtype(dtype)
    if dt == _FP4:
        return unpack_fp4(buf, shape)
    raw = np.frombuffer(buf, dtype=np.uint8) if isinstance(buf, (bytes, memoryview)) else buf
    out: np.ndarray = raw.view(dt).reshape(shape)
    return out


def fill_proto(t: pb.Tensor, arr: np.ndarray) -> None:
    """Writes an array from `as_array` into `t`, a Tensor field of the
    request being built, inline: its bytes are taken once (`tobytes`) and
    set in place, with no intermediate message to copy from."""
    t.dtype = _NP_TO_PB[arr.dtype.type][0]
    t.shape.extend(arr.shape)
    t.data = wire_bytes(arr).tobytes()


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
    want = wire_size(t.dtype, shape)
    if len(t.data) != want:
        raise ValueError(
            f"{name}: {len(t.data)} bytes for shape {list(shape)} of "
            f"{_PB_NAMES[t.dtype]} (expected {want})"
        )
    return from_wire(t.data, t.dtype, shape).copy()
