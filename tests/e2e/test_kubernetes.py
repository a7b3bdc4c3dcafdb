"""deploy/kubernetes: no cluster here, so the overlays are rendered (by
`kubectl kustomize` where kubectl is installed, else by kustomize_render)
and what they would deploy is checked against the code it runs: the
server's flags, its gRPC service name, its drain deadline, the images'
user and the images the Dockerfiles build."""

from __future__ import annotations

import functools
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

yaml = pytest.importorskip("yaml")

import kustomize_render  # after the PyYAML check: it imports yaml

REPO = Path(__file__).resolve().parents[2]
KUSTOMIZE = REPO / "deploy/kubernetes"
OVERLAYS = ["gpu", "cpu"]
DOCKERFILE = {"gpu": "docker/Dockerfile.cuda", "cpu": "docker/Dockerfile"}
LABEL = ("app.kubernetes.io/name", "tensorcheck")
TLS_SECRET, TOKENS_SECRET = "tensorcheck-tls", "tensorcheck-tokens"
GRPC_PORT, METRICS_PORT = 50051, 9090
# --health-port: plaintext, the gRPC health service alone, for the kubelet's
# probes (which speak no TLS and send no token; GRPC_PORT wants both).
HEALTH_PORT = 8081

Obj = dict[str, Any]


def kubectl() -> str | None:
    return shutil.which("kubectl")


def kubectl_render(directory: Path) -> list[Obj]:
    out = subprocess.run([kubectl(), "kustomize", str(directory)], capture_output=True,
                         text=True, check=True, timeout=120).stdout
    return [d for d in yaml.safe_load_all(out) if d is not None]


@functools.cache
def rendered(overlay: str) -> tuple[Obj, ...]:
    directory = KUSTOMIZE / "overlays" / overlay
    objects = kubectl_render(directory) if kubectl() else kustomize_render.render(directory)
    return tuple(objects)


def by_key(objects) -> dict[tuple[str, str], Obj]:
    return {(o["kind"], o["metadata"]["name"]): o for o in objects}


def one(overlay: str, kind: str, name: str | None = None) -> Obj:
    found = [o for o in rendered(overlay)
             if o["kind"] == kind and name in (None, o["metadata"]["name"])]
    assert len(found) == 1, f"{overlay}: {len(found)} {kind} {name or ''}"
    return found[0]


def pod(overlay: str) -> Obj:
    return one(overlay, "Deployment", "tensorcheck")["spec"]["template"]["spec"]


def container(overlay: str) -> Obj:
    (c,) = pod(overlay)["containers"]
    return c


def pod_labels(overlay: str) -> dict[str, str]:
    return one(overlay, "Deployment", "tensorcheck")["spec"]["template"]["metadata"]["labels"]


def selects_pods(overlay: str, selector: dict[str, str]) -> bool:
    labels = pod_labels(overlay)
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def container_env(overlay: str) -> dict[str, str]:
    """The container's environment from its envFrom ConfigMaps, each of which
    must be in the output under the name referenced (kustomize rewrites
    references to a generated, hash-suffixed name)."""
    env: dict[str, str] = {}
    for source in container(overlay).get("envFrom", []):
        name = source["configMapRef"]["name"]
        env.update(one(overlay, "ConfigMap", name).get("data", {}))
    for e in container(overlay).get("env", []):
        env[e["name"]] = e["value"]
    return env


def expand(arg: str, env: dict[str, str]) -> str:
    """The kubelet's $(VAR) expansion. It leaves an unknown reference as it
    is, which the server would then take as the flag's value: fail instead."""
    def value(m: re.Match) -> str:
        assert m.group(1) in env, f"{arg}: no {m.group(1)} in the container's environment"
        return env[m.group(1)]
    return re.sub(r"\$\((\w+)\)", value, arg)


def server_flags() -> set[str]:
    """Flags tensorcheck-server defines (ABSL_FLAG names, dashed form)."""
    names = set()
    for source in (REPO / "server").rglob("*.cc"):
        names |= set(re.findall(r"ABSL_FLAG\(\s*[^,]+,\s*(\w+)\s*,", source.read_text()))
    return {n.replace("_", "-") for n in names}


def flags(overlay: str) -> dict[str, str]:
    """The server's flags as the container gets them, by dashed name."""
    env, values = container_env(overlay), {}
    args = iter(expand(a, env) for a in container(overlay)["args"])
    for arg in args:
        assert arg.startswith("--"), arg
        name, sep, value = arg[2:].partition("=")
        assert name not in values, f"--{name} twice"
        values[name] = value if sep else next(args)
    return values


def quantity(q: str | int) -> float:
    """A Kubernetes resource quantity (24Gi, 500m, 4) as a number."""
    m = re.fullmatch(r"([0-9.]+)([KMGTPE]i?|m|)", str(q))
    assert m, q
    number, suffix = float(m.group(1)), m.group(2)
    if suffix == "m":
        return number / 1000
    if not suffix:
        return number
    power = "KMGTPE".index(suffix[0]) + 1
    return number * (1024 if suffix.endswith("i") else 1000) ** power


def docker_build_tags(path: Path) -> dict[str, str]:
    """`docker build -f DOCKERFILE -t IMAGE .` lines in a file: {DOCKERFILE: IMAGE}."""
    return dict(re.findall(r"docker build -f (\S+) -t (\S+) \.", path.read_text()))


def grpc_service_name() -> str:
    proto = (REPO / "proto/tensorcheck/v1/tensorcheck.proto").read_text()
    package = re.search(r"^package ([\w.]+);", proto, re.MULTILINE).group(1)
    service = re.search(r"^service (\w+) \{", proto, re.MULTILINE).group(1)
    return f"{package}.{service}"


# The renderer ----------------------------------------------------------------


@pytest.mark.parametrize("directory", ["base", "overlays/gpu", "overlays/cpu"])
def test_renderer_agrees_with_kubectl(directory):
    if not kubectl():
        pytest.skip("kubectl is not installed: nothing to compare kustomize_render with")
    path = KUSTOMIZE / directory
    assert by_key(kustomize_render.render(path)) == by_key(kubectl_render(path))


def test_config_map_hash_is_kustomizes():
    # kubectl kustomize (v1.32.4, kustomize v5.5.0) names this ConfigMap
    # x-6mggc5fd49: the suffix depends on the data only, with Go's escapes.
    cm = {"kind": "ConfigMap", "metadata": {"name": "x"}, "data": {"A": "1", "B": "<&>"}}
    assert kustomize_render.config_map_hash(cm) == "6mggc5fd49"


# What every overlay deploys --------------------------------------------------


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_renders_the_objects_of_the_spec_and_no_secrets(overlay):
    kinds = {(o["kind"], re.sub(r"-[a-z0-9]{10}$", "-HASH", o["metadata"]["name"])
              if o["kind"] == "ConfigMap" else o["metadata"]["name"])
             for o in rendered(overlay)}
    # No Secret objects (key material is created by hand, see the base's
    # kustomization.yaml) and no Role or RoleBinding (the server calls no API).
    assert kinds == {
        ("ServiceAccount", "tensorcheck"),
        ("ConfigMap", "tensorcheck-flags-HASH"),
        ("Deployment", "tensorcheck"),
        ("Service", "tensorcheck"),
        ("Service", "tensorcheck-headless"),
        ("PodDisruptionBudget", "tensorcheck"),
        ("HorizontalPodAutoscaler", "tensorcheck"),
        ("NetworkPolicy", "tensorcheck"),
    }
    assert len(rendered(overlay)) == len(kinds)
    for o in rendered(overlay):
        assert o["metadata"]["labels"][LABEL[0]] == LABEL[1], o["kind"]
    assert len({o["metadata"].get("namespace") for o in rendered(overlay)}) == 1


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_flags_come_from_the_config_map_and_roll_the_pods(overlay):
    ref = container(overlay)["envFrom"][0]["configMapRef"]["name"]
    # The generated name: a change of a flag is a new name, a new pod
    # template, a rollout.
    assert re.fullmatch(r"tensorcheck-flags-[a-z0-9]{10}", ref), ref
    values = flags(overlay)
    assert values["log-format"] == "json"
    assert int(values["store-bytes"]) > 0 and int(values["max-inflight-bytes"]) > 0
    data = one(overlay, "ConfigMap", ref)["data"]
    assert data["TENSORCHECK_SHUTDOWN_GRACE_SECONDS"] == values["shutdown-grace-seconds"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_args_are_flags_of_the_server(overlay):
    known = server_flags()
    # The parse found the flags at all (a changed ABSL_FLAG layout would
    # otherwise fail every arg below with a misleading message).
    assert {"port", "health-port", "tokens-file"} <= known, sorted(known)
    for name in flags(overlay):
        assert name in known, f"--{name}: tensorcheck-server defines no such flag"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_ports_and_grpc_probes(overlay):
    c, values = container(overlay), flags(overlay)
    assert int(values["port"]) == GRPC_PORT and int(values["metrics-port"]) == METRICS_PORT
    assert int(values["health-port"]) == HEALTH_PORT
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports == {"grpc": GRPC_PORT, "metrics": METRICS_PORT, "health": HEALTH_PORT}
    # The kubelet's gRPC probe has no TLS and no token: on GRPC_PORT (TLS,
    # tokens) every probe would fail. It asks the plaintext health port.
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert set(c[probe]) & {"grpc", "httpGet", "tcpSocket", "exec"} == {"grpc"}, probe
        assert c[probe]["grpc"]["port"] == ports["health"] == int(values["health-port"]), probe
    # Startup and liveness ask for the server as a whole (a full queue
    # leaves it SERVING); readiness for the API service, NOT_SERVING while
    # the queue is full or the server drains.
    assert c["startupProbe"]["grpc"].get("service", "") == ""
    assert c["livenessProbe"]["grpc"].get("service", "") == ""
    assert c["readinessProbe"]["grpc"]["service"] == grpc_service_name()
    # CUDA initialisation comes before the server listens: minutes, not the
    # default 30 s, before the kubelet gives up on a pod.
    startup = c["startupProbe"]
    assert startup.get("periodSeconds", 10) * startup.get("failureThreshold", 3) >= 120


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_termination_grace_outlasts_the_servers_drain(overlay):
    # On SIGTERM the server drains for --shutdown-grace-seconds, cancels
    # what still runs (kCancelGrace) and exits on its own a margin later
    # (server/main.cc): the kubelet's SIGKILL must come after all that.
    header = (REPO / "server/service/server.h").read_text()
    cancel = int(re.search(r"kCancelGrace = absl::Seconds\((\d+)\)", header).group(1))
    main = (REPO / "server/main.cc").read_text()
    margin = int(re.search(r"kCancelGrace \+\s*absl::Seconds\((\d+)\)", main).group(1))
    grace = float(flags(overlay)["shutdown-grace-seconds"])
    assert pod(overlay)["terminationGracePeriodSeconds"] > grace + cancel + margin


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_security_context(overlay):
    spec, c = pod(overlay), container(overlay)
    image_user = re.search(r"^USER (\S+)$", (REPO / DOCKERFILE[overlay]).read_text(), re.MULTILINE)
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["runAsUser"] == int(image_user.group(1)) != 0
    assert spec["securityContext"]["fsGroup"] > 0
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    sc = c["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert not sc.get("privileged", False)
    # The one writable place on a read-only root.
    volumes = {v["name"]: v for v in spec["volumes"]}
    tmp = [m for m in c["volumeMounts"] if m["mountPath"] == "/tmp"]
    assert len(tmp) == 1 and "emptyDir" in volumes[tmp[0]["name"]]
    assert not any("hostPath" in v for v in spec["volumes"])


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_service_account_has_no_token(overlay):
    spec = pod(overlay)
    account = one(overlay, "ServiceAccount", spec["serviceAccountName"])
    assert account["metadata"]["name"] == "tensorcheck"
    assert account["automountServiceAccountToken"] is False
    assert spec["automountServiceAccountToken"] is False


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_tls_and_tokens_come_from_the_referenced_secrets(overlay):
    spec, c, values = pod(overlay), container(overlay), flags(overlay)
    secrets = {v["name"]: v["secret"] for v in spec["volumes"] if "secret" in v}
    assert {s["secretName"] for s in secrets.values()} == {TLS_SECRET, TOKENS_SECRET}
    mounts = {m["name"]: m for m in c["volumeMounts"]}

    def secret_file(flag: str) -> tuple[str, str]:
        """(Secret, key) the file --flag names is read from."""
        path = Path(values[flag])
        volume = next(n for n, m in mounts.items() if Path(m["mountPath"]) == path.parent)
        assert volume in secrets, f"--{flag}={path}: not on a Secret volume"
        assert mounts[volume].get("readOnly") is True, f"{volume} mounted writable"
        # A subPath mount never sees a Secret's update, and the server
        # re-reads these files instead of being restarted (docs/operations.md).
        assert "subPath" not in mounts[volume], f"{volume}: subPath, never updated"
        secret = secrets[volume]
        if "items" in secret:  # a key list maps keys to other file names
            keys = {i["path"]: i["key"] for i in secret["items"]}
            return secret["secretName"], keys[path.name]
        return secret["secretName"], path.name

    # The keys of a kubernetes.io/tls Secret (and cert-manager's ca.crt).
    assert secret_file("tls-cert") == (TLS_SECRET, "tls.crt")
    assert secret_file("tls-key") == (TLS_SECRET, "tls.key")
    assert secret_file("tls-client-ca") == (TLS_SECRET, "ca.crt")
    assert secret_file("tokens-file") == (TOKENS_SECRET, "tokens.json")
    # 0 would turn the re-reading off (then only SIGHUP, which nothing sends).
    assert float(values.get("credentials-reload-seconds", "5")) > 0


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_docs_patch_dropping_the_client_ca_names_its_arg(overlay):
    # docs/operations.md shows an overlay patch that removes --tls-client-ca
    # by its index, guarded by a `test` op: the index must be that arg's.
    docs = (REPO / "docs/operations.md").read_text()
    blocks = [yaml.safe_load(b) for b in re.findall(r"```yaml\n(.*?)```", docs, re.DOTALL)
              if "--tls-client-ca" in b]
    assert len(blocks) == 1, f"{len(blocks)} yaml blocks on --tls-client-ca in the docs"
    (patch,) = blocks[0]["patches"]
    assert patch["target"] == {"kind": "Deployment", "name": "tensorcheck"}
    test, remove = yaml.safe_load(patch["patch"])
    assert test["op"] == "test" and remove["op"] == "remove"
    assert test["path"] == remove["path"]
    prefix = "/spec/template/spec/containers/0/args/"
    assert test["path"].startswith(prefix), test["path"]
    assert test["value"].startswith("--tls-client-ca="), test["value"]
    assert container(overlay)["args"][int(test["path"][len(prefix):])] == test["value"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_network_policy_admits_only_the_grpc_and_metrics_ports(overlay):
    policy = one(overlay, "NetworkPolicy", "tensorcheck")["spec"]
    assert policy["policyTypes"] == ["Ingress"]
    assert selects_pods(overlay, policy["podSelector"]["matchLabels"])
    ports = set()
    for rule in policy["ingress"]:
        # A rule without ports admits every port.
        assert rule.get("ports"), rule
        ports |= {(p.get("protocol", "TCP"), p["port"]) for p in rule["ports"]}
    # Not HEALTH_PORT: only the kubelet asks it, from the pod's node, whose
    # traffic NetworkPolicy always admits (networkpolicy.yaml).
    assert ports == {("TCP", GRPC_PORT), ("TCP", METRICS_PORT)}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_services(overlay):
    container_ports = {p["name"]: p["containerPort"] for p in container(overlay)["ports"]}

    def ports(service: Obj) -> dict[str, int]:
        for p in service["spec"]["ports"]:
            # A named targetPort must be one of the container's.
            assert container_ports[p["targetPort"]] == p["port"], p
        return {p["name"]: p["port"] for p in service["spec"]["ports"]}

    # Headless, for clients that balance calls over the pods themselves
    # (dns:///tensorcheck-headless.<ns>.svc.cluster.local:50051, round_robin),
    # listing ready pods only.
    headless = one(overlay, "Service", "tensorcheck-headless")
    assert headless["spec"]["clusterIP"] == "None"
    assert headless["spec"].get("publishNotReadyAddresses", False) is False
    assert ports(headless) == {"grpc": GRPC_PORT}
    assert selects_pods(overlay, headless["spec"]["selector"])
    # One virtual IP, for clients that do not balance and for scraping.
    service = one(overlay, "Service", "tensorcheck")
    assert service["spec"].get("type", "ClusterIP") == "ClusterIP"
    assert service["spec"].get("clusterIP") != "None"
    assert ports(service) == {"grpc": GRPC_PORT, "metrics": METRICS_PORT}
    assert selects_pods(overlay, service["spec"]["selector"])


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_disruption_budget_and_autoscaler(overlay):
    deployment = one(overlay, "Deployment", "tensorcheck")
    assert selects_pods(overlay, deployment["spec"]["selector"]["matchLabels"])
    budget = one(overlay, "PodDisruptionBudget", "tensorcheck")
    assert budget["apiVersion"] == "policy/v1"
    assert budget["spec"]["maxUnavailable"] == 1
    assert selects_pods(overlay, budget["spec"]["selector"]["matchLabels"])
    hpa = one(overlay, "HorizontalPodAutoscaler", "tensorcheck")
    assert hpa["apiVersion"] == "autoscaling/v2"
    assert hpa["spec"]["scaleTargetRef"] == {
        "apiVersion": "apps/v1", "kind": "Deployment", "name": "tensorcheck"}
    # Two at least: with maxUnavailable 1, an eviction leaves one serving.
    assert 2 <= hpa["spec"]["minReplicas"] <= hpa["spec"]["maxReplicas"]
    (metric,) = hpa["spec"]["metrics"]
    assert metric["resource"]["name"] == "cpu"
    assert metric["resource"]["target"]["type"] == "Utilization"
    # Utilisation is relative to the request, which must be there.
    assert quantity(container(overlay)["resources"]["requests"]["cpu"]) > 0
    # A replicas field would undo the autoscaler's count on every apply.
    assert "replicas" not in deployment["spec"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_memory_holds_the_store_and_the_calls_in_flight(overlay):
    values = flags(overlay)
    needed = int(values["store-bytes"]) + int(values["max-inflight-bytes"])
    resources = container(overlay)["resources"]
    assert quantity(resources["limits"]["memory"]) >= needed
    assert quantity(resources["requests"]["memory"]) >= needed


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_image_is_the_one_its_dockerfile_builds(overlay):
    dockerfile = DOCKERFILE[overlay]
    readme = docker_build_tags(REPO / "README.md")
    header = docker_build_tags(REPO / dockerfile)
    assert readme[dockerfile] == header[dockerfile]
    assert container(overlay)["image"] == header[dockerfile]


def test_gpu_overlay_asks_for_a_gpu_node():
    spec, c, values = pod("gpu"), container("gpu"), flags("gpu")
    assert c["image"] == "tensorcheck:cuda"
    assert quantity(c["resources"]["limits"]["nvidia.com/gpu"]) == 1
    assert any(t["key"] == "nvidia.com/gpu" and t["effect"] == "NoSchedule"
               and t.get("operator") == "Exists" for t in spec["tolerations"])
    assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert int(values["gpu-memory-budget-mb"]) > 0
    # A surge pod would wait for a free GPU, stalling the rollout.
    assert one("gpu", "Deployment")["spec"]["strategy"]["rollingUpdate"]["maxSurge"] == 0


def test_cpu_overlay_runs_without_a_gpu():
    spec, c, values = pod("cpu"), container("cpu"), flags("cpu")
    assert c["image"] == "tensorcheck:cpu"
    for kind in ("limits", "requests"):
        assert not any(r.startswith("nvidia.com/") for r in c["resources"].get(kind, {}))
    assert not any("nvidia" in t.get("key", "") for t in spec.get("tolerations", []))
    assert not any("nvidia" in k for k in spec.get("nodeSelector", {}))
    assert "gpu-memory-budget-mb" not in values


def test_docs_name_the_overlays_not_the_old_manifest():
    readme = (REPO / "README.md").read_text()
    assert "kubectl apply -k deploy/kubernetes/overlays/gpu" in readme
    assert "kubectl apply -k deploy/kubernetes/overlays/cpu" in readme
    for path in [REPO / "README.md", *(REPO / "docs").glob("*.md"), *(REPO / "docker").glob("Dockerfile*")]:
        assert "deploy/kubernetes/tensorcheck.yaml" not in path.read_text(), path
