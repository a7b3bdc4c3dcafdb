"""Split-K through the Python client against a live server
(docs/numerics.md, "Split-K"): a named configuration computes the
definition, redone here with numpy and ml_dtypes on small integers whose
sums are exact (slices of ceil(K/N) rounded up to a multiple of 8, each
partial rounded to bfloat16 and added left to right in bfloat16)."""

from __future__ import annotations

import ml_dtypes
import numpy as np


def _bf16(v: np.ndarray) -> np.ndarray:
    return v.astype(np.float32).astype(ml_dtypes.bfloat16).astype(np.float64)


def test_a_split_k_configuration_is_the_definition(client):
    rng = np.random.default_rng(31)
    x = rng.integers(-8, 9, size=(4, 200)).astype(np.float64) / 8
    w = rng.integers(-8, 9, size=(16, 200)).astype(np.float64) / 4
    size = 72  # ceil(200 / 3) = 67, rounded up to a multiple of 8
    r = None
    for k0 in range(0, 200, size):
        p = _bf16(x[:, k0 : k0 + size] @ w[:, k0 : k0 + size].T)
        r = p if r is None else _bf16(r + p)
    report = client.verify_linear(
        x.astype(ml_dtypes.bfloat16),
        w.astype(ml_dtypes.bfloat16),
        configs=["cpu:bf16@splitk=3"],
        return_outputs=True,
    )
    assert [c.config for c in report.results] == ["cpu:bf16:none@splitk=3,reduce=output"]
    out = report.results[0].output
    assert out is not None and out.dtype == ml_dtypes.bfloat16
    np.testing.assert_array_equal(out.astype(np.float64), r)
    # The reduction in bf16 rounds more than once: this layer shows it.
    assert not np.array_equal(r, _bf16(x @ w.T))
