"""The CLI's connection flags against in-process fake servers (Python grpcio)
over TLS, mutual TLS and plaintext: --tls-ca, --tls-cert, --tls-key,
--token, and the environment variables TENSORCHECK_SERVER and
TENSORCHECK_TOKEN. The fakes answer `capabilities` (GetCapabilities) and
`health` (grpc.health.v1.Health/Check) and record the authorization
metadata and client certificate of every call. Certificates come from
tests/testing/certs.py (openssl; skipped without it). Skips without the CLI
binary (TENSORCHECK_CLI_BIN) or the installed Python client's stubs.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
from concurrent import futures
from pathlib import Path
from typing import Any, Iterator, Optional

import pytest

from e2e_support import CLI_BIN, REPO, need_cli

grpc = pytest.importorskip("grpc")
_pb = pytest.importorskip("tensorcheck._pb")
pb, pb_grpc = _pb.pb, _pb.pb_grpc

sys.path.insert(0, str(REPO / "tests" / "testing"))
from certs import make_certs  # noqa: E402

# HealthCheckResponse{status: SERVING}, as bytes (no health stubs needed).
_SERVING = b"\x08\x01"


class Recorder:
    """What the fake saw; `require_token` refuses calls without that token
    (UNAUTHENTICATED), `deny_token` refuses that one (PERMISSION_DENIED)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.calls: list[tuple[str, Optional[str], Optional[str]]] = []
        self.require_token: Optional[str] = None
        self.deny_token: Optional[str] = None

    def record(self, method: str, context: Any) -> None:
        auth = dict(context.invocation_metadata()).get("authorization")
        cn = context.auth_context().get("x509_common_name")
        with self.lock:
            self.calls.append((method, auth, cn[0].decode() if cn else None))
        if self.deny_token is not None and auth == f"Bearer {self.deny_token}":
            context.abort(grpc.StatusCode.PERMISSION_DENIED, "token lacks the right")
        if self.require_token is not None and auth != f"Bearer {self.require_token}":
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or unknown bearer token")

    def auth(self) -> list[Optional[str]]:
        with self.lock:
            return [a for _, a, _ in self.calls]

    def reset(self) -> None:
        with self.lock:
            self.calls.clear()
        self.require_token = self.deny_token = None


@contextlib.contextmanager
def serve(recorder: Recorder, certs: Optional[dict[str, str]], *,
          require_client_auth: bool = False) -> Iterator[int]:
    """A fake on a free loopback port: TLS with `certs`' server certificate,
    plaintext when `certs` is None. Yields the port."""

    class Servicer(pb_grpc.TensorCheckServicer):
        def GetCapabilities(self, request, context):
            recorder.record("GetCapabilities", context)
            return pb.GetCapabilitiesResponse(server_version="fake-tls",
                                              default_reference="cpu:fp64")

    def check(request: bytes, context: Any) -> bytes:
        recorder.record("Check", context)
        return _SERVING

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    pb_grpc.add_TensorCheckServicer_to_server(Servicer(), server)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
        "grpc.health.v1.Health", {"Check": grpc.unary_unary_rpc_method_handler(check)}),))
    if certs is None:
        port = server.add_insecure_port("127.0.0.1:0")
    else:
        creds = grpc.ssl_server_credentials(
            [(Path(certs["server_key"]).read_bytes(), Path(certs["server_cert"]).read_bytes())],
            root_certificates=Path(certs["ca"]).read_bytes() if require_client_auth else None,
            require_client_auth=require_client_auth)
        port = server.add_secure_port("127.0.0.1:0", creds)
    server.start()
    try:
        yield port
    finally:
        server.stop(grace=None)


@pytest.fixture(scope="module")
def certs(tmp_path_factory) -> dict[str, str]:
    need_cli()
    return make_certs(tmp_path_factory.mktemp("certs"))


@pytest.fixture(scope="module")
def tls_server(certs) -> Iterator[tuple[Recorder, int]]:
    rec = Recorder()
    with serve(rec, certs) as port:
        yield rec, port


@pytest.fixture(scope="module")
def mtls_server(certs) -> Iterator[tuple[Recorder, int]]:
    rec = Recorder()
    with serve(rec, certs, require_client_auth=True) as port:
        yield rec, port


@pytest.fixture()
def tls(tls_server) -> tuple[Recorder, int]:
    rec, port = tls_server
    rec.reset()
    return rec, port


def cli(*args: str, env: Optional[dict[str, str]] = None) -> subprocess.CompletedProcess:
    """The CLI with TENSORCHECK_SERVER and TENSORCHECK_TOKEN taken only from
    `env`."""
    need_cli()
    e = {k: v for k, v in os.environ.items()
         if k not in ("TENSORCHECK_SERVER", "TENSORCHECK_TOKEN", "GITHUB_STEP_SUMMARY")}
    e.update(env or {})
    return subprocess.run([str(CLI_BIN), *args], capture_output=True, text=True,
                          timeout=60, env=e)


def test_tls_with_the_right_ca(tls, certs) -> None:
    rec, port = tls
    for host in ("127.0.0.1", "localhost"):
        r = cli("--server", f"{host}:{port}", "--tls-ca", certs["ca"], "capabilities")
        assert r.returncode == 0, r.stderr
        assert "fake-tls" in r.stdout
    # Flags before or after the command; health too.
    r = cli("--tls-ca", certs["ca"], "--server", f"127.0.0.1:{port}", "health", "--timeout", "20")
    assert (r.returncode, r.stdout.strip()) == (0, "SERVING"), r.stderr
    r = cli("capabilities", "--json", f"--server=127.0.0.1:{port}", f"--tls-ca={certs['ca']}")
    assert r.returncode == 0, r.stderr
    assert rec.auth() == [None, None, None, None]


def test_tls_with_a_wrong_ca_fails(tls, certs) -> None:
    rec, port = tls
    r = cli("--server", f"127.0.0.1:{port}", "--tls-ca", certs["other_ca"], "capabilities",
            "--timeout", "20")
    assert r.returncode == 3, r.stderr
    assert "UNAVAILABLE" in r.stderr and f"127.0.0.1:{port}, TLS" in r.stderr, r.stderr
    r = cli("--server", f"127.0.0.1:{port}", "--tls-ca", certs["other_ca"], "health",
            "--timeout", "20")
    assert r.returncode == 3, r.stderr
    # Nor does plaintext reach a TLS server.
    r = cli("--server", f"127.0.0.1:{port}", "capabilities", "--timeout", "20")
    assert r.returncode == 3, r.stderr
    assert rec.calls == []


def test_mutual_tls(mtls_server, certs) -> None:
    rec, port = mtls_server
    rec.reset()
    server = ("--server", f"127.0.0.1:{port}", "--tls-ca", certs["ca"])
    r = cli(*server, "capabilities", "--timeout", "20")
    assert r.returncode == 3, r.stderr
    client = ("--tls-cert", certs["client_cert"], "--tls-key", certs["client_key"])
    r = cli(*server, *client, "capabilities")
    assert r.returncode == 0, r.stderr
    r = cli(*server, "health", *client)
    assert (r.returncode, r.stdout.strip()) == (0, "SERVING"), r.stderr
    assert [cn for _, _, cn in rec.calls] == ["tensorcheck-test-client"] * 2


def test_token_arrives(tls, certs) -> None:
    rec, port = tls
    server = ("--server", f"127.0.0.1:{port}", "--tls-ca", certs["ca"])
    assert cli(*server, "capabilities", "--token", "flag-token").returncode == 0
    assert cli(*server, "health", env={"TENSORCHECK_TOKEN": "env-token"}).returncode == 0
    # --token wins over the environment; an empty one sends none.
    assert cli(*server, "--token", "flag-token", "capabilities",
               env={"TENSORCHECK_TOKEN": "env-token"}).returncode == 0
    assert cli(*server, "--token=", "capabilities",
               env={"TENSORCHECK_TOKEN": "env-token"}).returncode == 0
    assert cli(*server, "capabilities", env={"TENSORCHECK_TOKEN": ""}).returncode == 0
    assert rec.auth() == ["Bearer flag-token", "Bearer env-token", "Bearer flag-token", None, None]


def test_token_over_plaintext() -> None:
    rec = Recorder()
    with serve(rec, None) as port:
        r = cli("--server", f"127.0.0.1:{port}", "capabilities",
                env={"TENSORCHECK_TOKEN": "plain-token"})
        assert r.returncode == 0, r.stderr
        r = cli("--server", f"127.0.0.1:{port}", "health", "--token", "plain-token")
        assert r.returncode == 0, r.stderr
    assert rec.auth() == ["Bearer plain-token"] * 2


def test_server_from_the_environment(tls, certs) -> None:
    rec, port = tls
    r = cli("--tls-ca", certs["ca"], "capabilities",
            env={"TENSORCHECK_SERVER": f"localhost:{port}", "TENSORCHECK_TOKEN": "t"})
    assert r.returncode == 0, r.stderr
    r = cli("health", "--tls-ca", certs["ca"], env={"TENSORCHECK_SERVER": f"localhost:{port}"})
    assert r.returncode == 0, r.stderr
    # --server wins over the environment.
    r = cli("--server", f"localhost:{port}", "--tls-ca", certs["ca"], "capabilities",
            env={"TENSORCHECK_SERVER": "127.0.0.1:1"})
    assert r.returncode == 0, r.stderr
    assert rec.auth() == ["Bearer t", None, None]
    # An empty TENSORCHECK_SERVER is unset: the default target.
    r = cli("health", "--timeout", "5", env={"TENSORCHECK_SERVER": ""})
    assert r.returncode == 3
    assert "localhost:50051" in r.stderr


def test_refused_tokens_say_what_to_check(tls, certs) -> None:
    rec, port = tls
    rec.require_token = "good"
    rec.deny_token = "reader"
    server = ("--server", f"127.0.0.1:{port}", "--tls-ca", certs["ca"])
    r = cli(*server, "capabilities")
    assert r.returncode == 3
    assert "UNAUTHENTICATED" in r.stderr and "no token was sent" in r.stderr, r.stderr
    assert "--token" in r.stderr and "TENSORCHECK_TOKEN" in r.stderr
    r = cli(*server, "capabilities", env={"TENSORCHECK_TOKEN": "bad"})
    assert r.returncode == 3
    assert "UNAUTHENTICATED" in r.stderr and "token of TENSORCHECK_TOKEN" in r.stderr, r.stderr
    r = cli(*server, "health", "--token", "reader")
    assert r.returncode == 3
    assert "PERMISSION_DENIED" in r.stderr and "token of --token" in r.stderr, r.stderr
    assert cli(*server, "capabilities", "--token", "good").returncode == 0


@pytest.mark.parametrize("command", ["capabilities", "health", "verify", "diagnose", "upload",
                                     "sweep"])
def test_usage_errors_name_the_flag(command, certs, tmp_path) -> None:
    not_pem = tmp_path / "not.pem"
    not_pem.write_text("hello\n")
    absent = str(tmp_path / "absent.pem")
    cases = [
        (["--tls-cert", certs["client_cert"]], "--tls-cert"),
        (["--tls-key", certs["client_key"]], "--tls-key"),
        (["--tls-ca", absent], "--tls-ca"),
        (["--tls-ca", str(not_pem)], "--tls-ca"),
        (["--tls-ca", certs["ca"], "--tls-cert", absent, "--tls-key", certs["client_key"]],
         "--tls-cert"),
        (["--tls-cert", certs["client_cert"], "--tls-key", certs["client_cert"]], "--tls-key"),
        (["--token", "two\nlines"], "--token"),
        (["--server", ""], "--server"),
    ]
    for flags, named in cases:
        # 127.0.0.1:1: nothing is listening, so only a usage error exits 2.
        r = cli("--server", "127.0.0.1:1", command, *flags, "--timeout", "5")
        assert r.returncode == 2, (flags, r.stderr)
        assert r.stderr.startswith(f"tensorcheck: {named}"), (flags, r.stderr)
    r = cli("--server", "127.0.0.1:1", command, "--timeout", "5",
            env={"TENSORCHECK_TOKEN": "tab\there"})
    assert r.returncode == 2, r.stderr
    assert r.stderr.startswith("tensorcheck: TENSORCHECK_TOKEN"), r.stderr


def test_help_lists_the_connection_flags() -> None:
    for args in (["--help"], ["capabilities", "--help"], ["sweep", "--help"]):
        r = cli(*args)
        assert r.returncode == 0
        for word in ("--tls-ca", "--tls-cert", "--tls-key", "--token", "TENSORCHECK_TOKEN",
                     "TENSORCHECK_SERVER"):
            assert word in r.stdout, (args, word)
