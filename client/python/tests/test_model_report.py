"""ModelReport: the divergence rules on hand-built diagnoses, and the
report's outputs (to_dict, save_captures, which the CLI's `tensorcheck
sweep` reads, and to_junit, to_html and to_github, which the CLI's
`tensorcheck render` draws from to_dict(): the `cli` fixture, conftest.py)
on a small torch model."""

from __future__ import annotations

import json
import pickle
import struct
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any, Optional

import pytest

import tensorcheck
from tensorcheck._model import LayerCheck, ModelReport
from tensorcheck._model_types import NO_CALL_DECISION
from tensorcheck._pb import pb
from tensorcheck._report import Report

# --- the rules, on diagnoses written by hand -------------------------------------------


def _layer(
    name: str,
    best: str,
    equivalent: tuple[str, ...] = (),
    *,
    bound_ratio: Optional[float] = None,
    verdict: int = pb.VERDICT_PASS,
    diagnosis_verdict: int = pb.Diagnosis.VERDICT_UNSPECIFIED,
    verdict_reason: str = "",
    headline: str = "",
    advice: str = "",
    explaining: Optional[tuple[str, ...]] = None,
    divergence: str = "",
    bound_reason: str = "",
) -> LayerCheck:
    """A layer call's Diagnose answer, written by hand, with the server's
    decisions about it (`call`, docs/api.md) as each case states them:
    explained when it names a `best`; `explaining` (default: best, then
    `equivalent`); its own `divergence` and the `bound_reason` of a
    bound_ratio over the threshold, 3, as the server words them."""
    resp = pb.VerifyResponse(verdict=verdict)
    resp.call.explained = bool(best)
    if explaining is None:
        explaining = (best, *equivalent) if best else ()
    resp.call.explaining.extend(explaining)
    resp.call.divergence = divergence
    resp.call.bound_threshold = 3.0
    resp.call.bound_exceeded = bool(bound_reason)
    resp.call.bound_reason = bound_reason
    resp.diagnosis.best = best
    resp.diagnosis.verdict = diagnosis_verdict
    resp.diagnosis.verdict_reason = verdict_reason
    resp.diagnosis.headline = headline
    resp.diagnosis.advice = advice
    resp.diagnosis.equivalent.extend(equivalent)
    resp.diagnosis.confidence = 0.9 if best else 0.0
    stats = resp.observed_vs_reference
    stats.total = 8
    if bound_ratio is not None:
        stats.bound_ratio.value = bound_ratio
    layer = LayerCheck(name, 0, (2, 4), (8, 4), "out_in", "bfloat16")
    layer._fill(Report.from_proto(resp))
    return layer


FUSED, UNFUSED = "cpu:bf16:fused", "cpu:bf16:unfused"


def test_a_layer_matching_another_configuration_than_the_rest_diverges() -> None:
    layers = [_layer(f"l{i}", FUSED) for i in range(4)]
    layers.insert(2, _layer("odd", UNFUSED))
    report = ModelReport(layers)
    assert report.consensus == FUSED
    first = report.first_divergence()
    assert first is not None and first.name == "odd"
    assert first.divergence_reason == f"matches {UNFUSED}, while 4 of 5 layers match {FUSED}"
    assert [layer.status for layer in layers] == ["passed"] * 2 + ["failed"] + ["passed"] * 2
    assert not report.passed


def test_equivalents_and_a_bias_free_layer_agree_with_the_consensus() -> None:
    # fp32 and bf16 input rounding are one function for bf16 storage; a
    # layer without a bias runs b:p:none, which fused and unfused equal.
    layers = [
        _layer("a", "cpu:fp32:fused", (FUSED,)),
        _layer("b", FUSED),
        # Without a bias the server lists fused and unfused after none.
        _layer("lm_head", "cpu:bf16:none", explaining=("cpu:bf16:none", FUSED, UNFUSED)),
    ]
    report = ModelReport(layers)
    assert report.consensus == FUSED
    assert report.first_divergence() is None
    assert report.passed


def test_unexplained_and_bound_ratio_rules_and_their_order() -> None:
    layers = [
        _layer("a", FUSED, bound_ratio=1.0),
        _layer("b", FUSED, bound_ratio=3.5, bound_reason="bound_ratio 3.5 exceeds 3"),
        _layer(
            "c",
            "",
            bound_ratio=9.0,
            divergence="no candidate explains its output",
            bound_reason="bound_ratio 9 exceeds 3",
        ),
    ]
    report = ModelReport(layers)
    first = report.first_divergence()
    assert first is not None and first.name == "b"
    assert first.divergence_reason == "bound_ratio 3.5 exceeds 3"
    assert layers[2].divergence_reason == "no candidate explains its output"
    # A looser threshold leaves b; c stays unexplained.
    first = report.first_divergence(threshold=4)
    assert first is not None and first.name == "c"


def test_a_nan_bound_ratio_over_the_threshold_diverges_as_the_server_decided() -> None:
    # NaN is not at most 3: the server says it exceeds it, and so does a
    # what-if threshold (docs/model-checks.md, "The rules").
    nan = float("nan")
    layers = [
        _layer("a", FUSED, bound_ratio=1.0),
        _layer("b", FUSED, bound_ratio=nan, bound_reason="bound_ratio nan exceeds 3"),
    ]
    report = ModelReport(layers)
    first = report.first_divergence()
    assert first is not None and first.name == "b"
    assert first.divergence_reason == "bound_ratio nan exceeds 3"
    assert [layer.status for layer in layers] == ["passed", "failed"]
    first = report.first_divergence(threshold=1e9)
    assert first is not None and first.divergence_reason == "bound_ratio nan exceeds 1e+09"


def test_the_bound_ratio_is_the_servers_decision_at_the_runs_threshold() -> None:
    # At the run's threshold the report reads the server's decision and
    # never applies the rule again: a call the server did not find over it
    # (written so by hand here, 3.5 without bound_exceeded) passes.
    layers = [_layer("a", FUSED, bound_ratio=3.5)]
    assert ModelReport(layers).first_divergence() is None
    # A report made at another threshold than the run's is a what-if,
    # judged by the rule: 3.5 is not at most 2.
    report = ModelReport([_layer("a", FUSED, bound_ratio=3.5)], bound_threshold=2.0)
    first = report.first_divergence()
    assert first is not None and first.divergence_reason == "bound_ratio 3.5 exceeds 2"
    assert report.layers[0].status == "failed"


def test_a_response_without_call_decisions_is_an_error_naming_the_field() -> None:
    # A server that predates CallDecision: its calls are not judged (the
    # rules' per-call part is the server's), so they are errors, and the
    # others' consensus and divergences stand without them.
    old = pb.VerifyResponse(verdict=pb.VERDICT_PASS)
    old.diagnosis.best = UNFUSED
    old.diagnosis.confidence = 0.9
    legacy = LayerCheck("old", 0, (2, 4), (8, 4), "out_in", "bfloat16")
    legacy._fill(Report.from_proto(old))
    report = ModelReport([_layer("a", FUSED), legacy, _layer("c", FUSED)])
    assert legacy.status == "error" and not legacy.checked
    assert legacy.error == NO_CALL_DECISION
    assert "VerifyResponse.call" in legacy.error
    assert not legacy.explained and legacy.configs_explaining == set()
    assert report.consensus == FUSED and report.first_divergence() is None
    assert not report.passed
    d = report.to_dict()
    assert d["layers_checked"] == 2 and d["layers"][1]["status"] == "error"
    assert d["layers"][1]["error"] == legacy.error and d["layers"][1]["best"] is None
    assert f"\n  #1 old: ERROR: {legacy.error}\n" in report.summary()


# The server's sentence for a defect, as it writes them (docs/numerics.md, "Verdict").
_DEFECT_REASON = (
    f"Defect: {FUSED} explains the bulk of the output, but not all of it: 1 element(s) lie "
    "beyond 5.2 predicted standard errors of it (largest 2 ULP, 40 sigma). Look at output "
    "column 3 \N{LEFT RIGHT ARROW} weight row 3 (out_in layout) and bias element 3."
)


_DEFECT_HEADLINE = (
    "Not rounding: cpu:bf16:fused explains the output except column 3 (4 element(s) beyond "
    "5.9 predicted standard errors, largest 12 ULP). Look at output column 3."
)


def test_a_defect_verdict_is_a_divergence_with_the_servers_reason() -> None:
    # "odd" matches the consensus and its bound_ratio is ordinary: only the
    # server's verdict says that something in it is not rounding.
    rounding = pb.Diagnosis.VERDICT_ROUNDING
    layers = [
        _layer("a", FUSED, diagnosis_verdict=rounding, verdict_reason="Rounding: fine."),
        _layer(
            "odd",
            FUSED,
            bound_ratio=1.1,
            diagnosis_verdict=pb.Diagnosis.VERDICT_DEFECT,
            verdict_reason=_DEFECT_REASON,
            headline=_DEFECT_HEADLINE,
            divergence=_DEFECT_REASON,
        ),
        _layer(
            "c",
            FUSED,
            bound_ratio=9.0,
            diagnosis_verdict=rounding,
            bound_reason="bound_ratio 9 exceeds 3",
        ),
    ]
    report = ModelReport(layers)
    assert report.consensus == FUSED
    first = report.first_divergence()
    assert first is not None and first.name == "odd"
    assert first.divergence_reason == _DEFECT_REASON
    assert [layer.status for layer in layers] == ["passed", "failed", "failed"]
    assert (first.diagnosis_verdict, first.verdict_reason) == ("defect", _DEFECT_REASON)
    assert (first.verdict, layers[0].diagnosis_verdict) == ("pass", "rounding")
    # Also with the expected configurations in place of the consensus.
    assert report.first_divergence(expected=FUSED) is first
    assert first.divergence_reason == _DEFECT_REASON
    d = report.to_dict()
    assert d["first_divergence"]["reason"] == _DEFECT_REASON
    assert d["layers"][1]["diagnosis_verdict"] == "defect"
    assert d["layers"][1]["verdict_reason"] == _DEFECT_REASON
    assert d["layers"][0]["verdict_reason"] == "Rounding: fine."
    # The server's sentence ends in its own full stop: rendered once. A
    # layer call is #index, from 0, as in the table's first column.
    summary = report.summary()
    assert f"First divergence: #1 odd: {_DEFECT_REASON}\n" in summary
    # Each layer call that did not pass: its status word, then the server's
    # headline (else the rule it broke).
    assert f"\n  #1 odd: FAIL: {_DEFECT_HEADLINE}\n" in summary
    assert "\n  #2 c: FAIL: bound_ratio 9 exceeds 3.\n" in summary
    with pytest.raises(AssertionError) as e:
        tensorcheck.assert_model_parity(report)
    lines = str(e.value).splitlines()
    # The server's answer first; then where (its reason is the verdict's,
    # not repeated).
    assert lines[:2] == [
        _DEFECT_HEADLINE,
        "Model parity FAIL at layer call #1 odd (of 3, numbered from 0)",
    ]


def test_an_unexplained_verdict_with_a_best_match_diverges() -> None:
    reason = "Unexplained: no candidate explains the bulk of the output."
    layers = [
        _layer("a", FUSED),
        _layer(
            "b",
            FUSED,
            diagnosis_verdict=pb.Diagnosis.VERDICT_UNEXPLAINED,
            verdict_reason=reason,
            divergence=reason,
        ),
        _layer("c", FUSED),
    ]
    first = ModelReport(layers).first_divergence()
    assert first is not None and first.name == "b"
    assert first.divergence_reason == reason


def test_without_a_diagnosis_verdict_nothing_changes() -> None:
    # A server that predates the verdict.
    report = ModelReport([_layer("a", FUSED), _layer("b", FUSED)])
    assert report.first_divergence() is None and report.passed
    layer = report.to_dict()["layers"][0]
    assert layer["diagnosis_verdict"] is None and layer["verdict_reason"] is None


def test_no_consensus_below_half_and_expected_overrides_it() -> None:
    layers = [_layer("a", FUSED), _layer("b", UNFUSED), _layer("c", "cpu:fp32:fused")]
    report = ModelReport(layers)
    assert report.consensus is None
    assert report.first_divergence() is None
    first = report.first_divergence(expected=FUSED)
    assert first is not None and first.name == "b"
    assert first.divergence_reason == f"matches {UNFUSED}, not the expected {FUSED}"


def test_a_failed_verdict_fails_the_layer_without_a_divergence() -> None:
    report = ModelReport([_layer("a", FUSED, verdict=pb.VERDICT_FAIL), _layer("b", FUSED)])
    assert report.first_divergence() is None
    assert [layer.status for layer in report.layers] == ["failed", "passed"]
    with pytest.raises(AssertionError) as e:
        tensorcheck.assert_model_parity(report)
    # No headline (an older server): where it is comes first, with the rule.
    assert str(e.value).splitlines()[0] == (
        "Model parity FAIL at layer call #0 a (of 2, numbered from 0): "
        "verdict FAIL under the tolerance."
    )


def test_summary_status_words_are_the_servers_and_rows_numbered_from_0() -> None:
    advice = "To get cpu:bf16:fused (PyTorch's default): a sentence of the server's."
    rounding = "Rounding, not a bug: the output is cpu:bf16:unfused bit for bit."
    report = ModelReport(
        [
            _layer("a", FUSED),
            _layer("odd", UNFUSED, headline=rounding, advice=advice),
            _layer("c", FUSED),
        ]
    )
    lines = report.summary().splitlines()
    table = lines[1:6]
    assert table[0].split()[:2] == ["#", "layer"]
    status = table[0].index("status")
    assert [row[status : status + 4] for row in table[2:]] == ["PASS", "FAIL", "PASS"]
    assert [row.split()[0] for row in table[2:]] == ["0", "1", "2"]
    first = [line for line in lines if line.startswith("First divergence:")]
    assert first == [
        f"First divergence: #1 odd: matches {UNFUSED}, while 2 of 3 layers match {FUSED}."
    ]
    # The failed row: the server's headline, the model's rule it broke and
    # the advice beneath.
    i = lines.index(f"  #1 odd: FAIL: {rounding}")
    assert lines[i + 1 : i + 3] == [
        f"      Rule: matches {UNFUSED}, while 2 of 3 layers match {FUSED}.",
        f"      Advice: {advice}",
    ]
    assert "passed" not in "\n".join(lines) and "FAILED" not in "\n".join(lines)


def test_summary_max_ulp_leaves_out_elements_near_zero_and_counts_them() -> None:
    layer = _layer("a", FUSED)
    r = pb.VerifyResponse(verdict=pb.VERDICT_PASS)
    r.diagnosis.best = FUSED
    r.call.explained = True
    r.call.explaining.append(FUSED)
    r.call.bound_threshold = 3.0
    r.observed_vs_reference.total = 8
    r.observed_vs_reference.max_ulp = 1901874441
    r.observed_vs_reference.negligible.differing = 3
    r.observed_vs_reference.negligible.significant_max_ulp = 2
    layer._fill(Report.from_proto(r))
    report = ModelReport([layer])
    row = report.summary().splitlines()[3]
    assert "2 (3 near 0)" in row and "1901874441" not in row
    d = report.to_dict()["layers"][0]
    assert d["max_ulp"] == 1901874441 and d["negligible"]["significant_max_ulp"] == 2


def test_a_model_failure_message_is_at_most_25_lines_headline_first() -> None:
    # 40 layer calls, every one a defect: the message lists the first few
    # and stays within 25 lines; the table is the report's.
    defect = pb.Diagnosis.VERDICT_DEFECT
    layers = [
        _layer(
            f"l{i}",
            FUSED,
            diagnosis_verdict=defect,
            verdict_reason=f"Reason {i}.",
            divergence=f"Reason {i}.",
            headline=f"Not rounding: layer {i}. Look at column {i}.",
        )
        for i in range(40)
    ]
    with pytest.raises(AssertionError) as e:
        tensorcheck.assert_model_parity(ModelReport(layers))
    lines = str(e.value).splitlines()
    assert len(lines) <= 25
    assert lines[0] == "Not rounding: layer 0. Look at column 0."
    assert lines[1] == "Model parity FAIL at layer call #0 l0 (of 40, numbered from 0)"
    assert "  #7 l7: FAIL: Not rounding: layer 7. Look at column 7." in lines
    assert "  ... 32 more" in lines


def test_compare_models_describes_where_each_model_changes() -> None:
    a = ModelReport([_layer(n, FUSED) for n in ("x", "y", "z")])
    b = ModelReport([_layer("x", FUSED), _layer("y", UNFUSED), _layer("z", UNFUSED)])
    text = tensorcheck.compare_models(a, b, names=("torch", "port")).summary()
    assert text.splitlines()[0] == f"torch: {FUSED} everywhere"
    # The port's consensus is unfused (2 of 3), so it reads from its start.
    assert text.splitlines()[1] == f"port: {FUSED} up to x, {UNFUSED} from y on"
    assert "First difference: y:" in text


# --- the artifacts `tensorcheck render` draws --------------------------------------------


def test_without_the_cli_to_junit_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    report = ModelReport([_layer("a", FUSED)])
    path = tmp_path / "model.xml"
    monkeypatch.delenv("TENSORCHECK_CLI", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))  # no `tensorcheck` there
    with pytest.raises(tensorcheck.CliNotFoundError) as e:
        report.to_junit(path)
    assert isinstance(e.value, tensorcheck.Error)
    message = str(e.value)
    assert "no `tensorcheck` on PATH and TENSORCHECK_CLI is unset" in message
    assert "tensorcheck render" in message and "cmake --build build" in message
    # A TENSORCHECK_CLI that names nothing: that path, in the message.
    nowhere = tmp_path / "nowhere" / "tensorcheck"
    monkeypatch.setenv("TENSORCHECK_CLI", str(nowhere))
    with pytest.raises(tensorcheck.CliNotFoundError) as e:
        report.to_html(path)
    assert str(e.value).startswith(
        f"FAILED_PRECONDITION (render): TENSORCHECK_CLI={nowhere}: no executable file there."
    )
    assert not path.exists()


def test_a_report_render_cannot_read_raises_the_clis_message(cli: Path, tmp_path: Path) -> None:
    # The CLI checks FP8 layers one by one but a model's layer calls in
    # its four float dtypes only: render names the JSON path it rejects.
    fp8 = LayerCheck("fp8", 0, (2, 4), (8, 4), "out_in", "float8_e4m3fn")
    fp8._fill(_layer("fp8", FUSED).report)  # type: ignore[arg-type]
    path = tmp_path / "model.xml"
    with pytest.raises(tensorcheck.InvalidArgumentError, match=r"layers\[0\]\.dtype: .*float8"):
        ModelReport([fp8]).to_junit(path)
    assert not path.exists()


def test_the_page_is_titled_by_the_framework_and_model(cli: Path, tmp_path: Path) -> None:
    report = ModelReport([_layer("a", FUSED)], framework="torch", model="gpt2")
    assert (report.to_dict()["framework"], report.to_dict()["model"]) == ("torch", "gpt2")
    path = tmp_path / "model.html"
    report.to_html(path)
    page = path.read_text()
    assert "<title>tensorcheck torch gpt2 report</title>" in page
    assert "<h1>tensorcheck torch gpt2</h1>" in page
    # Unnamed: no keys, the sweep's own title.
    assert "model" not in ModelReport([_layer("a", FUSED)]).to_dict()


def test_a_rejected_request_renders_as_an_error_case(cli: Path, tmp_path: Path) -> None:
    # render exits 2 for this report's result (a request the server
    # rejected), as it does for a report it cannot read: the file tells
    # them apart.
    rejected = LayerCheck("g", 0, (2, 4), (8, 4), "out_in", "bfloat16", status="error")
    rejected.error = "INVALID_ARGUMENT (Diagnose): op.bias: 3 elements, expected 8"
    rejected.error_code = "INVALID_ARGUMENT"
    path = tmp_path / "model.xml"
    ModelReport([_layer("a", FUSED), rejected]).to_junit(path)
    suite = ET.parse(path).getroot().findall("testsuite")[0]
    assert (suite.get("tests"), suite.get("errors"), suite.get("failures")) == ("2", "1", "0")
    error = suite.findall("testcase")[1].find("error")
    assert error is not None and error.get("message") == rejected.error


def test_to_github_returns_the_annotations_and_appends_the_summary(
    cli: Path, tmp_path: Path
) -> None:
    report = ModelReport([_layer("a", FUSED), _layer("odd", UNFUSED), _layer("c", FUSED)])
    summary = tmp_path / "summary.md"
    summary.write_text("before\n")
    annotations = report.to_github(summary)
    reason = f"matches {UNFUSED}, while 2 of 3 layers match {FUSED}"
    # One per failed layer call, then the run's line.
    assert annotations.splitlines() == [
        f"::error title=tensorcheck sweep%3A odd::{reason}",
        f"::error title=tensorcheck sweep::First divergence: #1 odd (of 3 layer calls): {reason}",
    ]
    text = summary.read_text()
    assert text.startswith("before\n")
    assert "| 1 | `odd` | `cpu:bf16:unfused` | 0.90 | **FAIL** |" in text


def test_a_report_without_its_responses_is_not_rendered(tmp_path: Path) -> None:
    # An unpickled report keeps the fields, not the response render reads.
    layer = _layer("a", FUSED)
    layer.report = pickle.loads(pickle.dumps(layer.report))
    with pytest.raises(ValueError, match="layer call a: its report no longer holds"):
        ModelReport([layer]).to_junit(tmp_path / "model.xml")


# --- the outputs, on a small torch model --------------------------------------------------

torch = pytest.importorskip("torch")

# The JSON keys of docs/model-checks.md, written out.
_REPORT_KEYS = {
    "layers",
    "first_divergence",
    "consensus",
    "layers_checked",
    "layers_total",
    "passed",
    "uploaded_bytes",
    "reused_bytes",
    "sent_bytes",
    "error",
    "diagnose",
    "bound_threshold",
    # Set for a torch or Flax model's report.
    "framework",
    "model",
}
_LAYER_KEYS = {
    "name",
    "call",
    "input_shape",
    "weight_shape",
    "weight_layout",
    "dtype",
    "status",
    "verdict",
    "diagnosis_verdict",
    "verdict_reason",
    "best",
    "confidence",
    "equivalent",
    "tied",
    "explained",
    "max_abs",
    "max_ulp",
    "negligible",
    "bound_ratio",
    "columns",
    "rows",
    "explanation",
    "error",
    "report",
    "error_code",
    "response",
}


class _Net(torch.nn.Module):  # type: ignore[misc]
    def __init__(self) -> None:
        super().__init__()
        self.up = torch.nn.Linear(32, 64)
        self.down = torch.nn.Linear(64, 32)

    def forward(self, x: Any) -> Any:
        a = self.down(torch.relu(self.up(x)))
        return a + self.down(self.up(a))  # each module called twice


@pytest.fixture(scope="module")
def net_report(target: str) -> tuple[ModelReport, Any, Any]:
    import tensorcheck.torch

    torch.manual_seed(0)
    net = _Net().to(torch.bfloat16)
    x = torch.randn(3, 32).to(torch.bfloat16)
    return tensorcheck.torch.check_linears(net, x, server=target), net, x


def test_rows_per_call_and_the_json_keys(net_report: tuple[ModelReport, Any, Any]) -> None:
    report, _, _ = net_report
    assert [layer.label for layer in report.layers] == ["up", "down", "up#1", "down#1"]
    d = json.loads(json.dumps(report.to_dict()))
    assert set(d) == _REPORT_KEYS
    assert all(set(layer) == _LAYER_KEYS for layer in d["layers"])
    assert d["layers_total"] == 4 and d["layers_checked"] == 4
    assert d["passed"] is True and d["first_divergence"] is None
    # up's weight and bias and down's went up once, used by four calls.
    assert d["uploaded_bytes"] == 2 * (64 * 32 + 64 + 32 * 64 + 32)


def test_junit_has_one_case_per_layer_call(
    net_report: tuple[ModelReport, Any, Any], cli: Path, tmp_path: Path
) -> None:
    report, _, _ = net_report
    path = tmp_path / "model.xml"
    report.to_junit(path)
    root = ET.parse(path).getroot()
    # render's JUnit: one <testsuite> in <testsuites>.
    assert root.tag == "testsuites" and len(root.findall("testsuite")) == 1
    suite = root.findall("testsuite")[0]
    assert suite.get("tests") == "4"
    cases = suite.findall("testcase")
    assert [c.get("name") for c in cases] == ["up", "down", "up#1", "down#1"]
    assert not suite.findall(".//failure")


def test_html_is_one_self_contained_page(
    net_report: tuple[ModelReport, Any, Any], cli: Path, tmp_path: Path
) -> None:
    report, _, _ = net_report
    path = tmp_path / "model.html"
    report.to_html(path)
    page = path.read_text()
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")
    assert "<svg" in page and "bound_ratio" in page
    for label in ("up", "down", "up#1", "down#1"):
        assert label in page
    assert "http://" not in page and "https://" not in page  # nothing outside the page


@pytest.mark.parametrize("max_inline", [0, 1], ids=["inline", "by_digest"])
def test_html_draws_heatmaps_of_the_observed_outputs(
    target: str, cli: Path, tmp_path: Path, max_inline: int
) -> None:
    # The observed outputs go to render as a captures file, the returned
    # ones in the responses: inline (0: the server's default size, above
    # these outputs), or, at 1 byte, every one by digest, which the client
    # read and gives render as data, as `sweep --html` does.
    import tensorcheck.torch

    torch.manual_seed(0)
    net = _Net().to(torch.bfloat16)
    x = torch.randn(3, 32).to(torch.bfloat16)
    options = {"return_outputs": True, "max_inline_output_bytes": max_inline}
    report = tensorcheck.torch.check_linears(net, x, server=target, verify_options=options)
    responses = [layer["response"] for layer in report.to_dict()["layers"]]
    assert ["digest" in r["reference"]["output"] for r in responses] == [bool(max_inline)] * 4
    path = tmp_path / "model.html"
    report.to_html(path)
    page = path.read_text()
    # Per layer call, |observed - reference| and |observed - best|.
    assert page.count('href="data:image/png;base64,') == 8
    assert "no heatmap" not in page


def _read_safetensors(path: Path) -> tuple[dict[str, Any], bytes]:
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8 : 8 + n]), raw[8 + n :]


def test_save_captures_writes_the_calls_in_order(
    net_report: tuple[ModelReport, Any, Any], tmp_path: Path
) -> None:
    report, net, x = net_report
    path = tmp_path / "captures.safetensors"
    report.save_captures(path, weights=True)
    header, data = _read_safetensors(path)
    order = json.loads(header["__metadata__"]["tensorcheck.layers"])
    assert order == ["up", "down", "up#1", "down#1"]
    # The first call's input is x itself, its weight the module's.
    entry = header["up.input"]
    assert entry["dtype"] == "BF16" and entry["shape"] == [3, 32]
    lo, hi = entry["data_offsets"]
    want = x.view(torch.int16).numpy().tobytes()
    assert data[lo:hi] == want
    lo, hi = header["up.weight"]["data_offsets"]
    assert data[lo:hi] == net.up.weight.detach().view(torch.int16).numpy().tobytes()
    assert header["down.bias"]["shape"] == [32]
    assert "up#1.weight" not in header  # parameters once, by module


def test_the_cli_sweeps_the_captures_python_wrote(
    net_report: tuple[ModelReport, Any, Any], target: str, cli: Path, tmp_path: Path
) -> None:
    report, _, _ = net_report
    path = tmp_path / "captures.safetensors"
    report.save_captures(path, weights=True)
    out = subprocess.run(
        [str(cli), "--server", target, "sweep", "--weights", str(path), "--captures", str(path)]
        + ["--json", "--no-progress"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    sweep = json.loads(out.stdout)
    assert [(layer["name"], layer["call"]) for layer in sweep["layers"]] == [
        (layer.name, layer.call) for layer in report.layers
    ]
    assert [layer["best"] for layer in sweep["layers"]] == [layer.best for layer in report.layers]
    assert sweep["first_divergence"] is None


def test_no_layers_is_an_empty_report_with_a_clear_summary() -> None:
    import tensorcheck.torch

    with pytest.warns(UserWarning, match="ran no torch.nn.Linear"):
        report = tensorcheck.torch.check_linears(torch.nn.ReLU(), torch.ones(2), server="x:1")
    assert report.layers == [] and not report.passed
    assert "nothing was checked" in report.summary()
    with pytest.raises(ValueError, match="no captures"):
        report.save_captures("unused.safetensors")
