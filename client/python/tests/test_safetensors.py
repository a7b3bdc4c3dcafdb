"""tensorcheck.save_safetensors / load_safetensors: the format's bytes
checked against what numpy and ml_dtypes produce, round trips, and
malformed files as ValueErrors. No server."""

from __future__ import annotations

import json
import struct
import sys
import types
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest

import tensorcheck
from tensorcheck._safetensors import read_safetensors_metadata

RNG = np.random.default_rng(7)
F32 = RNG.standard_normal((3, 5)).astype(np.float32)
F16 = RNG.standard_normal((4,)).astype(np.float16)
# bf16 from float32 bits independently of ml_dtypes' cast: round to nearest
# even on the upper 16 bits (no NaN among these values).
_bits = RNG.standard_normal((2, 3, 4)).astype(np.float32).view(np.uint32).astype(np.uint64)
BF16_BITS = ((_bits + 0x7FFF + ((_bits >> 16) & 1)) >> 16).astype(np.uint16)
BF16 = BF16_BITS.view(ml_dtypes.bfloat16)
F64 = np.array([[1.0, -0.0], [np.inf, 2.5]])
E4M3 = np.array([0.5, -448.0, 1.75], np.float32).astype(ml_dtypes.float8_e4m3fn)


def _parse(path: Path) -> tuple[dict[str, Any], bytes]:
    """The header and the data, read as the format says: an 8-byte
    little-endian length, that much JSON, the rest data."""
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8 : 8 + n]), raw[8 + n :]


@pytest.fixture
def without_package(monkeypatch: pytest.MonkeyPatch) -> None:
    """The writer and reader of this client, whether or not `safetensors`
    is installed."""
    monkeypatch.setitem(sys.modules, "safetensors", None)
    monkeypatch.setitem(sys.modules, "safetensors.numpy", None)


def test_the_file_holds_the_bytes_numpy_and_ml_dtypes_produce(
    tmp_path: Path, without_package: None
) -> None:
    path = tmp_path / "t.safetensors"
    tensors = {"w.f32": F32, "b.f16": F16, "x.bf16": BF16, "r.f64": F64, "q.e4m3": E4M3}
    tensorcheck.save_safetensors(path, tensors, metadata={"format": "np"})
    header, data = _parse(path)
    assert header.pop("__metadata__") == {"format": "np"}
    assert list(header) == list(tensors)  # in the order given
    want = {
        "w.f32": ("F32", F32.astype("<f4").tobytes()),
        "b.f16": ("F16", F16.astype("<f2").tobytes()),
        "x.bf16": ("BF16", BF16_BITS.astype("<u2").tobytes()),
        "r.f64": ("F64", F64.astype("<f8").tobytes()),
        "q.e4m3": ("F8_E4M3", bytes([0x30, 0xFE, 0x3E])),  # 0.5, -448, 1.75 by hand
    }
    end = 0
    for name, (dtype, raw) in want.items():
        entry = header[name]
        assert entry["dtype"] == dtype
        assert entry["shape"] == list(tensors[name].shape)
        lo, hi = entry["data_offsets"]
        assert lo == end and data[lo:hi] == raw
        end = hi
    assert end == len(data)
    (n,) = struct.unpack("<Q", path.read_bytes()[:8])
    assert n % 8 == 0  # the data starts 8-byte aligned


def test_load_gives_the_arrays_back_bit_for_bit(tmp_path: Path, without_package: None) -> None:
    path = tmp_path / "t.safetensors"
    tensorcheck.save_safetensors(path, {"a": F32, "b": F16, "c": BF16, "d": E4M3, "e": F64})
    back = tensorcheck.load_safetensors(path)
    assert list(back) == ["a", "b", "c", "d", "e"]
    for name, src, view in (
        ("a", F32, np.uint32),
        ("b", F16, np.uint16),
        ("c", BF16, np.uint16),
        ("d", E4M3, np.uint8),
        ("e", F64, np.uint64),
    ):
        got = back[name]
        assert got.dtype == src.dtype and got.shape == src.shape
        np.testing.assert_array_equal(got.view(view), src.view(view))
    back["a"][0, 0] = 7.0  # writable
    assert read_safetensors_metadata(path) == {}


def test_a_file_written_elsewhere_loads(tmp_path: Path, without_package: None) -> None:
    # Written by hand: the data in another order than the header lists it.
    a, b = np.arange(3, dtype="<f4"), np.arange(2, dtype="<f2")
    header = {
        "__metadata__": {"k": "v"},
        "a": {"dtype": "F32", "shape": [3], "data_offsets": [4, 16]},
        "b": {"dtype": "F16", "shape": [2], "data_offsets": [0, 4]},
    }
    text = json.dumps(header).encode()
    path = tmp_path / "h.safetensors"
    path.write_bytes(struct.pack("<Q", len(text)) + text + b.tobytes() + a.tobytes())
    back = tensorcheck.load_safetensors(path)
    np.testing.assert_array_equal(back["a"], a)
    np.testing.assert_array_equal(back["b"], b)
    assert read_safetensors_metadata(path) == {"k": "v"}


def _file(tmp_path: Path, header: Any, data: bytes = b"", length: Any = None) -> Path:
    text = json.dumps(header).encode() if not isinstance(header, bytes) else header
    n = len(text) if length is None else length
    path = tmp_path / "bad.safetensors"
    path.write_bytes(struct.pack("<Q", n) + text + data)
    return path


@pytest.mark.parametrize(
    "header, data, length, pattern",
    [
        ({"x": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}, b"\0" * 4, None,
         r"x: .*past|the tensors hold 8 bytes of data, the file 4"),
        ({"x": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}, b"", 10_000,
         r"a header of 10000 bytes runs past the end"),
        ({"x": {"dtype": "I32", "shape": [1], "data_offsets": [0, 4]}}, b"\0" * 4, None,
         r"x: dtype 'I32' is not one of F64, F32, F16, BF16, F8_E4M3, F8_E5M2"),
        ({"x": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}}, b"\0" * 4, None,
         r"x: data_offsets \[0, 4\] hold 4 bytes, F32 \[2\] needs 8"),
        ({"x": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
          "y": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}, b"\0" * 8, None,
         r"y: data_offsets \[4, 8\] overlaps the tensor before it"),
        ({"x": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}, b"\0" * 8, None,
         r"x: data_offsets \[4, 8\] leaves a gap before it"),
        ({"x": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 0]}}, b"", None,
         r"x: shape \[-1\] is not a list of sizes"),
        (b"[1, 2]", b"", None, r"the header is not a JSON object"),
        (b"{not json", b"", None, r"the header is not JSON"),
    ],
)  # fmt: skip
def test_malformed_files_are_value_errors_naming_the_file_and_tensor(
    tmp_path: Path, without_package: None, header: Any, data: bytes, length: Any, pattern: str
) -> None:
    path = _file(tmp_path, header, data, length)
    with pytest.raises(ValueError, match=pattern) as e:
        tensorcheck.load_safetensors(path)
    assert str(e.value).startswith(str(path))


def test_a_short_file_is_a_value_error(tmp_path: Path, without_package: None) -> None:
    path = tmp_path / "short.safetensors"
    path.write_bytes(b"\x01\x00")
    with pytest.raises(ValueError, match="2 bytes, too short"):
        tensorcheck.load_safetensors(path)


def test_bad_names_and_dtypes_are_refused_before_writing(tmp_path: Path) -> None:
    path = tmp_path / "never.safetensors"
    with pytest.raises(ValueError, match="is not a tensor name"):
        tensorcheck.save_safetensors(path, {"": F32})
    with pytest.raises(ValueError, match="is not a tensor name"):
        tensorcheck.save_safetensors(path, {"__metadata__": F32})
    with pytest.raises(TypeError, match=r"^tensors\['i'\]"):
        tensorcheck.save_safetensors(path, {"i": np.arange(3, dtype=np.int32)})
    with pytest.raises(TypeError, match="^metadata"):
        tensorcheck.save_safetensors(path, {"a": F32}, metadata={"n": 1})  # type: ignore[dict-item]
    assert not path.exists()


def test_torch_bf16_is_written_as_its_bit_patterns(tmp_path: Path, without_package: None) -> None:
    torch = pytest.importorskip("torch")
    t = torch.from_numpy(F32).to(torch.bfloat16)
    path = tmp_path / "t.safetensors"
    tensorcheck.save_safetensors(path, {"t": t})
    header, data = _parse(path)
    assert header["t"]["dtype"] == "BF16"
    assert data == t.view(torch.int16).numpy().astype("<i2").tobytes()


class _FakePackage(types.ModuleType):
    """Stands in for safetensors.numpy: records what it was handed."""

    def __init__(self) -> None:
        super().__init__("safetensors.numpy")
        self.saved: list[list[str]] = []
        self.loaded: list[str] = []

    def save_file(self, tensors: dict[str, np.ndarray], path: str, metadata: Any = None) -> None:
        self.saved.append(list(tensors))
        header: dict[str, Any] = {}
        offset, blobs = 0, []
        for name, a in tensors.items():
            kind = {np.dtype("float32"): "F32", np.dtype("float16"): "F16"}[a.dtype]
            header[name] = {"dtype": kind, "shape": list(a.shape),
                            "data_offsets": [offset, offset + a.nbytes]}  # fmt: skip
            offset += a.nbytes
            blobs.append(a.tobytes())
        text = json.dumps(header).encode()
        Path(path).write_bytes(struct.pack("<Q", len(text)) + text + b"".join(blobs))

    def load_file(self, path: str) -> dict[str, np.ndarray]:
        self.loaded.append(path)
        return {"a": F32.copy()}


def test_the_safetensors_package_takes_the_dtypes_it_has(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = _FakePackage()
    package = types.ModuleType("safetensors")
    package.numpy = fake  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "safetensors", package)
    monkeypatch.setitem(sys.modules, "safetensors.numpy", fake)
    plain, bf16 = tmp_path / "plain.safetensors", tmp_path / "bf16.safetensors"
    tensorcheck.save_safetensors(plain, {"a": F32})
    tensorcheck.save_safetensors(bf16, {"a": F32, "c": BF16})  # BF16: not the package's
    assert fake.saved == [["a"]]
    np.testing.assert_array_equal(tensorcheck.load_safetensors(plain)["a"], F32)
    assert fake.loaded == [str(plain)]
    back = tensorcheck.load_safetensors(bf16)
    assert fake.loaded == [str(plain)]
    np.testing.assert_array_equal(back["c"].view(np.uint16), BF16_BITS)


def test_the_installed_package_reads_what_this_client_writes(tmp_path: Path) -> None:
    st = pytest.importorskip("safetensors.numpy")
    path = tmp_path / "t.safetensors"
    tensorcheck.save_safetensors(path, {"a": F32, "b": F16})
    back = st.load_file(str(path))
    np.testing.assert_array_equal(back["a"], F32)
    np.testing.assert_array_equal(back["b"], F16)
