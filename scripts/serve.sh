#!/usr/bin/env bash
# Starts tensorcheck on this machine with the embedded default (CPU
# backends, no GPU needed) and shows it working: capabilities, then the
# Flax-vs-PyTorch case of README.md verified and diagnosed through the CLI.
# The server keeps running in the foreground until Ctrl-C.
#
#   scripts/serve.sh [--host 127.0.0.1] [--port 50051] [--no-setup]
#
#   --host ADDR   the address the server listens on: 127.0.0.1 (this machine
#                 only) unless told; --host 0.0.0.0 serves other machines too,
#                 in plaintext and without tokens (docs/operations.md says
#                 what a shared server needs: TLS, tokens).
#   --port N      0 picks a free port (the one taken is printed).
#   --no-setup    skip scripts/setup.sh: the tree is built already.
#
# Exits with the server's code (0 after Ctrl-C), 1 when it cannot start (the
# port taken: its log says so), 2 on an unknown argument.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
HOST=127.0.0.1
PORT=50051
SETUP=1
usage() { sed -n '7,14s/^# \{0,1\}//p' "$0"; }
while (($#)); do
  case "$1" in
    --host) HOST=${2:?--host needs an address}; shift 2 ;;
    --host=*) HOST=${1#*=}; shift ;;
    --port) PORT=${2:?--port needs a number}; shift 2 ;;
    --port=*) PORT=${1#*=}; shift ;;
    --no-setup) SETUP=0; shift ;;
    -h | --help) usage; exit 0 ;;
    *) echo "serve.sh: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
  esac
done
if ((SETUP)); then scripts/setup.sh; fi

SERVER="$BUILD_DIR/server/tensorcheck-server"
CLI="$BUILD_DIR/client/cli/tensorcheck"
# The server's first line on stdout is "listening on HOST:PORT", printed once
# it accepts calls; nothing comes (end of file) when it cannot start.
exec {server_out}< <(exec "$SERVER" --host "$HOST" --port "$PORT")
pid=$!
demo=""
trap 'kill -TERM "$pid" 2>/dev/null || true; [[ -z $demo ]] || rm -rf "$demo"' EXIT
# shellcheck disable=SC2317  # called by the trap
stop() {
  kill -TERM "$pid" 2>/dev/null || true
  rc=0
  wait "$pid" || rc=$?
  exit "$rc"
}
trap stop INT TERM
if ! read -r first <&"$server_out" || [[ $first != "listening on "* ]]; then
  rc=0
  wait "$pid" || rc=$?
  echo "serve.sh: tensorcheck-server did not start (exit $rc); its log above says why" >&2
  exit 1
fi
echo "$first"
cat <&"$server_out" &  # what it prints later
address=${first#listening on }
case "$address" in
  0.0.0.0:* | "[::]:"* | :*) target="localhost:${address##*:}" ;;  # every address: ask loopback
  *) target=$address ;;
esac

echo; echo "== tensorcheck capabilities"
"$CLI" --server "$target" capabilities
demo=$(mktemp -d)
.venv/bin/python scripts/make_demo_tensors.py "$demo"
echo; echo "== Flax nn.Dense (TF32) output checked against strict fp32 configurations"
"$CLI" --server "$target" verify --input "$demo/x.npy" --weight "$demo/kernel.npy" \
  --weight-layout in_out --bias "$demo/bias.npy" --observed "$demo/flax_y.npy" \
  --config cpu:fp32 --config cpu:tf32:unfused || true
echo; echo "== which configuration produced it?"
"$CLI" --server "$target" diagnose --input "$demo/x.npy" --weight "$demo/kernel.npy" \
  --weight-layout in_out --bias "$demo/bias.npy" --observed "$demo/flax_y.npy" || true
echo; echo "tensorcheck-server is serving on $address (Ctrl-C stops it)"
rc=0
wait "$pid" || rc=$?
exit "$rc"
