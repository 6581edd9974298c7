"""Fixtures of the preset tests (MACE, Iron): the objects and binary they need, an extra container netns."""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from topology import TwoHostTopology

REPO_ROOT = Path(__file__).resolve().parents[2]
BUILD = REPO_ROOT / "kernel-patch" / "build"


def _object(name: str) -> Path:
    path = BUILD / name
    if not path.exists():
        pytest.fail(f"{path} is missing: run `make bpf`", pytrace=False)
    return path


@pytest.fixture(scope="session")
def mace_object(agent_binary: Path) -> Path:
    """mace.bpf.o (and the agent); a missing one is a failure telling how to build it (never a skip)."""
    return _object("mace.bpf.o")


@pytest.fixture(scope="session")
def iron_object(agent_binary: Path) -> Path:
    """iron.bpf.o (and the agent); a missing one is a failure telling how to build it (never a skip)."""
    return _object("iron.bpf.o")


def add_container(topo: TwoHostTopology, name: str, addr: str, mac: str) -> str:
    """A third container netns ``{prefix}-{name}`` on host-a's bridge (198.18.1.0/24); returns its netns.

    topo.destroy() does not know it: the caller deletes it (``ip netns del``).
    """
    ns = f"{topo.prefix}-{name}"
    subprocess.run(["ip", "netns", "add", ns], check=True)
    port = f"veth-{name}"
    cmds = [
        [
            "ip",
            "-n",
            topo.host_a,
            "link",
            "add",
            port,
            "type",
            "veth",
            "peer",
            "name",
            "eth0",
            "address",
            mac,
            "netns",
            ns,
        ],
        ["ip", "-n", topo.host_a, "link", "set", port, "master", "br0", "up"],
        ["ip", "-n", ns, "link", "set", "lo", "up"],
        ["ip", "-n", ns, "addr", "add", f"{addr}/24", "dev", "eth0"],
        ["ip", "-n", ns, "link", "set", "eth0", "up"],
        ["ip", "-n", ns, "route", "add", "default", "via", topo.addr("host-a", 4, "br0")],
    ]
    for cmd in cmds:
        subprocess.run(cmd, check=True, capture_output=True)
    return ns


@pytest.fixture
def extra_netns() -> Iterator[Callable[[str], None]]:
    """``track(name)``: namespaces deleted after the test, whatever happened."""
    names: list[str] = []
    yield names.append
    for name in names:
        subprocess.run(["ip", "netns", "del", name], check=False, capture_output=True)
