#!/usr/bin/env bash
# The whole test suite: installs and builds (scripts/setup.sh), then runs
# the format and lint checks, C++ (ctest), Python (pytest) and Go (go test,
# with gofmt and go vet). The Python and Go suites start their own servers
# on free loopback ports. Then the sanitizer runs (scripts/sanitize.sh:
# ASan + UBSan over ctest and the e2e suites, ThreadSanitizer over the
# concurrency tests) and a minute of fuzzing per target (scripts/fuzz.sh);
# docs/reliability.md says what they cover and how long they take.
#
#   scripts/test.sh
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
BUILD_DIR=${BUILD_DIR:-build}
# PyTorch and Flax too: the whole-model checks run real models.
TENSORCHECK_FRAMEWORKS=1 scripts/setup.sh

export TENSORCHECK_SERVER_BIN="$ROOT/$BUILD_DIR/server/tensorcheck-server"
export TENSORCHECK_CLI_BIN="$ROOT/$BUILD_DIR/client/cli/tensorcheck"
failed=()

echo "== format and lint (C++: clang-format; Python client: ruff, mypy --strict; Dockerfiles: hadolint)"
scripts/format.sh --check || failed+=("clang-format")
client/python/lint.sh || failed+=("python lint")
# The images are built by no one here (no Docker engine): hadolint
# (.hadolint.yaml) and tests/e2e/test_deploy.py check them.
.venv/bin/hadolint docker/Dockerfile docker/Dockerfile.cuda || failed+=("hadolint")
.venv/bin/yamllint -s deploy/kubernetes .yamllint.yaml || failed+=("yamllint")

echo "== C++ (ctest)"
ctest --test-dir "$BUILD_DIR" --output-on-failure -j "$(nproc)" || failed+=(ctest)

echo "== Python (pytest)"
# TENSORCHECK_BIG_TESTS: the Python client's 470 MB and 2.1 GB layers end
# to end (about 3 minutes; the CLI's and tests/e2e/test_store.py's run
# anyway).
TENSORCHECK_BIG_TESTS=1 .venv/bin/python -m pytest -q -rs client/python/tests tests/e2e ||
  failed+=(pytest)

echo "== Go (go test)"
client/go/test.sh || failed+=("go test")

echo "== sanitizers (scripts/sanitize.sh: ASan + UBSan, ThreadSanitizer)"
scripts/sanitize.sh || failed+=(sanitizers)

echo "== fuzzing (scripts/fuzz.sh 60)"
scripts/fuzz.sh 60 || failed+=(fuzz)

if ((${#failed[@]})); then
  echo "FAILED: ${failed[*]}"
  exit 1
fi
echo "all suites passed"
