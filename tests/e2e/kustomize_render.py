"""A small kustomize, for tests/e2e/test_kubernetes.py where kubectl is not
installed: `render(directory)` returns the objects `kubectl kustomize
directory` prints, for the features deploy/kubernetes uses and no others
(anything else in a kustomization raises, rather than rendering wrongly).

Supported: resources (files and directories), namespace, labels (pairs,
includeSelectors), images (newName, newTag, digest), configMapGenerator
(literals; behavior create or merge) with kustomize's hash suffix and the
rewriting of references to the generated name, and patches (a path or an
inline patch; strategic merge, merging containers, volumes and env by name
and volumeMounts by mountPath; JSON 6902 add, replace and remove), applied
in kustomize's order: patches, namespace, labels, images.
"""

from __future__ import annotations

import copy
import hashlib
import json
from pathlib import Path
from typing import Any

import yaml

Obj = dict[str, Any]

KUSTOMIZATION_FILES = ("kustomization.yaml", "kustomization.yml", "Kustomization")
KNOWN_FIELDS = {
    "apiVersion", "kind", "namespace", "labels", "resources", "images",
    "configMapGenerator", "patches",
}
CLUSTER_SCOPED = {
    "Namespace", "ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition",
    "PersistentVolume", "StorageClass", "PriorityClass",
}
WORKLOADS = {"Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job"}
# Strategic merge keys of the lists a patch here may touch; any other list
# is replaced whole, as kustomize does for lists without a merge key.
MERGE_KEYS = {
    "containers": "name", "initContainers": "name", "volumes": "name", "env": "name",
    "volumeMounts": "mountPath",
}
# Lists that kustomize merges by a key this renderer does not implement.
UNSUPPORTED_LISTS = {"ports", "imagePullSecrets"}


# Marks a ConfigMap from configMapGenerator, whose name gets the hash.
GENERATED = "__generated__"


def render(directory: Path | str) -> list[Obj]:
    objects = _build(Path(directory))
    renamed = {}
    for obj in objects:
        if obj.pop(GENERATED, False):
            name = obj["metadata"]["name"]
            renamed[name] = f"{name}-{config_map_hash(obj)}"
            obj["metadata"]["name"] = renamed[name]
    for obj in objects:
        if obj["kind"] in WORKLOADS:
            _rename_config_map_refs(obj["spec"]["template"]["spec"], renamed)
    return objects


def config_map_hash(obj: Obj) -> str:
    """kustomize's api/hasher: sha256 of the JSON of kind, name and data
    (its lookup of metadata/name finds nothing, so name is always ""), Go's
    json.Marshal escaping, the first 10 hex digits with 0 1 3 a e swapped
    for g h k m t (no vowels, no look-alike digits)."""
    encoded = json.dumps(
        {"kind": "ConfigMap", "name": "", "data": obj.get("data") or {}},
        sort_keys=True, separators=(",", ":"), ensure_ascii=False,
    )
    for c, escape in (("&", "\\u0026"), ("<", "\\u003c"), (">", "\\u003e"),
                      ("\u2028", "\\u2028"), ("\u2029", "\\u2029")):
        encoded = encoded.replace(c, escape)
    digest = hashlib.sha256(encoded.encode()).hexdigest()[:10]
    return digest.translate(str.maketrans("013ae", "ghkmt"))


def _kustomization(directory: Path) -> Obj:
    for name in KUSTOMIZATION_FILES:
        if (directory / name).is_file():
            k = yaml.safe_load((directory / name).read_text()) or {}
            unknown = set(k) - KNOWN_FIELDS
            if unknown:
                raise NotImplementedError(f"{directory}: kustomization fields {sorted(unknown)}")
            return k
    raise FileNotFoundError(f"{directory}: no kustomization.yaml")


def _load(path: Path) -> list[Obj]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


def _build(directory: Path) -> list[Obj]:
    k = _kustomization(directory)
    objects: list[Obj] = []
    for entry in k.get("resources", []):
        path = directory / entry
        objects += _build(path) if path.is_dir() else _load(path)
    for gen in k.get("configMapGenerator", []):
        _generate_config_map(objects, gen)
    for patch in k.get("patches", []):
        _apply_patch(objects, directory, patch)
    if "namespace" in k:
        for obj in objects:
            if obj["kind"] not in CLUSTER_SCOPED:
                obj["metadata"]["namespace"] = k["namespace"]
    for labels in k.get("labels", []):
        _add_labels(objects, labels)
    for image in k.get("images", []):
        _set_image(objects, image)
    return objects


def _generate_config_map(objects: list[Obj], gen: Obj) -> None:
    unknown = set(gen) - {"name", "literals", "behavior"}
    if unknown:
        raise NotImplementedError(f"configMapGenerator fields {sorted(unknown)}")
    data = {}
    for literal in gen.get("literals", []):
        key, sep, value = literal.partition("=")
        if not sep:
            raise ValueError(f"configMapGenerator literal without '=': {literal!r}")
        data[key] = value
    behavior = gen.get("behavior", "create")
    existing = [o for o in objects if o["kind"] == "ConfigMap"
                and o["metadata"]["name"] == gen["name"]]
    if behavior == "create":
        if existing:
            raise ValueError(f"ConfigMap {gen['name']} exists: behavior merge or replace")
        objects.append({"apiVersion": "v1", "kind": "ConfigMap",
                        "metadata": {"name": gen["name"]}, "data": data,
                        GENERATED: True})
    elif behavior == "merge":
        if len(existing) != 1:
            raise ValueError(f"ConfigMap {gen['name']} to merge into: found {len(existing)}")
        existing[0].setdefault("data", {}).update(data)
    else:
        raise NotImplementedError(f"configMapGenerator behavior {behavior}")


def _apply_patch(objects: list[Obj], directory: Path, entry: Obj) -> None:
    unknown = set(entry) - {"path", "patch", "target"}
    if unknown:
        raise NotImplementedError(f"patch fields {sorted(unknown)}")
    text = (directory / entry["path"]).read_text() if "path" in entry else entry["patch"]
    patch = yaml.safe_load(text)
    target = entry.get("target")
    if isinstance(patch, list):  # JSON 6902
        if target is None:
            raise ValueError("a JSON 6902 patch needs a target")
        for obj in _targets(objects, target):
            for op in patch:
                _json6902(obj, op)
        return
    if target is None:  # strategic merge: the patch names its object
        target = {"kind": patch["kind"], "name": patch["metadata"]["name"]}
    matched = _targets(objects, target)
    for obj in matched:
        merged = _strategic_merge(obj, copy.deepcopy(patch))
        obj.clear()
        obj.update(merged)


def _targets(objects: list[Obj], target: Obj) -> list[Obj]:
    unknown = set(target) - {"group", "version", "kind", "name"}
    if unknown:
        raise NotImplementedError(f"patch target fields {sorted(unknown)}")
    out = []
    for obj in objects:
        group, _, version = obj["apiVersion"].rpartition("/")
        if (target.get("kind", obj["kind"]) == obj["kind"]
                and target.get("name", obj["metadata"]["name"]) == obj["metadata"]["name"]
                and target.get("group", group) == group
                and target.get("version", version) == version):
            out.append(obj)
    if not out:
        raise ValueError(f"patch target {target} matches nothing")
    return out


def _strategic_merge(base: Any, patch: Any, field: str = "") -> Any:
    if isinstance(base, dict) and isinstance(patch, dict):
        if "$patch" in patch:
            raise NotImplementedError("$patch directives")
        out = dict(base)
        for key, value in patch.items():
            if value is None:
                out.pop(key, None)
            elif key in out:
                out[key] = _strategic_merge(out[key], value, key)
            else:
                out[key] = value
        return out
    if isinstance(base, list) and isinstance(patch, list):
        if field in UNSUPPORTED_LISTS:
            raise NotImplementedError(f"strategic merge of the list {field}")
        key = MERGE_KEYS.get(field)
        if key is None:
            return patch
        out = list(base)
        for item in patch:
            at = next((i for i, b in enumerate(out) if b.get(key) == item.get(key)), None)
            if at is None:
                out.append(item)
            else:
                out[at] = _strategic_merge(out[at], item)
        return out
    return patch


def _json6902(obj: Obj, op: Obj) -> None:
    parts = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].split("/")[1:]]
    parent: Any = obj
    for p in parts[:-1]:
        parent = parent[int(p)] if isinstance(parent, list) else parent[p]
    last = parts[-1]
    kind = op["op"]
    if isinstance(parent, list):
        if kind == "add":
            parent.insert(len(parent) if last == "-" else int(last), op["value"])
        elif kind == "replace":
            parent[int(last)] = op["value"]
        elif kind == "remove":
            del parent[int(last)]
        else:
            raise NotImplementedError(f"JSON patch op {kind}")
    elif kind in ("add", "replace"):
        if kind == "replace" and last not in parent:
            raise KeyError(f"JSON patch replace: no {op['path']}")
        parent[last] = op["value"]
    elif kind == "remove":
        del parent[last]
    else:
        raise NotImplementedError(f"JSON patch op {kind}")


def _add_labels(objects: list[Obj], entry: Obj) -> None:
    unknown = set(entry) - {"pairs", "includeSelectors"}
    if unknown:
        raise NotImplementedError(f"labels fields {sorted(unknown)}")
    pairs = entry["pairs"]
    for obj in objects:
        obj["metadata"].setdefault("labels", {}).update(pairs)
        if not entry.get("includeSelectors"):
            continue
        spec, kind = obj.get("spec", {}), obj["kind"]
        if kind in WORKLOADS:
            spec.setdefault("selector", {}).setdefault("matchLabels", {}).update(pairs)
            template = spec.setdefault("template", {}).setdefault("metadata", {})
            template.setdefault("labels", {}).update(pairs)
        elif kind == "Service":
            spec.setdefault("selector", {}).update(pairs)
        elif kind == "PodDisruptionBudget" and "matchLabels" in spec.get("selector", {}):
            spec["selector"]["matchLabels"].update(pairs)
        elif kind == "NetworkPolicy":
            if "matchLabels" in spec.get("podSelector", {}):
                spec["podSelector"]["matchLabels"].update(pairs)
            if any("from" in rule for rule in spec.get("ingress", [])):
                raise NotImplementedError("labels on NetworkPolicy peers")


def _set_image(objects: list[Obj], entry: Obj) -> None:
    unknown = set(entry) - {"name", "newName", "newTag", "digest"}
    if unknown:
        raise NotImplementedError(f"images fields {sorted(unknown)}")
    for obj in objects:
        if obj["kind"] not in WORKLOADS:
            continue
        pod = obj["spec"]["template"]["spec"]
        for c in pod.get("containers", []) + pod.get("initContainers", []):
            name, tag, digest = split_image(c["image"])
            if name != entry["name"]:
                continue
            name = entry.get("newName", name)
            if "digest" in entry:
                c["image"] = f"{name}@{entry['digest']}"
            elif "newTag" in entry:
                c["image"] = f"{name}:{entry['newTag']}"
            else:
                c["image"] = name + (f":{tag}" if tag else "") + (f"@{digest}" if digest else "")


def split_image(image: str) -> tuple[str, str, str]:
    """NAME[:TAG][@DIGEST] -> (name, tag, digest); a registry's :port is
    part of the name."""
    image, _, digest = image.partition("@")
    name, tag = image, ""
    if ":" in image.rsplit("/", 1)[-1]:
        name, _, tag = image.rpartition(":")
    return name, tag, digest


def _rename_config_map_refs(pod: Obj, renamed: dict[str, str]) -> None:
    for c in pod.get("containers", []) + pod.get("initContainers", []):
        for source in c.get("envFrom", []):
            ref = source.get("configMapRef")
            if ref and ref.get("name") in renamed:
                ref["name"] = renamed[ref["name"]]
        for env in c.get("env", []):
            ref = env.get("valueFrom", {}).get("configMapKeyRef")
            if ref and ref.get("name") in renamed:
                ref["name"] = renamed[ref["name"]]
    for volume in pod.get("volumes", []):
        ref = volume.get("configMap")
        if ref and ref.get("name") in renamed:
            ref["name"] = renamed[ref["name"]]
        for source in volume.get("projected", {}).get("sources", []):
            ref = source.get("configMap")
            if ref and ref.get("name") in renamed:
                ref["name"] = renamed[ref["name"]]
