"""The server's TLS and mutual TLS end to end (docs/operations.md, "TLS and
mutual TLS"), with certificates made by openssl during the test: TLS works
with the right CA and fails with a wrong one or in plaintext, mutual TLS
needs a client certificate, a rotated certificate is served without a
restart, a bad set (a broken CA bundle, a key that is not the
certificate's) is refused, logged and counted while the set in force keeps
serving, bad files stop the start with the flag named, and the plaintext
health port answers probes."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

import grpc
import numpy as np
import pytest
import tensorcheck
from e2e_support import SERVER_BIN, ServerProcess, free_port, gauge, run_cli

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "testing"))
from certs import make_certs  # noqa: E402


def tls_server(c: dict[str, str], *extra: str) -> ServerProcess:
    return ServerProcess("--tls-cert", c["server_cert"], "--tls-key", c["server_key"], *extra)


def tls(c: dict[str, str], ca: str = "ca", client: bool = False) -> grpc.ChannelCredentials:
    if client:
        return tensorcheck.tls_credentials(ca=c[ca], cert=c["client_cert"], key=c["client_key"])
    return tensorcheck.tls_credentials(ca=c[ca])


def capabilities(address: str, credentials) -> None:
    with tensorcheck.Client(address, tls=credentials, timeout=10, max_retries=0) as client:
        client.capabilities()


def health(address: str) -> bytes:
    with grpc.insecure_channel(address) as channel:
        check = channel.unary_unary("/grpc.health.v1.Health/Check",
                                    request_serializer=lambda b: b,
                                    response_deserializer=lambda b: b)
        return check(b"", timeout=10)


def test_tls_serves_the_right_ca_and_refuses_a_wrong_one_or_plaintext(tmp_path):
    c = make_certs(tmp_path)
    server = tls_server(c)
    try:
        x = np.ones((2, 4), np.float32)
        w = np.ones((3, 4), np.float32)
        with tensorcheck.Client(server.address, tls=tls(c)) as client:
            r = client.verify_linear(x, w, configs=["cpu:fp32"], return_outputs=True)
        np.testing.assert_array_equal(r.result("cpu:fp32").output, np.full((2, 3), 4.0))
        with pytest.raises(tensorcheck.UnavailableError):
            capabilities(server.address, tls(c, ca="other_ca"))
        with pytest.raises(tensorcheck.UnavailableError):
            capabilities(server.address, None)
        # The CLI too.
        ok = run_cli("health", "--server", server.address, "--tls-ca", c["ca"])
        assert ok.returncode == 0, ok.stderr
        wrong = run_cli("health", "--server", server.address, "--tls-ca", c["other_ca"])
        assert wrong.returncode == 3, wrong.stderr
    finally:
        assert server.stop() == 0


def test_mutual_tls_needs_a_client_certificate_from_the_ca(tmp_path):
    c = make_certs(tmp_path)
    server = tls_server(c, "--tls-client-ca", c["ca"])
    try:
        capabilities(server.address, tls(c, client=True))
        with pytest.raises(tensorcheck.UnavailableError):
            capabilities(server.address, tls(c))
        # A certificate from another CA is no better than none.
        other = make_certs(tmp_path / "other")
        foreign = tensorcheck.tls_credentials(ca=c["ca"], cert=other["client_cert"],
                                              key=other["client_key"])
        with pytest.raises(tensorcheck.UnavailableError):
            capabilities(server.address, foreign)
    finally:
        assert server.stop() == 0


def test_a_rotated_certificate_is_served_without_a_restart(tmp_path):
    old = make_certs(tmp_path / "old")
    new = make_certs(tmp_path / "new")  # another CA, another server certificate
    live = tmp_path / "live"
    live.mkdir()
    for name in ("server_cert", "server_key"):
        shutil.copy(old[name], live / name)
    server = ServerProcess("--tls-cert", str(live / "server_cert"), "--tls-key",
                           str(live / "server_key"), "--credentials-reload-seconds", "1")
    try:
        capabilities(server.address, tls(old))
        # As a Secret update does it: both files replaced by renames.
        for name in ("server_cert", "server_key"):
            shutil.copy(new[name], live / f".{name}.tmp")
            (live / f".{name}.tmp").rename(live / name)
        deadline = time.monotonic() + 20
        while True:
            try:
                capabilities(server.address, tls(new))
                break
            except tensorcheck.UnavailableError:
                assert time.monotonic() < deadline, "the new certificate was never served"
                time.sleep(0.2)
        with pytest.raises(tensorcheck.UnavailableError):
            capabilities(server.address, tls(old))
        assert server.proc.poll() is None
    finally:
        assert server.stop() == 0


GARBAGE_PEM = b"-----BEGIN CERTIFICATE-----\nnot base64\n-----END CERTIFICATE-----\n"


def _rotate(path: Path, content: bytes) -> None:
    """As a Secret update does it: a new file renamed over the old."""
    (path.parent / f".{path.name}.tmp").write_bytes(content)
    (path.parent / f".{path.name}.tmp").rename(path)


def _wait_for_gauge(port: int, name: str, value: float, never: str) -> None:
    deadline = time.monotonic() + 20
    while gauge(port, name) != value:
        assert time.monotonic() < deadline, never
        time.sleep(0.2)


def _handshakes_keep_working(address: str, credentials, polls: int) -> None:
    """A fresh connection (a new handshake) per poll of the server's
    one-second reload interval, each one must succeed."""
    for _ in range(polls):
        capabilities(address, credentials)
        time.sleep(0.5)


@pytest.mark.parametrize("case", ["ca_garbage", "key_of_another_cert"])
def test_a_bad_set_is_refused_counted_and_the_set_in_force_keeps_serving(tmp_path, case):
    c = make_certs(tmp_path)
    live = tmp_path / "live"
    live.mkdir()
    for name in ("server_cert", "server_key", "ca"):
        shutil.copy(c[name], live / name)
    metrics = free_port()
    # No --tokens-file: a TLS-only server reloads (and logs) too.
    server = ServerProcess("--tls-cert", str(live / "server_cert"), "--tls-key",
                           str(live / "server_key"), "--tls-client-ca", str(live / "ca"),
                           "--credentials-reload-seconds", "1", "--metrics-port", str(metrics))
    refused = 'tensorcheck_credential_reloads_refused_total{credentials="tls"}'
    stale = 'tensorcheck_credentials_stale{credentials="tls"}'
    try:
        capabilities(server.address, tls(c, client=True))
        name, content, flag = {
            "ca_garbage": ("ca", GARBAGE_PEM, "--tls-client-ca"),
            "key_of_another_cert": ("server_key", Path(c["client_key"]).read_bytes(),
                                    "--tls-key"),
        }[case]
        original = (live / name).read_bytes()
        _rotate(live / name, content)
        _wait_for_gauge(metrics, refused, 1, "the bad set was never refused")
        assert gauge(metrics, stale) == 1
        log = "\n".join(server.stdout + server.stderr)
        assert "TLS files refused" in log and flag in log, log[-2000:]
        # gRPC's watcher re-reads its files every second: handshakes over
        # several of its polls must all use the set still in force.
        _handshakes_keep_working(server.address, tls(c, client=True), polls=6)
        assert gauge(metrics, refused) == 1  # counted once, not once per poll
        # The good file back: nothing stale, nothing more refused.
        _rotate(live / name, original)
        _wait_for_gauge(metrics, stale, 0, "the good set was never taken back")
        capabilities(server.address, tls(c, client=True))
        assert gauge(metrics, refused) == 1
    finally:
        assert server.stop() == 0


@pytest.mark.parametrize("case", ["key_of_another_cert", "cert_without_key", "ca_unreadable"])
def test_bad_tls_files_stop_the_start_naming_the_flag(tmp_path, case):
    if not SERVER_BIN.is_file():
        pytest.skip(f"server binary not built: {SERVER_BIN}")
    c = make_certs(tmp_path)
    flags, named = {
        "key_of_another_cert": (["--tls-cert", c["server_cert"], "--tls-key", c["client_key"]],
                                "--tls-key"),
        "cert_without_key": (["--tls-cert", c["server_cert"]], "--tls-cert and --tls-key"),
        "ca_unreadable": (["--tls-cert", c["server_cert"], "--tls-key", c["server_key"],
                           "--tls-client-ca", str(tmp_path / "absent.pem")], "--tls-client-ca"),
    }[case]
    done = subprocess.run([str(SERVER_BIN), "--host", "127.0.0.1", "--port", "0", *flags],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode != 0
    assert "listening on" not in done.stdout
    assert named in done.stderr, done.stderr


def test_the_health_port_answers_probes_in_plaintext_while_the_api_needs_tls(tmp_path):
    c = make_certs(tmp_path)
    port = free_port()
    server = tls_server(c, "--health-port", str(port))
    try:
        deadline = time.monotonic() + 10  # printed right after "listening on"
        while f"health on 127.0.0.1:{port}" not in server.stdout:
            assert time.monotonic() < deadline, server.stdout
            time.sleep(0.05)
        assert health(f"127.0.0.1:{port}") == b"\x08\x01"  # SERVING
        # Only health there: the API is not served in plaintext.
        with pytest.raises(tensorcheck.UnimplementedError):
            capabilities(f"127.0.0.1:{port}", None)
    finally:
        assert server.stop() == 0
