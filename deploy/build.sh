#!/usr/bin/env bash
# Builds the sluice binary the way releases are built; the Dockerfile and
# .ci/run both call this script, so the flags live here only.
#
#   deploy/build.sh                      -> bin/sluice, version from git describe
#   VERSION=v1.2.3 OUT=/tmp/sluice deploy/build.sh
#   GOOS=linux GOARCH=arm64 deploy/build.sh
#
# CGO_ENABLED=0: a static binary (no libc), so it runs on distroless/static
# or scratch. -trimpath: no build machine paths in the binary (and
# reproducible builds). -s -w: no symbol table or DWARF (smaller; stack
# traces keep function names and lines). -X main.version: the version
# `sluice version`, the banner, the logs and /debug/config report.
set -euo pipefail
cd "$(dirname "$0")/.."

VERSION="${VERSION:-$(git describe --tags --always --dirty 2>/dev/null || echo dev)}"
OUT="${OUT:-bin/sluice}"

export CGO_ENABLED=0
go build -trimpath -ldflags "-s -w -X main.version=${VERSION}" -o "$OUT" ./cmd/sluice
echo "built $OUT (version $VERSION)"
