"""TLS, mutual TLS, bearer tokens and the environment variables of Client,
against an in-process TLS server (grpcio) with certificates made by openssl
for the test (tests/testing/certs.py; skipped without openssl)."""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any, Optional

import grpc
import pytest

import tensorcheck
from in_process_server import serve_in_process
from tensorcheck._pb import pb, pb_grpc

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tests" / "testing"))
from certs import make_certs  # noqa: E402

TIMEOUT_S = 20.0


class RecordingServicer(pb_grpc.TensorCheckServicer):
    """GetCapabilities only; records each call's authorization metadata and
    the client certificate's common name; with `require_token`, answers
    UNAUTHENTICATED to a call without that token."""

    def __init__(self, require_token: Optional[str] = None) -> None:
        self.require_token = require_token
        self.authorization: list[Optional[str]] = []
        self.client_cn: list[Optional[str]] = []
        self.lock = threading.Lock()

    def GetCapabilities(self, request: Any, context: grpc.ServicerContext) -> Any:
        md = dict(context.invocation_metadata())
        auth = md.get("authorization")
        cn = context.auth_context().get("x509_common_name")
        with self.lock:
            self.authorization.append(auth if isinstance(auth, str) else None)
            self.client_cn.append(cn[0].decode() if cn else None)
        if self.require_token is not None and auth != f"Bearer {self.require_token}":
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or unknown bearer token")
        return pb.GetCapabilitiesResponse(server_version="fake-tls")


@contextlib.contextmanager
def serve_tls(
    servicer: RecordingServicer,
    certs: dict[str, str],
    *,
    require_client_auth: bool = False,
) -> Iterator[int]:
    """Serves `servicer` over TLS on a free loopback port; yields the port."""
    creds = grpc.ssl_server_credentials(
        [(Path(certs["server_key"]).read_bytes(), Path(certs["server_cert"]).read_bytes())],
        root_certificates=Path(certs["ca"]).read_bytes() if require_client_auth else None,
        require_client_auth=require_client_auth,
    )
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    pb_grpc.add_TensorCheckServicer_to_server(servicer, server)
    port = server.add_secure_port("127.0.0.1:0", creds)
    server.start()
    try:
        yield port
    finally:
        server.stop(grace=None)


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    return make_certs(tmp_path_factory.mktemp("certs"))


@pytest.fixture(autouse=True)
def no_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """The tests set TENSORCHECK_SERVER and TENSORCHECK_TOKEN themselves."""
    monkeypatch.delenv("TENSORCHECK_SERVER", raising=False)
    monkeypatch.delenv("TENSORCHECK_TOKEN", raising=False)


def capabilities(target: Optional[str], **kw: Any) -> str:
    with tensorcheck.Client(target, timeout=TIMEOUT_S, **kw) as client:
        return client.capabilities().server_version


def test_tls_with_the_right_ca(certs: dict[str, str]) -> None:
    servicer = RecordingServicer()
    with serve_tls(servicer, certs) as port:
        tls = tensorcheck.tls_credentials(ca=certs["ca"])
        assert capabilities(f"127.0.0.1:{port}", tls=tls) == "fake-tls"
        # The certificate names localhost too.
        assert capabilities(f"localhost:{port}", tls=tls) == "fake-tls"
        # PEM bytes instead of a path.
        tls = tensorcheck.tls_credentials(ca=Path(certs["ca"]).read_bytes())
        assert capabilities(f"127.0.0.1:{port}", tls=tls) == "fake-tls"
    assert servicer.authorization == [None, None, None]


def test_tls_with_a_wrong_ca_fails(certs: dict[str, str]) -> None:
    servicer = RecordingServicer()
    with serve_tls(servicer, certs) as port:
        tls = tensorcheck.tls_credentials(ca=certs["other_ca"])
        with pytest.raises(tensorcheck.UnavailableError):
            capabilities(f"127.0.0.1:{port}", tls=tls)
        # Nor does plaintext reach a TLS server.
        with pytest.raises(tensorcheck.UnavailableError):
            capabilities(f"127.0.0.1:{port}")
    assert servicer.authorization == []


def test_mutual_tls(certs: dict[str, str]) -> None:
    servicer = RecordingServicer()
    with serve_tls(servicer, certs, require_client_auth=True) as port:
        target = f"127.0.0.1:{port}"
        with pytest.raises(tensorcheck.UnavailableError):
            capabilities(target, tls=tensorcheck.tls_credentials(ca=certs["ca"]))
        tls = tensorcheck.tls_credentials(
            ca=certs["ca"], cert=certs["client_cert"], key=certs["client_key"]
        )
        assert capabilities(target, tls=tls) == "fake-tls"
    assert servicer.client_cn == ["tensorcheck-test-client"]


def test_token_arrives_as_bearer(certs: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    servicer = RecordingServicer()
    with serve_tls(servicer, certs) as port:
        target = f"127.0.0.1:{port}"
        tls = tensorcheck.tls_credentials(ca=certs["ca"])
        capabilities(target, tls=tls, token="explicit-token")
        monkeypatch.setenv("TENSORCHECK_TOKEN", "env-token")
        capabilities(target, tls=tls)
        # An explicit token wins over the environment's.
        capabilities(target, tls=tls, token="explicit-token")
        monkeypatch.setenv("TENSORCHECK_TOKEN", "")
        capabilities(target, tls=tls)
    assert servicer.authorization == [
        "Bearer explicit-token",
        "Bearer env-token",
        "Bearer explicit-token",
        None,
    ]


def test_token_over_plaintext(monkeypatch: pytest.MonkeyPatch) -> None:
    servicer = RecordingServicer()
    monkeypatch.setenv("TENSORCHECK_TOKEN", "plain-token")
    with serve_in_process(servicer) as target:
        capabilities(target)
    assert servicer.authorization == ["Bearer plain-token"]


def test_refused_token_is_unauthenticated(certs: dict[str, str]) -> None:
    servicer = RecordingServicer(require_token="good")
    with serve_tls(servicer, certs) as port:
        target = f"127.0.0.1:{port}"
        tls = tensorcheck.tls_credentials(ca=certs["ca"])
        with pytest.raises(tensorcheck.UnauthenticatedError):
            capabilities(target, tls=tls)
        with pytest.raises(tensorcheck.UnauthenticatedError):
            capabilities(target, tls=tls, token="bad")
        assert capabilities(target, tls=tls, token="good") == "fake-tls"


def test_server_from_the_environment(
    certs: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    servicer = RecordingServicer()
    with serve_tls(servicer, certs) as port:
        monkeypatch.setenv("TENSORCHECK_SERVER", f"localhost:{port}")
        tls = tensorcheck.tls_credentials(ca=certs["ca"])
        with tensorcheck.Client(tls=tls, timeout=TIMEOUT_S) as client:
            assert client.server == f"localhost:{port}"
            assert client.capabilities().server_version == "fake-tls"
        # The one-off helpers' default target too.
        assert capabilities(None, tls=tls) == "fake-tls"
    assert len(servicer.authorization) == 2


def test_target_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    with tensorcheck.Client() as client:
        assert client.server == tensorcheck.DEFAULT_SERVER
    monkeypatch.setenv("TENSORCHECK_SERVER", "")
    with tensorcheck.Client() as client:
        assert client.server == tensorcheck.DEFAULT_SERVER
    monkeypatch.setenv("TENSORCHECK_SERVER", "elsewhere:1234")
    with tensorcheck.Client("given:1") as client:
        assert client.server == "given:1"


def test_bad_token_from_the_environment_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TENSORCHECK_TOKEN", "two\nlines")
    with pytest.raises(ValueError, match="TENSORCHECK_TOKEN"):
        tensorcheck.Client("localhost:1")


def test_tls_credentials_errors(certs: dict[str, str], tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"^cert: needs key"):
        tensorcheck.tls_credentials(ca=certs["ca"], cert=certs["client_cert"])
    with pytest.raises(ValueError, match=r"^key: needs cert"):
        tensorcheck.tls_credentials(key=certs["client_key"])
    with pytest.raises(ValueError, match=r"^ca: cannot read"):
        tensorcheck.tls_credentials(ca=tmp_path / "absent.pem")
    with pytest.raises(ValueError, match=r"^key: cannot read"):
        tensorcheck.tls_credentials(cert=certs["client_cert"], key=str(tmp_path / "absent.key"))
    not_pem = tmp_path / "not.pem"
    not_pem.write_text("hello\n")
    with pytest.raises(ValueError, match=r"^cert: no PEM data"):
        tensorcheck.tls_credentials(cert=not_pem, key=certs["client_key"])
    with pytest.raises(TypeError, match=r"^ca:"):
        tensorcheck.tls_credentials(ca=42)  # type: ignore[arg-type]
    # Nothing given: TLS with the system's roots.
    assert isinstance(tensorcheck.tls_credentials(), grpc.ChannelCredentials)
