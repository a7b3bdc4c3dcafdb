"""`.safetensors` files: `save_safetensors(path, {name: array})` and
`load_safetensors(path)`.

    tensorcheck.save_safetensors("layer.safetensors", {"x": x, "fc.weight": w})
    arrays = tensorcheck.load_safetensors("layer.safetensors")   # {name: numpy array}

The format: an 8-byte little-endian header length, a JSON header
({name: {"dtype", "shape", "data_offsets": [begin, end]}}, and
"__metadata__": {str: str}), then the tensors' little-endian row-major
bytes. The dtypes are those a tensorcheck layer takes: F64, F32, F16,
BF16 (`ml_dtypes.bfloat16`), F8_E4M3 and F8_E5M2 (`ml_dtypes`' FP8).

When the `safetensors` package is installed, files of F64/F32/F16 only go
through `safetensors.numpy` (its numpy API has no bfloat16 or FP8); the
others, and every file without the package, through the reader and writer
here. A malformed file (a header past the end, offsets that overlap, leave
a gap or do not match dtype x shape, an unknown dtype) is a ValueError
naming the file and the tensor, never a crash.
"""

from __future__ import annotations

import importlib
import json
import os
import struct
from collections.abc import Mapping
from typing import Any, Optional, Union

import numpy as np

from ._store import byte_view
from ._tensors import as_array, dtype_enum, dtype_name, numpy_dtype

__all__ = ["save_safetensors", "load_safetensors", "read_safetensors_metadata"]

PathArg = Union[str, "os.PathLike[str]"]

# tensorcheck dtype name <-> the format's.
_TO_FORMAT = {
    "float64": "F64",
    "float32": "F32",
    "float16": "F16",
    "bfloat16": "BF16",
    "float8_e4m3fn": "F8_E4M3",
    "float8_e5m2": "F8_E5M2",
}
_FROM_FORMAT = {v: k for k, v in _TO_FORMAT.items()}
# What safetensors.numpy reads and writes.
_PACKAGE_DTYPES = frozenset({"F64", "F32", "F16"})
# The reference implementation's limit on the header.
_MAX_HEADER_BYTES = 100_000_000
_METADATA = "__metadata__"


def _package() -> Any:
    """safetensors.numpy, or None when the package is not installed."""
    try:
        return importlib.import_module("safetensors.numpy")
    except ImportError:
        return None


def save_safetensors(
    path: PathArg,
    tensors: Mapping[str, Any],
    metadata: Optional[Mapping[str, str]] = None,
) -> None:
    """Writes `tensors` ({name: array}; numpy, torch or JAX arrays of a
    dtype above) to `path`, in the given order, with `metadata` as the
    header's "__metadata__" (strings only). TypeError / ValueError naming
    the tensor for a dtype the format here lacks, a name that is not a
    non-empty string, or "__metadata__" as a name."""
    arrays: dict[str, np.ndarray] = {}
    for name, value in tensors.items():
        if not isinstance(name, str) or not name or name == _METADATA:
            raise ValueError(f"tensors: {name!r} is not a tensor name (a non-empty string)")
        arrays[name] = as_array(value, f"tensors[{name!r}]")
    meta = dict(metadata or {})
    for k, v in meta.items():
        if not isinstance(k, str) or not isinstance(v, str):
            raise TypeError(f"metadata: keys and values must be strings, got {k!r}: {v!r}")
    formats = {name: _TO_FORMAT[_dtype(a)] for name, a in arrays.items()}
    package = _package()
    if package is not None and set(formats.values()) <= _PACKAGE_DTYPES:
        package.save_file(arrays, os.fspath(path), metadata=meta or None)
        return
    header: dict[str, Any] = {}
    if meta:
        header[_METADATA] = meta
    offset = 0
    for name, arr in arrays.items():
        header[name] = {
            "dtype": formats[name],
            "shape": list(arr.shape),
            "data_offsets": [offset, offset + arr.nbytes],
        }
        offset += arr.nbytes
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the data starts 8-byte aligned
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for arr in arrays.values():
            # as_array's arrays are C-contiguous and little-endian.
            f.write(byte_view(arr))


def _dtype(arr: np.ndarray) -> str:
    name = dtype_name(dtype_enum(arr.dtype))
    assert name is not None
    return name


def _read_header(data: Union[bytes, bytearray], where: str) -> tuple[dict[str, Any], int]:
    """The header and where the data starts."""
    if len(data) < 8:
        raise ValueError(f"{where}: {len(data)} bytes, too short for a safetensors header")
    (n,) = struct.unpack("<Q", data[:8])
    if n > _MAX_HEADER_BYTES or 8 + n > len(data):
        raise ValueError(
            f"{where}: a header of {n} bytes runs past the end of the file ({len(data)} bytes)"
        )
    try:
        header = json.loads(data[8 : 8 + n].decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{where}: the header is not JSON: {e}") from None
    if not isinstance(header, dict):
        raise ValueError(f"{where}: the header is not a JSON object")
    return header, 8 + n


def read_safetensors_metadata(path: PathArg) -> dict[str, str]:
    """The header's "__metadata__" of a .safetensors file ({} when none)."""
    where = os.fspath(path)
    with open(path, "rb") as f:
        head = f.read(8)
        (n,) = struct.unpack("<Q", head) if len(head) == 8 else (0,)
        data = head + f.read(min(n, _MAX_HEADER_BYTES))
    header, _ = _read_header(data, where)
    meta = header.get(_METADATA) or {}
    if not isinstance(meta, dict):
        raise ValueError(f"{where}: __metadata__ is not an object")
    return {str(k): str(v) for k, v in meta.items()}


def load_safetensors(path: PathArg) -> dict[str, np.ndarray]:
    """The tensors of a .safetensors file, {name: writable numpy array} in
    the header's order (bfloat16 as `ml_dtypes.bfloat16`, FP8 as
    `ml_dtypes.float8_e4m3fn` / `float8_e5m2`). ValueError naming the file
    and the tensor for a malformed file or a dtype other than F64, F32,
    F16, BF16, F8_E4M3 and F8_E5M2."""
    where = os.fspath(path)
    with open(path, "rb") as f:
        data = bytearray(f.read())
    header, start = _read_header(data, where)
    body = memoryview(data)[start:]
    entries = []
    for name, info in header.items():
        if name == _METADATA:
            continue
        if not isinstance(info, dict):
            raise ValueError(f"{where}: {name}: not an object")
        fmt = info.get("dtype")
        if fmt not in _FROM_FORMAT:
            raise ValueError(
                f"{where}: {name}: dtype {fmt!r} is not one of {', '.join(_FROM_FORMAT)}"
            )
        shape = info.get("shape")
        if not isinstance(shape, list) or not all(
            isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape
        ):
            raise ValueError(f"{where}: {name}: shape {shape!r} is not a list of sizes")
        offsets = info.get("data_offsets")
        if (
            not isinstance(offsets, list)
            or len(offsets) != 2
            or not all(isinstance(o, int) and not isinstance(o, bool) for o in offsets)
        ):
            raise ValueError(f"{where}: {name}: data_offsets {offsets!r} is not [begin, end]")
        dt = numpy_dtype(_FROM_FORMAT[fmt])
        want = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
        begin, end = offsets
        if not 0 <= begin <= end or end - begin != want:
            raise ValueError(
                f"{where}: {name}: data_offsets {offsets} hold {end - begin} bytes, "
                f"{fmt} {shape} needs {want}"
            )
        entries.append((begin, end, name, dt, shape))
    entries.sort(key=lambda e: (e[0], e[1]))
    pos = 0
    for begin, end, name, _, _ in entries:
        if begin != pos:
            what = "overlaps the tensor before it" if begin < pos else "leaves a gap before it"
            raise ValueError(f"{where}: {name}: data_offsets [{begin}, {end}] {what}")
        pos = end
    if pos != len(body):
        raise ValueError(
            f"{where}: the tensors hold {pos} bytes of data, the file {len(body)} after its header"
        )
    formats = {header[name]["dtype"] for _, _, name, _, _ in entries}
    package = _package()
    if package is not None and formats <= _PACKAGE_DTYPES:
        loaded = package.load_file(where)
        return {name: np.array(loaded[name]) for _, _, name, _, _ in entries}
    by_name = {e[2]: e for e in entries}
    out: dict[str, np.ndarray] = {}
    # In the header's order, as written.
    for name in (n for n in header if n != _METADATA):
        begin, end, _, dt, shape = by_name[name]
        out[name] = np.frombuffer(body[begin:end], dtype=dt).reshape(shape)
    return out
