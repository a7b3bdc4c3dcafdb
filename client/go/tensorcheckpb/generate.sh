#!/usr/bin/env bash
# Regenerates the Go code of ../../../proto/tensorcheck/v1/tensorcheck.proto:
# tensorcheck.pb.go (the messages, google.golang.org/protobuf's protoc-gen-go)
# and tensorcheck_grpc.pb.go (the service, grpc-go's protoc-gen-go-grpc).
# This script is the one way to regenerate them; client/go/test.sh runs its
# --check mode, which fails when the committed files are not what the proto
# gives.
#
#   client/go/tensorcheckpb/generate.sh           # rewrite the *.pb.go files
#   client/go/tensorcheckpb/generate.sh --check   # fail if they are stale
#
# The plugins are Debian 12's (apt-get install protobuf-compiler
# protoc-gen-go protoc-gen-go-grpc): protoc-gen-go v1.28.1 and
# protoc-gen-go-grpc 1.0 (from grpc-go 1.33.3), with protoc 3.21.12. The code
# they write needs google.golang.org/protobuf >= 1.20 and
# google.golang.org/grpc >= 1.32 (grpc.SupportPackageIsVersion7,
# grpc.ServiceRegistrar), so it builds against Debian's 1.28.1 and 1.33.3
# offline and against current releases from the module proxy. Other plugin
# versions write other code, so both modes refuse to run with them.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
proto_root="$(cd "${here}/../../../proto" && pwd)"
include="${PROTOC_INCLUDE:-/usr/include}"
want_go="protoc-gen-go v1.28.1"
want_grpc="protoc-gen-go-grpc 1.0"
want_protoc="libprotoc 3.21.12"

mode=write
case "${1:-}" in
  "") ;;
  --check) mode=check ;;
  *) echo "usage: $0 [--check]" >&2; exit 2 ;;
esac

# An older protoc-gen-go (golang/protobuf 1.3, Debian's protoc-gen-go-1-3)
# ignores --version and reads a request from stdin, hence </dev/null.
for tool in protoc protoc-gen-go protoc-gen-go-grpc; do
  if ! command -v "${tool}" >/dev/null; then
    echo "$0: ${tool} not found: apt-get install protobuf-compiler protoc-gen-go protoc-gen-go-grpc" >&2
    exit 1
  fi
done
have_go="$(protoc-gen-go --version </dev/null 2>&1 | head -n1 || true)"
have_grpc="$(protoc-gen-go-grpc --version </dev/null 2>&1 | head -n1 || true)"
have_protoc="$(protoc --version 2>&1 | head -n1 || true)"
if [[ "${have_go}" != "${want_go}" || "${have_grpc}" != "${want_grpc}" ||
      "${have_protoc}" != "${want_protoc}" ]]; then
  echo "$0: the committed code comes from ${want_protoc}, ${want_go} and ${want_grpc};" \
    "here: ${have_protoc:-no version}, ${have_go:-no version}, ${have_grpc:-no version}" \
    "(Debian 12: apt-get install protobuf-compiler protoc-gen-go protoc-gen-go-grpc)" >&2
  exit 1
fi

tmp="$(mktemp -d)"
trap 'rm -rf "${tmp}"' EXIT

# paths=source_relative would name the files after the proto's directory;
# this puts them under the go_package import path and takes them from there.
protoc \
  -I "${proto_root}" \
  -I "${include}" \
  --go_out="${tmp}" \
  --go-grpc_out="${tmp}" \
  "${proto_root}/tensorcheck/v1/tensorcheck.proto"

out="${tmp}/github.com/tensorcheck/tensorcheck/client/go/tensorcheckpb"
gofmt -w "${out}"

if [[ "${mode}" == check ]]; then
  # Every generated file must be committed unchanged, and no other *.pb.go
  # (one from an older layout, a removed proto) may be left beside them.
  stale=()
  for f in "${out}"/*.pb.go; do
    name="$(basename "${f}")"
    cmp -s "${f}" "${here}/${name}" || stale+=("${name}")
  done
  for f in "${here}"/*.pb.go; do
    [[ -e "${f}" ]] || continue
    name="$(basename "${f}")"
    [[ -e "${out}/${name}" ]] || stale+=("${name} (not generated any more)")
  done
  if ((${#stale[@]})); then
    echo "client/go/tensorcheckpb is stale: ${stale[*]}; run client/go/tensorcheckpb/generate.sh" >&2
    exit 1
  fi
  exit 0
fi

rm -f "${here}"/*.pb.go
cp "${out}"/*.pb.go "${here}/"
for f in "${out}"/*.pb.go; do
  echo "wrote ${here}/$(basename "${f}")"
done
