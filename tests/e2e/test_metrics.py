"""The Prometheus endpoint of the server binary (--metrics-port,
docs/operations.md "Metrics"): scraped before and after a few calls, the
counters move by exactly the calls sent, per status code; the histograms
count them; the gauges read what the server holds at scrape time.

What each metric counts for known events, bucket by bucket, is tested in
process by server/service/metrics_test.cc."""

from __future__ import annotations

import re
import socket
import subprocess
import time
import urllib.request

import numpy as np
import pytest
from e2e_support import SERVER_BIN, ServerProcess

tensorcheck = pytest.importorskip("tensorcheck")

Series = tuple[str, frozenset[tuple[str, str]]]
SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$")
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def scrape(port: int) -> dict[Series, float]:
    """Every sample of http://127.0.0.1:PORT/metrics by name and labels."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as reply:
        assert reply.status == 200
        text = reply.read().decode()
    samples: dict[Series, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = SAMPLE.match(line)
        assert m, line
        labels = frozenset(LABEL.findall(m.group(2) or ""))
        samples[(m.group(1), labels)] = float(m.group(3))
    return samples


def total(samples: dict[Series, float], name: str, **labels: str) -> float:
    """The sum of `name` over the series whose labels include `labels`
    (0 when there are none: a series appears with its first event)."""
    want = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and want <= ls)


def moved(before: dict[Series, float], after: dict[Series, float], name: str,
          **labels: str) -> float:
    return total(after, name, **labels) - total(before, name, **labels)


def scrape_when_counted(port: int, before: dict[Series, float], calls: int,
                        **labels: str) -> dict[Series, float]:
    """A scrape once `requests_total` with `labels` has moved by `calls`
    since `before`. A call is counted when the server is done with it,
    which may be just after its client has the answer."""
    deadline = time.monotonic() + 60
    while True:
        samples = scrape(port)
        if (moved(before, samples, "tensorcheck_requests_total", **labels) >= calls
                or time.monotonic() > deadline):
            return samples
        time.sleep(0.05)


def problem(m: int, k: int, n: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((m, k), dtype=np.float32)
    w = (rng.standard_normal((n, k)) / np.sqrt(k)).astype(np.float32)
    return x, w


def start_with_metrics() -> tuple[ServerProcess, int]:
    port = free_port()
    server = ServerProcess("--metrics-port", str(port))
    # The second stdout line, right after "listening on".
    deadline = time.monotonic() + 30
    while len(server.stdout) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.stdout[1:2] == [f"metrics on 127.0.0.1:{port}"], server.stdout
    return server, port


def test_counters_and_histograms_move_by_the_calls_sent():
    server, port = start_with_metrics()
    try:
        before = scrape(port)
        x, w = problem(3, 16, 4)
        with tensorcheck.Client(server.address) as client:
            for _ in range(3):
                client.verify_linear(x, w, configs=["cpu:fp32"])
            with pytest.raises(tensorcheck.InvalidArgumentError):
                client.verify_linear(x, w, configs=["cpu:fp33"])
        after = scrape_when_counted(port, before, 4, method="Verify")
    finally:
        assert server.stop() == 0

    requests = "tensorcheck_requests_total"
    assert moved(before, after, requests, method="Verify", code="OK") == 3
    assert moved(before, after, requests, method="Verify", code="INVALID_ARGUMENT") == 1
    assert moved(before, after, requests, method="Verify") == 4
    # Every one of them reached a worker (the bad configuration is found
    # there), so all three histograms counted all four.
    for histogram in ("duration", "queue", "compute"):
        name = f"tensorcheck_request_{histogram}_seconds"
        assert moved(before, after, name + "_count", method="Verify") == 4, name
        assert moved(before, after, name + "_bucket", method="Verify", le="+Inf") == 4, name
        assert moved(before, after, name + "_sum", method="Verify") >= 0, name
    assert moved(before, after, "tensorcheck_received_bytes_total", method="Verify") > 0
    assert moved(before, after, "tensorcheck_sent_bytes_total", method="Verify") > 0
    assert total(after, "tensorcheck_requests_in_flight") == 0
    assert total(after, "tensorcheck_requests_queued") == 0
    # A host without a GPU reads zeros, present all the same.
    assert (("tensorcheck_gpu_memory_used_bytes", frozenset())) in after
    assert (("tensorcheck_gpu_cache_hits_total", frozenset())) in after


def test_store_gauges_and_calls_move_with_an_upload_and_a_read():
    server, port = start_with_metrics()
    try:
        a = np.random.default_rng(1).standard_normal((64, 256)).astype(np.float32)
        with tensorcheck.Client(server.address) as client:
            before = scrape(port)
            ref = client.upload(a)  # FindMissingTensors (a miss), then UploadTensor
            middle = scrape_when_counted(port, before, 1, method="UploadTensor")
            back = client.read_tensor(ref)  # a hit
            after = scrape_when_counted(port, middle, 1, method="ReadTensor")
        assert np.array_equal(back, a)
    finally:
        assert server.stop() == 0

    requests = "tensorcheck_requests_total"
    assert moved(before, middle, requests, method="FindMissingTensors", code="OK") == 1
    assert moved(before, middle, requests, method="UploadTensor", code="OK") == 1
    assert moved(before, middle, "tensorcheck_received_bytes_total",
                 method="UploadTensor") == a.nbytes
    assert moved(before, middle, "tensorcheck_store_tensors") == 1
    assert moved(before, middle, "tensorcheck_store_bytes") == a.nbytes
    assert moved(before, middle, "tensorcheck_store_misses_total") == 1
    assert moved(before, middle, "tensorcheck_store_hits_total") == 0

    assert moved(middle, after, requests, method="ReadTensor", code="OK") == 1
    assert moved(middle, after, "tensorcheck_sent_bytes_total", method="ReadTensor") == a.nbytes
    assert moved(middle, after, "tensorcheck_store_hits_total") == 1
    assert moved(middle, after, "tensorcheck_request_duration_seconds_count",
                 method="ReadTensor") == 1
    # The store's calls never wait for a worker.
    assert total(after, "tensorcheck_request_queue_seconds_count", method="ReadTensor") == 0


def test_no_endpoint_unless_asked_and_a_bad_port_is_refused():
    server = ServerProcess()
    try:
        time.sleep(0.2)
        assert server.stdout == [f"listening on {server.address}"]
    finally:
        assert server.stop() == 0
    bad = subprocess.run([str(SERVER_BIN), "--port", "0", "--metrics-port", "70000"],
                         check=False, capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2
    assert "--metrics-port: 0 (no endpoint) or 1..65535 expected, got 70000" in bad.stderr
