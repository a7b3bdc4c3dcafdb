#!/usr/bin/env bash
# Packs what a GPU host needs to validate the CUDA backends into one folder
# (under 60 MiB): the server, the GPU test and benchmark binaries, the CLI, the non-CUDA
# shared libraries they load, the Python client and the runner scripts.
#
#   cmake -S . -B build-cuda -G Ninja
#   cmake --build build-cuda --target tensorcheck-server tensorcheck cuda_backends_test gpu_engine_test gpu_bench sweep_bench
#   tests/gpu/pack.sh [BUILD_DIR] [PACK_DIR]      # defaults: build-cuda, BUILD_DIR/gpu-pack
#   # copy PACK_DIR to the GPU host, then there:  PACK_DIR/run.sh OUTDIR
#
# libcuda, libcudart and libcublas/libcublasLt are left out: the GPU host's
# driver and CUDA 13 runtime provide them. glibc is left out too (it must
# match the host's loader); libstdc++ and everything else come along.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
build="$(cd "${1:-$repo/build-cuda}" && pwd)"
pack="${2:-$build/gpu-pack}"
limit_mib=60

server="$build/server/tensorcheck-server"
cli="$build/client/cli/tensorcheck"
gputest="$build/server/backends/cuda/cuda_backends_test"
gpuengine="$build/server/engine/gpu_engine_test"
gpubench="$build/bench/gpu_bench"
sweepbench="$build/bench/sweep_bench"
for f in "$server" "$cli" "$gputest" "$gpuengine" "$gpubench" "$sweepbench"; do
  if [[ ! -x "$f" ]]; then
    echo "pack.sh: missing $f" >&2
    echo "  build it: cmake --build $build --target tensorcheck-server tensorcheck cuda_backends_test gpu_engine_test gpu_bench sweep_bench" >&2
    exit 1
  fi
done
if ! grep -q "TENSORCHECK_ENABLE_CUDA:BOOL=ON" "$build/CMakeCache.txt" 2>/dev/null; then
  echo "pack.sh: $build is not a CUDA build (TENSORCHECK_ENABLE_CUDA is not ON)" >&2
  exit 1
fi
archs="$(sed -n 's/^CMAKE_CUDA_ARCHITECTURES:[A-Z]*=//p' "$build/CMakeCache.txt")"
case "$archs" in
  *80*|*90*) ;;
  *) echo "pack.sh: warning: CUDA architectures are '$archs' (no sm_80/sm_90 code;" \
          "the kernels will be JIT-compiled from PTX, if any)" >&2 ;;
esac

rm -rf "$pack"
mkdir -p "$pack/bin" "$pack/lib" "$pack/python"
libdir="$pack/lib"

for f in "$server" "$cli" "$gputest" "$gpuengine" "$gpubench" "$sweepbench"; do
  cp "$f" "$pack/bin/"
  strip --strip-debug "$pack/bin/$(basename "$f")"
done

# Shared libraries the three binaries load, minus the CUDA ones and glibc.
# They travel gzipped (lib.tar.gz; OpenBLAS alone is ~35 MiB unpacked) and
# run.sh unpacks them into a temporary folder.
skip='^(linux-vdso|ld-linux|libc\.so|libm\.so|libpthread\.so|libdl\.so|librt\.so|libresolv\.so|libutil\.so|libnsl\.so|libanl\.so|libcuda\.so|libcudart\.so|libcublas\.so|libcublasLt\.so|libnvidia-)'
declare -A seen=()
for f in "$server" "$cli" "$gputest" "$gpuengine" "$gpubench" "$sweepbench"; do
  while read -r name path; do
    [[ -z "$path" || "$path" == "not" ]] && { echo "pack.sh: $f needs $name, not found" >&2; exit 1; }
    [[ "$name" =~ $skip ]] && continue
    [[ -n "${seen[$name]:-}" ]] && continue
    seen[$name]=1
    cp -L "$path" "$pack/lib/$name"
    chmod u+w "$pack/lib/$name"
    strip --strip-unneeded "$pack/lib/$name" 2>/dev/null || true
  done < <(ldd "$f" | awk '/=>/ { print $1, $3 }')
done

tar -czf "$pack/lib.tar.gz" -C "$pack" lib
rm -rf "$libdir"

# The Python client, with gRPC stubs generated here by Debian's protoc 3.21
# and grpc_python_plugin: that generated code carries no runtime version
# check, so it imports under whatever protobuf/grpcio the GPU host has
# (newer gencode refuses an older runtime). Without those tools, the stubs
# of the source tree or a setup.py build are taken as they are.
cp -r "$repo/client/python/src/tensorcheck" "$pack/python/"
find "$pack/python" -name __pycache__ -prune -exec rm -rf {} +
rm -rf "$pack/python/tensorcheck.egg-info"
stubs="$pack/python/tensorcheck/_proto/tensorcheck/v1"
mkdir -p "$stubs"
if command -v protoc >/dev/null && command -v grpc_python_plugin >/dev/null; then
  tmp="$(mktemp -d)"
  protoc -I "$repo/proto" --python_out="$tmp" \
    --plugin=protoc-gen-grpc_python="$(command -v grpc_python_plugin)" \
    --grpc_python_out="$tmp" "$repo/proto/tensorcheck/v1/tensorcheck.proto"
  rm -f "$stubs"/tensorcheck_pb2*.py "$stubs"/tensorcheck_pb2*.pyi
  cp "$tmp"/tensorcheck/v1/tensorcheck_pb2*.py "$stubs/"
  # The generated grpc module imports "tensorcheck.v1"; point it at the package.
  sed -i 's/^from tensorcheck\.v1 import/from . import/' "$stubs/tensorcheck_pb2_grpc.py"
  rm -rf "$tmp"
elif [[ ! -f "$stubs/tensorcheck_pb2.py" ]]; then
  built="$repo/client/python/build/lib/tensorcheck/_proto/tensorcheck/v1"
  if [[ -f "$built/tensorcheck_pb2.py" ]]; then
    cp "$built"/tensorcheck_pb2*.py "$stubs/"
  else
    echo "pack.sh: warning: no generated Python stubs (apt-get install" \
         "protobuf-compiler-grpc); the replay will be skipped" >&2
  fi
fi

here="$repo/tests/gpu"
cp "$here/run.sh" "$here/replay_cases.py" "$repo/bench/gpu_concurrency.py" \
  "$repo/bench/gpu_cli_case.py" "$pack/"
chmod +x "$pack/run.sh"
{
  echo "tensorcheck GPU validation pack"
  echo "built from: $(git -C "$repo" rev-parse --short HEAD 2>/dev/null || echo unknown)$(git -C "$repo" diff --quiet 2>/dev/null || echo ' (with local changes)')"
  echo "packed: $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -n)"
  echo "CUDA architectures: $archs"
  echo "run on a host with an NVIDIA GPU and a CUDA 13 runtime: ./run.sh OUTDIR"
  echo "(to run a binary by hand: tar -xzf lib.tar.gz; LD_LIBRARY_PATH=\$PWD/lib:/usr/local/cuda/lib64 bin/...)"
} > "$pack/PACK_INFO.txt"

size_kib="$(du -sk "$pack" | cut -f1)"
size_mib=$(( (size_kib + 1023) / 1024 ))
echo "pack: $pack"
echo "size: ${size_mib} MiB (${#seen[@]} libraries in lib.tar.gz)"
if (( size_kib > limit_mib * 1024 )); then
  echo "pack.sh: the pack is over ${limit_mib} MiB" >&2
  du -sk "$pack"/* | sort -n | tail -8 >&2
  exit 1
fi
