"""A private containerd with its CRI plugin and Kubernetes-style pods, for tests of pods named through CRI.

The lab itself is Go (`agent/internal/workload/crilab`, also used by the agent's own CRI test): containerd
1.6 with its own root, state and socket in a temporary directory, pods made through the CRI API as the
kubelet makes them, wired by the CNI bridge plugin on a bridge and subnet of the caller's (inside
198.18.0.0/15, no gateway, no masquerade), a pause image built locally (no registry is reachable). This
module builds its command, runs it, reads what it made, and stops it; the command removes everything it
made (pods, shims, mounts, network namespaces, the bridge, its directory) when told to stop or when this
process goes away (its standard input closes).
"""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from hoptrace.common.timeouts import scaled

REPO = Path(os.environ.get("HOPTRACE_REPO") or Path(__file__).resolve().parent.parent)
CRILAB_PACKAGE = "./internal/workload/crilab/cmd/crilab"
PAUSE_PACKAGE = "./internal/workload/crilab/pause"


class ContainerdLabError(RuntimeError):
    """The lab could not be built or started; the message says why (and how to install what is missing)."""


@dataclass(frozen=True)
class CriPod:
    """A pod sandbox the lab made: its identity, the network namespace containerd made for it, and its
    containers' ids by name."""

    namespace: str
    name: str
    uid: str
    id: str
    netns: str
    containers: dict[str, str]


@dataclass
class PrivateContainerd:
    """containerd with `pods` (each ``NAMESPACE/NAME[/CONTAINER...]``) on `bridge` with `subnet`."""

    pods: Sequence[str]
    bridge: str
    subnet: str
    socket: str = ""
    # The directory its own (root, state, socket) is made in: None = the system's temporary directory.
    parent: str | None = None
    # More arguments of the lab's command: hoptrace.lab.crio's runtime (CRI-O instead of containerd).
    runtime_args: Sequence[str] = ()
    made: dict[str, CriPod] = field(default_factory=dict)  # by "NAMESPACE/NAME"
    _dir: Path | None = None
    _process: subprocess.Popen[str] | None = None

    def start(self, timeout_s: float = 120.0) -> PrivateContainerd:
        """Build the lab's command and the pause binary, start it, and wait until the pods run."""
        self._dir = Path(tempfile.mkdtemp(prefix="hoptrace-crilab-", dir=self.parent))
        bin_dir = self._dir / "bin"
        bin_dir.mkdir()
        build = subprocess.run(
            ["go", "build", "-trimpath", "-o", f"{bin_dir}/", CRILAB_PACKAGE, PAUSE_PACKAGE],
            cwd=REPO / "agent",
            env={**os.environ, "CGO_ENABLED": "0"},
            capture_output=True,
            text=True,
            timeout=scaled(600),
        )
        if build.returncode != 0:
            self.stop()  # nothing ran yet: only the directory
            raise ContainerdLabError(f"go build of the CRI lab failed:\n{build.stderr[-3000:]}")
        # The lab's directory is this whole one: the lab removes it, its own binary too, however this
        # process ends.
        argv = [
            *[str(bin_dir / "crilab"), "--dir", str(self._dir), "--pause", str(bin_dir / "pause")],
            *["--bridge", self.bridge, "--subnet", self.subnet],
            *self.runtime_args,
        ]
        for pod in self.pods:
            argv += ["--pod", pod]
        # Its standard input stays open while this process lives: EOF tells it to clean up and exit.
        self._process = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,  # a few lines at most: what failed
            text=True,
            start_new_session=True,  # a Ctrl-C to the tests' process group must not skip its cleanup
        )
        assert self._process.stdout is not None
        ready, _, _ = select.select([self._process.stdout], [], [], scaled(timeout_s))
        line = self._process.stdout.readline() if ready else ""
        if not line:
            try:
                self.stop()
            except ContainerdLabError as failed:
                raise ContainerdLabError(f"the CRI lab did not start: {failed}") from None
            raise ContainerdLabError("the CRI lab did not start in time")
        made = json.loads(line)
        self.socket = made["socket"]
        for pod in made["pods"] or []:  # null: no pods asked for
            cri_pod = CriPod(**pod)
            self.made[f"{cri_pod.namespace}/{cri_pod.name}"] = cri_pod
        return self

    def stop(self, timeout_s: float = 60.0) -> None:
        """Tell the lab to remove its pods and containerd, wait for it, and remove the build directory;
        ContainerdLabError when the lab could not remove everything (its message says what)."""
        process, self._process = self._process, None
        returncode, log = 0, ""
        if process is not None:
            assert process.stdin is not None and process.stderr is not None
            process.stdin.close()
            try:
                process.wait(timeout=scaled(timeout_s))
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
            returncode, log = process.returncode, process.stderr.read()[-4000:]
            for stream in (process.stdout, process.stderr):
                if stream is not None:
                    stream.close()
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None
        if returncode != 0:
            raise ContainerdLabError(f"the CRI lab exited with {returncode}:\n{log}")

    def __enter__(self) -> PrivateContainerd:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
