#!/usr/bin/env bash
# Builds the libFuzzer targets of tests/fuzz (clang-14; the tree with ASan
# and UBSan) in build-fuzz and runs each for SECONDS_PER_TARGET on a copy of
# its seed corpus (tests/fuzz/corpus/TARGET/), so that the checkout stays
# clean. Fails on any crash, leak, timeout, out-of-memory or undefined
# behaviour, leaving the input that caused it in the printed directory.
# Prints executions and coverage (libFuzzer's cov: and ft:) per target.
#
#   scripts/fuzz.sh [SECONDS_PER_TARGET]     # default 60
#
# Environment: FUZZ_BUILD_DIR (default build-fuzz), FUZZ_TARGETS (default:
# request npy safetensors config upload), FUZZ_KEEP=DIR (keep the grown corpora
# and logs in DIR instead of a temporary directory).
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_PER_TARGET=${1:-60}
BUILD=${FUZZ_BUILD_DIR:-build-fuzz}
read -r -a TARGETS <<<"${FUZZ_TARGETS:-request npy safetensors config upload}"
CC=${FUZZ_CC:-clang-14}
CXX=${FUZZ_CXX:-clang++-14}

echo "== fuzz: configuring and building $BUILD ($CXX, ASan + UBSan + libFuzzer)"
launcher=()
if command -v ccache >/dev/null; then
  # Another clone of the tree hits the same cache (scripts/setup.sh says why
  # hash_dir is off).
  export CCACHE_BASEDIR="$PWD" CCACHE_NOHASHDIR=1
  launcher=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
fi
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_C_COMPILER="$CC" -DCMAKE_CXX_COMPILER="$CXX" "${launcher[@]}" \
  -DTENSORCHECK_FUZZ=ON -DTENSORCHECK_ENABLE_CUDA=OFF -DTENSORCHECK_BUILD_BENCH=OFF >/dev/null
cmake --build "$BUILD" -j "$(nproc)" --target fuzzers
echo "== fuzz: built in $SECONDS s"

if [[ -n "${FUZZ_KEEP:-}" ]]; then
  WORK=$FUZZ_KEEP
  mkdir -p "$WORK"
else
  WORK=$(mktemp -d "${TMPDIR:-/tmp}/tensorcheck-fuzz.XXXXXX")
fi
# Leaks are failures; UBSan already aborts (-fno-sanitize-recover).
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=0
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
export OPENBLAS_NUM_THREADS=1

failed=()
summary=()
for t in "${TARGETS[@]}"; do
  bin="$BUILD/tests/fuzz/${t}_fuzzer"
  seeds="tests/fuzz/corpus/$t"
  corpus="$WORK/corpus/$t"
  log="$WORK/$t.log"
  mkdir -p "$corpus" "$WORK/crashes"
  cp -r "$seeds/." "$corpus/"
  echo "== fuzz: $t for ${SECONDS_PER_TARGET}s (corpus $corpus)"
  # -timeout: one input over 30 s is a failure (the limits keep every
  # input in milliseconds). -rss_limit_mb: libFuzzer's own default, also
  # the largest single allocation (-malloc_limit_mb follows it).
  rc=0
  "$bin" -max_total_time="$SECONDS_PER_TARGET" -timeout=30 -rss_limit_mb=2048 \
    -dict="tests/fuzz/$t.dict" -print_final_stats=1 \
    -artifact_prefix="$WORK/crashes/$t-" "$corpus" >"$log" 2>&1 || rc=$?
  # The last status line ("#N DONE cov: C ft: F corp: U/S ...") and the
  # final statistics.
  status=$(grep -E '^#[0-9]+[[:space:]]+(DONE|pulse|NEW|REDUCE|INITED)' "$log" | tail -n 1 || true)
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log")
  cov=$(sed -n 's/.* cov: \([0-9]*\).*/\1/p' <<<"$status")
  ft=$(sed -n 's/.* ft: \([0-9]*\).*/\1/p' <<<"$status")
  corp=$(sed -n 's/.* corp: \([0-9]*\/[0-9]*[a-zA-Z]*\).*/\1/p' <<<"$status")
  # crash-, leak-, timeout- and oom- files; slow-unit- ones (over 10 s,
  # still under -timeout) are not failures.
  crashes=$(find "$WORK/crashes" -name "$t-*" ! -name "$t-slow-unit-*" | wc -l)
  line=$(printf '%-12s execs %-9s exec/s %-6s cov %-6s ft %-6s corpus %-12s crashes %s' \
    "$t" "${execs:-?}" "${rate:-?}" "${cov:-?}" "${ft:-?}" "${corp:-?}" "$crashes")
  summary+=("$line")
  echo "$line"
  if ((rc != 0 || crashes != 0)); then
    failed+=("$t")
    echo "fuzz: $t failed (exit $rc); the end of $log:" >&2
    tail -n 40 "$log" >&2
    find "$WORK/crashes" -name "$t-*" -printf 'fuzz: reproducer %p\n' >&2
  fi
done

echo "== fuzz summary (${SECONDS_PER_TARGET}s per target; logs and corpora in $WORK)"
printf '%s\n' "${summary[@]}"
if ((${#failed[@]})); then
  echo "fuzz.sh FAILED: ${failed[*]} (reproduce: $BUILD/tests/fuzz/TARGET_fuzzer FILE)"
  exit 1
fi
[[ -n "${FUZZ_KEEP:-}" ]] || rm -rf "$WORK"
