#!/bin/bash
# Fetch the Debian kernels of hoptrace's kernel matrix (make vm-kernels): vmlinuz into .tools/kernels/<release>/,
# modules under /lib/modules/<release> where a guest sharing this root (virtme-ng) finds them.
# Debian suites are added to a private apt state only; the host's sources stay as they are.
set -euo pipefail
out=$(realpath -m "${1:?usage: kernels.sh OUTDIR SUITE...}")
shift
state=$out/.apt
mkdir -p "$state/lists/partial" "$state/cache/archives/partial" "$state/parts"
touch "$state/status"
# The mirror the host already uses (deb822 or one-line sources), so the lab works behind the same proxy.
mirror=$({ sed -n 's/^URIs: *//p' /etc/apt/sources.list.d/*.sources; sed -n 's/^deb \(\[[^]]*\] \)\?//p' \
	/etc/apt/sources.list /etc/apt/sources.list.d/*.list; } 2>/dev/null | awk '{print $1}' | grep -v security | head -n1 || true)
mirror=${mirror:-http://deb.debian.org/debian}
: >"$state/sources.list"
for suite in "$@"; do
	echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $mirror $suite main" >>"$state/sources.list"
done
apt_opts=(-o "Dir::Etc::sourcelist=$state/sources.list" -o "Dir::Etc::sourceparts=$state/parts" -o "Dir::State::Lists=$state/lists"
	-o "Dir::Cache=$state/cache" -o "Dir::State::status=$state/status" -o Debug::NoLocking=1 -o APT::Sandbox::User=root)
apt-get -qq "${apt_opts[@]}" update
for suite in "$@"; do
	# The suite's current kernel: linux-image-amd64 depends on linux-image-<release>; take its unsigned build.
	version=$(apt-cache "${apt_opts[@]}" madison linux-image-amd64 | awk -v s="$suite/" '$0 ~ s {print $3; exit}')
	image=$(apt-cache "${apt_opts[@]}" show "linux-image-amd64=$version" | sed -n 's/^Depends: \(linux-image-[^ ]*\).*/\1/p')
	release=${image#linux-image-}
	if [ -f "$out/$release/vmlinuz" ] && [ -d "/lib/modules/$release" ]; then
		echo "kernel $release ($suite) present"
		continue
	fi
	echo "kernel $release ($suite): fetching $image-unsigned"
	(cd "$state/cache/archives" && apt-get -qq "${apt_opts[@]}" download "$image-unsigned")
	mkdir -p "$out/$release" /lib/modules
	# Unpacked beside /lib/modules (one file system: the rename below is atomic). A release's module tree
	# already there stays: it is this package's, and guests of another checkout may be reading it (a tree
	# replaced under a running guest's /lib overlay fails its module loads: "Unknown device type").
	tree=$(mktemp -d /lib/modules/.hoptrace-kernel-XXXXXX)
	dpkg-deb -x "$state/cache/archives/${image}-unsigned_"*.deb "$tree"
	cp "$tree/boot/vmlinuz-$release" "$out/$release/vmlinuz"
	if [ ! -d "/lib/modules/$release" ]; then
		mv "$tree/lib/modules/$release" "/lib/modules/$release"
	fi
	rm -rf "$tree"
	echo "$suite" >"$out/$release/suite"
done
