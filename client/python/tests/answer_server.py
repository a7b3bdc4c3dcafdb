"""A fake tensorcheck server that answers with responses the test writes
(the server's sentences: headline, advice, verdict reason), and records
what the client sent. No tensor store: tensors stay inline.

    servicer = AnswerServicer(verify=failing_verify(), diagnose=diagnosis_response())
    with serve_in_process(servicer) as target: ...

Also imported by the pytest run that test_answers.py starts in a
subprocess (its traceback is the subject there).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any, Optional

import grpc

from in_process_server import serve_in_process
from tensorcheck._pb import pb, pb_grpc

HEADLINE = (
    "Not rounding: cpu:fp32:fused explains the output except column 2 (7 element(s) "
    "beyond 6.2 predicted standard errors, largest 4096 ULP). Look at output column 2 "
    "<-> weight row 2 (out_in layout) and bias element 2."
)
ADVICE = "To get cpu:fp32:fused (PyTorch's default for fp32): a sentence of the server's."
REASON = "Column 2 holds 64 of the 72 disagreements where rounding predicts 0.8: not rounding."


def failing_verify() -> pb.VerifyResponse:
    """A FAIL under the torch tolerance: 3 of 32 elements, the worst 0.5
    apart at (1, 2)."""
    r = pb.VerifyResponse(verdict=pb.VERDICT_FAIL, output_shape=[4, 8])
    r.tolerance.preset = pb.Tolerance.PRESET_TORCH
    r.tolerance.atol.value = 1e-5
    r.tolerance.rtol.value = 1.3e-6
    s = r.observed_vs_reference
    s.total, s.mismatched, s.max_abs, s.max_rel = 32, 3, 0.5, 0.25
    s.max_abs_index[:] = [1, 2]
    s.max_rel_index[:] = [1, 2]
    s.max_ulp = 4096
    s.compared_dtype = pb.DTYPE_FLOAT32
    for row in range(8):  # more worst elements than a message lists
        s.worst.add(index=[row % 4, 2], actual=1.5, expected=1.0, abs_diff=0.5, ulp=4096)
    r.reference.config = "cpu:fp64:none"
    return r


def diagnosis(headline: str = HEADLINE, advice: str = ADVICE) -> pb.Diagnosis:
    """A defect in column 2, with more candidates, columns and elements than
    a 25-line message can hold."""
    d = pb.Diagnosis(best="cpu:fp32:fused", confidence=0.9, headline=headline, advice=advice)
    d.verdict = pb.Diagnosis.VERDICT_DEFECT
    d.verdict_reason = REASON
    d.explanation = "A paragraph: the headline says it in one sentence."
    for i in range(10):
        d.ranking.add(config=f"cpu:cand{i}:fused", compared_elements=32, ruled_out=f"reason {i}.")
    f = d.defect
    f.element_threshold_sigma, f.element_count, f.max_ulp, f.max_sigma = 6.2, 40, 4096, 900.0
    f.where_to_look = "output column 2 <-> weight row 2 (out_in layout) and bias element 2"
    for c in range(8):
        f.columns.add(index=c, disagreements=8, expected_disagreements=0.1, max_ulp=4096)
    for e in range(8):
        f.elements.add(sigma=900.0 - e).element.index.extend([e % 4, 2])
    return d


def diagnose_response(d: Optional[pb.Diagnosis] = None) -> pb.VerifyResponse:
    r = pb.VerifyResponse(verdict=pb.VERDICT_FAIL)
    r.diagnosis.CopyFrom(d if d is not None else diagnosis())
    return r


class AnswerServicer(pb_grpc.TensorCheckServicer):
    """Verify, Diagnose and Compare answer with the responses given; every
    request is kept in `requests` as (method, request)."""

    def __init__(
        self,
        verify: Optional[pb.VerifyResponse] = None,
        diagnose: Optional[pb.VerifyResponse] = None,
        compare: Optional[pb.CompareResponse] = None,
    ) -> None:
        self.verify = verify or failing_verify()
        self.diagnose = diagnose or diagnose_response()
        self.compare = compare or pb.CompareResponse()
        self.requests: list[tuple[str, Any]] = []
        self._lock = threading.Lock()

    def _keep(self, method: str, request: Any) -> None:
        with self._lock:
            self.requests.append((method, request))

    def Verify(self, request: pb.VerifyRequest, context: grpc.ServicerContext) -> Any:
        self._keep("Verify", request)
        return self.verify

    def Diagnose(self, request: pb.VerifyRequest, context: grpc.ServicerContext) -> Any:
        self._keep("Diagnose", request)
        return self.diagnose

    def Compare(self, request: pb.CompareRequest, context: grpc.ServicerContext) -> Any:
        self._keep("Compare", request)
        return self.compare

    def FindMissingTensors(self, request: Any, context: grpc.ServicerContext) -> Any:
        context.abort(grpc.StatusCode.UNIMPLEMENTED, "no store")

    @property
    def methods(self) -> list[str]:
        return [m for m, _ in self.requests]


@contextlib.contextmanager
def serve_answers(servicer: Optional[AnswerServicer] = None) -> Iterator[str]:
    """A failing layer's server (or `servicer`); yields its HOST:PORT."""
    with serve_in_process(servicer or AnswerServicer()) as target:
        yield target
