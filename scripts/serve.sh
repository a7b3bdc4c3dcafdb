#!/usr/bin/env bash
# Starts tensorcheck on this machine with the embedded default (CPU
# backends, no GPU needed) and shows it working: capabilities, then the
# Flax-vs-PyTorch case of README.md verified and diagnosed through the CLI.
# The server keeps running in the foreground until Ctrl-C.
#
#   scripts/serve.sh [--port 50051]
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
PORT=50051
if [[ "${1:-}" == "--port" ]]; then PORT=$2; fi
scripts/setup.sh

SERVER="$BUILD_DIR/server/tensorcheck-server"
CLI="$BUILD_DIR/client/cli/tensorcheck"
"$SERVER" --port "$PORT" &
pid=$!
trap 'kill -TERM $pid 2>/dev/null; wait $pid' INT TERM
for _ in $(seq 50); do
  "$CLI" --server "localhost:$PORT" capabilities >/dev/null 2>&1 && break
  sleep 0.2
done

echo; echo "== tensorcheck capabilities"
"$CLI" --server "localhost:$PORT" capabilities
demo=$(mktemp -d)
.venv/bin/python scripts/make_demo_tensors.py "$demo"
echo; echo "== Flax nn.Dense (TF32) output checked against strict fp32 configurations"
"$CLI" --server "localhost:$PORT" verify --input "$demo/x.npy" --weight "$demo/kernel.npy" \
  --weight-layout in_out --bias "$demo/bias.npy" --observed "$demo/flax_y.npy" \
  --config cpu:fp32 --config cpu:tf32:unfused || true
echo; echo "== which configuration produced it?"
"$CLI" --server "localhost:$PORT" diagnose --input "$demo/x.npy" --weight "$demo/kernel.npy" \
  --weight-layout in_out --bias "$demo/bias.npy" --observed "$demo/flax_y.npy" || true
echo; echo "tensorcheck-server is serving on localhost:$PORT (Ctrl-C stops it)"
wait $pid
