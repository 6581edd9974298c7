"""Fixtures of the end-to-end datapath tests: the BPF object and the traffic tools they need."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from e2e_helpers import BPF_OBJECT


@pytest.fixture(scope="session")
def bpf_object() -> Path:
    """The generic hop object; a missing one is a failure telling how to build it (never a skip)."""
    if not BPF_OBJECT.exists():
        pytest.fail(f"{BPF_OBJECT} is missing: run `make bpf`", pytrace=False)
    return BPF_OBJECT


@pytest.fixture(scope="session")
def require_tool():
    """``require_tool(name)``: fail (never skip) when a command the test drives is not installed."""

    def check(name: str) -> str:
        path = shutil.which(name)
        if path is None:
            pytest.fail(f"{name} is not installed: run `make setup` (apt-get install {name})", pytrace=False)
        return path

    return check
