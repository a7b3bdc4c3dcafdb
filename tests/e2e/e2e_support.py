"""What the end-to-end tests share: the binaries, a server process on a free
loopback port, and running the CLI."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SERVER_BIN = Path(
    os.environ.get("TENSORCHECK_SERVER_BIN", REPO / "build/server/tensorcheck-server")
)
CLI_BIN = Path(os.environ.get("TENSORCHECK_CLI_BIN", REPO / "build/client/cli/tensorcheck"))


def need_cli() -> None:
    if not CLI_BIN.is_file():
        pytest.skip(f"CLI binary not built: {CLI_BIN} (set TENSORCHECK_CLI_BIN)")


class ServerProcess:
    """tensorcheck-server on 127.0.0.1 with --port 0, its stdout and stderr
    collected line by line (so logs never fill a pipe)."""

    def __init__(self, *flags: str) -> None:
        if not SERVER_BIN.is_file():
            pytest.skip(f"server binary not built: {SERVER_BIN} (set TENSORCHECK_SERVER_BIN)")
        self.proc = subprocess.Popen(
            [str(SERVER_BIN), "--host", "127.0.0.1", "--port", "0", *flags],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.stdout: list[str] = []
        self.stderr: list[str] = []
        self.address = ""
        ready = threading.Event()

        def read(stream, sink, watch):
            for line in stream:
                sink.append(line.rstrip("\n"))
                m = re.match(r"listening on (\S+:\d+)$", line.strip())
                if watch and m:
                    self.address = m.group(1)
                    ready.set()
            ready.set()

        for stream, sink, watch in ((self.proc.stdout, self.stdout, True),
                                    (self.proc.stderr, self.stderr, False)):
            threading.Thread(target=read, args=(stream, sink, watch), daemon=True).start()
        if not ready.wait(60) or not self.address:
            self.proc.kill()
            self.proc.wait()
            pytest.fail(f"server did not print 'listening on HOST:PORT': {self.stderr[-5:]}")

    def stop(self) -> int:
        """SIGTERM, then the exit code (killed after 60 s)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()


def run_cli(*args: str, env: dict[str, str] | None = None,
            timeout: float = 180) -> subprocess.CompletedProcess:
    need_cli()
    full_env = dict(os.environ)
    full_env.pop("GITHUB_STEP_SUMMARY", None)
    if env:
        full_env.update(env)
    return subprocess.run([str(CLI_BIN), *args], capture_output=True, text=True,
                          timeout=timeout, env=full_env)
