"""End-to-end tests of the CLI with FP8 operands (docs/numerics.md, "FP8"):
`<u1` .npy bit patterns read under --dtype NAME=fp8e4m3/fp8e5m2, safetensors
F8_E4M3/F8_E5M2, the dequantisation scales --input-scale/--weight-scale (a
number or a float32 tensor), `upload --dtype fp8e4m3` and its digest.

Expected outputs are computed here in float64 from values decoded by hand
from the OCP definitions, and chosen exact in bfloat16 (the default output
dtype of an FP8 layer), so they compare bit for bit.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from e2e_support import e4m3fn_value, e5m2_value, run_cli, write_safetensors


def test_decoders_agree_with_the_documented_patterns() -> None:
    # docs/numerics.md's table, and the values the tests below rely on.
    assert e4m3fn_value(0x7E) == 448.0 and e5m2_value(0x7B) == 57344.0
    assert e4m3fn_value(0x3C) == 1.5 and e5m2_value(0x3E) == 1.5
    assert e4m3fn_value(0x01) == 2.0 ** -9 and e5m2_value(0x01) == 2.0 ** -16


# x [2, 3] in e4m3fn: [[1, 2, 0.5], [-1, 3, 1.5]].
X_BITS = np.array([[0x38, 0x40, 0x30], [0xB8, 0x44, 0x3C]], dtype=np.uint8)
# w [4, 3] (out_in): the unit rows and a row of ones (e4m3fn 1.0 = 0x38,
# e5m2 1.0 = 0x3c).
W_E4M3_BITS = np.array([[0x38, 0, 0], [0, 0x38, 0], [0, 0, 0x38], [0x38, 0x38, 0x38]],
                       dtype=np.uint8)
W_E5M2_BITS = np.array([[0x3C, 0, 0], [0, 0x3C, 0], [0, 0, 0x3C], [0x3C, 0x3C, 0x3C]],
                       dtype=np.uint8)


def decode(bits: np.ndarray, value) -> np.ndarray:
    return np.vectorize(lambda b: value(int(b)))(bits).astype(np.float64)



@pytest.fixture()
def files(tmp_path: Path) -> Path:
    np.save(tmp_path / "x.npy", X_BITS)  # numpy writes '|u1'
    np.save(tmp_path / "w.npy", W_E4M3_BITS)
    return tmp_path


def fp8_verify(server: str, d: Path, *extra: str) -> list[str]:
    return ["--server", server, "verify", "--input", str(d / "x.npy"), "--dtype",
            "input=fp8e4m3", "--weight", str(d / "w.npy"), "--dtype", "weight=fp8e4m3",
            *extra]


def test_per_tensor_number_scales_reproduce_the_dequantised_layer(server: str,
                                                                   files: Path) -> None:
    out = files / "out"
    r = run_cli(*fp8_verify(server, files, "--input-scale", "0.5", "--weight-scale", "0.25",
                            "--config", "cpu:fp8e4m3:fused@scaling=tensor,fast_accum",
                            "--json", "--save-outputs", str(out)))
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert report["verdict"] == "pass"
    expected = (decode(X_BITS, e4m3fn_value) @ decode(W_E4M3_BITS, e4m3fn_value).T) * 0.125
    saved = sorted(p.name for p in out.iterdir())
    assert len(saved) == 2, saved
    for name in saved:
        y = np.load(out / name)
        assert y.dtype == np.float32  # bf16 outputs widened exactly
        np.testing.assert_array_equal(y.astype(np.float64), expected)


def test_row_wise_scale_files_reproduce_the_dequantised_layer(server: str, files: Path) -> None:
    xs = np.array([0.5, 0.25], dtype=np.float32)
    ws = np.array([[1.0], [2.0], [4.0], [0.5]], dtype=np.float32)  # [N, 1]
    np.save(files / "xs.npy", xs)
    write_safetensors(files / "s.safetensors", {"w_scale": ("F32", ws)})
    write_safetensors(files / "w5.safetensors", {"w": ("F8_E5M2", W_E5M2_BITS)})
    out = files / "out"
    r = run_cli("--server", server, "verify", "--input", str(files / "x.npy"), "--dtype",
                "input=fp8e4m3", "--weight", f"{files / 'w5.safetensors'}:w",
                "--input-scale", str(files / "xs.npy"),
                "--weight-scale", f"{files / 's.safetensors'}:w_scale",
                "--config", "cpu:fp8e4m3e5m2:fused@scaling=row", "--save-outputs", str(out))
    assert r.returncode == 0, r.stdout + r.stderr
    acc = decode(X_BITS, e4m3fn_value) @ decode(W_E5M2_BITS, e5m2_value).T
    expected = acc * xs.astype(np.float64)[:, None] * ws.astype(np.float64)[:, 0][None, :]
    # Without a bias the canonical name says none: cpu:fp8e4m3e5m2:none@scaling=row.
    y = np.load(out / "cpu_fp8e4m3e5m2_none_scaling_row.npy")
    np.testing.assert_array_equal(y.astype(np.float64), expected)


def test_fp8_npy_without_dtype_names_the_flag(server: str, files: Path) -> None:
    r = run_cli("--server", server, "verify", "--input", str(files / "x.npy"), "--weight",
                str(files / "w.npy"), "--input-scale", "1", "--weight-scale", "1")
    assert r.returncode == 2
    assert "--input:" in r.stderr and "--dtype NAME=fp8e4m3" in r.stderr


def test_bad_scales_are_usage_errors_naming_the_flag(server: str, files: Path) -> None:
    r = run_cli(*fp8_verify(server, files, "--input-scale", "abc", "--weight-scale", "1"))
    assert r.returncode == 2 and "--input-scale" in r.stderr, r.stderr
    np.save(files / "s16.npy", np.array([1.0], dtype=np.float16))
    r = run_cli(*fp8_verify(server, files, "--input-scale", "1",
                            "--weight-scale", str(files / "s16.npy")))
    assert r.returncode == 2 and "--weight-scale" in r.stderr and "float32" in r.stderr
    r = run_cli(*fp8_verify(server, files, "--input-scale", "1"))
    assert r.returncode == 2 and "--weight-scale is required" in r.stderr


def test_uploaded_fp8_tensor_is_named_by_its_digest(server: str, files: Path) -> None:
    r = run_cli("--server", server, "upload", "--dtype", "fp8e4m3", str(files / "x.npy"))
    assert r.returncode == 0, r.stderr
    ref = r.stdout.strip()
    assert ref.startswith("sha256:") and ref.endswith(":fp8e4m3:2x3"), ref
    r = run_cli("--server", server, "verify", "--input", ref, "--weight", str(files / "w.npy"),
                "--dtype", "weight=fp8e4m3", "--input-scale", "1", "--weight-scale", "1",
                "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["verdict"] == "pass"


# The server's rule for every dequantisation scale (docs/numerics.md,
# "FP8"), as its INVALID_ARGUMENT message words it.
SCALE_RULE = "a finite, positive float32 scale expected, got"


def test_a_nan_in_a_row_wise_scale_file_is_refused_by_the_server_naming_the_element(
        server: str, files: Path) -> None:
    np.save(files / "xs.npy", np.array([0.5, 0.25], dtype=np.float32))
    # W's third output feature would be blamed for a NaN scale's column.
    np.save(files / "ws.npy", np.array([1.0, 2.0, np.nan, 0.5], dtype=np.float32))
    args = fp8_verify(server, files, "--input-scale", str(files / "xs.npy"),
                      "--weight-scale", str(files / "ws.npy"), "--config",
                      "cpu:fp8e4m3@scaling=row")
    r = run_cli(*args)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "INVALID_ARGUMENT" in r.stderr, r.stderr
    assert f"op.weight_scale[2]: {SCALE_RULE} NaN" in r.stderr, r.stderr
    # diagnose takes the same rule.
    np.save(files / "y.npy", np.zeros((2, 4), dtype=np.float32))
    r = run_cli("--server", server, "diagnose", *args[3:], "--observed", str(files / "y.npy"))
    assert r.returncode == 2, r.stdout + r.stderr
    assert f"op.weight_scale[2]: {SCALE_RULE} NaN" in r.stderr, r.stderr
    # The server keeps serving: the same layer with a good scale passes.
    np.save(files / "ws.npy", np.array([1.0, 2.0, 4.0, 0.5], dtype=np.float32))
    r = run_cli(*args, "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    assert json.loads(r.stdout)["verdict"] == "pass"


@pytest.mark.parametrize("value, shown", [(0.0, "0"), (-1.0, "-1"), (np.inf, "+Inf"),
                                          (-np.inf, "-Inf"), (np.nan, "NaN")])
def test_a_per_tensor_scale_file_that_is_not_finite_and_positive_is_refused(
        server: str, files: Path, value: float, shown: str) -> None:
    np.save(files / "xs.npy", np.array([value], dtype=np.float32))  # [1]: element 0
    r = run_cli(*fp8_verify(server, files, "--input-scale", str(files / "xs.npy"),
                            "--weight-scale", "1"))
    assert r.returncode == 2, r.stdout + r.stderr
    assert f"op.input_scale[0]: {SCALE_RULE} {shown}" in r.stderr, r.stderr


def test_a_stored_scale_is_checked_where_the_server_resolves_its_digest(server: str,
                                                                        files: Path) -> None:
    np.save(files / "xs.npy", np.array([0.5, 0.25], dtype=np.float32))
    np.save(files / "ws.npy", np.array([1.0, -0.5, 1.0, 1.0], dtype=np.float32))
    r = run_cli("--server", server, "upload", str(files / "ws.npy"))
    assert r.returncode == 0, r.stderr
    ref = r.stdout.strip()
    assert ref.startswith("sha256:"), ref
    r = run_cli(*fp8_verify(server, files, "--input-scale", str(files / "xs.npy"),
                            "--weight-scale", ref, "--config", "cpu:fp8e4m3@scaling=row"))
    assert r.returncode == 2, r.stdout + r.stderr
    assert f"op.weight_scale[1]: {SCALE_RULE} -0.5" in r.stderr, r.stderr
