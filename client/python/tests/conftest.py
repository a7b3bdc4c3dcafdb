"""Fixtures: a tensorcheck-server on a free loopback port, and clients.

The server binary is $TENSORCHECK_SERVER_BIN, default
<repo>/build/server/tensorcheck-server. It is started once per session as
`tensorcheck-server --host 127.0.0.1 --port 0`, which prints
`listening on HOST:PORT` on stdout; tests that need it are skipped, with the
reason, when it is missing.

The CLI, which ModelReport.to_junit/to_html run (`tensorcheck render`), is
$TENSORCHECK_CLI_BIN (as in tests/e2e and scripts/test.sh), else
$TENSORCHECK_CLI, default <repo>/build/client/cli/tensorcheck: the `cli`
fixture sets $TENSORCHECK_CLI to it for the test, or skips it.
"""

from __future__ import annotations

import collections
import os
import queue
import re
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import tensorcheck

REPO = Path(__file__).resolve().parents[3]
DEFAULT_SERVER_BIN = REPO / "build" / "server" / "tensorcheck-server"
DEFAULT_CLI_BIN = REPO / "build" / "client" / "cli" / "tensorcheck"
_LISTENING = re.compile(r"listening on (\S+):(\d+)")
_START_TIMEOUT_S = 60.0


def server_bin() -> Path:
    return Path(os.environ.get("TENSORCHECK_SERVER_BIN") or DEFAULT_SERVER_BIN)


def cli_bin() -> Path:
    return Path(
        os.environ.get("TENSORCHECK_CLI_BIN")
        or os.environ.get("TENSORCHECK_CLI")
        or DEFAULT_CLI_BIN
    )


@pytest.fixture
def cli(monkeypatch: pytest.MonkeyPatch) -> Path:
    """The tensorcheck CLI, as $TENSORCHECK_CLI for the test (where
    ModelReport.to_junit/to_html find it); skips the test when it is not
    built."""
    path = cli_bin()
    if not (path.is_file() and os.access(path, os.X_OK)):
        pytest.skip(
            f"tensorcheck CLI not found at {path}: ModelReport.to_junit/to_html run its "
            "`tensorcheck render`; build it (cmake --build build) or set TENSORCHECK_CLI_BIN"
        )
    monkeypatch.setenv("TENSORCHECK_CLI", str(path))
    return path


def _dial_host(host: str) -> str:
    """Where to connect for a server that printed `host`."""
    if host in ("0.0.0.0", ""):
        return "127.0.0.1"
    if host in ("::", "[::]"):
        return "[::1]"
    return host


class _Server:
    def __init__(self, path: Path, args: tuple[str, ...] = ()) -> None:
        self.output: collections.deque = collections.deque(maxlen=2000)
        self._lines: queue.Queue[str | None] = queue.Queue()
        self.proc = subprocess.Popen(
            # Loopback only: nothing outside this machine needs the test server.
            [str(path), "--host", "127.0.0.1", "--port", "0", *args],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            bufsize=1,
        )
        # Drain the output for the server's lifetime: a full pipe would
        # block its request logging.
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self.target = self._wait_listening()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.output.append(line.rstrip("\n"))
            self._lines.put(line)
        self._lines.put(None)

    def _wait_listening(self) -> str:
        deadline = time.monotonic() + _START_TIMEOUT_S
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                self.stop()
                pytest.fail(
                    f"tensorcheck-server printed no 'listening on HOST:PORT' line "
                    f"within {_START_TIMEOUT_S:.0f}s; output:\n" + self.log()
                )
            try:
                line = self._lines.get(timeout=left)
            except queue.Empty:
                continue
            if line is None:
                self.proc.wait()
                pytest.fail(
                    f"tensorcheck-server exited with {self.proc.returncode} "
                    "before listening; output:\n" + self.log()
                )
            m = _LISTENING.search(line)
            if m:
                return f"{_dial_host(m.group(1))}:{m.group(2)}"

    def log(self) -> str:
        return "\n".join(self.output)

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._reader.join(timeout=5)
        return self.proc.returncode


def launch_server(*args: str) -> _Server:
    """A tensorcheck-server of its own with extra flags (e.g.
    "--store-bytes", "0"); skips the test when there is no binary. Stop it
    with .stop()."""
    path = server_bin()
    if not (path.is_file() and os.access(path, os.X_OK)):
        pytest.skip(
            f"tensorcheck-server not found at {path}: build the server "
            "(cmake --build build) or set TENSORCHECK_SERVER_BIN"
        )
    return _Server(path, tuple(args))


@pytest.fixture(scope="session")
def start_server() -> Callable[..., _Server]:
    """launch_server, for tests that need a server of their own (a fixture:
    `from conftest import` would clash with tests/e2e/conftest.py when both
    suites run in one pytest)."""
    return launch_server


@pytest.fixture(scope="session")
def server() -> Iterator[_Server]:
    srv = launch_server()
    yield srv
    srv.stop()


@pytest.fixture(scope="session")
def target(server: _Server) -> str:
    return server.target


@pytest.fixture(scope="session")
def client(target: str) -> Iterator[tensorcheck.Client]:
    with tensorcheck.Client(target, timeout=120) as c:
        yield c


@pytest.fixture
def offline_client() -> Iterator[tensorcheck.Client]:
    """A client whose server does not exist: any RPC would raise
    UnavailableError, so a TypeError/ValueError proves the argument was
    rejected before a call was made."""
    with tensorcheck.Client("127.0.0.1:1", timeout=10) as c:
        yield c


# Fixtures that start a tensorcheck-server process: a test that uses one
# (directly or through `target`/`client`) is marked e2e. The markers are
# registered in pyproject.toml.
_SERVER_FIXTURES = frozenset({"server", "start_server"})


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Marks e2e this folder's tests that start a server."""
    here = Path(__file__).parent
    for item in items:
        if here in Path(item.path).parents and _SERVER_FIXTURES & set(
            getattr(item, "fixturenames", ())
        ):
            item.add_marker(pytest.mark.e2e)
