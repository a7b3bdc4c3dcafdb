"""The server's flags by name and unit (docs/operations.md, "Flags: names,
units, old names"): sizes with suffixes and durations with units, each
renamed flag's old name in its old unit, both names given different values
refused, a bad value refused naming the flag as it was written, and --help
listing each old name with its flag.

What the tests expect is worked out by hand from the flags given (8MiB is
8 x 2^20 = 8388608 bytes; 5MB is 5 x 10^6), never read from the binary."""

from __future__ import annotations

import re
import subprocess

import pytest

grpc = pytest.importorskip("grpc")
pytest.importorskip("tensorcheck")

from e2e_support import SERVER_BIN, ServerProcess  # noqa: E402
from tensorcheck._pb import pb  # noqa: E402

CAPABILITIES = "/tensorcheck.v1.TensorCheck/GetCapabilities"
MiB = 1 << 20

# Each renamed flag and its old name (the old unit is in docs/operations.md).
RENAMED = {
    "max-message": "max-message-mb",
    "max-inline-tensor": "max-tensor-mb",
    "max-stored-tensor": "max-tensor-bytes",
    "max-inflight": "max-inflight-bytes",
    "max-inline-output": "inline-output-bytes",
    "store-size": "store-bytes",
    "gpu-memory-budget": "gpu-memory-budget-mb",
    "cublaslt-workspace": "cublaslt-workspace-mb",
    "max-request-time": "max-request-seconds",
    "max-connection-idle": "max-connection-idle-seconds",
    "keepalive-time": "keepalive-seconds",
    "partial-upload-ttl": "partial-upload-seconds",
    "upload-idle": "upload-idle-seconds",
    "credentials-reload": "credentials-reload-seconds",
    "shutdown-grace": "shutdown-grace-seconds",
}


def server(*flags: str) -> subprocess.CompletedProcess:
    """The server binary run to completion (a guard of 60 s against a hang)."""
    if not SERVER_BIN.is_file():
        pytest.skip(f"server binary not built: {SERVER_BIN} (set TENSORCHECK_SERVER_BIN)")
    return subprocess.run([str(SERVER_BIN), *flags], capture_output=True, text=True,
                          timeout=60, check=False)


def capabilities(*flags: str) -> pb.GetCapabilitiesResponse:
    """GetCapabilities of a server started with `flags`, which then stops."""
    process = ServerProcess(*flags)
    try:
        with grpc.insecure_channel(process.address) as channel:
            call = channel.unary_unary(CAPABILITIES, request_serializer=lambda b: b,
                                       response_deserializer=lambda b: b)
            return pb.GetCapabilitiesResponse.FromString(call(b"", timeout=30))
    finally:
        assert process.stop() == 0


def help_entries() -> dict[str, str]:
    """--help's flags (dashed) to their help and default, on one line each."""
    done = server("--help")
    assert done.returncode == 0, done.stderr
    text = " ".join(done.stdout.split())
    entries = re.findall(r"--(\w+) \((.*?); default: ([^;]*);", text)
    return {name.replace("_", "-"): f"{help_text}; default: {default}"
            for name, help_text, default in entries}


@pytest.mark.parametrize("flags", [
    # The new names take sizes and durations ...
    ("--max-message=8MiB", "--max-inline-tensor=3M", "--store-size=64MiB",
     "--max-stored-tensor=5MB", "--partial-upload-ttl=1m30s", "--max-inline-output=2KiB"),
    # ... and the old names keep their units.
    ("--max-message-mb=8", "--max-tensor-mb=3", "--store-bytes=67108864",
     "--max-tensor-bytes=5000000", "--partial-upload-seconds=90", "--inline-output-bytes=2048"),
], ids=["new_names_take_sizes_and_durations", "old_names_keep_their_units"])
def test_both_spellings_set_the_same_limits(flags):
    caps = capabilities(*flags)
    assert caps.limits.max_message_bytes == 8 * MiB
    assert caps.limits.max_tensor_bytes == 3 * MiB
    assert caps.store.budget_bytes == 64 * MiB
    assert caps.store.max_tensor_bytes == 5_000_000
    assert caps.store.partial_upload_seconds == 90
    assert caps.store.inline_output_bytes == 2048


def test_a_flag_and_its_old_name_with_one_value_are_accepted():
    caps = capabilities("--max-message=8MiB", "--max-message-mb=8", "--store-size=0",
                        "--store-bytes=0")
    assert caps.limits.max_message_bytes == 8 * MiB
    assert not caps.store.present


@pytest.mark.parametrize("flags, message", [
    (["--max-message=512MiB", "--max-message-mb=256"],
     "--max-message and --max-message-mb: two names of one option, given different values "
     "(512MiB and 256MiB); give one of them"),
    (["--max-request-time=10s", "--max-request-seconds=5"],
     "--max-request-time and --max-request-seconds: two names of one option, given different "
     "values (10s and 5s); give one of them"),
    (["--store-size=auto", "--store-bytes=0"],
     "--store-size and --store-bytes: two names of one option, given different values "
     "(auto and 0); give one of them"),
])
def test_a_flag_and_its_old_name_with_different_values_are_a_usage_error(flags, message):
    done = server("--host", "127.0.0.1", "--port", "0", *flags)
    assert done.returncode == 2, (done.returncode, done.stderr)
    assert message in done.stderr
    assert "listening on" not in done.stdout


@pytest.mark.parametrize("flags, message", [
    # Sizes: the parser's reason, after Abseil's naming of the flag.
    (["--max-inflight=4XB"], "Illegal value '4XB' specified for flag 'max_inflight'; '4XB': "
                             "unknown suffix 'XB'"),
    (["--max-inflight=-1"], "a size is not negative, got '-1'"),
    (["--max-stored-tensor=1.5GiB"], "a whole number expected"),
    # Durations need a unit.
    (["--max-request-time=300"], "Illegal value '300' specified for flag 'max_request_time'"),
    # Ranges, by the flag written and in its unit.
    (["--max-request-time=25h"], "--max-request-time: a value in (0, 24h] expected, got 25h"),
    (["--max-request-seconds=90000"],
     "--max-request-seconds: a value in (0, 86400] expected, got 90000"),
    (["--max-message=0"], "--max-message: 1MiB..2047MiB expected, got 0"),
    (["--max-inline-tensor=300MiB"],
     "--max-inline-tensor: 0 (the smaller of 256MiB and --max-message) or 1..256MiB "
     "(--max-message) expected, got 300MiB"),
    (["--max-message-mb=4", "--max-tensor-mb=5"],
     "--max-tensor-mb: 0 (the smaller of 256 and --max-message-mb) or 1..4 (--max-message-mb) "
     "expected, got 5"),
    (["--shutdown-grace=-1s"], "--shutdown-grace: 0..24h expected, got -1s"),
    (["--max-queue=0"], "--max-queue: a positive count expected, got 0"),
    # Values an old unit cannot carry over.
    (["--gpu-memory-budget-mb=9223372036854775807"],
     "--gpu-memory-budget-mb: 9223372036854775807 is out of range (times 2^20, over 64 bits)"),
    (["--max-request-seconds=nan"], "--max-request-seconds: a number of seconds expected, got nan"),
    # What Start checked only once it ran, some of it after the API port
    # was bound: now before anything listens.
    (["--health-port=70000"], "--health-port: 0 (none) or 1..65535 expected, got 70000"),
    (["--port=8081", "--health-port=8081"],
     "--health-port: 8081 is --port too; the health service needs a port of its own"),
    (["--metrics-port=9090", "--health-port=9090"],
     "--health-port: 9090 is --metrics-port too; the health service needs a port of its own"),
    (["--tls-key=server.key"], "--tls-cert and --tls-key: both or neither expected"),
])
def test_a_bad_value_is_a_usage_error_naming_the_flag(flags, message):
    done = server("--host", "127.0.0.1", *flags)
    assert done.returncode == 2, (done.returncode, done.stderr)
    assert message in done.stderr, done.stderr
    assert "listening on" not in done.stdout


def test_help_lists_each_old_name_with_its_flag():
    entries = help_entries()
    assert {"port", "max-message", "max-message-mb"} <= entries.keys()  # the parse works
    for flag, old in RENAMED.items():
        assert f"Old name: --{old} (" in entries[flag], entries[flag]
        assert entries[old].startswith(f"Old name of --{flag}, in "), entries[old]
    # Defaults in the new units: 256 MiB, auto, 300 s as Abseil writes it.
    assert entries["max-message"].endswith("default: 256MiB")
    assert entries["max-message-mb"].endswith("default: 256")
    assert entries["store-size"].endswith("default: auto")
    assert entries["max-request-time"].endswith("default: 5m")
    assert entries["max-inflight"].endswith("default: 4GiB")
