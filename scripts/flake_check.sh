#!/usr/bin/env bash
# The unit and e2e suites RUNS times in a row (default 5) with every core
# kept busy by `stress-ng --cpu $(nproc)`, so that a test that waits on a
# time instead of a condition shows itself (docs/reliability.md, "Flaky
# tests"). Builds nothing: run it after scripts/test.sh (or --quick, for the
# binaries; the e2e suites need the server and the CLI).
#
#   scripts/flake_check.sh [RUNS]
#
# Each run: ctest -L 'unit|e2e' (not slow, not gpu), pytest -m "not slow and
# not big" over client/python/tests and tests/e2e, and client/go/test.sh.
# Prints each run's failures by name, then a summary; exits 1 when any test
# failed in any run. Environment: BUILD_DIR (default build), FLAKE_STRESS=0
# (no load), FLAKE_LOGS=DIR (keep the logs there; default a temporary
# directory, printed).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
RUNS=${1:-5}
BUILD_DIR=${BUILD_DIR:-build}
LOGS=${FLAKE_LOGS:-$(mktemp -d "${TMPDIR:-/tmp}/tensorcheck-flake.XXXXXX")}
mkdir -p "$LOGS"
export TENSORCHECK_SERVER_BIN="$ROOT/$BUILD_DIR/server/tensorcheck-server"
export TENSORCHECK_CLI_BIN="$ROOT/$BUILD_DIR/client/cli/tensorcheck"

stress_pid=""
stop_stress() {
  if [[ -n "$stress_pid" ]]; then
    kill "$stress_pid" 2>/dev/null || true
    wait "$stress_pid" 2>/dev/null || true
    stress_pid=""
  fi
}
trap stop_stress EXIT
if [[ "${FLAKE_STRESS:-1}" != 0 ]]; then
  if ! command -v stress-ng >/dev/null; then
    echo "flake_check.sh: stress-ng is missing (apt-get install stress-ng), or set FLAKE_STRESS=0" >&2
    exit 2
  fi
  stress-ng --cpu "$(nproc)" --quiet &
  stress_pid=$!
  echo "== stress-ng --cpu $(nproc) running (pid $stress_pid)"
fi

all=()
for ((run = 1; run <= RUNS; run++)); do
  echo "== [$(date +%H:%M:%S)] run $run of $RUNS (logs: $LOGS/run$run-*.log)"
  start=$SECONDS
  failures=()
  if ! ctest --test-dir "$BUILD_DIR" -j "$(nproc)" -L '^(unit|e2e)$' \
    >"$LOGS/run$run-ctest.log" 2>&1; then
    mapfile -t f < <(sed -n 's/^[0-9]*:/ctest /p' "$BUILD_DIR/Testing/Temporary/LastTestsFailed.log")
    ((${#f[@]})) || f=("ctest (see $LOGS/run$run-ctest.log)")
    failures+=("${f[@]}")
  fi
  if ! .venv/bin/python -m pytest -q -rfE -p no:cacheprovider -m "not slow and not big" \
    client/python/tests tests/e2e >"$LOGS/run$run-pytest.log" 2>&1; then
    mapfile -t f < <(sed -n 's/^\(FAILED\|ERROR\) \([^ ]*\).*/pytest \2/p' "$LOGS/run$run-pytest.log")
    ((${#f[@]})) || f=("pytest (see $LOGS/run$run-pytest.log)")
    failures+=("${f[@]}")
  fi
  if ! client/go/test.sh -count=1 >"$LOGS/run$run-go.log" 2>&1; then
    mapfile -t f < <(sed -n 's/^ *--- FAIL: \([^ ]*\).*/go \1/p' "$LOGS/run$run-go.log")
    ((${#f[@]})) || f=("go (see $LOGS/run$run-go.log)")
    failures+=("${f[@]}")
  fi
  echo "run $run: $((SECONDS - start)) s, ${#failures[@]} failed${failures:+: ${failures[*]}}"
  all+=("${failures[@]}")
done
stop_stress

echo "== flake_check.sh: $RUNS runs, ${#all[@]} failures"
if ((${#all[@]})); then
  printf '%s\n' "${all[@]}" | sort | uniq -c
  exit 1
fi
