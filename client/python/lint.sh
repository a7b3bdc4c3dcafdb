#!/usr/bin/env bash
# Lint of the Python client: ruff check, ruff format --check and
# mypy --strict, all configured in client/python/pyproject.toml.
#
#   client/python/lint.sh                      # the repository's .venv
#   PYTHON=/path/to/python client/python/lint.sh
#
# Works from any directory. Installs nothing: $PYTHON (default: the
# repository's .venv/bin/python) needs
#   - ruff, mypy, types-protobuf, grpc-stubs (the lint tools and stubs);
#   - the client itself, `pip install ./client/python` (or -e): it brings
#     numpy, ml_dtypes, grpcio and protobuf, whose types mypy reads, and
#     generates the gRPC stubs (src/tensorcheck/_proto) that mypy follows.
# Runs all three checks and fails if any of them did.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PYTHON="${PYTHON:-$here/../../.venv/bin/python}"
# A relative path is relative to where the script was called from.
case "$PYTHON" in
/*) ;;
*/*) PYTHON="$PWD/$PYTHON" ;;
esac
if ! command -v "$PYTHON" >/dev/null 2>&1; then
    echo "lint.sh: no Python at $PYTHON; set PYTHON=/path/to/python" >&2
    exit 2
fi

cd "$here"

# What the checks need, checked up front for a clear message.
"$PYTHON" - <<'EOF' || exit 2
import importlib.metadata as md
import os
import sys

need = ["ruff", "mypy", "types-protobuf", "grpc-stubs", "numpy", "ml_dtypes", "grpcio", "protobuf"]
missing = []
for dist in need:
    try:
        md.version(dist)
    except md.PackageNotFoundError:
        missing.append(dist)
if missing:
    print(f"lint.sh: {sys.executable} lacks {', '.join(missing)}; install them with\n"
          f"  {sys.executable} -m pip install ruff mypy types-protobuf grpc-stubs ./client/python",
          file=sys.stderr)
    sys.exit(1)
stubs = os.path.join("src", "tensorcheck", "_proto", "tensorcheck", "v1", "tensorcheck_pb2.pyi")
if not os.path.isfile(stubs):
    try:
        md.version("tensorcheck")
    except md.PackageNotFoundError:
        print("lint.sh: the generated gRPC stubs (client/python/" + stubs + ") are missing\n"
              "and tensorcheck is not installed; generate them with\n"
              f"  {sys.executable} -m pip install ./client/python", file=sys.stderr)
        sys.exit(1)
print("lint.sh: " + ", ".join(f"{d} {md.version(d)}" for d in ("ruff", "mypy")))
EOF

failed=()
echo "== ruff check"
"$PYTHON" -m ruff check . || failed+=("ruff check")
echo "== ruff format --check"
"$PYTHON" -m ruff format --check . || failed+=("ruff format --check (fix: ruff format, in client/python)")
echo "== mypy --strict"
"$PYTHON" -m mypy --strict || failed+=("mypy --strict")

if ((${#failed[@]})); then
    printf 'lint.sh: FAILED: %s\n' "${failed[@]}" >&2
    exit 1
fi
echo "lint.sh: all checks passed"
