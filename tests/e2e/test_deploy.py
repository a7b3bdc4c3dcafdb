"""Docker and Kubernetes do not run here: the Dockerfile and the manifests
are checked by parsing them against the code they deploy."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

yaml = pytest.importorskip("yaml")

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "docker/Dockerfile"
MANIFEST = REPO / "deploy/kubernetes/tensorcheck.yaml"


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


def dockerfile_instructions() -> list[tuple[str, str]]:
    text = DOCKERFILE.read_text().replace("\\\n", " ")
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            keyword, _, rest = line.partition(" ")
            out.append((keyword.upper(), rest.strip()))
    return out


def test_dockerfile_builds_the_server_from_sources_that_exist():
    steps = dockerfile_instructions()
    assert [k for k, _ in steps].count("FROM") == 2  # build and runtime stages
    for keyword, rest in steps:
        if keyword == "COPY" and not rest.startswith("--from"):
            *sources, _ = shlex.split(rest)
            for s in sources:
                assert (REPO / s).exists(), f"COPY {s}: no such path"
    build_cmd = " ".join(r for k, r in steps if k == "RUN" and "cmake" in r)
    assert "--target tensorcheck-server" in build_cmd
    assert "TENSORCHECK_ENABLE_CUDA=OFF" in build_cmd


def test_dockerfile_packages_are_the_ones_setup_installs():
    setup = (REPO / "scripts/setup.sh").read_text()
    build_run = next(r for k, r in dockerfile_instructions() if k == "RUN" and "-dev" in r)
    packages = [p for p in build_run.split() if re.fullmatch(r"lib[\w.+-]+-dev|[\w-]+-grpc", p)]
    assert packages
    for p in packages:
        assert p in setup, f"{p} is built with in Docker but not installed by scripts/setup.sh"


def test_dockerfile_serves_on_the_exposed_port_with_known_flags():
    steps = dict((k, r) for k, r in dockerfile_instructions())
    cmd = yaml.safe_load(steps["CMD"])  # JSON array form
    entry = yaml.safe_load(steps["ENTRYPOINT"])
    assert entry == ["/usr/local/bin/tensorcheck-server"]
    values = check_args(cmd)
    assert values["port"] == steps["EXPOSE"]
    assert steps["STOPSIGNAL"] == "SIGTERM"
    assert steps["USER"] != "root"


def test_manifest_probes_health_of_the_service_and_drains_within_grace():
    docs = list(yaml.safe_load_all(MANIFEST.read_text()))
    kinds = {d["kind"]: d for d in docs}
    assert set(kinds) == {"Deployment", "Service"}
    pod = kinds["Deployment"]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    values = check_args(container["args"])
    port = int(values["port"])
    assert container["ports"][0]["containerPort"] == port
    proto = (REPO / "proto/tensorcheck/v1/tensorcheck.proto").read_text()
    package = re.search(r"^package ([\w.]+);", proto, re.M).group(1)
    service = re.search(r"^service (\w+) \{", proto, re.M).group(1)
    ready = container["readinessProbe"]["grpc"]
    assert ready["port"] == port and ready["service"] == f"{package}.{service}"
    assert container["livenessProbe"]["grpc"]["port"] == port
    # Liveness asks for the server as a whole, which a full queue leaves
    # SERVING (readiness, the named service, goes NOT_SERVING then).
    assert container["livenessProbe"]["grpc"].get("service", "") == ""
    assert int(container["resources"]["limits"]["nvidia.com/gpu"]) >= 1
    # SIGTERM: the grace period, then requests still running are cancelled
    # (they stop within TensorCheckServer::kCancelGrace, 5 s) and, should
    # anything still hold the process, it exits 5 s later: Kubernetes must
    # not SIGKILL before that.
    assert pod["terminationGracePeriodSeconds"] > float(values["shutdown-grace-seconds"]) + 10
    svc = kinds["Service"]["spec"]
    assert svc["clusterIP"] == "None"  # headless: clients balance with round_robin
    assert svc["selector"] == kinds["Deployment"]["spec"]["selector"]["matchLabels"]
