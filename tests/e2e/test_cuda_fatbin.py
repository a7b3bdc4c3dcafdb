"""The CUDA build's device code, checked without a GPU: every kernel in the
server's fatbin is built as machine code for sm_80 (A100) and sm_90
(H100/H200), and PTX for sm_90 rides along for newer devices to JIT. A
kernel missing for one architecture would make the GPU host JIT it from
PTX or fail at launch, which no test on this machine could otherwise see.

Reads the binary with cuobjdump (the CUDA toolkit's, or the
nvidia-cuda-cuobjdump wheel that scripts/setup.sh installs into .venv).
Skips on a build without the CUDA backends."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ARCHS = {"sm_80", "sm_90"}
SOURCES = ["cuda_kernels", "device_compare_kernels", "error_model_kernels", "diagnosis_kernels"]


def server_binary() -> Path:
    return Path(
        os.environ.get("TENSORCHECK_SERVER_BIN", REPO / "build/server/tensorcheck-server")
    )


def cuda_build(binary: Path) -> bool:
    cache = binary.parent.parent / "CMakeCache.txt"
    return cache.is_file() and "TENSORCHECK_ENABLE_CUDA:BOOL=ON" in cache.read_text()


def cuobjdump() -> str:
    found = shutil.which("cuobjdump")
    if found:
        return found
    candidates = [Path("/usr/local/cuda/bin/cuobjdump")]
    candidates += sorted(Path(sys.prefix).glob("lib/python3*/site-packages/nvidia/cu*/bin/cuobjdump"))
    for c in candidates:
        if c.is_file():
            return str(c)
    pytest.fail("no cuobjdump: scripts/setup.sh installs nvidia-cuda-cuobjdump into .venv")


def kernels_per_arch(binary: Path) -> dict[str, set[str]]:
    out = subprocess.run(
        [cuobjdump(), "--dump-resource-usage", str(binary)],
        check=True, capture_output=True, text=True,
    ).stdout
    per_arch: dict[str, set[str]] = {}
    arch = None
    for line in out.splitlines():
        m = re.match(r"\s*arch = (sm_\d+)", line)
        if m:
            arch = m.group(1)
            per_arch.setdefault(arch, set())
            continue
        m = re.match(r"\s*Function (\S+):$", line)
        if m and arch is not None:
            per_arch[arch].add(m.group(1))
    return per_arch


def test_every_kernel_is_built_for_sm80_and_sm90() -> None:
    binary = server_binary()
    if not binary.is_file() or not cuda_build(binary):
        pytest.skip(f"{binary} is not a CUDA build")
    per_arch = kernels_per_arch(binary)
    assert ARCHS <= set(per_arch), f"machine code for {sorted(per_arch)} only"
    every = set().union(*per_arch.values())
    # Kernels of each of the four .cu files (their anonymous namespaces
    # carry the file's name in the mangled name).
    for source in SOURCES:
        assert any(f"{source}_cu_" in k for k in every), f"no kernel of {source}.cu in the fatbin"
    for arch in sorted(ARCHS):
        missing = sorted(every - per_arch[arch])
        assert not missing, f"{len(missing)} kernels without {arch} code, e.g. {missing[:3]}"


def test_sm90_ptx_rides_along() -> None:
    binary = server_binary()
    if not binary.is_file() or not cuda_build(binary):
        pytest.skip(f"{binary} is not a CUDA build")
    out = subprocess.run(
        [cuobjdump(), "--list-ptx", str(binary)], check=True, capture_output=True, text=True
    ).stdout
    assert re.search(r"\.sm_90\.ptx", out), out[:500]
