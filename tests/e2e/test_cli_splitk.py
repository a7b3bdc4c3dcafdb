"""End-to-end tests of split-K through the CLI (docs/numerics.md,
"Split-K"): a named `@splitk=N,reduce=output` configuration computes the
definition bit for bit, and a default diagnosis of the public report's
case (16x14336->512 bf16, K split in 4, partials rounded to and added in
bf16) names the split and the reduction.

Expected outputs are computed here with numpy and ml_dtypes from the
definition: slices of ceil(K/N) rounded up to a multiple of 8, each
partial summed exactly (float64, exact in float32 for the small integers
of the first test), rounded to bfloat16, added left to right in bfloat16.
"""

from __future__ import annotations

import json
from pathlib import Path

import ml_dtypes
import numpy as np

from e2e_support import run_cli


BF16 = ("--dtype", "input=bf16", "--dtype", "weight=bf16")


def bf16(v: np.ndarray) -> np.ndarray:
    return v.astype(np.float32).astype(ml_dtypes.bfloat16).astype(np.float64)


def split_k_bf16(x: np.ndarray, w: np.ndarray, n_slices: int) -> np.ndarray:
    k = x.shape[1]
    size = -(-k // n_slices)
    size = -(-size // 8) * 8
    r = None
    for k0 in range(0, k, size):
        p = bf16(x[:, k0:k0 + size] @ w[:, k0:k0 + size].T)
        r = p if r is None else bf16(r + p)
    return r


def save_bf16(path: Path, v: np.ndarray) -> None:
    np.save(path, v.astype(ml_dtypes.bfloat16))


def test_a_named_split_k_configuration_is_the_definition(server: str, tmp_path: Path) -> None:
    rng = np.random.default_rng(21)
    x = rng.integers(-4, 5, size=(3, 1000)).astype(np.float64) / 4
    w = rng.integers(-4, 5, size=(5, 1000)).astype(np.float64) / 2
    save_bf16(tmp_path / "x.npy", x)
    save_bf16(tmp_path / "w.npy", w)
    out = tmp_path / "out"
    r = run_cli("--server", server, "verify", "--input", str(tmp_path / "x.npy"),
                "--weight", str(tmp_path / "w.npy"), *BF16, "--config", "cpu:bf16@splitk=3",
                "--json", "--save-outputs", str(out))
    assert r.returncode in (0, 1), r.stdout + r.stderr
    report = json.loads(r.stdout)
    assert [c["config"] for c in report["results"]] == ["cpu:bf16:none@splitk=3,reduce=output"]
    y = np.load(out / "cpu_bf16_none_splitk_3_reduce_output.npy")
    np.testing.assert_array_equal(y.astype(np.float64), split_k_bf16(x, w, 3))


def test_the_reports_case_is_named_split_k_in_four_reduced_in_bf16(server: str,
                                                                   tmp_path: Path) -> None:
    rng = np.random.default_rng(22)
    m, n, k = 16, 512, 14336
    x = bf16(rng.standard_normal((m, k)))
    w = bf16(rng.standard_normal((n, k)) / np.sqrt(k))
    save_bf16(tmp_path / "x.npy", x)
    save_bf16(tmp_path / "w.npy", w)
    save_bf16(tmp_path / "y.npy", split_k_bf16(x, w, 4))
    r = run_cli("--server", server, "diagnose", "--input", str(tmp_path / "x.npy"),
                "--weight", str(tmp_path / "w.npy"), "--observed", str(tmp_path / "y.npy"),
                *BF16, "--dtype", "observed=bf16", "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    d = json.loads(r.stdout)["diagnosis"]
    assert d["best"] == "cpu:bf16:none@splitk=4,reduce=output", d
    assert d["candidate_tiers"] == [1, 2]
    assert "allow_bf16_reduced_precision_reduction" in d["framework_hint"]
