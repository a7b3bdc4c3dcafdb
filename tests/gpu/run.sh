#!/usr/bin/env bash
# Validates the CUDA backends on a GPU host, from a pack made by pack.sh.
#
#   ./run.sh OUTDIR
#
# Needs an NVIDIA GPU, its driver and a CUDA 13 runtime (libcudart.so.13,
# libcublas.so.13, libcublasLt.so.13 under $CUDA_HOME/lib64, default
# /usr/local/cuda, or on the loader path). Steps, all logged under OUTDIR,
# everything in under 8 minutes:
#   1. the GPU unit tests (cuda_backends_test, gpu_engine_test) -> gpu_tests.log/.xml
#   2. the server on a free port (--port 0)                -> server.log
#   3. README.md's two cases replayed with real PyTorch and
#      JAX/Flax through the Python client, when installed  -> replay.log
#   4. the GPU benchmark (bench/gpu_bench)                  -> bench.log
#   5. the algorithm sweep's cost (bench/sweep_bench)       -> sweep.log
# and prints a short summary table last. Exit status 0 when nothing failed.
set -uo pipefail

if [[ $# -ne 1 ]]; then
  echo "usage: $0 OUTDIR" >&2
  exit 2
fi
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
out="$1"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
start=$(date +%s)

# The pack's libraries travel gzipped; unpack them for this run.
libtmp="$(mktemp -d "${TMPDIR:-/tmp}/tensorcheck-gpu.XXXXXX")"
trap 'rm -rf "$libtmp"' EXIT
if ! tar -xzf "$here/lib.tar.gz" -C "$libtmp"; then
  echo "run.sh: cannot unpack $here/lib.tar.gz" >&2
  exit 1
fi
cuda_home="${CUDA_HOME:-/usr/local/cuda}"
cuda_libs="$cuda_home/lib64:$cuda_home/targets/x86_64-linux/lib"
# No CUDA 13 cuBLAS there (a host whose CUDA comes with PyTorch's wheels):
# take the one the nvidia-cublas wheel installed.
if ! ls "$cuda_home"/lib64/libcublasLt.so.13* >/dev/null 2>&1 &&
   ! ldconfig -p 2>/dev/null | grep -q 'libcublasLt\.so\.13'; then
  wheel_lib="$(find /usr /opt -name 'libcublasLt.so.13*' -print -quit 2>/dev/null)"
  [[ -n "$wheel_lib" ]] && cuda_libs="$(dirname "$wheel_lib"):$cuda_libs"
fi
export LD_LIBRARY_PATH="$libtmp/lib:$cuda_libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "host: $(uname -n) $(uname -r)"
  cat "$here/PACK_INFO.txt" 2>/dev/null
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv
} > "$out/environment.txt" 2>&1
command -v nvidia-smi >/dev/null && nvidia-smi > "$out/nvidia-smi.txt" 2>&1
ldd "$here/bin/cuda_backends_test" > "$out/ldd.txt" 2>&1

failed=0

# ---- 1. GPU unit tests (hard limit 3 minutes).
timeout 180 "$here/bin/cuda_backends_test" --gtest_color=no \
  --gtest_output="xml:$out/gpu_tests.xml" > "$out/gpu_tests.log" 2>&1
tests_rc=$?
# The whole request on the device, through the engine (hard limit 2 minutes).
timeout 120 "$here/bin/gpu_engine_test" --gtest_color=no \
  --gtest_output="xml:$out/gpu_engine_tests.xml" >> "$out/gpu_tests.log" 2>&1
engine_rc=$?
[[ $engine_rc -ne 0 ]] && tests_rc=$engine_rc
tests_passed=$(grep -c '^\[       OK \]' "$out/gpu_tests.log")
tests_failed=$(grep -c '^\[  FAILED  \] [A-Za-z0-9_]*\.[A-Za-z0-9_]* (' "$out/gpu_tests.log")
tests_skipped=$(grep -c '^\[  SKIPPED \] [A-Za-z0-9_]*\.[A-Za-z0-9_]* (' "$out/gpu_tests.log")
[[ $tests_rc -ne 0 ]] && failed=1
gpu_skipped=$(grep -c '^\[  SKIPPED \] [A-Za-z0-9_]*\.Gpu.* (' "$out/gpu_tests.log")
[[ $gpu_skipped -gt 0 ]] && failed=1   # on a GPU host nothing may skip

# ---- 2. The server.
server_addr=""
"$here/bin/tensorcheck-server" --host 127.0.0.1 --port 0 --gpu_memory_budget_mb 16384 --shutdown_grace_seconds 5 \
  > "$out/server.log" 2>&1 &
server_pid=$!
for _ in $(seq 1 120); do
  server_addr=$(sed -n 's/.*listening on \([^ ]*\).*/\1/p' "$out/server.log" | head -1)
  [[ -n "$server_addr" ]] && break
  kill -0 "$server_pid" 2>/dev/null || break
  sleep 0.5
done
if [[ -z "$server_addr" ]]; then
  failed=1
  server_state="did not start (see server.log)"
else
  server_state="listening on $server_addr"
fi

# ---- 3. Replay of README.md's two cases (hard limit 200 s).
replay_state="skipped: no server"
if [[ -n "$server_addr" ]]; then
  if command -v python3 >/dev/null; then
    PYTHONPATH="$here/python${PYTHONPATH:+:$PYTHONPATH}" timeout 200 \
      python3 "$here/replay_cases.py" --target "$server_addr" --out "$out" \
      > "$out/replay.log" 2>&1
    replay_rc=$?
    case $replay_rc in
      0) replay_state="ok" ;;
      124) replay_state="timed out"; failed=1 ;;
      *) replay_state="FAILED (rc $replay_rc, see replay.log)"; failed=1 ;;
    esac
  else
    replay_state="skipped: no python3"
  fi
fi

# ---- 3b. Eight concurrent clients over loopback, the candle case by
# digest: verifications per second and the GPU's busy share (hard limit
# 90 s).
concurrency_state="skipped: no server"
if [[ -n "$server_addr" ]] && command -v python3 >/dev/null; then
  PYTHONPATH="$here/python${PYTHONPATH:+:$PYTHONPATH}" timeout 90 \
    python3 "$here/gpu_concurrency.py" --target "$server_addr" --seconds 10 \
    > "$out/concurrency.log" 2>&1
  case $? in
    0) concurrency_state="ok (concurrency.log)" ;;
    124) concurrency_state="timed out"; failed=1 ;;
    *) concurrency_state="FAILED (see concurrency.log)"; failed=1 ;;
  esac
fi

# ---- 3c. The 2x768 -> 512 Flax case through the CLI, the server's GPU
# defaults against the CPU backend's candidates (hard limit 60 s).
cli_case_state="skipped: no server"
if [[ -n "$server_addr" ]] && command -v python3 >/dev/null; then
  timeout 60 python3 "$here/gpu_cli_case.py" --target "$server_addr" \
    --cli "$here/bin/tensorcheck" > "$out/cli_case.log" 2>&1
  case $? in
    0) cli_case_state="ok (cli_case.log)" ;;
    124) cli_case_state="timed out"; failed=1 ;;
    *) cli_case_state="FAILED (see cli_case.log)"; failed=1 ;;
  esac
fi

# Stop the server (graceful, then hard).
if kill -0 "$server_pid" 2>/dev/null; then
  kill -TERM "$server_pid"
  for _ in $(seq 1 40); do kill -0 "$server_pid" 2>/dev/null || break; sleep 0.5; done
  kill -0 "$server_pid" 2>/dev/null && kill -KILL "$server_pid"
fi
wait "$server_pid" 2>/dev/null
server_rc=$?
if grep -q "sticky CUDA error" "$out/server.log"; then failed=1; fi

# ---- 4. The GPU benchmark (hard limit 150 s).
timeout 150 "$here/bin/gpu_bench" 20 > "$out/bench.log" 2>&1
bench_rc=$?
case $bench_rc in
  0) bench_state="ok (bench.log)" ;;
  124) bench_state="timed out"; failed=1 ;;
  *) bench_state="FAILED (rc $bench_rc, see bench.log)"; failed=1 ;;
esac

# ---- 5. The algorithm sweep's cost per candidate (hard limit 90 s).
timeout 90 "$here/bin/sweep_bench" --sweep=8 --m=1024 --k=4096 --n=4096 > "$out/sweep.log" 2>&1
sweep_rc=$?
case $sweep_rc in
  0) sweep_state="ok (sweep.log)" ;;
  124) sweep_state="timed out"; failed=1 ;;
  *) sweep_state="FAILED (rc $sweep_rc, see sweep.log)"; failed=1 ;;
esac

elapsed=$(( $(date +%s) - start ))

# ---- Summary (last).
{
  echo
  echo "## tensorcheck GPU validation ($(date -u +%Y-%m-%d), ${elapsed}s)"
  echo
  grep -m1 '^| device |' "$out/gpu_tests.log" || echo "| device | (not reported: $(head -1 "$out/nvidia-smi.txt" 2>/dev/null || echo 'no nvidia-smi')) |"
  echo
  echo "| step | result |"
  echo "|---|---|"
  echo "| GPU tests | $tests_passed passed, $tests_failed failed, $tests_skipped skipped (exit $tests_rc) |"
  grep '^TF32 rounding of' "$out/gpu_tests.log" | sed 's/^/| tf32 | /; s/$/ |/'
  grep '^| cublaslt:bf16:fused vs cublas:bf16:unfused' "$out/gpu_tests.log" \
    | sed 's/^| cublaslt:bf16:fused vs cublas:bf16:unfused |/| fused vs unfused |/' | cut -c1-200
  echo "| server | $server_state; exit $server_rc after SIGTERM |"
  echo "| replay | $replay_state |"
  grep '^| case ' "$out/replay.log" 2>/dev/null
  echo "| CLI, Flax case | $cli_case_state |"
  grep -E '^\| (cpu|server)' "$out/cli_case.log" 2>/dev/null
  echo "| concurrency | $concurrency_state |"
  grep -E '^\| [0-9]+ ' "$out/concurrency.log" 2>/dev/null | cut -c1-200
  echo "| benchmark | $bench_state |"
  echo "| algorithm sweep | $sweep_state |"
  grep -E '\*\*[0-9.]+\*\*' "$out/bench.log" 2>/dev/null | cut -c1-220
  echo
  echo "logs: $out"
  [[ $failed -eq 0 ]] && echo "RESULT: PASS" || echo "RESULT: FAIL"
} | tee "$out/summary.md"
exit $failed
