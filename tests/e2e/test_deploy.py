"""Docker does not run here: the Dockerfiles are checked by parsing them
against the code they build (tests/e2e/test_kubernetes.py does the same for
deploy/kubernetes)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

yaml = pytest.importorskip("yaml")

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "docker/Dockerfile"
DOCKERFILE_CUDA = REPO / "docker/Dockerfile.cuda"
DOCKERFILES = [DOCKERFILE, DOCKERFILE_CUDA]
# The metrics endpoint's port, which deploy/kubernetes serves with
# --metrics-port and the images expose beside the gRPC port.
METRICS_PORT = "9090"


def server_flags() -> set[str]:
    """Flags tensorcheck-server defines (ABSL_FLAG names, dashed form)."""
    source = (REPO / "server/main.cc").read_text()
    return {name.replace("_", "-") for name in re.findall(r"ABSL_FLAG\([^,]+, (\w+),", source)}


def check_args(args: list[str]) -> dict[str, str]:
    flags, values = server_flags(), {}
    it = iter(args)
    for arg in it:
        assert arg.startswith("--"), arg
        name = arg[2:].split("=", 1)[0]
        assert name in flags, f"unknown server flag --{name}"
        values[name] = arg.split("=", 1)[1] if "=" in arg else next(it)
    return values


def dockerfile_instructions(path: Path = DOCKERFILE) -> list[tuple[str, str]]:
    text = path.read_text().replace("\\\n", " ")
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            keyword, _, rest = line.partition(" ")
            out.append((keyword.upper(), rest.strip()))
    return out


def exposed_ports(path: Path) -> list[str]:
    """The ports of every EXPOSE, in order."""
    return [p for k, r in dockerfile_instructions(path) if k == "EXPOSE" for p in r.split()]


def dockerignore_allows(path: str) -> bool:
    """Whether .dockerignore leaves `path` in the build context (its rules
    in order, the last match deciding; only the forms it uses)."""
    allowed = True
    for rule in (REPO / ".dockerignore").read_text().splitlines():
        rule = rule.strip()
        if not rule or rule.startswith("#"):
            continue
        negate = rule.startswith("!")
        pattern = rule[1:] if negate else rule
        if pattern == "*" or path == pattern.rstrip("/") or path.startswith(pattern):
            allowed = negate
    return allowed


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.name)
def test_dockerfile_builds_the_server_from_sources_that_exist(path):
    steps = dockerfile_instructions(path)
    assert [k for k, _ in steps].count("FROM") == 2  # build and runtime stages
    for keyword, rest in steps:
        if keyword == "COPY" and not rest.startswith("--from"):
            *sources, _ = shlex.split(rest)
            for s in sources:
                assert (REPO / s).exists(), f"COPY {s}: no such path"
                assert dockerignore_allows(s), f"COPY {s}: left out by .dockerignore"
    build_cmd = " ".join(r for k, r in steps if k == "RUN" and "cmake" in r)
    assert "--target tensorcheck-server tensorcheck" in build_cmd  # the server and its CLI
    cuda = path == DOCKERFILE_CUDA
    assert f"TENSORCHECK_ENABLE_CUDA={'ON' if cuda else 'OFF'}" in build_cmd
    if cuda:
        # sm_80 and sm_90 machine code, and PTX for what comes after.
        archs = re.search(r"CMAKE_CUDA_ARCHITECTURES=([\w;-]+)", build_cmd).group(1).split(";")
        assert {"80-real", "90-real", "90-virtual"} <= set(archs)


def test_dockerfile_base_images():
    cpu = [r.split()[0] for k, r in dockerfile_instructions(DOCKERFILE) if k == "FROM"]
    assert cpu == ["debian:12", "debian:12-slim"]
    cuda = [r.split()[0] for k, r in dockerfile_instructions(DOCKERFILE_CUDA) if k == "FROM"]
    assert re.fullmatch(r"nvidia/cuda:13\.\d+\.\d+-devel-ubuntu[\d.]+", cuda[0]), cuda
    assert re.fullmatch(r"nvidia/cuda:13\.\d+\.\d+-runtime-ubuntu[\d.]+", cuda[1]), cuda


def build_packages(path: Path) -> list[str]:
    build_run = next(r for k, r in dockerfile_instructions(path) if k == "RUN" and "-dev" in r)
    return [p for p in build_run.split() if re.fullmatch(r"lib[\w.+-]+-dev|[\w-]+-grpc", p)]


def runtime_packages(path: Path) -> set[str]:
    """The runtime stage's libraries, without their version suffixes
    (libgrpc++1.51t64 -> libgrpc++)."""
    run = [r for k, r in dockerfile_instructions(path) if k == "RUN"][-1]
    return {re.sub(r"[\d.]+(t64)?$", "", p) for p in run.split() if p.startswith("lib")}


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.name)
def test_dockerfile_packages_are_the_ones_setup_installs(path):
    setup = (REPO / "scripts/setup.sh").read_text()
    packages = build_packages(path)
    assert packages
    for p in packages:
        assert p in setup, f"{p} is built with in Docker but not installed by scripts/setup.sh"


def test_cuda_image_runs_on_the_libraries_of_the_cpu_image():
    assert build_packages(DOCKERFILE_CUDA) == build_packages(DOCKERFILE)
    assert runtime_packages(DOCKERFILE_CUDA) == runtime_packages(DOCKERFILE)


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.name)
def test_dockerfile_serves_on_the_exposed_port_with_known_flags(path):
    steps = dict(dockerfile_instructions(path))
    cmd = yaml.safe_load(steps["CMD"])  # JSON array form
    entry = yaml.safe_load(steps["ENTRYPOINT"])
    assert entry == ["/usr/local/bin/tensorcheck-server"]
    values = check_args(cmd)
    assert exposed_ports(path) == [values["port"], METRICS_PORT]
    assert steps["STOPSIGNAL"] == "SIGTERM"
    assert steps["USER"] not in ("root", "0")


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.name)
def test_dockerfile_health_check_asks_the_grpc_health_service(path):
    steps = dict(dockerfile_instructions(path))
    port = check_args(yaml.safe_load(steps["CMD"]))["port"]
    options, _, command = steps["HEALTHCHECK"].partition(" CMD ")
    argv = yaml.safe_load(command)  # JSON array form: no shell in between
    assert argv[0] == "/usr/local/bin/tensorcheck"
    assert argv[argv.index("--server") + 1] == f"localhost:{port}"
    assert argv[argv.index("--server") + 2] == "health"
    # The CLI's `health` command exists and asks grpc.health.v1.
    assert 'c == "health"' in (REPO / "client/cli/command_line.cc").read_text()
    assert "health::Health::NewStub" in (REPO / "client/cli/commands.cc").read_text()
    assert "--timeout" in options and "--retries" in options
