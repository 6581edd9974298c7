#!/bin/bash
# Builds Jaeger v2 (github.com/jaegertracing/jaeger/cmd/jaeger, the module version this folder's go.mod
# pins) into OUTDIR: the OTLP backend of the collector's OpenTelemetry export test (hoptrace.lab.otel).
# Static (CGO off); the version stamped in as Jaeger's own Makefile does (BuildInfo.mk), so the binary
# reports the module version it was built from.
# usage: build.sh OUTDIR
set -euo pipefail
out=$(realpath -m "$1")
cd "$(dirname "$0")"
version=$(go list -m -f '{{.Version}}' github.com/jaegertracing/jaeger)
mkdir -p "$out.partial"
start=$(date +%s)
# nice: a cold build takes both cores for minutes on a machine others share.
CGO_ENABLED=0 nice -n 19 go build -trimpath \
	-ldflags "-s -w -X github.com/jaegertracing/jaeger/internal/version.latestVersion=$version" \
	-o "$out.partial/jaeger" github.com/jaegertracing/jaeger/cmd/jaeger
rm -rf "$out"
mv "$out.partial" "$out"
echo "built jaeger $version into $out in $(($(date +%s) - start)) s"
