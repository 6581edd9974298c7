#!/bin/bash
# Builds CRI-O for the CRI lab (hoptrace.lab.crio) into OUTDIR, at the github.com/cri-o/cri-o version this
# folder's go.mod pins: crio from the Go module proxy, pinns (the C helper that pins a pod's namespaces)
# from the same module's sources, and importimage (importimage/: writes an image into CRI-O's storage, as
# no image registry is reachable) with the containers/image and containers/storage CRI-O uses. CRI-O's Makefile picks its build tags by the C libraries it finds; these are
# its choices without them: the pure-Go OpenPGP instead of gpgme, no ostree, btrfs or devicemapper storage,
# no seccomp, SELinux or AppArmor (the lab's pods ask for none).
# usage: build.sh OUTDIR
set -euo pipefail
out=$(realpath -m "$1")
cd "$(dirname "$0")"
version=$(go list -m -f '{{.Version}}' github.com/cri-o/cri-o)
go mod download github.com/cri-o/cri-o
src=$(go list -m -f '{{.Dir}}' github.com/cri-o/cri-o)
tags="containers_image_openpgp containers_image_ostree_stub exclude_graphdriver_btrfs exclude_graphdriver_devicemapper"
mkdir -p "$out.partial"
start=$(date +%s)
# nice: a cold build takes both cores for minutes on a machine others share.
nice -n 10 go build -trimpath -tags "$tags" -ldflags "-s -w" -o "$out.partial/" \
	github.com/cri-o/cri-o/cmd/crio ./importimage
# pinns as CRI-O's pinns/Makefile builds it (static, so it runs in any mount namespace), less -Werror.
cc -std=c99 -Os -Wall -Wextra -static -o "$out.partial/pinns" "$src"/pinns/src/*.c
strip -s "$out.partial/pinns"
rm -rf "$out"
mv "$out.partial" "$out"
echo "built crio, pinns and importimage $version into $out in $(($(date +%s) - start)) s"
