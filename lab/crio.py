"""A private CRI-O with Kubernetes-style pods, for tests of pods named through CRI-O's CRI.

The same Go CRI lab as `hoptrace.lab.containerd` (`agent/internal/workload/crilab`, run with `--runtime
cri-o`): CRI-O with every path of its own under a temporary directory (storage on the vfs driver, run root,
socket, configuration with an empty drop-in directory, CNI configuration, the namespaces pinns pins, exits
and logs), Debian's conmon and runc, pods made through the CRI API with the kubelet's namespace options
(each container its own PID namespace: CRI-O runs no infra container then, its default), wired by the CNI
bridge plugin on a bridge and subnet of the caller's (inside 198.18.0.0/15, no gateway, no masquerade), the
pause image built locally and written into CRI-O's storage by lab/crio/importimage (no registry is
reachable). The lab removes everything it made (pods, conmon and container processes, mounts, namespaces,
the pods' cgroups, the bridge, its directory) when told to stop or when this process goes away.

CRI-O itself comes from `make crio` (.tools/crio/VERSION, built from the Go module proxy at the version
lab/crio/go.mod pins).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from hoptrace.lab.containerd import REPO, ContainerdLabError, PrivateContainerd

MODULE_DIR = REPO / "lab" / "crio"
PROGRAMS = ("crio", "pinns", "importimage")


def crio_version() -> str:
    """The github.com/cri-o/cri-o version lab/crio/go.mod pins (the one `make crio` builds)."""
    match = re.search(r"^\s*github\.com/cri-o/cri-o (v\S+)", (MODULE_DIR / "go.mod").read_text(), re.M)
    if match is None:
        raise ContainerdLabError(f"{MODULE_DIR / 'go.mod'} does not require github.com/cri-o/cri-o")
    return match.group(1)


def tools_dir(version: str | None = None) -> Path:
    """Where `make crio` puts crio, pinns and importimage of `version` (default: the pinned one)."""
    return REPO / ".tools" / "crio" / (version or crio_version())


@dataclass
class PrivateCrio(PrivateContainerd):
    """CRI-O with `pods` (each ``NAMESPACE/NAME[/CONTAINER...]``) on `bridge` with `subnet`; `socket` is its
    CRI socket once started. ContainerdLabError when CRI-O is not built (the message says `make crio`)."""

    def start(self, timeout_s: float = 120.0) -> PrivateCrio:
        """Start the lab with CRI-O and wait until the pods run."""
        tools = tools_dir()
        missing = [p for p in PROGRAMS if not (tools / p).is_file()]
        if missing:
            raise ContainerdLabError(f"{', '.join(missing)} missing in {tools}: run `make crio`")
        self.runtime_args = ("--runtime", "cri-o", "--crio-dir", str(tools))
        super().start(timeout_s)
        return self

    def __enter__(self) -> PrivateCrio:
        return self.start()
