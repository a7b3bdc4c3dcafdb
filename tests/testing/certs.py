"""Throw-away TLS certificates for tests, made with the `openssl` command.

    import sys; sys.path.insert(0, str(REPO / "tests" / "testing"))
    from certs import make_certs

    c = make_certs(tmp_path)        # skips the test when openssl is missing
    server: --tls-cert c["server_cert"] --tls-key c["server_key"]
            [--tls-client-ca c["ca"]]   (mutual TLS)
    client: --tls-ca c["ca"] [--tls-cert c["client_cert"] --tls-key c["client_key"]]

Every path is an absolute str. The server certificate is for
IP:127.0.0.1, IP:::1 and DNS:localhost, so a client dialing 127.0.0.1:PORT
or localhost:PORT verifies it against c["ca"]; c["other_ca"] is a second,
unrelated CA (a client trusting only it must fail the handshake). Keys are
EC P-256, unencrypted PKCS#8 PEM; certificates are valid from now for 30
days. Used by client/python/tests/test_credentials.py and
tests/e2e/test_cli_tls.py; shared by the server's TLS tests.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
from pathlib import Path
from typing import Union

_CONFIG = """\
[req]
distinguished_name = dn
prompt = no

[dn]
CN = tensorcheck test

[ca]
basicConstraints = critical, CA:TRUE
keyUsage = critical, keyCertSign, cRLSign
subjectKeyIdentifier = hash

[server]
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature, keyEncipherment
extendedKeyUsage = serverAuth
subjectAltName = IP:127.0.0.1, IP:::1, DNS:localhost
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid

[client]
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature
extendedKeyUsage = clientAuth
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid
"""

_DAYS = "30"
_KEY = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"]


def have_openssl() -> bool:
    return shutil.which("openssl") is not None


def _openssl(*args: Union[str, Path]) -> None:
    r = subprocess.run(["openssl", *map(str, args)], capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"openssl {' '.join(map(str, args))} failed:\n{r.stderr}")


def _self_signed(d: Path, name: str, cn: str, config: Path) -> None:
    _openssl("req", "-x509", "-new", *_KEY, "-keyout", d / f"{name}.key",
             "-out", d / f"{name}.pem", "-days", _DAYS, "-subj", f"/CN={cn}",
             "-config", config, "-extensions", "ca")


def _signed(d: Path, name: str, cn: str, extensions: str, config: Path) -> None:
    csr = d / f"{name}.csr"
    _openssl("req", "-new", *_KEY, "-keyout", d / f"{name}.key", "-out", csr,
             "-subj", f"/CN={cn}", "-config", config)
    _openssl("x509", "-req", "-in", csr, "-CA", d / "ca.pem", "-CAkey", d / "ca.key",
             "-set_serial", f"0x{secrets.token_hex(8)}", "-days", _DAYS,
             "-out", d / f"{name}.pem", "-extfile", config, "-extensions", extensions)
    csr.unlink()


def make_certs(directory: Union[str, os.PathLike[str]]) -> dict[str, str]:
    """Writes a CA, a server and a client certificate signed by it, and an
    unrelated second CA into `directory` (created if need be); returns their
    paths: ca, ca_key, server_cert, server_key, client_cert, client_key,
    other_ca. Skips the calling pytest test when openssl is missing (raises
    RuntimeError outside pytest)."""
    if not have_openssl():
        try:
            import pytest
        except ImportError:
            raise RuntimeError("make_certs: the openssl command is not installed") from None
        pytest.skip("the openssl command is not installed")
    d = Path(directory).resolve()
    d.mkdir(parents=True, exist_ok=True)
    config = d / "openssl.cnf"
    config.write_text(_CONFIG)
    _self_signed(d, "ca", "tensorcheck test CA", config)
    _self_signed(d, "other_ca", "tensorcheck other test CA", config)
    _signed(d, "server", "localhost", "server", config)
    _signed(d, "client", "tensorcheck-test-client", "client", config)
    return {
        "ca": str(d / "ca.pem"),
        "ca_key": str(d / "ca.key"),
        "server_cert": str(d / "server.pem"),
        "server_key": str(d / "server.key"),
        "client_cert": str(d / "client.pem"),
        "client_key": str(d / "client.key"),
        "other_ca": str(d / "other_ca.pem"),
    }


if __name__ == "__main__":  # python3 tests/testing/certs.py DIR
    import json
    import sys

    print(json.dumps(make_certs(sys.argv[1] if len(sys.argv) > 1 else "."), indent=2))
