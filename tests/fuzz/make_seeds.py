"""Writes the fuzzers' seed corpora into tests/fuzz/corpus/<target>/.

    .venv/bin/python tests/fuzz/make_seeds.py

The seeds are committed; this script says where they came from and
rewrites them (deterministically) when a format or the API changes. Each
corpus holds valid inputs of every kind the target reads plus a few
typical malformed ones:

  request      serialized tensorcheck.v1.VerifyRequest messages (every dtype,
               both layouts, activations, tolerances, default candidates)
  npy          numpy-written .npy files of each dtype, formats 1.0-3.0
  safetensors  .safetensors files of F64, F32, F16, BF16 (names x, fc.weight,
               fc.bias; with __metadata__)
  config       configuration strings and the other names a request spells
  upload       scripts of UploadTensor streams (bytes FuzzedDataProvider reads)
"""

from __future__ import annotations

import io
import json
import shutil
import struct
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
from tensorcheck._pb import pb

CORPUS = Path(__file__).resolve().parent / "corpus"
RNG = np.random.default_rng(20261201)

PB_DTYPE = {
    "f8": pb.DTYPE_FLOAT64,
    "f4": pb.DTYPE_FLOAT32,
    "f2": pb.DTYPE_FLOAT16,
    "bf16": pb.DTYPE_BFLOAT16,
}
NP_DTYPE: dict[str, Any] = {
    "f8": np.float64,
    "f4": np.float32,
    "f2": np.float16,
    "bf16": ml_dtypes.bfloat16,
}


def values(shape: tuple[int, ...], dtype: str) -> np.ndarray:
    return RNG.standard_normal(shape).astype(NP_DTYPE[dtype])


def tensor(a: np.ndarray, dtype: str) -> Any:
    t = pb.Tensor(dtype=PB_DTYPE[dtype], shape=list(a.shape))
    t.data = np.ascontiguousarray(a).tobytes()
    return t


def write(target: str, name: str, data: bytes) -> None:
    d = CORPUS / target
    d.mkdir(parents=True, exist_ok=True)
    (d / name).write_bytes(data)


def request(
    m: int,
    k: int,
    n: int,
    dtype: str = "f4",
    *,
    bias: bool = True,
    observed: bool = True,
    in_out: bool = False,
    **fields: Any,
) -> Any:
    x = values((m, k), dtype)
    w = values((k, n) if in_out else (n, k), dtype)
    r = pb.VerifyRequest()
    r.op.input.CopyFrom(tensor(x, dtype))
    r.op.weight.CopyFrom(tensor(w, dtype))
    r.op.weight_layout = pb.WEIGHT_LAYOUT_IN_OUT if in_out else pb.WEIGHT_LAYOUT_OUT_IN
    if bias:
        r.op.bias.CopyFrom(tensor(values((n,), dtype), dtype))
    if observed:
        wt = w.astype(np.float64) if in_out else w.astype(np.float64).T
        y = x.astype(np.float64) @ wt
        r.observed.CopyFrom(tensor(y.astype(NP_DTYPE[dtype]), dtype))
    for key, value in fields.items():
        if key == "configs":
            r.configs.extend(value)
        elif key == "tolerance":
            r.tolerance.CopyFrom(value)
        elif key == "output":
            r.output.CopyFrom(value)
        elif key in ("activation", "output_dtype"):
            setattr(r.op, key, value)
        else:
            setattr(r, key, value)
    return r


def request_seeds() -> None:
    seeds = {
        "fp32_fused_tf32": request(2, 8, 4, configs=["cpu:fp32", "cpu:tf32:unfused"]),
        "bf16_fused_unfused": request(
            3, 16, 5, "bf16", configs=["cpu:bf16:fused", "cpu:bf16:unfused"]
        ),
        "fp16_in_out_gelu_ulp": request(
            2,
            8,
            3,
            "f2",
            in_out=True,
            activation=pb.ACTIVATION_GELU_TANH,
            configs=["cpu:fp16acc", "cpu:fp16:fused"],
            tolerance=pb.Tolerance(preset=pb.Tolerance.PRESET_ULP, max_ulp=2),
        ),
        "fp64_outputs_repeat": request(
            4,
            4,
            4,
            "f8",
            observed=False,
            configs=["cpu:fp64", "cpu:fp32:unfused"],
            output=pb.OutputOptions(return_outputs=True, top_k=3, top_groups=2),
            repeat=2,
        ),
        "diagnose_default_candidates": request(
            2, 12, 6, tolerance=pb.Tolerance(preset=pb.Tolerance.PRESET_BOUND, bound_factor=2)
        ),
        "explicit_tolerance_reference": request(
            2,
            8,
            2,
            bias=False,
            activation=pb.ACTIVATION_RELU,
            reference="cpu:fp32",
            configs=["cpu:tf32rna", "cpu:tf32trunc"],
            tolerance=pb.Tolerance(
                preset=pb.Tolerance.PRESET_EXPLICIT,
                atol={"value": 1e-4},
                rtol={"value": 1e-3},
                nan_equal=True,
                bound_precision="tf32",
            ),
            disallow_reduced_precision_reduction=True,
        ),
        "bf16_output_dtype": request(
            2, 8, 3, output_dtype=pb.DTYPE_BFLOAT16, configs=["cpu:bf16:unfused"]
        ),
        # Typical refusals.
        "bad_gpu_backend": request(1, 4, 2, configs=["cublaslt:tf32", "cublas:bf16:fused"]),
        "bad_bias_none_with_bias": request(1, 4, 2, configs=["cpu:fp32:none"]),
        "bad_top_k": request(1, 4, 2, output=pb.OutputOptions(top_k=100000)),
    }
    # A rank-3 input [2, 2, 4].
    r = request(4, 4, 3, configs=["cpu:fp32"])
    del r.op.input.shape[:]
    r.op.input.shape.extend([2, 2, 4])
    del r.observed.shape[:]
    r.observed.shape.extend([2, 2, 3])
    seeds["rank3_input"] = r
    # Wire-level refusals.
    r = request(1, 4, 2)
    r.op.weight.shape[1] = 5
    seeds["bad_weight_shape"] = r
    r = request(1, 4, 2)
    r.op.input.digest = "sha256:" + "0" * 64
    seeds["bad_digest"] = r
    r = request(1, 4, 2)
    r.op.input.dtype = 9
    seeds["bad_dtype"] = r
    r = request(1, 4, 2)
    r.op.bias.data = r.op.bias.data[:-1]
    seeds["bad_short_bias"] = r
    for name, msg in seeds.items():
        write("request", name + ".pb", msg.SerializeToString())


def npy_bytes(a: np.ndarray, version: tuple[int, int] | None = None) -> bytes:
    f = io.BytesIO()
    np.lib.format.write_array(f, a, version=version)
    return f.getvalue()


def npy_seeds() -> None:
    for dtype in ("f8", "f4", "f2"):
        write("npy", f"{dtype}_2x3.npy", npy_bytes(values((2, 3), dtype)))
    write("npy", "bf16_bits_4.npy", npy_bytes(values((4,), "bf16").view(np.uint16)))
    write("npy", "f4_v2.npy", npy_bytes(values((3, 2), "f4"), (2, 0)))
    write("npy", "f4_v3.npy", npy_bytes(values((1, 2, 2), "f4"), (3, 0)))
    write("npy", "f4_scalar.npy", npy_bytes(np.array(1.5, dtype=np.float32)))
    write("npy", "f4_empty_0x3.npy", npy_bytes(np.zeros((0, 3), dtype=np.float32)))
    # Refusals: Fortran order, big-endian, an int dtype, truncated data.
    write("npy", "bad_fortran.npy", npy_bytes(np.asfortranarray(values((2, 3), "f4"))))
    write("npy", "bad_big_endian.npy", npy_bytes(values((3,), "f4").astype(">f4")))
    write("npy", "bad_int32.npy", npy_bytes(np.arange(4, dtype=np.int32)))
    write("npy", "bad_truncated.npy", npy_bytes(values((4, 4), "f4"))[:-5])


def safetensors_bytes(
    tensors: dict[str, tuple[str, np.ndarray]], metadata: dict[str, str] | None = None
) -> bytes:
    header: dict[str, Any] = {}
    if metadata is not None:
        header["__metadata__"] = metadata
    data = b""
    for name, (dtype, a) in tensors.items():
        raw = np.ascontiguousarray(a).tobytes()
        header[name] = {
            "dtype": dtype,
            "shape": list(a.shape),
            "data_offsets": [len(data), len(data) + len(raw)],
        }
        data += raw
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the reference writer pads to 8 bytes
    return struct.pack("<Q", len(text)) + text + data


def safetensors_seeds() -> None:
    names = {"f8": "F64", "f4": "F32", "f2": "F16", "bf16": "BF16"}
    for dtype, st in names.items():
        layer = {
            "x": (st, values((2, 4), dtype)),
            "fc.weight": (st, values((3, 4), dtype)),
            "fc.bias": (st, values((3,), dtype)),
        }
        write("safetensors", f"{st.lower()}_layer.safetensors", safetensors_bytes(layer))
    write(
        "safetensors",
        "f32_metadata.safetensors",
        safetensors_bytes({"x": ("F32", values((2, 2), "f4"))}, {"format": "pt"}),
    )
    write("safetensors", "empty.safetensors", safetensors_bytes({}))
    # Refusals: an integer dtype, overlapping tensors, offsets past the end.
    write(
        "safetensors",
        "bad_i32.safetensors",
        safetensors_bytes({"x": ("I32", np.arange(4, dtype=np.int32))}),
    )
    good = safetensors_bytes(
        {"x": ("F32", values((2,), "f4")), "fc.weight": ("F32", values((2,), "f4"))}
    )
    write("safetensors", "bad_overlap.safetensors", good.replace(b"[8,16]", b"[4,12]"))
    write("safetensors", "bad_truncated.safetensors", good[:-3])


def config_seeds() -> None:
    texts = [
        "cpu:bf16:fused",
        "cpu:bf16:unfused",
        "cublaslt:tf32",
        "cublas:fp16acc:none",
        "cpu:fp64",
        "cpu:tf32rna:unfused",
        "cpu:tf32trunc",
        "cpu:fp16",
        "fp32",
        "bfloat16",
        "half",
        "gelu",
        "in_out",
        "torch",
        "bound",
        # Refusals.
        "cpu",
        "cpu:fp33",
        ":fp32",
        "cpu:fp32:fused:extra",
        "cpu::fused",
        "cpu:fp32:sideways",
    ]
    for i, text in enumerate(texts):
        write("config", f"{i:02d}_{text.replace(':', '_') or 'empty'}", text.encode())


def upload_seeds() -> None:
    # upload_fuzzer reads its input with FuzzedDataProvider: any bytes are a
    # script; these give it a few sizes of tensor and stream count to start.
    rng = np.random.default_rng(7)
    for i, n in enumerate((16, 200, 1000, 4000)):
        write("upload", f"{i:02d}_random_{n}", rng.integers(0, 256, n, dtype=np.uint8).tobytes())
    write("upload", "04_zeros", bytes(600))
    write("upload", "05_ones", b"\xff" * 600)


def main() -> None:
    for target in ("request", "npy", "safetensors", "config", "upload"):
        shutil.rmtree(CORPUS / target, ignore_errors=True)
    request_seeds()
    npy_seeds()
    safetensors_seeds()
    config_seeds()
    upload_seeds()


if __name__ == "__main__":
    main()
