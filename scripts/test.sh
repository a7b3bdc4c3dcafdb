#!/usr/bin/env bash
# The test command and its two siblings (CONTRIBUTING.md, "Inner loop";
# their measured times: docs/performance.md, "The test commands").
#
#   scripts/test.sh           # the test command (README): installs and builds
#                             # (scripts/setup.sh, PyTorch and Flax included),
#                             # format and lint, then every unit and e2e suite:
#                             # C++ (ctest -LE slow: the candle case at full
#                             # size once among them), Python (pytest -m "not
#                             # slow and not big": the client and tests/e2e,
#                             # which start their own servers on loopback) and
#                             # Go (client/go/test.sh: gofmt, go vet, go test)
#   scripts/test.sh --quick   # the inner loop: the incremental build, then the
#                             # unit tests of every language (ctest -L unit,
#                             # pytest -m "not e2e and not slow and not big" on
#                             # the client, client/go/test.sh -short) and the
#                             # layer check (tests/check_layers.py)
#   scripts/test.sh --deep    # what CI runs (.ci/run): the test command, then
#                             # the slow and big layers (ctest -L slow;
#                             # TENSORCHECK_BIG_TESTS=1 pytest -m "slow or big"),
#                             # ASan + UBSan and ThreadSanitizer
#                             # (scripts/sanitize.sh) and a minute of fuzzing per
#                             # target (scripts/fuzz.sh 60)
#
# Exits non-zero when any step fails (every step runs regardless) and ends
# with each step's time. docs/reliability.md says what the sanitizers and the
# fuzzers cover. Environment: BUILD_DIR (default build), and what
# scripts/setup.sh, scripts/sanitize.sh and scripts/fuzz.sh read.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
BUILD_DIR=${BUILD_DIR:-build}

mode=default
case "${1:-}" in
  "") ;;
  --quick) mode=quick ;;
  --deep) mode=deep ;;
  -h | --help)
    sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
    exit 0
    ;;
  *)
    echo "usage: scripts/test.sh [--quick | --deep]" >&2
    exit 2
    ;;
esac

# Every tree (build/, the sanitizers', the fuzzers') compiles through ccache
# with paths relative to the checkout, so that another clone of the same
# tree hits what this one compiled (setup.sh, sanitize.sh and fuzz.sh set
# it too, for when they run alone).
export CCACHE_BASEDIR="$ROOT"
export TENSORCHECK_SERVER_BIN="$ROOT/$BUILD_DIR/server/tensorcheck-server"
export TENSORCHECK_CLI_BIN="$ROOT/$BUILD_DIR/client/cli/tensorcheck"
PYTEST=(.venv/bin/python -m pytest -q -rs)
failed=()
timings=()
step_name=""
step_start=$SECONDS

# Starts a step: closes the previous one's timing, prints a dated header.
step() {
  finish_step
  step_name=$1
  step_start=$SECONDS
  echo "== [$(date +%H:%M:%S)] $1"
}
finish_step() {
  if [[ -n "$step_name" ]]; then
    timings+=("$step_name: $((SECONDS - step_start)) s")
  fi
  step_name=""
}

if [[ $mode == quick ]]; then
  # The venv and build/ as the test command leaves them; without PyTorch and
  # Flax on a machine that never ran it (their tests skip, saying so).
  step "setup and incremental build (scripts/setup.sh)"
  scripts/setup.sh || failed+=("setup")
  if ((${#failed[@]})); then
    finish_step
    echo "FAILED: ${failed[*]}"
    exit 1
  fi
  step "layer check (tests/check_layers.py)"
  python3 tests/check_layers.py "$ROOT" || failed+=("layer check")
  step "C++ unit tests (ctest -L unit)"
  ctest --test-dir "$BUILD_DIR" --output-on-failure -j "$(nproc)" -L unit || failed+=("ctest -L unit")
  step "Python unit tests (pytest -m 'not e2e and not slow and not big' client/python/tests)"
  "${PYTEST[@]}" -m "not e2e and not slow and not big" client/python/tests ||
    failed+=("pytest (unit)")
  step "Go unit tests (client/go/test.sh -short)"
  client/go/test.sh -short || failed+=("go test -short")
else
  # PyTorch and Flax too: the whole-model checks run real models.
  step "setup and build (scripts/setup.sh, with PyTorch and Flax)"
  TENSORCHECK_FRAMEWORKS=1 scripts/setup.sh || failed+=("setup")
  if ((${#failed[@]})); then
    finish_step
    echo "FAILED: ${failed[*]}"
    exit 1
  fi

  step "format and lint (clang-format; ruff, mypy --strict; hadolint, yamllint)"
  scripts/format.sh --check || failed+=("clang-format")
  client/python/lint.sh || failed+=("python lint")
  # The images are built by no one here (no Docker engine): hadolint
  # (.hadolint.yaml) and tests/e2e/test_deploy.py check them.
  .venv/bin/hadolint docker/Dockerfile docker/Dockerfile.cuda || failed+=("hadolint")
  .venv/bin/yamllint -s deploy/kubernetes .yamllint.yaml || failed+=("yamllint")

  step "C++ (ctest -LE slow: unit, e2e, gpu)"
  ctest --test-dir "$BUILD_DIR" --output-on-failure -j "$(nproc)" -LE slow || failed+=(ctest)

  step "Python (pytest -m 'not slow and not big' client/python/tests tests/e2e)"
  "${PYTEST[@]}" -m "not slow and not big" client/python/tests tests/e2e || failed+=(pytest)

  step "Go (client/go/test.sh)"
  client/go/test.sh || failed+=("go test")

  if [[ $mode == deep ]]; then
    # build/ as the test command left it: nothing is rebuilt here.
    step "C++ slow tests (ctest -L slow)"
    ctest --test-dir "$BUILD_DIR" --output-on-failure -j "$(nproc)" -L slow ||
      failed+=("ctest -L slow")

    step "Python slow and big layers (TENSORCHECK_BIG_TESTS=1 pytest -m 'slow or big')"
    TENSORCHECK_BIG_TESTS=1 "${PYTEST[@]}" -m "slow or big" client/python/tests tests/e2e ||
      failed+=("pytest (slow, big)")

    step "sanitizers (scripts/sanitize.sh: ASan + UBSan, ThreadSanitizer)"
    scripts/sanitize.sh || failed+=(sanitizers)

    step "fuzzing (scripts/fuzz.sh 60)"
    scripts/fuzz.sh 60 || failed+=(fuzz)
  fi
fi
finish_step

echo "== scripts/test.sh${1:+ $1} timings: $(printf '%s; ' "${timings[@]}")total: $SECONDS s"
if ((${#failed[@]})); then
  echo "FAILED: ${failed[*]}"
  exit 1
fi
echo "all suites passed"
