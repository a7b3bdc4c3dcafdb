"""End-to-end tests of the CLI with MXFP8 and NVFP4 operands and block-wise
FP8 scales (docs/numerics.md, "Block-wise FP8", "MXFP8 and NVFP4"): `<u1`
.npy files read as float8_e8m0fnu scales and packed float4_e2m1fn values
under --dtype, safetensors F8_E8M0, NVFP4's --input-global-scale and
--weight-global-scale, and the canonical configurations the server echoes.

Expected outputs are computed here in float64 from values decoded by hand
from the OCP definitions, on layers whose sums are exact in float32 and
rounded once to bfloat16 (the default output of narrow operands) here as
on the server, so they compare bit for bit.
"""

from __future__ import annotations

import json
from pathlib import Path

import ml_dtypes
import numpy as np
from e2e_support import e2m1_value, e4m3fn_value, run_cli, write_safetensors

M, N, K = 2, 4, 32


def test_mxfp8_with_e8m0_scale_files_gives_the_dequantised_layer(server: str,
                                                                 tmp_path: Path) -> None:
    rng = np.random.default_rng(11)
    # Values 1 .. 1.875 (codes 0x38..0x3f), scales 2^-1 .. 2^1: each
    # product on a 2^-8 grid, sums of 32 below 2^8: exact in fp32.
    xc = rng.integers(0x38, 0x40, size=(M, K)).astype(np.uint8)
    wc = rng.integers(0x38, 0x40, size=(N, K)).astype(np.uint8)
    xs = rng.integers(126, 129, size=(M, 1)).astype(np.uint8)
    ws = rng.integers(126, 129, size=(N, 1)).astype(np.uint8)
    np.save(tmp_path / "x.npy", xc)
    np.save(tmp_path / "w.npy", wc)
    np.save(tmp_path / "xs.npy", xs)
    write_safetensors(tmp_path / "ws.safetensors", {"s": ("F8_E8M0", ws)})
    out = tmp_path / "out"
    r = run_cli("--server", server, "verify", "--input", str(tmp_path / "x.npy"), "--dtype",
                "input=fp8e4m3", "--weight", str(tmp_path / "w.npy"), "--dtype",
                "weight=fp8e4m3", "--input-scale", str(tmp_path / "xs.npy"), "--dtype",
                "input-scale=e8m0", "--weight-scale", f"{tmp_path / 'ws.safetensors'}:s",
                "--config", "cpu:mxfp8e4m3:fused@scaling=rceil", "--save-outputs", str(out))
    assert r.returncode == 0, r.stdout + r.stderr
    dx = np.vectorize(e4m3fn_value)(xc) * np.exp2(xs.astype(np.float64) - 127)
    dw = np.vectorize(e4m3fn_value)(wc) * np.exp2(ws.astype(np.float64) - 127)
    expected = dx @ dw.T
    # No bias: the canonical name says none; the scale rounding is echoed.
    y = np.load(out / "cpu_mxfp8e4m3_none_scaling_rceil.npy")
    assert y.dtype == np.float32  # bf16 outputs widened exactly
    np.testing.assert_array_equal(y.astype(np.float64),
                                  expected.astype(ml_dtypes.bfloat16).astype(np.float64))


def test_nvfp4_packed_operands_and_global_scales_give_the_dequantised_layer(
        server: str, tmp_path: Path) -> None:
    rng = np.random.default_rng(12)
    xc = rng.integers(0, 16, size=(M, K)).astype(np.uint8)
    wc = rng.integers(0, 16, size=(N, K)).astype(np.uint8)

    def packed(codes: np.ndarray) -> np.ndarray:  # element 2i in the low nibble
        return (codes[:, 0::2] | (codes[:, 1::2] << 4)).astype(np.uint8)

    xs = np.full((M, K // 16), 0x38, np.uint8)  # e4m3 1.0
    ws = np.array([[0x40, 0x30]] * N, np.uint8)  # e4m3 2.0, 0.5
    np.save(tmp_path / "x.npy", packed(xc))
    np.save(tmp_path / "w.npy", packed(wc))
    np.save(tmp_path / "xs.npy", xs)
    np.save(tmp_path / "ws.npy", ws)
    out = tmp_path / "out"
    r = run_cli("--server", server, "verify", "--input", str(tmp_path / "x.npy"), "--dtype",
                "input=fp4e2m1", "--weight", str(tmp_path / "w.npy"), "--dtype",
                "weight=fp4e2m1", "--input-scale", str(tmp_path / "xs.npy"), "--dtype",
                "input-scale=fp8e4m3", "--weight-scale", str(tmp_path / "ws.npy"), "--dtype",
                "weight-scale=fp8e4m3", "--input-global-scale", "0.5",
                "--weight-global-scale", "4", "--config", "cpu:nvfp4", "--save-outputs",
                str(out))
    assert r.returncode == 0, r.stdout + r.stderr
    dx = np.vectorize(e2m1_value)(xc) * np.repeat(np.vectorize(e4m3fn_value)(xs), 16, 1)
    dw = np.vectorize(e2m1_value)(wc) * np.repeat(np.vectorize(e4m3fn_value)(ws), 16, 1)
    expected = (dx @ dw.T) * 2.0
    y = np.load(out / "cpu_nvfp4_none.npy")
    np.testing.assert_array_equal(y.astype(np.float64),
                                  expected.astype(ml_dtypes.bfloat16).astype(np.float64))


def test_block128_scale_files_name_the_block_wise_configuration(server: str,
                                                                tmp_path: Path) -> None:
    k = 256
    xc = np.full((M, k), 0x38, np.uint8)  # all 1.0
    wc = np.full((N, k), 0x38, np.uint8)
    np.save(tmp_path / "x.npy", xc)
    np.save(tmp_path / "w.npy", wc)
    np.save(tmp_path / "xs.npy", np.array([[0.5, 0.25], [1.0, 2.0]], np.float32))
    np.save(tmp_path / "ws.npy", np.array([[0.125, 4.0]], np.float32))
    r = run_cli("--server", server, "verify", "--input", str(tmp_path / "x.npy"), "--dtype",
                "input=fp8e4m3", "--weight", str(tmp_path / "w.npy"), "--dtype",
                "weight=fp8e4m3", "--input-scale", str(tmp_path / "xs.npy"),
                "--weight-scale", str(tmp_path / "ws.npy"), "--config", "cpu:fp8e4m3",
                "--json", "--save-outputs", str(tmp_path / "out"))
    assert r.returncode == 0, r.stdout + r.stderr
    report = json.loads(r.stdout)
    assert [c["config"] for c in report["results"]] == ["cpu:fp8e4m3:none@scaling=block128"]
    y = np.load(tmp_path / "out" / "cpu_fp8e4m3_none_scaling_block128.npy")
    # Each slice sums 128 ones: row 0 128*(0.5*0.125 + 0.25*4), row 1
    # 128*(1*0.125 + 2*4).
    np.testing.assert_array_equal(y, np.array([[136.0] * N, [1040.0] * N], np.float32))


def test_a_missing_global_scale_is_the_servers_refusal_naming_the_field(
        server: str, tmp_path: Path) -> None:
    np.save(tmp_path / "x.npy", np.zeros((M, K // 2), np.uint8))
    np.save(tmp_path / "w.npy", np.zeros((N, K // 2), np.uint8))
    np.save(tmp_path / "xs.npy", np.full((M, 2), 0x38, np.uint8))
    np.save(tmp_path / "ws.npy", np.full((N, 2), 0x38, np.uint8))
    r = run_cli("--server", server, "verify", "--input", str(tmp_path / "x.npy"), "--dtype",
                "input=fp4e2m1", "--weight", str(tmp_path / "w.npy"), "--dtype",
                "weight=fp4e2m1", "--input-scale", str(tmp_path / "xs.npy"), "--dtype",
                "input-scale=fp8e4m3", "--weight-scale", str(tmp_path / "ws.npy"), "--dtype",
                "weight-scale=fp8e4m3", "--input-global-scale", "1", "--config", "cpu:nvfp4")
    assert r.returncode == 2, r.stdout + r.stderr
    assert "op.weight_global_scale" in r.stderr
