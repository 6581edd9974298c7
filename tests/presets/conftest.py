"""Fixtures of the preset tests (MACE, Iron): the objects and binary they need, an extra container netns."""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

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


@pytest.fixture
def extra_netns() -> Iterator[Callable[[str], None]]:
    """``track(name)``: namespaces deleted after the test, whatever happened."""
    names: list[str] = []
    yield names.append
    for name in names:
        subprocess.run(["ip", "netns", "del", name], check=False, capture_output=True)
