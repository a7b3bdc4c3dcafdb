"""End-to-end tests of `--gpu` through the CLI (docs/numerics.md, "Kernel
K order"): a diagnosis that names the GPU also ranks the CPU replays of its
default kernels and finds the one an H100's output came from bit for bit;
an unknown GPU is the server's INVALID_ARGUMENT, exit 2.

The observed output is computed here by e2e_support.sm90_bf16_linear, the
sm_90 tensor-core model redone in exact rational arithmetic from its
description (never from the server): a bf16 layer with float32 output,
each element the tensor cores' blocked, truncating inner product, the bias
added in fp32. A few inputs are x4096, so that the truncation shows
against fp32 accumulation.
"""

from __future__ import annotations

import json
from pathlib import Path

import ml_dtypes
import numpy as np

from e2e_support import run_cli, sm90_bf16_linear


def _layer(tmp_path: Path) -> list[str]:
    """x [4, 64], w [8, 64], b [8] in bfloat16 and the H100's float32 y,
    written to tmp_path; the arguments that name them."""
    rng = np.random.default_rng(90)
    x = rng.standard_normal((4, 64))
    x.reshape(-1)[::7] *= 4096
    x = x.astype(ml_dtypes.bfloat16)
    w = (rng.standard_normal((8, 64)) * 0.05).astype(ml_dtypes.bfloat16)
    b = rng.standard_normal(8).astype(ml_dtypes.bfloat16)
    for name, v in (("x", x), ("w", w), ("b", b)):
        np.save(tmp_path / f"{name}.npy", v)
    np.save(tmp_path / "y.npy", sm90_bf16_linear(x, w, b))
    return ["--input", str(tmp_path / "x.npy"), "--weight", str(tmp_path / "w.npy"),
            "--bias", str(tmp_path / "b.npy"), "--observed", str(tmp_path / "y.npy"),
            "--dtype", "input=bf16", "--dtype", "weight=bf16", "--dtype", "bias=bf16",
            "--output-dtype", "float32"]


def test_diagnose_with_gpu_finds_the_h100_kernel_bit_for_bit(server: str, tmp_path: Path) -> None:
    layer = _layer(tmp_path)
    # Without --gpu no candidate reproduces the output: the layer tells the
    # tensor cores' truncation from fp32 accumulation.
    r = run_cli("--server", server, "diagnose", *layer, "--json")
    assert r.returncode in (0, 1), r.stdout + r.stderr
    plain = json.loads(r.stdout)["diagnosis"]
    assert plain["ranking"] and not plain["ranking"][0]["exact"], plain["ranking"][:2]

    r = run_cli("--server", server, "diagnose", *layer, "--gpu", "h100", "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    report = json.loads(r.stdout)
    d = report["diagnosis"]
    assert d["best"] == "cpu:bf16:fused@mma=sm90", d
    assert d["ranking"][0]["config"] == "cpu:bf16:fused@mma=sm90", d["ranking"][0]
    assert d["ranking"][0]["exact"] is True, d["ranking"][0]
    assert any("h100" in note for note in report["notes"]), report["notes"]

    # The text report prints the server's notes with --verbose.
    r = run_cli("--server", server, "diagnose", *layer, "--gpu", "h100", "--verbose")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "Replays of h100's kernels" in r.stdout, r.stdout


def test_an_unknown_gpu_is_the_servers_invalid_argument(server: str, tmp_path: Path) -> None:
    r = run_cli("--server", server, "diagnose", *_layer(tmp_path), "--gpu", "tpu")
    assert r.returncode == 2, r.stdout + r.stderr
    assert "INVALID_ARGUMENT" in r.stderr, r.stderr
    assert "gpu: unknown GPU 'tpu'" in r.stderr, r.stderr


def test_gpu_is_a_flag_of_verify_and_diagnose_only(server: str, tmp_path: Path) -> None:
    for command in ("verify", "diagnose"):
        r = run_cli(command, "--help")
        assert r.returncode == 0 and "--gpu NAME" in r.stdout, (command, r.stdout)
    r = run_cli("--server", server, "compare", "--gpu", "h100")
    assert r.returncode == 2 and "unknown flag --gpu for 'compare'" in r.stderr, r.stderr
