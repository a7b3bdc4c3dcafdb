#!/usr/bin/env bash
# Vets and tests the Go client offline, in GOPATH mode against the system's
# grpc-go and google.golang.org/protobuf (Debian 12: grpc-go 1.33.3,
# google.golang.org/protobuf 1.28.1 and the golang/protobuf 1.5.2 shim that
# grpc-go 1.33 marshals with, under /usr/share/gocode). CI calls this.
#
#   client/go/test.sh [go test flags...]      e.g. client/go/test.sh -v -run Live
#
# The live-server tests start $TENSORCHECK_SERVER_BIN (default
# <repo>/build/server/tensorcheck-server) or use a running server at
# $TENSORCHECK_SERVER ($TENSORCHECK_TARGET: the deprecated spelling), and
# skip when neither is there, or with -short (the unit tests only).
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
gopath="${TENSORCHECK_GOPATH:-${repo}/.gopath}"
system_gocode="${SYSTEM_GOCODE:-/usr/share/gocode}"

# GOPATH mode needs the repository at the proto's go_package import path.
link="${gopath}/src/github.com/tensorcheck/tensorcheck"
mkdir -p "$(dirname "${link}")"
if [[ -L "${link}" || ! -e "${link}" ]]; then
  ln -sfn "${repo}" "${link}"
fi

export GO111MODULE=off
export GOPATH="${gopath}:${system_gocode}"
cd "${link}/client/go"

unformatted="$(gofmt -l .)"
if [[ -n "${unformatted}" ]]; then
  echo "gofmt -l: not formatted:" >&2
  echo "${unformatted}" >&2
  exit 1
fi
# The committed generated code must match the proto. generate.sh --check
# fails when it is stale, and also when protoc-gen-go-grpc is missing or a
# plugin is not the version the code was generated with; a machine without
# protoc or protoc-gen-go skips the check and says so.
if command -v protoc >/dev/null && command -v protoc-gen-go >/dev/null; then
  ./tensorcheckpb/generate.sh --check
else
  echo "test.sh: protoc or protoc-gen-go not installed: not checking tensorcheckpb against the proto" >&2
fi
go vet ./...
go test "$@" ./...
