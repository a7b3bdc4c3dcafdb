"""`CompareResult`: the answer of `compare_outputs` (the Compare RPC), two
outputs of one layer diagnosed against the same candidates.

    result = tensorcheck.compare_outputs(x, w, b, {"torch": y1, "flax": y2})
    print(result)
    # torch is cpu:fp32:fused (...), flax is cpu:tf32:unfused (...); their
    # difference is rounding: at most 1.1e-03 expected, 1.05e-03 seen. ...
    #   torch: Rounding, not a bug: the output is cpu:fp32:fused ...
    #   flax: Rounding, not a bug: the output is cpu:tf32:unfused ...
    #   torch vs flax: max_abs 1.05e-03, max 12 ULP; expected at most 1.1e-03

Every sentence is the server's (docs/numerics.md, "Comparing two
outputs"); the text adds labels and numbers. `to_dict()` follows the
proto's field names, as the JSON report does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from ._format import VERDICT_WORDS, ulp_cell
from ._node import _Node
from ._pb import pb
from ._report_nodes import _VERDICT_NAMES, Diagnosis, Stats

__all__ = ["CompareResult", "ComparedOutput", "OutputPair"]


def _says(text: str, sentence: str) -> bool:
    """Whether `text` holds `sentence` already (the headline quotes the
    advice mid-sentence, its first letter in lower case)."""
    return sentence in text or (sentence[:1].lower() + sentence[1:]) in text


@dataclass(frozen=True)
class ComparedOutput(_Node):
    """One of the compared outputs: its name, its statistics against the
    reference, and its own diagnosis (`diagnosis.headline` says what it
    is)."""

    name: str
    vs_reference: Optional[Stats]
    diagnosis: Optional[Diagnosis]

    @classmethod
    def from_proto(cls, m: pb.ComparedOutput) -> ComparedOutput:
        return cls(
            name=m.name,
            vs_reference=Stats.from_proto(m.vs_reference) if m.HasField("vs_reference") else None,
            diagnosis=Diagnosis.from_proto(m.diagnosis) if m.HasField("diagnosis") else None,
        )


@dataclass(frozen=True)
class OutputPair(_Node):
    """The two outputs against each other: `stats` are a vs b (b
    expected); `rounding` whether both are rounding of their
    configurations; `configs_max_abs` the largest difference those two
    configurations leave between their own outputs, `expected_max_abs` the
    bound on max |a - b| when both are rounding; `advice_b_to_a` what to
    change in b's framework to match a, `advice_a_to_b` the other way ("" when
    they already agree)."""

    a: str
    b: str
    stats: Optional[Stats]
    rounding: bool
    configs_max_abs: float
    expected_max_abs: float
    advice_b_to_a: str
    advice_a_to_b: str

    @classmethod
    def from_proto(cls, m: pb.OutputPair) -> OutputPair:
        return cls(
            a=m.a,
            b=m.b,
            stats=Stats.from_proto(m.stats) if m.HasField("stats") else None,
            rounding=m.rounding,
            configs_max_abs=m.configs_max_abs,
            expected_max_abs=m.expected_max_abs,
            advice_b_to_a=m.advice_b_to_a,
            advice_a_to_b=m.advice_a_to_b,
        )

    @property
    def advice(self) -> dict[str, str]:
        """What to change, by the output whose framework changes:
        {b: advice_b_to_a, a: advice_a_to_b}, the empty ones left out."""
        out = {self.b: self.advice_b_to_a, self.a: self.advice_a_to_b}
        return {k: v for k, v in out.items() if v}


@dataclass(frozen=True)
class CompareResult(_Node):
    """The answer of `compare_outputs`.

    result.headline                 # the server's one-sentence answer
    result.outputs                  # [ComparedOutput, ComparedOutput], as sent
    result["flax"].diagnosis        # one output's Diagnosis (headline, best, advice, ...)
    result.diagnoses                # {"torch": Diagnosis, "flax": Diagnosis}
    result.pair                     # OutputPair: rounding, expected_max_abs, stats, advice
    result.verdict, result.passed   # with accept=: "pass"/"fail"; else None
    str(result)                     # the headline, then a short summary

    `uploaded_bytes` / `reused_bytes` say what went through the tensor
    store and `accept` is the call's accept= (none of the three is in
    to_dict())."""

    headline: str
    outputs: list[ComparedOutput]
    pair: Optional[OutputPair]
    reference: str
    output_shape: tuple[int, ...]
    notes: list[str]
    verdict: Optional[str]
    uploaded_bytes: int = 0
    reused_bytes: int = 0
    accept: tuple[str, ...] = ()
    _not_json = ("uploaded_bytes", "reused_bytes", "accept")

    @classmethod
    def from_proto(cls, m: pb.CompareResponse) -> CompareResult:
        return cls(
            headline=m.headline,
            outputs=[ComparedOutput.from_proto(o) for o in m.outputs],
            pair=OutputPair.from_proto(m.pair) if m.HasField("pair") else None,
            reference=m.reference,
            output_shape=tuple(m.output_shape),
            notes=list(m.notes),
            verdict=_VERDICT_NAMES.get(m.verdict),
        )

    @classmethod
    def _of_response(
        cls,
        m: pb.CompareResponse,
        *,
        uploaded_bytes: int,
        reused_bytes: int,
        accept: tuple[str, ...] = (),
    ) -> CompareResult:
        r = cls.from_proto(m)
        object.__setattr__(r, "uploaded_bytes", uploaded_bytes)
        object.__setattr__(r, "reused_bytes", reused_bytes)
        object.__setattr__(r, "accept", accept)
        return r

    def __getitem__(self, name: str) -> ComparedOutput:
        for o in self.outputs:
            if o.name == name:
                return o
        raise KeyError(f"no output {name!r}; have {[o.name for o in self.outputs]}")

    @property
    def diagnoses(self) -> dict[str, Optional[Diagnosis]]:
        """Each output's diagnosis, by name."""
        return {o.name: o.diagnosis for o in self.outputs}

    @property
    def passed(self) -> Optional[bool]:
        """With accept=: whether the server accepted both outputs (its
        verdict); None without (the comparison is an explanation, not a
        test, and the verdict is only defined with accept=)."""
        if not self.accept or self.verdict is None:
            return None
        return self.verdict == "pass"

    def to_dict(self) -> dict[str, Any]:
        d = super().to_dict()
        d["output_shape"] = list(self.output_shape)
        return d

    def summary(self) -> str:
        """The headline, then a line per output (its own headline, or its
        best match) and the pair's numbers and advice."""
        lines = [self.headline] if self.headline else []
        if self.accept and self.verdict is not None:
            word = VERDICT_WORDS.get(self.verdict, self.verdict.upper())
            lines.append(f"Verdict: {word} (accept {', '.join(self.accept)})")
        for o in self.outputs:
            d = o.diagnosis
            what = (d.lead or f"best match {d.best or 'none'}") if d is not None else "-"
            lines.append(f"  {o.name}: {what}")
        p = self.pair
        if p is not None and p.stats is not None:
            lines.append(
                f"  {p.a} vs {p.b}: max_abs {p.stats.max_abs:.3g}, max {ulp_cell(p.stats)} ULP; "
                f"expected at most {p.expected_max_abs:.3g} "
                f"(rounding of both: {'yes' if p.rounding else 'no'})"
            )
        if p is not None:
            for who, advice in p.advice.items():
                if not _says(self.headline, advice):
                    lines.append(f"  Advice for {who}: {advice}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.summary()
