#!/usr/bin/env python3
"""Checks that the C++ layers point one way (docs/architecture.md).

    tests/check_layers.py REPO_ROOT          # exit 1 and a list of violations
    tests/check_layers.py --self-test        # a tree with a cycle must fail

Reads the `#include "..."` and `#include <...>` lines of every C++ and CUDA
file under core/, server/ and client/cli/ and fails when

- core/ (shared by the server and its clients) includes anything but
  core/;
- a lower server layer includes a higher one: core < stats < backends <
  engine < service < server/main.cc (store sits beside stats);
- one backend includes another (backends/cpu and backends/cuda are
  siblings; only backends/builtin_backends.cc knows both, and a backend's
  tests may compare it with another);
- the CLI includes anything of server/ (it uses core/ and talks to the
  server through proto/ only);
- a file outside server/service, client/ and proto/ includes a gRPC header;
- a file outside server/backends/cuda includes a CUDA header;
- a header outside an `internal/` folder includes one inside it (a
  public header may not expose its folder's internals), or a file
  outside the folder that holds an `internal/` includes from it.

Standard library only: CTest runs it with the system's python3.
"""

from __future__ import annotations

import pathlib
import re
import sys
import tempfile

SOURCE_SUFFIXES = {".h", ".cc", ".cu", ".cuh"}
INCLUDE = re.compile(r'^\s*#\s*include\s*[<"]([^>"]+)[>"]')

RANK = {"stats": 1, "store": 1, "backends": 2, "engine": 3, "service": 4}
MAIN_RANK = 5

GRPC = re.compile(r"^(grpcpp/|grpc/|grpc\+\+/)|\.grpc\.pb\.h$")
CUDA = re.compile(
    r"^(cuda[^/]*\.h|cublas[^/]*\.h|cublasLt\.h|cusparse[^/]*\.h|curand[^/]*\.h|"
    r"device_launch_parameters\.h|cub/|thrust/|cuda/|nv/|mma\.h|cooperative_groups)"
)


def layer_of(rel: str) -> tuple[str, int] | None:
    """The layer name and rank of a repository path under core/ or server/."""
    parts = rel.split("/")
    if parts[0] == "core":
        return ("core", 0)
    if parts[0] != "server":
        return None
    if len(parts) == 2:
        return ("main", MAIN_RANK)
    name = parts[1]
    return (name, RANK[name]) if name in RANK else None


def backend_of(rel: str) -> str | None:
    """cpu or cuda for files inside one backend's folder."""
    parts = rel.split("/")
    if len(parts) > 3 and parts[:2] == ["server", "backends"]:
        return parts[2]
    return None


def violations(root: pathlib.Path) -> list[str]:
    found: list[str] = []
    files = []
    for top in ("core", "server", "client/cli"):
        base = root / top
        if base.is_dir():
            files += [p for p in base.rglob("*") if p.suffix in SOURCE_SUFFIXES]
    for path in sorted(files):
        rel = path.relative_to(root).as_posix()
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            match = INCLUDE.match(line)
            if not match:
                continue
            target = match.group(1)
            where = f"{rel}:{number}: includes {target}"
            in_service = rel.startswith("server/service/") or rel.startswith("client/")
            if GRPC.search(target) and not in_service:
                found.append(f"{where}: gRPC outside server/service, client/ and proto/")
            if CUDA.search(target) and not rel.startswith("server/backends/cuda/"):
                found.append(f"{where}: CUDA outside server/backends/cuda")
            if "/internal/" in target and target.startswith(("server/", "core/", "client/")):
                owner = target.split("/internal/")[0] + "/"
                if not rel.startswith(owner):
                    found.append(f"{where}: internal to {owner}")
                elif path.suffix == ".h" and "/internal/" not in rel:
                    found.append(f"{where}: a public header exposes {owner}internal/")
            if rel.startswith("core/"):
                if "/" in target and not target.startswith("core/") and \
                        target.split("/")[0] in ("server", "client", "proto"):
                    found.append(f"{where}: core/ is shared by the server and its clients "
                                 "and includes only core/")
                continue
            if not target.startswith(("server/", "core/")):
                continue
            if rel.startswith("client/cli/"):
                if target.startswith("server/"):
                    found.append(f"{where}: the CLI may use core/ and proto/ only")
                continue
            mine, theirs = layer_of(rel), layer_of(target)
            if mine is None or theirs is None:
                found.append(f"{where}: a folder no layer is known for")
                continue
            if theirs[1] > mine[1]:
                found.append(f"{where}: {mine[0]} (layer {mine[1]}) must not depend on "
                             f"{theirs[0]} (layer {theirs[1]})")
            own, other = backend_of(rel), backend_of(target)
            # A backend's test may hold it against another (GPU vs CPU
            # emulation); its code may not use one.
            if own and other and own != other and not rel.endswith("_test.cc"):
                found.append(f"{where}: backend {own} must not depend on backend {other}")
    return found


def self_test() -> int:
    """A cycle between stats and backends, gRPC in the engine, CUDA in
    core, core reaching into the server and a CLI reaching into the
    service must all be reported."""
    with tempfile.TemporaryDirectory() as tmp:
        root = pathlib.Path(tmp)
        files = {
            "server/stats/error_model.h": '#include "server/backends/linear_backend.h"\n',
            "server/backends/linear_backend.h": '#include "server/stats/diff_stats.h"\n',
            "server/engine/engine.cc": "#include <grpcpp/grpcpp.h>\n",
            "core/tensor.cc": "#include <cuda_runtime.h>\n",
            "server/backends/cpu/cpu_backend.cc": '#include "server/backends/cuda/x.h"\n',
            "client/cli/main.cc": '#include "server/service/dtype_proto.h"\n',
            "core/dtype.h": '#include "server/stats/diff_stats.h"\n',
            "server/backends/cuda/kernels.h": '#include "server/backends/cuda/internal/k.h"\n',
            "server/engine/plan.cc": '#include "server/backends/cuda/internal/k.h"\n',
            # Allowed: an implementation file using its own folder's internals.
            "server/backends/cuda/kernels.cu": '#include "server/backends/cuda/internal/k.h"\n',
        }
        for rel, text in files.items():
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / rel).write_text(text)
        found = violations(root)
    expected = ["server/stats/error_model.h", "server/engine/engine.cc",
                "core/tensor.cc", "server/backends/cpu/cpu_backend.cc",
                "client/cli/main.cc", "core/dtype.h", "server/backends/cuda/kernels.h",
                "server/engine/plan.cc"]
    missing = [e for e in expected if not any(f.startswith(e) for f in found)]
    # The allowed direction (backends -> stats) is not reported.
    wrong = [f for f in found if f.startswith(("server/backends/linear_backend.h",
                                              "server/backends/cuda/kernels.cu"))]
    for line in found:
        print("self-test found:", line)
    if missing or wrong:
        print("self-test FAILED: missed", missing, "wrongly reported", wrong)
        return 1
    print(f"self-test passed: {len(found)} planted violations reported")
    return 0


def main(argv: list[str]) -> int:
    if argv[1:] == ["--self-test"]:
        return self_test()
    if len(argv) != 2:
        print(__doc__)
        return 2
    found = violations(pathlib.Path(argv[1]))
    for line in found:
        print(line)
    if found:
        print(f"{len(found)} include(s) against the layer order (docs/architecture.md)")
        return 1
    print("layers: every include points down or sideways")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
