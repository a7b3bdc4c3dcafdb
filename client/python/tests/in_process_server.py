"""A fake tensorcheck server in the test's own process: a servicer of the
test's on a free loopback port, for tests of what the client sends and how
it reacts, without the real server binary.

    with serve_in_process(MyServicer()) as target:
        with tensorcheck.Client(target) as client: ...
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from concurrent import futures
from typing import Any

import grpc

from tensorcheck._pb import pb_grpc


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
