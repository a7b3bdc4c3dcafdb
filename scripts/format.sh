#!/usr/bin/env bash
# Formats the tracked C++ and CUDA sources with the repository's
# .clang-format; with --check, changes nothing and fails when a file differs.
#
#   scripts/format.sh            # format in place
#   scripts/format.sh --check    # what the test command runs
set -euo pipefail
cd "$(dirname "$0")/.."
CLANG_FORMAT=${CLANG_FORMAT:-clang-format}
mapfile -t files < <(git ls-files '*.h' '*.cc' '*.cu' '*.cuh' | grep -v '^client/go/')
if [[ "${1:-}" == "--check" ]]; then
  bad=()
  for f in "${files[@]}"; do
    if ! "$CLANG_FORMAT" --style=file "$f" | cmp -s - "$f"; then bad+=("$f"); fi
  done
  if ((${#bad[@]})); then
    echo "not clang-formatted (run scripts/format.sh): ${bad[*]}" >&2
    exit 1
  fi
  echo "clang-format: ${#files[@]} files formatted"
else
  "$CLANG_FORMAT" --style=file -i "${files[@]}"
fi
