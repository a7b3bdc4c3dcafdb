#!/usr/bin/env bash
# Vets and tests the Go client offline, in GOPATH mode against the system's
# grpc-go and golang/protobuf (Debian: /usr/share/gocode). CI calls this.
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
# The committed generated code must match the proto (when protoc and the
# protoc-gen-go 1.3 plugin are installed; CI images without them skip this).
if command -v protoc >/dev/null && command -v protoc-gen-go >/dev/null; then
  ./tensorcheckpb/generate.sh --check
fi
go vet ./...
go test "$@" ./...
