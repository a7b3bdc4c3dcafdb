"""The plaintext health port (--health-port, docs/operations.md "Probes and
shutdown") keeps its connections short, as the API port does: one that never
speaks HTTP/2, one that trickles its preface, and a channel left idle after
its probe are all closed by the server. The limit follows
--max-connection-idle-seconds (1 s here); each test waits for the close
with a guard of 30 times it. The health port used to have no such limit: a
silent connection stayed until gRPC's 120 s handshake deadline, an idle
channel for ever."""

from __future__ import annotations

import socket
import threading

import pytest

grpc = pytest.importorskip("grpc")

from e2e_support import ServerProcess, free_port, wait_until  # noqa: E402

HEALTH = "/grpc.health.v1.Health/Check"
IDLE_S = 1
GUARD_S = 30 * IDLE_S
# The client's connection preface (RFC 9113, 3.4) less its last byte: it
# never completes, so the connection never speaks HTTP/2.
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r"


def start() -> tuple[ServerProcess, int]:
    port = free_port()
    server = ServerProcess("--health-port", str(port), "--max-connection-idle-seconds", str(IDLE_S))
    return server, port


def closed_by_server(s: socket.socket) -> bool:
    """Reads until the server closes `s` (True) or a read waits past the
    socket's timeout (False). The server's own SETTINGS may come first."""
    try:
        while s.recv(4096):
            pass
    except ConnectionResetError:
        pass
    except socket.timeout:  # TimeoutError from Python 3.10
        return False
    return True


@pytest.mark.parametrize("sends", ["nothing", "its preface a byte at a time"])
def test_a_connection_that_does_not_speak_http2_is_closed(sends):
    server, port = start()
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=GUARD_S) as s:
            stop = threading.Event()

            def trickle() -> None:
                for byte in PREFACE:
                    if stop.wait(0.1):
                        return
                    try:
                        s.sendall(bytes([byte]))
                    except OSError:
                        return

            if sends != "nothing":
                threading.Thread(target=trickle, daemon=True).start()
            try:
                assert closed_by_server(s), f"still open after {GUARD_S} s"
            finally:
                stop.set()
    finally:
        assert server.stop() == 0


def test_an_idle_channel_is_closed_after_its_probe():
    server, port = start()
    try:
        states: list[grpc.ChannelConnectivity] = []
        channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        channel.subscribe(states.append, try_to_connect=False)
        check = channel.unary_unary(
            HEALTH, request_serializer=lambda b: b, response_deserializer=lambda b: b
        )
        assert check(b"", timeout=30) == b"\x08\x01"  # SERVING
        ready = grpc.ChannelConnectivity.READY

        def went_idle() -> bool:
            seen = list(states)
            return ready in seen and grpc.ChannelConnectivity.IDLE in seen[seen.index(ready) :]

        wait_until(went_idle, "the server closing the idle health channel", guard_s=GUARD_S)
        channel.close()
    finally:
        assert server.stop() == 0
