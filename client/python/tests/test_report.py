"""Report <- VerifyResponse and Report.to_dict() (docs/json-report.md),
on hand-built responses: no server."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

import tensorcheck
from tensorcheck._pb import pb
from tensorcheck._report import format_diagnosis, format_mismatch, format_share

UINT64_MAX = (1 << 64) - 1


def _stats(**overrides) -> pb.Stats:
    s = pb.Stats(
        total=4,
        mismatched=1,
        max_abs=float("inf"),
        max_abs_index=[1, 0],
        max_rel=float("nan"),
        max_rel_index=[1, 0],
        mean_abs=0.25,
        rms=0.5,
        rel_l2=1e-3,
        cosine=0.999,
        max_ulp=UINT64_MAX,
        mean_ulp=1.5,
        ulp_histogram=[
            pb.UlpBucket(lo=0, hi=0, count=3),
            pb.UlpBucket(lo=3, hi=4, count=1),
            pb.UlpBucket(lo=UINT64_MAX, hi=UINT64_MAX, count=1),
        ],
        bitwise_equal=False,
        bitwise_equal_count=3,
        nan_actual=1,
        nan_expected=0,
        inf_actual=0,
        inf_expected=0,
        nan_mismatch=1,
        worst=[
            pb.Element(
                index=[1, 0],
                actual=float("nan"),
                expected=2.0,
                actual_bits="0x7fc00000",
                expected_bits="0x40000000",
                abs_diff=float("nan"),
                rel_diff=float("-inf"),
                ulp=UINT64_MAX,
            )
        ],
        top_columns=[pb.Group(index=0, mismatched=1, share=1.0)],
        top_rows=[pb.Group(index=1, mismatched=1, share=1.0)],
        bound_precision="fp32",
        compared_dtype=pb.DTYPE_FLOAT32,
        passed=False,
    )
    for k, v in overrides.items():
        setattr(s, k, v)
    return s


def _response() -> pb.VerifyResponse:
    r = pb.VerifyResponse(verdict=pb.VERDICT_FAIL, output_shape=[2, 2], notes=["a note"])
    r.tolerance.preset = pb.Tolerance.PRESET_TORCH
    r.tolerance.atol.value = 1e-5
    r.tolerance.rtol.value = 1.3e-6
    r.tolerance.bound_factor = 1.0
    r.observed_vs_reference.CopyFrom(_stats())
    ref = r.reference
    ref.config = "cpu:fp64:none"
    ref.vs_reference.CopyFrom(
        _stats(max_ulp=0, max_abs=0.0, max_rel=0.0, mismatched=0, passed=True)
    )
    ref.elapsed_ms = 0.5
    ref.runs = 1
    ref.deterministic = True
    ref.output.CopyFrom(
        pb.Tensor(dtype=pb.DTYPE_FLOAT32, shape=[2, 2], data=np.arange(4, dtype="<f4").tobytes())
    )
    res = r.results.add(config="cpu:tf32:none", elapsed_ms=1.25, deterministic=True, runs=1)
    res.vs_reference.CopyFrom(_stats(max_ulp=7))
    res.vs_reference.bound_ratio.value = 1.1
    res.vs_observed.CopyFrom(_stats(max_ulp=2))
    res.details["algo"] = "sgemm"
    shared = r.results.add(
        config="cpu:bf16:none",
        elapsed_ms=0.25,
        deterministic=True,
        runs=1,
        shared_computation="cpu:tf32:none",
    )
    shared.vs_reference.CopyFrom(_stats(max_ulp=7))
    return r


STATS_KEYS = {
    "total",
    "mismatched",
    "max_abs",
    "max_abs_index",
    "max_rel",
    "max_rel_index",
    "mean_abs",
    "rms",
    "rel_l2",
    "cosine",
    "max_ulp",
    "mean_ulp",
    "bitwise_equal",
    "bitwise_equal_count",
    "ulp_histogram",
    "nan_actual",
    "nan_expected",
    "inf_actual",
    "inf_expected",
    "nan_mismatch",
    "worst",
    "top_columns",
    "top_rows",
    "bound_ratio",
    "bound_precision",
    "compared_dtype",
    "passed",
    "negligible",
}


def test_attributes_hold_real_values():
    report = tensorcheck.Report.from_proto(_response())
    assert report.verdict == "fail" and report.passed is False
    ovr = report.observed_vs_reference
    assert ovr.max_abs == math.inf and math.isnan(ovr.max_rel)
    assert ovr.max_ulp == math.inf  # NaN against a number
    assert ovr.max_abs_index == (1, 0)
    assert ovr.bound_ratio is None
    assert ovr.compared_dtype == "float32"
    assert report.results[0].vs_reference.bound_ratio == 1.1
    assert report.results[0].vs_observed.max_ulp == 2
    assert report.result("cpu:tf32").config == "cpu:tf32:none"
    assert report.reference.output.dtype == np.float32
    assert report.reference.output.tolist() == [[0.0, 1.0], [2.0, 3.0]]
    assert report.results[0].output is None
    assert report.results[0].shared_computation == ""
    assert report.result("cpu:bf16").shared_computation == "cpu:tf32:none"
    assert report.diagnosis is None
    assert report.tolerance.atol == 1e-5


def test_to_dict_is_the_documented_json_object():
    d = tensorcheck.Report.from_proto(_response()).to_dict()
    assert list(d) == [
        "verdict",
        "tolerance",
        "observed_vs_reference",
        "reference",
        "results",
        "output_shape",
        "notes",
        "diagnosis",
        "uploaded_bytes",
        "reused_bytes",
    ]
    assert d["verdict"] == "fail"
    assert d["tolerance"] == {
        "preset": "torch",
        "atol": 1e-05,
        "rtol": 1.3e-06,
        "max_ulp": 0,
        "bound_factor": 1.0,
        "nan_equal": False,
    }
    assert d["output_shape"] == [2, 2] and d["notes"] == ["a note"]
    assert d["diagnosis"] is None
    ovr = d["observed_vs_reference"]
    assert set(ovr) == STATS_KEYS
    assert ovr["max_abs"] == "inf" and ovr["max_rel"] == "nan" and ovr["max_ulp"] == "inf"
    assert ovr["max_abs_index"] == [1, 0]
    assert ovr["bound_ratio"] is None
    assert ovr["compared_dtype"] == "float32"
    assert ovr["ulp_histogram"] == [
        {"lo": 0, "hi": 0, "count": 3},
        {"lo": 3, "hi": 4, "count": 1},
        {"lo": "inf", "hi": "inf", "count": 1},
    ]
    assert ovr["worst"] == [
        {
            "index": [1, 0],
            "actual": "nan",
            "expected": 2.0,
            "actual_bits": "0x7fc00000",
            "expected_bits": "0x40000000",
            "abs_diff": "nan",
            "rel_diff": "-inf",
            "ulp": "inf",
        }
    ]
    assert ovr["top_columns"] == [{"index": 0, "mismatched": 1, "share": 1.0}]
    res = d["results"][0]
    assert list(res) == [
        "config",
        "vs_reference",
        "vs_observed",
        "elapsed_ms",
        "details",
        "deterministic",
        "runs",
        "shared_computation",
        "batch_invariance",
    ]
    assert res["shared_computation"] == ""
    assert res["batch_invariance"] is None
    assert d["results"][1]["shared_computation"] == "cpu:tf32:none"
    assert d["reference"]["shared_computation"] == ""
    assert res["vs_reference"]["bound_ratio"] == 1.1
    assert res["vs_observed"]["max_ulp"] == 2
    assert res["details"] == {"algo": "sgemm"}
    assert "output" not in d["reference"]
    # Strict JSON: no NaN/Infinity literals.
    json.dumps(d, allow_nan=False)


def test_unset_messages_are_null():
    r = pb.VerifyResponse(verdict=pb.VERDICT_PASS)
    res = r.results.add(config="cpu:fp32:none")
    res.vs_reference.CopyFrom(_stats(passed=True))
    d = tensorcheck.Report.from_proto(r).to_dict()
    assert d["observed_vs_reference"] is None
    assert d["results"][0]["vs_observed"] is None
    assert d["reference"] is None
    # The CLI prints the (default) tolerance message even when unset.
    assert d["tolerance"] == {
        "preset": "torch",
        "atol": None,
        "rtol": None,
        "max_ulp": 0,
        "bound_factor": 1.0,
        "nan_equal": False,
    }
    assert d["verdict"] == "pass"
    r.verdict = pb.VERDICT_UNSPECIFIED
    assert tensorcheck.Report.from_proto(r).to_dict()["verdict"] is None


def test_diagnosis_to_dict():
    r = pb.VerifyResponse(verdict=pb.VERDICT_FAIL)
    dg = r.diagnosis
    dg.best = "cpu:tf32:unfused"
    dg.equivalent.append("cpu:tf32rna:unfused")
    dg.confidence = 0.9
    rc = dg.ranking.add(
        config="cpu:tf32:unfused", bitwise_equal_fraction=0.75, max_ulp=1, mean_ulp=0.25
    )
    rc.bound_ratio.value = 0.98
    rc.disagreements = 3
    rc.expected_disagreements = 2.5
    rc.plausibility_p = 0.46
    rc.plausible = True
    rc.consistent_fraction = 1.0
    rc.compared_elements = 4
    dg.ranking.add(
        config="cpu:fp32:fused",
        bitwise_equal_fraction=0.0,
        max_ulp=UINT64_MAX,
        mean_ulp=float("inf"),
        disagreements=4,
        expected_disagreements=0.5,
        plausibility_p=float("nan"),
        consistent_fraction=0.25,
        compared_elements=4,
        ruled_out="4 of 4 elements differ where 0.5 are expected.",
        shared_computation="cpu:fp32:unfused",
    )
    dg.framework_hint = "JAX/Flax default on Ampere+"
    dg.localization.columns.add(index=3, mismatched=2, share=0.5)
    dg.explanation = "TF32."
    d = tensorcheck.Report.from_proto(r).to_dict()["diagnosis"]
    assert d == {
        "best": "cpu:tf32:unfused",
        "equivalent": ["cpu:tf32rna:unfused"],
        "tied": [],
        "confidence": 0.9,
        "ranking": [
            {
                "config": "cpu:tf32:unfused",
                "bitwise_equal_fraction": 0.75,
                "max_ulp": 1,
                "mean_ulp": 0.25,
                "bound_ratio": 0.98,
                "equivalent": [],
                "disagreements": 3,
                "expected_disagreements": 2.5,
                "plausibility_p": 0.46,
                "plausible": True,
                "consistent_fraction": 1.0,
                "compared_elements": 4,
                "ruled_out": "",
                "shared_computation": "",
                "exact": False,
                "details": {},
                "framework_default": "",
                "accepted": False,
            },
            {
                "config": "cpu:fp32:fused",
                "bitwise_equal_fraction": 0.0,
                "max_ulp": "inf",
                "mean_ulp": "inf",
                "bound_ratio": None,
                "equivalent": [],
                "disagreements": 4,
                "expected_disagreements": 0.5,
                "plausibility_p": "nan",
                "plausible": False,
                "consistent_fraction": 0.25,
                "compared_elements": 4,
                "ruled_out": "4 of 4 elements differ where 0.5 are expected.",
                "shared_computation": "cpu:fp32:unfused",
                "exact": False,
                "details": {},
                "framework_default": "",
                "accepted": False,
            },
        ],
        "framework_hint": "JAX/Flax default on Ampere+",
        "localization": {
            "columns": [{"index": 3, "mismatched": 2, "share": 0.5}],
            "rows": [],
            "outliers": [],
        },
        "explanation": "TF32.",
        # A server that predates the verdict, the headline, acceptance
        # and the tiers.
        "verdict": "",
        "verdict_reason": "",
        "defect": None,
        "headline": "",
        "advice": "",
        "accepted": False,
        "accepted_as": "",
        "candidate_tiers": [],
    }
    # The keys in the CLI's order: the proto's, new ones last.
    assert list(d["ranking"][0]) == [
        "config",
        "bitwise_equal_fraction",
        "max_ulp",
        "mean_ulp",
        "bound_ratio",
        "equivalent",
        "disagreements",
        "expected_disagreements",
        "plausibility_p",
        "plausible",
        "consistent_fraction",
        "compared_elements",
        "ruled_out",
        "shared_computation",
        "exact",
        "details",
        "framework_default",
        "accepted",
    ]
    r.diagnosis.best = ""
    r.diagnosis.ClearField("localization")
    d = tensorcheck.Report.from_proto(r).to_dict()["diagnosis"]
    assert d["best"] is None
    assert d["localization"] == {"columns": [], "rows": [], "outliers": []}


# Every proto field is in the JSON (except tensors, which the CLI saves to
# files): catches a proto field added without its Python mirror.
@pytest.mark.parametrize(
    "message, node",
    [
        (pb.VerifyResponse, tensorcheck.Report),
        (pb.Stats, tensorcheck.Stats),
        (pb.ConfigResult, tensorcheck.ConfigResult),
        (pb.Tolerance, tensorcheck.Tolerance),
        (pb.Diagnosis, tensorcheck.Diagnosis),
        (pb.RankedCandidate, tensorcheck.RankedCandidate),
        (pb.Localization, tensorcheck.Localization),
        (pb.Defect, tensorcheck.Defect),
        (pb.DefectGroup, tensorcheck.DefectGroup),
        (pb.DefectElement, tensorcheck.DefectElement),
        (pb.Element, tensorcheck.Element),
        (pb.Group, tensorcheck.Group),
        (pb.UlpBucket, tensorcheck.UlpBucket),
        (pb.NegligibleElements, tensorcheck.NegligibleElements),
        (pb.GetCapabilitiesResponse, tensorcheck.Capabilities),
        (pb.BackendInfo, tensorcheck.BackendInfo),
        (pb.DeviceInfo, tensorcheck.DeviceInfo),
        (pb.Limits, tensorcheck.Limits),
        (pb.StoreInfo, tensorcheck.StoreInfo),
        (pb.CompareResponse, tensorcheck.CompareResult),
        (pb.ComparedOutput, tensorcheck.ComparedOutput),
        (pb.OutputPair, tensorcheck.OutputPair),
    ],
)
def test_python_mirror_covers_every_proto_field(message, node):
    proto_fields = {f.name for f in message.DESCRIPTOR.fields}
    py_fields = set(node.__dataclass_fields__)
    # What the client adds of its own (not the server's; in to_dict() as in
    # the CLI's JSON).
    client_only = {
        tensorcheck.Report: {"uploaded_bytes", "reused_bytes", "accept"},
        tensorcheck.CompareResult: {"uploaded_bytes", "reused_bytes", "accept"},
    }.get(node, set())
    assert proto_fields == py_fields - client_only


def test_failure_message_reads_like_torch():
    report = tensorcheck.Report.from_proto(_response())
    msg = format_mismatch(report)
    assert msg.startswith("Tensor-likes are not close!\n\nMismatched elements: 1 / 4 (25.0%)\n")
    assert "Greatest absolute difference: inf at index (1, 0) (up to 1e-05 allowed)" in msg
    assert "Greatest relative difference: nan at index (1, 0) (up to 1.3e-06 allowed)" in msg


def _near_zero_left_out() -> pb.VerifyResponse:
    r = _response()
    r.observed_vs_reference.max_ulp = 1901874441
    r.observed_vs_reference.negligible.CopyFrom(
        pb.NegligibleElements(
            below=2.4e-4,
            differing=3,
            max_abs=6e-8,
            significant_max_ulp=1,
            note="leaving out 3 elements near zero (the server's words)",
        )
    )
    return r


def test_negligible_is_read_and_is_an_object_or_null_in_json():
    stats = tensorcheck.Report.from_proto(_near_zero_left_out()).observed_vs_reference
    assert stats is not None and stats.negligible is not None
    assert stats.max_ulp == 1901874441 and stats.headline_max_ulp == 1
    assert stats.to_dict()["negligible"] == {
        "below": 2.4e-4,
        "differing": 3,
        "max_abs": 6e-8,
        "significant_max_ulp": 1,
        "note": "leaving out 3 elements near zero (the server's words)",
    }
    plain = tensorcheck.Report.from_proto(_response()).observed_vs_reference
    assert plain is not None and plain.negligible is None
    assert plain.headline_max_ulp == plain.max_ulp
    assert plain.to_dict()["negligible"] is None


def test_failure_message_leaves_elements_near_zero_out_of_the_ulp_figure():
    msg = format_mismatch(tensorcheck.Report.from_proto(_near_zero_left_out()))
    assert (
        "Greatest ULP distance: 1 in float32, "
        "leaving out 3 elements near zero (the server's words)\n"
    ) in msg
    assert "1901874441" not in msg
    # A ULP tolerance judged every element: its figure, and no note.
    r = _near_zero_left_out()
    r.tolerance.preset = pb.Tolerance.PRESET_ULP
    r.tolerance.max_ulp = 4
    msg = format_mismatch(tensorcheck.Report.from_proto(r))
    assert "Greatest ULP distance: 1901874441 (up to 4 allowed)\n" in msg
    assert "near zero" not in msg


def test_capabilities_from_proto():
    m = pb.GetCapabilitiesResponse(
        server_version="1.0",
        default_reference="cpu:fp64",
        tolerance_presets=["torch", "numpy"],
        tensor_store=False,
    )
    b = m.backends.add(
        name="cpu",
        available=True,
        precisions=["fp32"],
        bias_modes=["fused"],
        configs=["cpu:fp32:fused"],
        storage_dtypes=[pb.DTYPE_FLOAT32, pb.DTYPE_BFLOAT16],
    )
    m.backends.add(name="cublaslt", available=False, unavailable_reason="no GPU")
    m.limits.max_configs = 64
    m.backends[0].storage_dtypes.append(99)  # from a newer server
    caps = tensorcheck.Capabilities.from_proto(m)
    assert caps.backend("cpu").storage_dtypes == ["float32", "bfloat16", None]
    assert caps.backend("cpu").device is None and b.name == "cpu"
    assert caps.configs == ["cpu:fp32:fused"]
    assert caps.limits.max_configs == 64
    assert caps.to_dict()["backends"][1]["unavailable_reason"] == "no GPU"


@pytest.mark.parametrize(
    "fraction, text",
    [
        (1.0, "100%"),
        (0.0, "0%"),
        (0.5, "50.0%"),
        (0.333, "33.3%"),
        (0.99996831, "99.997%"),  # 100.0 and 100.00 at one and two decimals
        (0.9996, "99.96%"),
        (0.99999999, "99.999999%"),
        (3e-5, "0.003%"),
        (0.0004, "0.04%"),
        (1e-8, "0.000001%"),
        (1e-9, "<0.000001%"),
        (1 - 1e-10, ">99.999999%"),
        (5e-324, "<0.000001%"),
        (float("nan"), "nan%"),
        (1.5, "150.0%"),
    ],
)
def test_format_share_reads_all_or_none_only_when_exact(fraction, text):
    assert format_share(fraction) == text


@pytest.mark.parametrize(
    "part, whole, text",
    [
        (1024, 1024, "100%"),
        (0, 1024, "0%"),
        (0, 0, "0%"),
        (3, 1024, "0.3%"),
        (2, 6, "33.3%"),
        (94671, 94674, "99.997%"),
        (1, 4_000_000_000, "<0.000001%"),
        (3_999_999_999, 4_000_000_000, ">99.999999%"),
        # (2^62 - 1) / 2^62 is 1.0 as a float; one element still differs.
        (2**62 - 1, 2**62, ">99.999999%"),
    ],
)
def test_format_share_of_counts_decides_all_and_none_on_the_counts(part, whole, text):
    assert format_share(part, whole) == text


def test_failure_message_never_rounds_a_share_to_all():
    r = _response()
    r.observed_vs_reference.total = 94674
    r.observed_vs_reference.mismatched = 94671
    del r.observed_vs_reference.top_columns[:]
    r.observed_vs_reference.top_columns.add(index=0, mismatched=94670, share=94670 / 94671)
    msg = format_mismatch(tensorcheck.Report.from_proto(r))
    assert "Mismatched elements: 94671 / 94674 (99.997%)" in msg
    assert "Mismatches concentrate in columns: 0 (99.999%)" in msg
    assert "100.0%" not in msg


def test_diagnosis_message_shows_plausibility_ruled_out_and_shared_gemm():
    dg = pb.Diagnosis(best="cpu:tf32:unfused", confidence=0.97)
    dg.ranking.add(
        config="cpu:tf32:unfused",
        bitwise_equal_fraction=0.99996831,
        max_ulp=1,
        plausible=True,
        compared_elements=94674,
    ).bound_ratio.value = 0.71
    dg.ranking.add(
        config="cpu:tf32:fused",
        bitwise_equal_fraction=0.5,
        max_ulp=2,
        plausible=True,
        compared_elements=94674,
        shared_computation="cpu:tf32:unfused",
    )
    dg.ranking.add(
        config="cpu:fp32:fused",
        bitwise_equal_fraction=3e-5,
        max_ulp=900,
        compared_elements=94674,
        ruled_out="94671 of 94674 elements differ where 12.5 are expected.",
    )
    for i in range(3):
        dg.ranking.add(config=f"cpu:fp16:v{i}", ruled_out=f"reason {i}")
    msg = format_diagnosis(tensorcheck.Diagnosis.from_proto(dg))
    lines = msg.splitlines()
    assert lines[0] == "Best match: cpu:tf32:unfused (confidence 0.97)"
    assert lines[1:] == [
        "Ranking (config: plausible, bitwise-equal share, max ULP, bound ratio):",
        "  cpu:tf32:unfused: yes, 99.997%, 1, 0.71",
        "  cpu:tf32:fused*: yes, 50.0%, 2, n/a",
        "  cpu:fp32:fused: no, 0.003%, 900, n/a",
        "  cpu:fp16:v0: -, 0%, 0, n/a",  # no plausibility test: a dash
        "  cpu:fp16:v1: -, 0%, 0, n/a",
        "  * cpu:tf32:fused reused the GEMM of cpu:tf32:unfused.",
        "  Ruled out:",
        "    3. cpu:fp32:fused: 94671 of 94674 elements differ where 12.5 are expected.",
        "    4. cpu:fp16:v0: reason 0",
        "    5. cpu:fp16:v1: reason 1",
    ]
    assert "reason 2" not in msg  # sixth: beyond the candidates listed


def _five_candidates_three_equivalent() -> pb.Diagnosis:
    """cpu:fp32:fused, cpu:tf32:fused and cpu:fp32:unfused computed the same
    bits (24,575 of 24,576 equal to the observed output); two others differ."""
    dg = pb.Diagnosis(best="cpu:fp32:fused", confidence=0.9)
    dg.equivalent.extend(["cpu:tf32:fused", "cpu:fp32:unfused"])
    same = ["cpu:fp32:fused", "cpu:tf32:fused", "cpu:fp32:unfused"]
    for name in same:
        dg.ranking.add(
            config=name,
            bitwise_equal_fraction=24575 / 24576,
            max_ulp=1,
            plausible=True,
            compared_elements=24576,
            equivalent=[e for e in same if e != name],
            shared_computation="cpu:fp32:fused" if name == "cpu:fp32:unfused" else "",
        )
    dg.ranking.add(
        config="cpu:bf16:fused",
        bitwise_equal_fraction=0.25,
        max_ulp=40,
        compared_elements=24576,
        ruled_out="bf16 rounding everywhere.",
    )
    dg.ranking.add(
        config="cpu:fp16:fused",
        bitwise_equal_fraction=0.125,
        max_ulp=80,
        compared_elements=24576,
        ruled_out="fp16 rounding everywhere.",
    )
    return dg


def test_ranking_groups_puts_candidates_with_the_same_bits_in_one_row():
    d = tensorcheck.Diagnosis.from_proto(_five_candidates_three_equivalent())
    assert [[c.config for c in row] for row in d.ranking_groups()] == [
        ["cpu:fp32:fused", "cpu:tf32:fused", "cpu:fp32:unfused"],
        ["cpu:bf16:fused"],
        ["cpu:fp16:fused"],
    ]
    assert len(d.ranking) == 5  # the ranking itself keeps one entry per candidate


def test_diagnosis_message_shows_equivalent_candidates_as_one_row():
    msg = format_diagnosis(tensorcheck.Diagnosis.from_proto(_five_candidates_three_equivalent()))
    lines = msg.splitlines()
    start = lines.index("Ranking (config: plausible, bitwise-equal share, max ULP, bound ratio):")
    assert lines[start + 1 :] == [
        # 24,575 of 24,576 bitwise equal: never "100.0%".
        "  cpu:fp32:fused = cpu:tf32:fused = cpu:fp32:unfused*: yes, 99.996%, 1, n/a",
        "  cpu:bf16:fused: no, 25.0%, 40, n/a",
        "  cpu:fp16:fused: no, 12.5%, 80, n/a",
        "  * cpu:fp32:unfused reused the GEMM of cpu:fp32:fused.",
        "  Ruled out:",
        "    2. cpu:bf16:fused: bf16 rounding everywhere.",
        "    3. cpu:fp16:fused: fp16 rounding everywhere.",
    ]
    assert "100.0%" not in msg and "100%" not in msg


def test_diagnosis_message_wraps_a_long_row_before_an_equals_sign():
    dg = pb.Diagnosis()
    names = [f"cuda:tf32_trunc:unfused:v{i}" for i in range(4)]
    for name in names:
        dg.ranking.add(config=name, equivalent=[e for e in names if e != name])
    lines = format_diagnosis(tensorcheck.Diagnosis.from_proto(dg)).splitlines()
    assert lines[-2:] == [
        "  cuda:tf32_trunc:unfused:v0 = cuda:tf32_trunc:unfused:v1",
        "    = cuda:tf32_trunc:unfused:v2 = cuda:tf32_trunc:unfused:v3: -, 0%, 0, n/a",
    ]


# The verdict (docs/numerics.md, "Verdict"): decided and worded by the
# server; the client carries and shows it.
DEFECT_REASON = (
    "Column 2 holds 64 of the 72 disagreements with cpu:fp32:fused where rounding "
    "predicts 0.8 (p 1e-30): not rounding."
)
WHERE_TO_LOOK = "output column 2 <-> weight row 2 (out_in layout) and bias element 2"


def _defect_diagnosis() -> pb.Diagnosis:
    """cpu:fp32:fused explains a [32, 4] output but for column 2: a wrong
    weight row. Seven elements lie beyond the threshold, one of them NaN
    against a number."""
    dg = pb.Diagnosis(best="cpu:fp32:fused", confidence=0.9)
    dg.verdict = pb.Diagnosis.VERDICT_DEFECT
    dg.verdict_reason = DEFECT_REASON
    dg.ranking.add(config="cpu:fp32:fused", max_ulp=4096, plausible=True, compared_elements=128)
    f = dg.defect
    f.element_threshold_sigma = 6.1875
    f.false_alarm_rate = 1e-3
    f.element_count = 7
    f.max_ulp = UINT64_MAX
    f.max_sigma = float("inf")
    f.where_to_look = WHERE_TO_LOOK
    f.columns.add(
        index=2,
        disagreements=64,
        expected_disagreements=0.8,
        p_value=1e-30,
        beyond_threshold=7,
        max_ulp=UINT64_MAX,
        max_sigma=float("inf"),
        shift_t=7.5,
        shift_p_value=0.25,
    )
    f.rows.add(
        index=5,
        disagreements=3,
        expected_disagreements=0.025,
        p_value=2.5e-6,
        beyond_threshold=1,
        max_ulp=4096,
        max_sigma=812.25,
    )
    f.elements.add(sigma=float("inf")).element.CopyFrom(
        pb.Element(index=[9, 2], actual=float("nan"), expected=0.5, ulp=UINT64_MAX)
    )
    for row in range(6):
        e = f.elements.add(sigma=812.25 - row)
        e.element.index.extend([row, 2])
        e.element.actual = 1.5
        e.element.expected = 0.5
        e.element.ulp = 4096
    return dg


@pytest.mark.parametrize(
    "verdict, name",
    [
        (pb.Diagnosis.VERDICT_ROUNDING, "rounding"),
        (pb.Diagnosis.VERDICT_DEFECT, "defect"),
        (pb.Diagnosis.VERDICT_UNEXPLAINED, "unexplained"),
        (pb.Diagnosis.VERDICT_UNSPECIFIED, ""),  # a server that predates the verdict
    ],
)
def test_diagnosis_verdict_from_proto(verdict, name):
    dg = pb.Diagnosis(best="cpu:fp32:fused", verdict=verdict, verdict_reason="Because.")
    d = tensorcheck.Diagnosis.from_proto(dg)
    assert d.verdict == name
    assert d.verdict_reason == "Because."
    assert d.defect is None  # not sent
    assert d.to_dict()["verdict"] == name and d.to_dict()["defect"] is None


@pytest.mark.parametrize("tiers", [[], [1], [1, 2]])
def test_candidate_tiers_are_the_servers_list(tiers):
    m = pb.Diagnosis(best="cpu:fp8e4m3:fused")
    m.candidate_tiers.extend(tiers)
    d = tensorcheck.Diagnosis.from_proto(m)
    assert d.candidate_tiers == tiers
    assert d.to_dict()["candidate_tiers"] == tiers
    assert list(d.to_dict())[-1] == "candidate_tiers"


def test_diagnosis_defect_from_proto_and_to_dict():
    d = tensorcheck.Diagnosis.from_proto(_defect_diagnosis())
    assert d.verdict == "defect" and d.verdict_reason == DEFECT_REASON
    f = d.defect
    assert isinstance(f, tensorcheck.Defect)
    assert f.where_to_look == WHERE_TO_LOOK
    assert f.element_count == 7 and f.element_threshold_sigma == 6.1875
    assert f.max_ulp == math.inf and f.max_sigma == math.inf
    assert f.columns == [
        tensorcheck.DefectGroup(
            index=2,
            disagreements=64,
            expected_disagreements=0.8,
            p_value=1e-30,
            beyond_threshold=7,
            max_ulp=math.inf,
            max_sigma=math.inf,
            shift_t=7.5,
            shift_p_value=0.25,
        )
    ]
    assert f.rows[0].index == 5 and f.rows[0].max_ulp == 4096
    assert f.elements[0].element.index == (9, 2) and f.elements[0].sigma == math.inf
    assert len(f.elements) == 7

    j = tensorcheck.Report.from_proto(pb.VerifyResponse(diagnosis=_defect_diagnosis())).to_dict()
    dj = j["diagnosis"]
    # The new keys last, in the proto's order (the CLI's --json too).
    assert list(dj)[-8:] == [
        "verdict",
        "verdict_reason",
        "defect",
        "headline",
        "advice",
        "accepted",
        "accepted_as",
        "candidate_tiers",
    ]
    assert dj["verdict"] == "defect" and dj["verdict_reason"] == DEFECT_REASON
    fj = dj["defect"]
    assert list(fj) == [
        "element_threshold_sigma",
        "false_alarm_rate",
        "element_count",
        "elements",
        "columns",
        "rows",
        "max_ulp",
        "max_sigma",
        "where_to_look",
    ]
    assert fj["max_ulp"] == "inf" and fj["max_sigma"] == "inf"
    assert fj["columns"][0] == {
        "index": 2,
        "disagreements": 64,
        "expected_disagreements": 0.8,
        "p_value": 1e-30,
        "beyond_threshold": 7,
        "max_ulp": "inf",
        "max_sigma": "inf",
        "shift_t": 7.5,
        "shift_p_value": 0.25,
    }
    assert fj["rows"][0]["max_ulp"] == 4096 and fj["rows"][0]["max_sigma"] == 812.25
    assert fj["elements"][0]["sigma"] == "inf"
    assert fj["elements"][0]["element"]["index"] == [9, 2]
    assert fj["elements"][0]["element"]["actual"] == "nan"
    assert fj["elements"][0]["element"]["ulp"] == "inf"
    assert fj["elements"][1] == {
        "element": {
            "index": [0, 2],
            "actual": 1.5,
            "expected": 0.5,
            "actual_bits": "",
            "expected_bits": "",
            "abs_diff": 0.0,
            "rel_diff": 0.0,
            "ulp": 4096,
        },
        "sigma": 812.25,
    }
    json.dumps(j, allow_nan=False)  # nothing non-finite left as a float


def test_diagnosis_message_from_an_older_server_opens_with_the_verdict_reason():
    # No headline (a server that predates it): its verdict reason, verbatim,
    # is the first line; where to look follows.
    lines = format_diagnosis(tensorcheck.Diagnosis.from_proto(_defect_diagnosis())).splitlines()
    assert lines[0] == DEFECT_REASON
    assert lines[1:16] == [
        f"Where to look: {WHERE_TO_LOOK}",
        "Columns not explained by rounding:",
        "  column 2: 64 disagreements vs 0.8 expected, max inf ULP, inf sigma, shift t = 7.5",
        "Rows not explained by rounding:",
        "  row 5: 3 disagreements vs 0.025 expected, max 4096 ULP, 812.2 sigma",
        "Elements beyond 6.2 sigma: 7 (farthest: inf ULP, inf sigma)",
        "  (9, 2): observed nan, best 0.5, inf ULP, inf sigma",
        "  (0, 2): observed 1.5, best 0.5, 4096 ULP, 812.2 sigma",
        "  (1, 2): observed 1.5, best 0.5, 4096 ULP, 811.2 sigma",
        "  (2, 2): observed 1.5, best 0.5, 4096 ULP, 810.2 sigma",
        "  (3, 2): observed 1.5, best 0.5, 4096 ULP, 809.2 sigma",
        "  ... 2 more",  # 7 beyond the threshold, 5 shown
        "Best match: cpu:fp32:fused (confidence 0.90; verdict defect)",
        "Ranking (config: plausible, bitwise-equal share, max ULP, bound ratio):",
        "  cpu:fp32:fused: yes, 0%, 4096, n/a",
    ]


HEADLINE = (
    "Not rounding: cpu:fp32:fused explains the output except column 2 (7 element(s) "
    f"beyond 6.2 predicted standard errors, largest 4096 ULP). Look at {WHERE_TO_LOOK}."
)


def test_diagnosis_message_opens_with_the_headline_then_the_advice():
    dg = _defect_diagnosis()
    dg.headline = HEADLINE
    dg.advice = "To get cpu:fp32:fused (PyTorch's default): a sentence of the server's."
    dg.explanation = "A paragraph the headline replaces in the message."
    lines = format_diagnosis(tensorcheck.Diagnosis.from_proto(dg)).splitlines()
    assert lines[:4] == [
        HEADLINE,
        f"Advice: {dg.advice}",
        f"Why: {DEFECT_REASON}",
        # The headline names where to look already: no line of its own.
        "Columns not explained by rounding:",
    ]
    assert not any(line.startswith("Where to look") for line in lines)
    assert dg.explanation not in lines
    # The message adds labels and numbers, never a verdict sentence of its own.
    assert "not a bug" not in "\n".join(lines[1:]).lower()


@pytest.mark.parametrize(
    "verdict, name",
    [
        (pb.Diagnosis.VERDICT_ROUNDING, "rounding"),
        (pb.Diagnosis.VERDICT_UNEXPLAINED, "unexplained"),
    ],
)
def test_diagnosis_message_shows_each_verdict_reason_first_verbatim(verdict, name):
    reason = f"A sentence of the server's, {name}: 0.5 <= 1.5 (kept as sent)."
    dg = pb.Diagnosis(confidence=0.4, verdict=verdict, verdict_reason=reason)
    dg.defect.SetInParent()  # an empty defect adds no line
    lines = format_diagnosis(tensorcheck.Diagnosis.from_proto(dg)).splitlines()
    assert lines[0] == reason
    assert lines[1] == f"Best match: none (confidence 0.40; verdict {name})"


def test_diagnosis_message_from_a_server_without_a_verdict_has_no_verdict_line():
    msg = format_diagnosis(tensorcheck.Diagnosis.from_proto(pb.Diagnosis(best="cpu:fp32:fused")))
    assert msg.splitlines()[0] == "Best match: cpu:fp32:fused (confidence 0.00)"
    assert "verdict" not in msg.lower()
