"""A fake tensorcheck server in the test's own process: a servicer of the
test's on a free loopback port, for tests of what the client sends and how
it reacts, without the real server binary; and two servicers several tests
use (BlobStore, RecordingServicer).

    with serve_in_process(MyServicer()) as target:
        with tensorcheck.Client(target) as client: ...
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Sequence
from concurrent import futures
from typing import Any

import grpc

from tensorcheck._pb import pb, pb_grpc


@contextlib.contextmanager
def serve_in_process(
    servicer: pb_grpc.TensorCheckServicer,
    *,
    workers: int = 4,
    options: Sequence[tuple[str, Any]] = (),
) -> Iterator[str]:
    """Serves `servicer` until the block ends; yields its HOST:PORT."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=workers), options=list(options))
    pb_grpc.add_TensorCheckServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        server.stop(grace=None)


class BlobStore(pb_grpc.TensorCheckServicer):
    """ReadTensor over a dict of blobs (digest hash -> bytes), in chunks of
    `chunk` bytes; NOT_FOUND for any other digest."""

    def __init__(self, chunk: int) -> None:
        self.blobs: dict[str, bytes] = {}
        self.chunk = chunk

    def ReadTensor(self, request, context):
        blob = self.blobs.get(request.digest.hash)
        if blob is None:
            context.abort(grpc.StatusCode.NOT_FOUND, "not stored")
        for pos in range(request.offset, len(blob), self.chunk):
            yield pb.ReadTensorResponse(offset=pos, data=blob[pos : pos + self.chunk])


class RecordingServicer(pb_grpc.TensorCheckServicer):
    """Records every Verify and Diagnose request (method, request) and
    answers each over `total` elements: pass, or fail while `fail` is set
    (so that assert_linear_parity goes on to Diagnose); a Diagnose names
    `best` and reports `candidate_tiers`."""

    def __init__(self, total: int, best: str, candidate_tiers: Sequence[int] = ()) -> None:
        self.lock = threading.Lock()
        self.requests: list[tuple[str, pb.VerifyRequest]] = []
        self.fail = False
        self.total = total
        self.best = best
        self.candidate_tiers = list(candidate_tiers)

    def _answer(self, method: str, request: pb.VerifyRequest) -> pb.VerifyResponse:
        with self.lock:
            self.requests.append((method, request))
        r = pb.VerifyResponse(verdict=pb.VERDICT_FAIL if self.fail else pb.VERDICT_PASS)
        r.tolerance.preset = pb.Tolerance.PRESET_TORCH
        r.observed_vs_reference.CopyFrom(
            pb.Stats(total=self.total, mismatched=1 if self.fail else 0)
        )
        if method == "Diagnose":
            r.diagnosis.best = self.best
            r.diagnosis.candidate_tiers.extend(self.candidate_tiers)
        return r

    def Verify(self, request, context):
        return self._answer("Verify", request)

    def Diagnose(self, request, context):
        return self._answer("Diagnose", request)
