"""End-to-end tests of the CLI's --algorithm-sweep, --batch-invariance and
--batch-sizes against a server's CPU backend: one algorithm (a sweep runs
each cpu configuration once, named without @algo) and batch invariant by
construction (every row is computed by the same loop whatever the batch).

The layer holds small integers, so every fp32 partial sum is exact and the
observed output, computed here in float64, is reproduced bit for bit.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from e2e_support import run_cli

M, K, N = 7, 8, 4


@pytest.fixture()
def files(tmp_path: Path) -> Path:
    rng = np.random.default_rng(5)
    x = rng.integers(-4, 5, size=(M, K)).astype(np.float32)
    w = rng.integers(-4, 5, size=(N, K)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "w.npy", w)
    np.save(tmp_path / "y.npy", (x.astype(np.float64) @ w.astype(np.float64).T).astype(np.float32))
    return tmp_path


def layer(d: Path) -> list[str]:
    return ["--input", str(d / "x.npy"), "--weight", str(d / "w.npy")]


def test_verify_reports_batch_invariance_per_sub_batch(server: str, files: Path) -> None:
    r = run_cli("--server", server, "verify", *layer(files), "--config", "cpu:fp32",
                "--config", "cpu:fp32:none@algo=0", "--batch-invariance", "--batch-sizes", "3",
                "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    report = json.loads(r.stdout)
    assert [c["config"] for c in report["results"]][1].endswith("@algo=0")
    for c in [report["reference"], *report["results"]]:
        b = c["batch_invariance"]
        assert list(b) == ["invariant", "rows", "rows_differing", "max_ulp",
                           "full_batch_details", "sub_batches"]
        assert b["invariant"] is True
        assert (b["rows"], b["rows_differing"], b["max_ulp"]) == (M, 0, 0)
        assert [s["batch_size"] for s in b["sub_batches"]] == [1, 3]
        for s in b["sub_batches"]:
            assert list(s) == ["batch_size", "runs", "rows_differing", "max_ulp", "details",
                               "tail_rows", "tail_details"]
            assert s["runs"] == math.ceil(M / s["batch_size"])
            assert s["rows_differing"] == 0
        assert b["sub_batches"][1]["tail_rows"] == M % 3


def test_text_report_shows_the_verdict_and_each_sub_batch(server: str, files: Path) -> None:
    r = run_cli("--server", server, "verify", *layer(files), "--config", "cpu:fp32",
                "--batch-invariance", "--batch-sizes", "3")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "cpu:fp32:none: batch invariance: invariant" in r.stdout
    assert f"    batches of 1: {M} runs, invariant" in r.stdout
    assert f"    batches of 3: 3 runs (last of {M % 3}), invariant" in r.stdout


def test_without_the_flag_batch_invariance_is_null(server: str, files: Path) -> None:
    r = run_cli("--server", server, "verify", *layer(files), "--config", "cpu:fp32", "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    assert json.loads(r.stdout)["results"][0]["batch_invariance"] is None


def test_sweep_runs_each_cpu_candidate_once_and_marks_exact(server: str, files: Path) -> None:
    r = run_cli("--server", server, "diagnose", *layer(files), "--observed",
                str(files / "y.npy"), "--candidates", "cpu:fp32,cpu:bf16",
                "--algorithm-sweep", "3", "--json")
    assert r.returncode in (0, 1), r.stderr
    report = json.loads(r.stdout)
    names = sorted(c["config"] for c in report["results"])
    assert names == ["cpu:bf16:none", "cpu:fp32:none"]
    ranking = {c["config"]: c for c in report["diagnosis"]["ranking"]}
    assert ranking["cpu:fp32:none"]["exact"] is True
    assert isinstance(ranking["cpu:fp32:none"]["details"], dict)


def test_batch_sizes_without_batch_invariance_names_the_flag(server: str, files: Path) -> None:
    r = run_cli("--server", server, "verify", *layer(files), "--batch-sizes", "4")
    assert r.returncode == 2, r.stdout + r.stderr
    assert "--batch-sizes applies only with --batch-invariance" in r.stderr
