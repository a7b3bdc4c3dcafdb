"""`Report`: a VerifyResponse as Python objects, and its JSON form.

Attributes hold real Python values (floats may be inf/nan, a ULP distance
of a NaN-against-number pair is `math.inf`, unset messages are None);
`to_dict()` gives exactly the object of docs/json-report.md, the one the
CLI's `--json` prints: proto field names, lower-case enum words, non-finite
floats as the strings "inf"/"-inf"/"nan", unset messages as null.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, Optional

from google.protobuf import json_format

from ._capabilities import BackendInfo, Capabilities, DeviceInfo, Limits, StoreInfo
from ._format import format_diagnosis as format_diagnosis
from ._format import format_mismatch, format_report
from ._format import format_share as format_share
from ._node import _Node
from ._pb import pb
from ._report_nodes import (
    _VERDICT_NAMES,
    BatchInvariance,
    CallDecision,
    ConfigResult,
    Defect,
    DefectElement,
    DefectGroup,
    Diagnosis,
    Element,
    Group,
    Localization,
    NegligibleElements,
    RankedCandidate,
    Stats,
    SubBatch,
    Tolerance,
    UlpBucket,
)
from ._tensors import ReadTensor

# The parts of a Report (`_report_nodes`, which `_format` reads too), the
# capabilities and the messages live in modules of their own; this one
# offers them as it always did.
__all__ = [
    "Report",
    "CallDecision",
    "Stats",
    "ConfigResult",
    "BatchInvariance",
    "SubBatch",
    "Tolerance",
    "Diagnosis",
    "RankedCandidate",
    "Localization",
    "Defect",
    "DefectGroup",
    "DefectElement",
    "Element",
    "Group",
    "UlpBucket",
    "NegligibleElements",
    "Capabilities",
    "BackendInfo",
    "DeviceInfo",
    "Limits",
    "StoreInfo",
]


def _report_field(m: pb.VerifyResponse, name: str, read: Optional[ReadTensor]) -> Any:
    """One of Report's _CONVERTED_ON_ACCESS fields, from its response."""
    if name == "tolerance":
        return Tolerance.from_proto(m.tolerance)
    if name == "observed_vs_reference":
        has = m.HasField("observed_vs_reference")
        return Stats.from_proto(m.observed_vs_reference) if has else None
    if name == "reference":
        has = m.HasField("reference")
        return ConfigResult.from_proto(m.reference, "reference", read) if has else None
    if name == "results":
        return [ConfigResult.from_proto(r, f"results[{i}]", read) for i, r in enumerate(m.results)]
    if name == "diagnosis":
        return Diagnosis.from_proto(m.diagnosis) if m.HasField("diagnosis") else None
    raise AssertionError(name)


def _call_decision(m: pb.VerifyResponse) -> Optional[CallDecision]:
    """Report.call, converted with the report at once by both paths: a few
    fields, and a field with a default (a class attribute, so never missing
    from an instance: __getattr__ would not be asked for it)."""
    return CallDecision.from_proto(m.call) if m.HasField("call") else None


# The Report fields that a report the Client built converts on first access.
_CONVERTED_ON_ACCESS = (
    "tolerance",
    "observed_vs_reference",
    "reference",
    "results",
    "diagnosis",
)
_CONVERT_LOCK = threading.Lock()


@dataclass(frozen=True)
class Report(_Node):
    """The answer of `verify_linear` / `diagnose_linear`.

    report.passed, report.verdict                 # True, "pass"
    report.observed_vs_reference.max_abs          # None without observed
    report.results[0].config                      # "cpu:tf32:fused"
    report.results[0].vs_observed.max_ulp
    report.diagnosis.best                         # diagnose_linear only
    report.to_dict()                              # the CLI's --json object
    report.uploaded_bytes, report.reused_bytes    # the tensor store's part

    `uploaded_bytes` counts the bytes of the tensors this call uploaded to
    the server's tensor store (tensors above 1 MiB the store lacked, again
    when one was evicted before the request ran); `reused_bytes` those of
    the tensors the request named by digest that the store already held
    (uploaded by an earlier call, `Client.upload`, or anyone else). Both
    are 0 when everything went inline (small tensors, a server without a
    store).

    `accept` is the call's `accept=` (the configurations accepted; not part
    of to_dict(), the server's report): with it, `verdict` is the server's
    acceptance, not the tolerance's. str(report) reads the server's
    headline first (`tensorcheck._format.format_report`).
    """

    verdict: Optional[str]
    tolerance: Tolerance
    observed_vs_reference: Optional[Stats]
    reference: Optional[ConfigResult]
    results: list[ConfigResult]
    output_shape: tuple[int, ...]
    notes: list[str]
    diagnosis: Optional[Diagnosis]
    uploaded_bytes: int = 0
    reused_bytes: int = 0
    accept: tuple[str, ...] = ()
    # The server's decisions about this call for a whole-model check (not
    # part of to_dict(), as in the CLI's JSON).
    call: Optional[CallDecision] = None
    _not_json = ("accept", "call")

    @classmethod
    def from_proto(cls, m: pb.VerifyResponse, read: Optional[ReadTensor] = None) -> Report:
        """The report of a response; `read` fetches outputs returned by
        digest (the Client passes its ReadTensor)."""
        report = cls(
            verdict=_VERDICT_NAMES.get(m.verdict),
            output_shape=tuple(m.output_shape),
            notes=list(m.notes),
            call=_call_decision(m),
            **{name: _report_field(m, name, read) for name in _CONVERTED_ON_ACCESS},
        )
        # Kept for _response_dict, as the report converted on access keeps it.
        report.__dict__["_response"] = m
        return report

    @classmethod
    def _of_response(
        cls,
        m: pb.VerifyResponse,
        read: Optional[ReadTensor],
        *,
        uploaded_bytes: int,
        reused_bytes: int,
        accept: tuple[str, ...] = (),
    ) -> Report:
        """The Client's report of a response it owns (nobody else holds or
        changes `m`): verdict, shape and notes now; the tolerance, the
        statistics, the results and the diagnosis, which take most of the
        conversion's time, when first read (then kept). A response carrying
        outputs is converted whole at once, so that outputs returned by
        digest are read within the call and its deadline."""
        if (m.HasField("reference") and m.reference.HasField("output")) or any(
            r.HasField("output") for r in m.results
        ):
            eager = cls.from_proto(m, read)
            object.__setattr__(eager, "uploaded_bytes", uploaded_bytes)
            object.__setattr__(eager, "reused_bytes", reused_bytes)
            object.__setattr__(eager, "accept", accept)
            return eager
        report = object.__new__(cls)
        # The frozen dataclass's instance dict, filled without __init__; the
        # fields of _CONVERTED_ON_ACCESS come from __getattr__ when read.
        report.__dict__.update(
            verdict=_VERDICT_NAMES.get(m.verdict),
            output_shape=tuple(m.output_shape),
            notes=list(m.notes),
            uploaded_bytes=uploaded_bytes,
            reused_bytes=reused_bytes,
            accept=accept,
            call=_call_decision(m),
            _response=m,
        )
        return report

    if not TYPE_CHECKING:  # (mypy would accept any attribute name otherwise)

        def __getattr__(self, name: str) -> Any:
            # Reached only for names missing from the instance: a field of a
            # report from _of_response not read yet.
            state = self.__dict__
            m = state.get("_response")
            if m is None or name not in _CONVERTED_ON_ACCESS:
                raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
            with _CONVERT_LOCK:  # one conversion per field, whoever asks first
                if name not in state:
                    state[name] = _report_field(m, name, None)
            return state[name]

    def __getstate__(self) -> dict[str, Any]:
        # pickle and copy: every field converted, not the response.
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def _response_dict(self) -> Optional[dict[str, Any]]:
        """The response this report was made from, in protobuf's JSON
        mapping (lowerCamelCase names, default values left out): the
        `response` of a layer call in ModelReport.to_dict(), as `tensorcheck
        sweep --json` prints it. None for a report that was copied or
        unpickled (they keep the fields, not the response)."""
        m = self.__dict__.get("_response")
        return None if m is None else json_format.MessageToDict(m)

    @property
    def passed(self) -> bool:
        return self.verdict == "pass"

    def result(self, config: str) -> ConfigResult:
        """The result of one configuration, by its canonical name or a
        prefix of it ("cpu:tf32" finds "cpu:tf32:fused")."""
        for r in self.results:
            if r.config == config:
                return r
        matches = [r for r in self.results if r.config.startswith(config + ":")]
        if len(matches) == 1:
            return matches[0]
        raise KeyError(f"no single result for {config!r}; have {[r.config for r in self.results]}")

    def to_dict(self) -> dict[str, Any]:
        d = super().to_dict()
        d["output_shape"] = list(self.output_shape)
        return d

    def failure_message(self) -> str:
        """The numpy/torch-style message of a failed comparison of the
        observed output against the reference (or, without an observed
        output, of the first failing configuration)."""
        return format_mismatch(self)

    def __str__(self) -> str:
        return format_report(self)
