"""The server's front door: --help, --version, the exit code of a usage
error, a port that is taken, and scripts/serve.sh binding loopback.

What the tests expect comes from elsewhere than the binary: the flags from
the ABSL_FLAG definitions in server/ sources, the version from the
top-level CMakeLists.txt, the build type from the build's CMakeCache.txt,
which address a socket listens on from /proc/net/tcp{,6}.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import threading

import pytest

from e2e_support import REPO, SERVER_BIN, ServerProcess, wait_until

grpc = pytest.importorskip("grpc")


def server(*flags: str) -> subprocess.CompletedProcess:
    """The server binary run to completion (a guard of 60 s against a hang)."""
    if not SERVER_BIN.is_file():
        pytest.skip(f"server binary not built: {SERVER_BIN} (set TENSORCHECK_SERVER_BIN)")
    return subprocess.run([str(SERVER_BIN), *flags], capture_output=True, text=True,
                          timeout=60, check=False)


def server_flags() -> set[str]:
    """The names of the flags the server's sources define (not its tests')."""
    names = set()
    for source in (REPO / "server").rglob("*.cc"):
        if source.name.endswith("_test.cc"):
            continue
        names |= set(re.findall(r"ABSL_FLAG\(\s*[\w:]+\s*,\s*(\w+)\s*,", source.read_text()))
    return names


def health(address: str) -> int:
    """grpc.health.v1.Health/Check with an empty request; the status enum."""
    with grpc.insecure_channel(address) as channel:
        check = channel.unary_unary("/grpc.health.v1.Health/Check",
                                    request_serializer=lambda b: b,
                                    response_deserializer=lambda b: b)
        reply = check(b"", timeout=30)
    # HealthCheckResponse{status = 1: varint}; absent means UNKNOWN (0).
    return reply[1] if len(reply) >= 2 and reply[0] == 0x08 else 0


def listening_addresses(port: int) -> set[str]:
    """The local addresses of the TCP sockets listening on `port`, as the
    kernel lists them (hex, /proc/net/tcp and tcp6)."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        if not os.path.exists(table):
            continue
        with open(table) as f:
            next(f)
            for line in f:
                fields = line.split()
                address, port_hex = fields[1].split(":")
                if fields[3] == "0A" and int(port_hex, 16) == port:  # 0A: LISTEN
                    found.add(address)
    return found


# 127.0.0.1 in /proc/net/tcp, ::ffff:127.0.0.1 and ::1 in /proc/net/tcp6.
LOOPBACK = {"0100007F", "0000000000000000FFFF00000100007F", "00000000000000000000000001000000"}


def test_help_lists_every_server_flag_with_its_help_and_exits_zero():
    flags = server_flags()
    assert {"port", "host", "metrics_port", "tokens_file"} <= flags  # the scan works
    done = server("--help")
    assert done.returncode == 0, done.stderr
    assert "No flags matched" not in done.stdout
    listed = set(re.findall(r"^    --(\w+) \(", done.stdout, re.MULTILINE))
    assert listed == flags
    assert "--port (Port to listen on; 0 picks a free port.); default: 50051;" in done.stdout
    # Every address by default: the images and manifests rely on it (with TLS
    # and tokens); scripts/serve.sh asks for 127.0.0.1.
    assert '--host (Address to listen on.); default: "0.0.0.0";' in done.stdout
    # Abseil's own flags only with --helpfull.
    assert "--flagfile" not in done.stdout
    full = server("--helpfull")
    assert full.returncode == 0
    assert "--flagfile" in full.stdout and "--port (Port to listen on" in full.stdout
    # Flags are documented with dashes: the usage line says both spellings work.
    assert "--max-message-mb" in done.stdout


def test_version_prints_the_project_version_and_the_build():
    project = re.search(r"project\(tensorcheck VERSION (\d+\.\d+\.\d+)",
                        (REPO / "CMakeLists.txt").read_text())
    assert project
    done = server("--version")
    assert done.returncode == 0, done.stderr
    assert "Debug build" not in done.stdout
    m = re.fullmatch(r"tensorcheck-server (\S+) \((\w+), CUDA (on|off)\)\n", done.stdout)
    assert m, done.stdout
    assert m.group(1) == project.group(1)
    cache = SERVER_BIN.parents[1] / "CMakeCache.txt"
    if cache.is_file():  # the binary of a build tree: its configuration
        settings = dict(re.findall(r"^(\w+):\w+=(.*)$", cache.read_text(), re.MULTILINE))
        assert m.group(2) == settings["CMAKE_BUILD_TYPE"]
        cuda = settings.get("TENSORCHECK_ENABLE_CUDA", "OFF").upper() in ("ON", "1", "TRUE")
        assert m.group(3) == ("on" if cuda else "off")


@pytest.mark.parametrize("flags, message", [
    (["--bogus"], "Unknown command line flag 'bogus'"),
    (["--port=abc"], "Illegal value 'abc' specified for flag 'port'"),
    (["--threads", "many"], "Illegal value 'many' specified for flag 'threads'"),
    (["--port", "70000"], "--port: 0 (a free port) or 1..65535 expected, got 70000"),
    (["--max-message-mb", "0"], "--max-message-mb: 1..2047 expected, got 0"),
    # A usage error beside --help is still a usage error.
    (["--help", "--bogus"], "Unknown command line flag 'bogus'"),
])
def test_a_usage_error_exits_two_with_the_reason(flags, message):
    done = server("--host", "127.0.0.1", *flags)
    assert done.returncode == 2, (done.returncode, done.stderr)
    assert message in done.stderr
    assert "listening on" not in done.stdout


@pytest.mark.parametrize("host", ["127.0.0.1", "0.0.0.0"])
def test_a_taken_port_fails_the_second_server_and_the_first_still_serves(host):
    first = ServerProcess()
    try:
        port = int(first.address.rsplit(":", 1)[1])
        assert health(first.address) == 1  # SERVING
        # 0.0.0.0 covers 127.0.0.1: taken too (no SO_REUSEPORT sharing).
        second = server("--host", host, "--port", str(port))
        assert second.returncode == 1, (second.returncode, second.stdout, second.stderr)
        assert "listening on" not in second.stdout
        assert f"cannot listen on {host}:{port}" in second.stderr, second.stderr
        assert f"port {port} is already in use" in second.stderr
        # The first is still the one that answers, and the only listener.
        assert first.proc.poll() is None
        assert health(first.address) == 1
        assert listening_addresses(port) <= LOOPBACK
    finally:
        assert first.stop() == 0


@pytest.mark.parametrize("flag, what", [("--health-port", "the health port"),
                                        ("--metrics-port", "the metrics endpoint")])
def test_a_taken_health_or_metrics_port_is_named(flag, what):
    first = ServerProcess()
    try:
        port = int(first.address.rsplit(":", 1)[1])
        second = server("--host", "127.0.0.1", "--port", "0", flag, str(port))
        assert second.returncode == 1, second.stderr
        assert "listening on" not in second.stdout
        assert (f"cannot listen on 127.0.0.1:{port} ({what}): port {port} is already in use"
                in second.stderr), second.stderr
        assert health(first.address) == 1
    finally:
        assert first.stop() == 0


class Serve:
    """scripts/serve.sh --no-setup on the build of SERVER_BIN, its output
    collected line by line; in its own session, so that a failed test
    leaves no server behind."""

    def __init__(self, *args: str) -> None:
        build = SERVER_BIN.parents[1]
        if not (build / "client/cli/tensorcheck").is_file():
            pytest.skip(f"serve.sh needs the CLI beside the server in {build}")
        self.proc = subprocess.Popen(
            ["bash", str(REPO / "scripts/serve.sh"), "--no-setup", *args],
            env={**os.environ, "BUILD_DIR": str(build)}, cwd=REPO, start_new_session=True,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.stdout: list[str] = []
        self.stderr: list[str] = []
        self.readers = [threading.Thread(target=self._read, args=pipe, daemon=True)
                        for pipe in ((self.proc.stdout, self.stdout),
                                     (self.proc.stderr, self.stderr))]
        for reader in self.readers:
            reader.start()

    @staticmethod
    def _read(stream, sink: list[str]) -> None:
        for line in stream:
            sink.append(line.rstrip("\n"))

    def wait(self) -> int:
        """The exit code, once serve.sh and everything it printed are in."""
        code = self.proc.wait(timeout=120)
        for reader in self.readers:
            reader.join(timeout=60)
        return code

    def serving(self) -> str:
        """HOST:PORT once serve.sh says it is serving (fails if it exits first)."""
        def said() -> bool:
            return (any("is serving on" in line for line in self.stdout)
                    or self.proc.poll() is not None)
        wait_until(said, "serve.sh: 'tensorcheck-server is serving on'")
        line = next((x for x in self.stdout if "is serving on" in x), None)
        assert line, (self.stdout[-20:], self.stderr[-20:])
        return line.split("serving on ")[1].split()[0]

    def close(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()


def test_serve_sh_binds_loopback_shows_it_working_and_stops_on_ctrl_c():
    serve = Serve("--port", "0")
    try:
        address = serve.serving()
        host, port = address.rsplit(":", 1)
        assert host == "127.0.0.1"
        assert f"listening on {address}" in serve.stdout
        bound = listening_addresses(int(port))
        assert bound and bound <= LOOPBACK, bound
        assert health(address) == 1
        # README: it shows capabilities, then the Flax case verified and
        # diagnosed (the TF32 configuration found).
        out = "\n".join(serve.stdout)
        assert "== tensorcheck capabilities" in out and "tensorcheck server " in out
        diagnosis = out.split("== which configuration produced it?")[1]
        assert "cpu:tf32:unfused" in diagnosis
        # Ctrl-C: serve.sh stops the server and exits 0 with it.
        serve.proc.send_signal(signal.SIGINT)
        assert serve.wait() == 0
        wait_until(lambda: not listening_addresses(int(port)), "the port released")
    finally:
        serve.close()


def test_serve_sh_on_a_taken_port_says_so_and_fails():
    first = ServerProcess()
    serve = None
    try:
        port = first.address.rsplit(":", 1)[1]
        serve = Serve("--port", port)
        assert serve.wait() == 1
        err = "\n".join(serve.stderr)
        assert f"port {port} is already in use" in err
        assert "serve.sh: tensorcheck-server did not start" in err
        # It never talked to the other server.
        assert not any("== tensorcheck capabilities" in x for x in serve.stdout)
        assert health(first.address) == 1
    finally:
        if serve is not None:
            serve.close()
        assert first.stop() == 0
