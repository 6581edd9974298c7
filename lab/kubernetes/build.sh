#!/bin/bash
# Builds the Kubernetes commands the lab cluster runs (hoptrace.lab.kubernetes) into OUTDIR, at the
# k8s.io/kubernetes version this folder's go.mod pins. Static (CGO off), as Kubernetes' own release builds
# them; the version stamped in as `hack/lib/version.sh` would, so kubectl and the kubelet report it.
# usage: build.sh OUTDIR
set -euo pipefail
out=$(realpath -m "$1")
cd "$(dirname "$0")"
version=$(go list -m -f '{{.Version}}' k8s.io/kubernetes)
minor=$(echo "$version" | cut -d. -f2)
# Each staging module (k8s.io/api, k8s.io/apiserver, ...) is released as v0.MINOR.PATCH beside v1.MINOR.PATCH.
staging="v0.${version#v1.}"
if grep -E '^\s+k8s\.io/\S+ => ' go.mod | grep -v " $staging\$"; then
	echo "go.mod: the replace lines above must pin $staging, the match of k8s.io/kubernetes $version" >&2
	exit 1
fi
commands="kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy kubectl"
ldflags="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
	ldflags="$ldflags -X $pkg.gitVersion=$version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
	ldflags="$ldflags -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
done
mkdir -p "$out.partial"
start=$(date +%s)
# nice: the build takes both cores for many minutes on a machine others share.
CGO_ENABLED=0 nice -n 19 go build -trimpath -ldflags "$ldflags" -o "$out.partial/" \
	$(for c in $commands; do echo "k8s.io/kubernetes/cmd/$c"; done)
# etcd: the server release k8s.io/kubernetes itself requires (go.mod's tool line), as Kubernetes tests with.
CGO_ENABLED=0 nice -n 19 go build -trimpath -ldflags "-s -w" -o "$out.partial/etcd" go.etcd.io/etcd/server/v3
rm -rf "$out"
mv "$out.partial" "$out"
echo "built $commands etcd $version into $out in $(($(date +%s) - start)) s"
