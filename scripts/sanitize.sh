#!/usr/bin/env bash
# Sanitizer runs of the CPU paths (docs/reliability.md, "Sanitizers"):
#
#   asan  build-asan, AddressSanitizer + UndefinedBehaviorSanitizer: every
#         C++ test (ctest) except the full-size diagnoses, then the e2e and
#         Python suites against the sanitized server and CLI.
#   tsan  build-tsan, ThreadSanitizer: the concurrency tests (the service
#         and its worker pool on a live server, draining streams, the
#         tensor store's uploads and first reads after a restart, the idle
#         trim, the metrics endpoint's loop, the statistics Executor,
#         concurrent and multi-threaded statistics, the CPU backend's
#         threads, the stop signal).
#
#   scripts/sanitize.sh            # asan, then tsan
#   scripts/sanitize.sh asan       # one of them
#
# Needs what scripts/setup.sh installs (.venv for pytest). Both builds are
# CPU-only and at -O1 -g1: enough for the sanitizers and readable stacks,
# about half the compile time of -O2 -g. Environment: ASAN_BUILD_DIR
# (default build-asan), TSAN_BUILD_DIR (default build-tsan).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
ASAN_BUILD_DIR=${ASAN_BUILD_DIR:-build-asan}
TSAN_BUILD_DIR=${TSAN_BUILD_DIR:-build-tsan}
STEPS=("$@")
((${#STEPS[@]})) || STEPS=(asan tsan)

CMAKE_COMMON=(-G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo
  "-DCMAKE_C_FLAGS_RELWITHDEBINFO=-O1 -g1" "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g1"
  -DTENSORCHECK_ENABLE_CUDA=OFF -DTENSORCHECK_BUILD_BENCH=OFF)
if command -v ccache >/dev/null; then
  # Another clone of the tree hits the same cache (scripts/setup.sh says why
  # hash_dir is off).
  export CCACHE_BASEDIR="$ROOT" CCACHE_NOHASHDIR=1
  CMAKE_COMMON+=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
fi
# One BLAS thread: the tests that want threads ask the CPU backend for them.
export OPENBLAS_NUM_THREADS=1
failed=()
timings=()

# Records the seconds since the previous lap under a name.
lap_start=$SECONDS
lap() {
  timings+=("$1: $((SECONDS - lap_start)) s")
  lap_start=$SECONDS
}

run_asan() {
  echo "== ASan + UBSan: configuring and building $ASAN_BUILD_DIR"
  cmake -S . -B "$ASAN_BUILD_DIR" "${CMAKE_COMMON[@]}" -DTENSORCHECK_SANITIZE=ON >/dev/null
  # Every test binary but the full-size diagnoses (diagnosis_orders_test:
  # 24 G multiply-adds per summation order in its reference loops, hours
  # under ASan; the same code runs at small sizes in engine_test), plus the
  # server and the CLI for the e2e suites.
  local targets
  mapfile -t targets < <(ninja -C "$ASAN_BUILD_DIR" -t targets all |
    sed -n 's/^\([A-Za-z0-9_]*_test\): phony$/\1/p' | grep -vx diagnosis_orders_test)
  cmake --build "$ASAN_BUILD_DIR" -j "$(nproc)" --target "${targets[@]}" tensorcheck-server tensorcheck
  lap "ASan build"

  # abort_on_error: a report fails the test. allocator_may_return_null: the
  # test of an impossible allocation sees the null it checks for.
  # tests/lsan.supp: leaks inside Debian's libraries (c-ares), each with
  # its reason.
  export ASAN_OPTIONS=abort_on_error=1:allocator_may_return_null=1:detect_leaks=1
  export LSAN_OPTIONS="suppressions=$ROOT/tests/lsan.supp"
  export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
  echo "== ASan + UBSan: ctest (excluded: DiagnosisOrdersTest, full size)"
  ctest --test-dir "$ASAN_BUILD_DIR" --output-on-failure -j "$(nproc)" \
    -E '^DiagnosisOrdersTest\.|^diagnosis_orders_test_NOT_BUILT' || failed+=("asan ctest")
  lap "ASan ctest"

  # The multi-GB layers are left out: the code paths are those of the
  # small store tests, and under ASan they would take minutes each.
  echo "== ASan + UBSan: e2e and Python suites against the sanitized server and CLI"
  TENSORCHECK_SKIP_LARGE=1 \
    TENSORCHECK_SERVER_BIN="$ROOT/$ASAN_BUILD_DIR/server/tensorcheck-server" \
    TENSORCHECK_CLI_BIN="$ROOT/$ASAN_BUILD_DIR/client/cli/tensorcheck" \
    .venv/bin/python -m pytest -q -rs tests/e2e client/python/tests || failed+=("asan pytest")
  lap "ASan pytest"
  unset ASAN_OPTIONS UBSAN_OPTIONS LSAN_OPTIONS
}

# The concurrency tests, by ctest name (gtest Suite.Test): the live
# service (requests, the fatal-device-error path, admission, cancellation
# and shutdown with a gated backend), the worker pool, the statistics
# executor, the stop signal, cancellation through the engine, and the
# multi-threaded statistics and CPU backend.
TSAN_TESTS='^(ExecutorTest|StopSignalTest|ServiceTest|ServiceFatalErrorTest|ByteBudgetTest|GatedServiceTest|CancellationTest|TensorStoreTest|TensorStoreUploadTest|StoreCallsTest|StoreDrainTest|RestartTest|IdleTrimTest|MetricsEndpointTest)\.'
TSAN_TESTS+='|^CompareTest\.(Concurrent|Multithreaded|RowsSplitAcrossThreads)'
TSAN_TESTS+='|^ErrorModelTest\.PerElementPassesAreBitwiseTheSameOnAnyExecutor$'
TSAN_TESTS+='|^CpuBackendTest\.Fp16AccSplitsLargeProblemsAcrossThreadsBitwise$'

run_tsan() {
  echo "== TSan: configuring and building $TSAN_BUILD_DIR"
  cmake -S . -B "$TSAN_BUILD_DIR" "${CMAKE_COMMON[@]}" -DTENSORCHECK_TSAN=ON >/dev/null
  cmake --build "$TSAN_BUILD_DIR" -j "$(nproc)" \
    --target core_test stats_test store_test service_test store_calls_test admission_test \
    cancellation_test cpu_backend_test idle_trim_test metrics_test
  lap "TSan build"
  # Debian's gRPC, Abseil, protobuf and OpenBLAS are not instrumented:
  # ignore_noninstrumented_modules keeps TSan from checking the memory
  # their own code touches (memcpy and friends called from them), and
  # tests/tsan.supp lists, with the reason, the reports that involve gRPC's
  # hand-overs between its threads.
  export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:ignore_noninstrumented_modules=1:suppressions=$ROOT/tests/tsan.supp"
  echo "== TSan: the concurrency tests"
  local n
  n=$(ctest --test-dir "$TSAN_BUILD_DIR" -N -R "$TSAN_TESTS" | sed -n 's/^Total Tests: //p')
  if [[ "${n:-0}" -lt 1 ]]; then
    echo "TSan: no test matches $TSAN_TESTS" >&2
    failed+=("tsan ctest")
  else
    ctest --test-dir "$TSAN_BUILD_DIR" --output-on-failure -j "$(nproc)" -R "$TSAN_TESTS" ||
      failed+=("tsan ctest")
  fi
  lap "TSan ctest"
  unset TSAN_OPTIONS
}

for step in "${STEPS[@]}"; do
  case "$step" in
    asan) run_asan ;;
    tsan) run_tsan ;;
    *) echo "usage: scripts/sanitize.sh [asan] [tsan]" >&2; exit 2 ;;
  esac
done

echo "== sanitize.sh timings: $(printf '%s; ' "${timings[@]}")"
if ((${#failed[@]})); then
  echo "sanitize.sh FAILED: ${failed[*]}"
  exit 1
fi
echo "sanitize.sh: ${STEPS[*]} clean"
