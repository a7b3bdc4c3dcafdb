"""The golden model checks (tests/golden/model_check/<case>/): the JSON
report `tensorcheck sweep --json` wrote for each case, which the Python
client's ModelReport must reproduce from the same responses.

Each layer call of a case's report.json carries the server's whole answer
(`response`, in protobuf's JSON mapping) besides the keys of
docs/model-checks.md. A ModelReport built from those answers, as
`check_captures` builds one from the Client's (the layer call's metadata,
its response through the Client's path, the run's options), gives the
same object from to_dict(): the per-call decisions the server's, the
consensus and the first divergence Python's own, by the same rules as the
CLI's. Its JUnit file (to_junit) is what `tensorcheck render` draws from
that JSON, so it is junit.xml byte for byte (those tests run the CLI: the
`cli` fixture, conftest.py). Python's text summary is its own, not the
CLI's table (docs/model-checks.md), so summary.txt is the CLI's alone.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import json_format

from tensorcheck._model import LayerCheck, ModelReport
from tensorcheck._pb import pb
from tensorcheck._report import Report

GOLDEN = Path(__file__).resolve().parents[3] / "tests" / "golden" / "model_check"
CASES = sorted(p.parent.name for p in GOLDEN.glob("*/report.json"))

# Keys of Python's to_dict() that the CLI's JSON does not have: the bytes
# sent inline, and why a run stopped early (the CLI exits with a code).
PYTHON_ONLY = {"sent_bytes", "error"}


def _layer(j: dict[str, Any]) -> LayerCheck:
    """A layer call as check_captures leaves it: its metadata, then the
    server's answer, or, for one without an answer, how its request went
    (which no response can say)."""
    layer = LayerCheck(
        j["name"],
        j["call"],
        tuple(j["input_shape"]),
        tuple(j["weight_shape"]),
        j["weight_layout"],
        j["dtype"],
    )
    if j["response"] is None:
        layer.status, layer.error, layer.error_code = j["status"], j["error"], j["error_code"]
        return layer
    response = json_format.Parse(json.dumps(j["response"]), pb.VerifyResponse())
    # The bytes of the call's tensors, the client's count, not the server's.
    counts = j["report"]
    layer._fill(
        Report._of_response(
            response,
            None,
            uploaded_bytes=counts["uploaded_bytes"],
            reused_bytes=counts["reused_bytes"],
        )
    )
    return layer


def _report(golden: dict[str, Any]) -> ModelReport:
    return ModelReport(
        [_layer(j) for j in golden["layers"]],
        bound_threshold=golden["bound_threshold"],
        diagnose=golden["diagnose"],
        uploaded_bytes=golden["uploaded_bytes"],
        reused_bytes=golden["reused_bytes"],
    )


def test_there_are_golden_cases() -> None:
    if not GOLDEN.is_dir():
        pytest.skip(f"no golden fixtures at {GOLDEN} (a client checkout without tests/)")
    assert CASES, f"no case in {GOLDEN}"


@pytest.mark.parametrize("case", CASES)
def test_to_dict_reproduces_the_clis_json_report(case: str) -> None:
    golden = json.loads((GOLDEN / case / "report.json").read_text())
    got = json.loads(json.dumps(_report(golden).to_dict(), allow_nan=False))
    assert set(got) - PYTHON_ONLY == set(golden)
    assert len(got["layers"]) == len(golden["layers"])
    for i, (mine, theirs) in enumerate(zip(got["layers"], golden["layers"])):
        assert set(mine) == set(theirs), f"layers[{i}]"
        for key in theirs:
            assert mine[key] == theirs[key], f"layers[{i}].{key}"
    for key in set(golden) - {"layers"}:
        assert got[key] == golden[key], key


@pytest.mark.parametrize("case", CASES)
def test_the_per_call_decisions_are_the_responses(case: str) -> None:
    # What the JSON says of each answered layer call is what its response's
    # CallDecision says: Python decides none of it again.
    golden = json.loads((GOLDEN / case / "report.json").read_text())
    report = _report(golden)
    for layer, j in zip(report.layers, golden["layers"]):
        if j["response"] is None:
            continue
        call = j["response"].get("call", {})
        assert layer.explained == call.get("explained", False) == j["explained"]
        assert layer.configs_explaining == set(call.get("explaining", []))
        if call.get("divergence") or call.get("boundExceeded"):
            assert layer.status == j["status"] == "failed"


@pytest.mark.parametrize("case", CASES)
def test_to_junit_is_the_clis_junit_byte_for_byte(case: str, cli: Path, tmp_path: Path) -> None:
    golden = json.loads((GOLDEN / case / "report.json").read_text())
    path = tmp_path / "junit.xml"
    _report(golden).to_junit(path)
    assert path.read_bytes() == (GOLDEN / case / "junit.xml").read_bytes()
