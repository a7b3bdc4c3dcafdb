#!/usr/bin/env bash
# Regenerates tensorcheck.pb.go from ../../../proto with the protoc-gen-go 1.3
# plugin (github.com/golang/protobuf v1.3.x API, grpc plugin built in), so the
# generated code builds against Debian's grpc-go 1.33 and golang/protobuf
# 1.3.5 offline as well as against newer releases from the module proxy.
#
#   client/go/tensorcheckpb/generate.sh           # rewrite tensorcheck.pb.go
#   client/go/tensorcheckpb/generate.sh --check   # fail if it is stale
#
# google/protobuf/wrappers.proto is mapped to the golang/protobuf 1.3 wrapper
# types (protoc 3.21 would otherwise name google.golang.org/protobuf's
# wrapperspb, which golang/protobuf 1.3 cannot marshal).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
proto_root="$(cd "${here}/../../../proto" && pwd)"
include="${PROTOC_INCLUDE:-/usr/include}"
tmp="$(mktemp -d)"
trap 'rm -rf "${tmp}"' EXIT

protoc \
  -I "${proto_root}" \
  -I "${include}" \
  --go_out="plugins=grpc,Mgoogle/protobuf/wrappers.proto=github.com/golang/protobuf/ptypes/wrappers:${tmp}" \
  "${proto_root}/tensorcheck/v1/tensorcheck.proto"

generated="${tmp}/github.com/tensorcheck/tensorcheck/client/go/tensorcheckpb/tensorcheck.pb.go"
gofmt -w "${generated}"
if [[ "${1:-}" == "--check" ]]; then
  if ! diff -q "${generated}" "${here}/tensorcheck.pb.go" >/dev/null; then
    echo "client/go/tensorcheckpb/tensorcheck.pb.go is stale: run client/go/tensorcheckpb/generate.sh" >&2
    exit 1
  fi
  exit 0
fi
cp "${generated}" "${here}/tensorcheck.pb.go"
echo "wrote ${here}/tensorcheck.pb.go"
