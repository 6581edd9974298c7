"""A guest reads hoptrace's Python from its memory (lab/vm.py's PYTHON_TREES): every package the Makefile
byte-compiles for it (PY_PACKAGES), so none is read through the slow shared root."""

from __future__ import annotations

import re

import pytest

from hoptrace.lab import vm

pytestmark = pytest.mark.unit


def test_python_trees_are_the_makefiles_packages() -> None:
    makefile = (vm.REPO_ROOT / "Makefile").read_text()
    packages = re.search(r"^PY_PACKAGES := (.+)$", makefile, re.MULTILINE)
    assert packages, "the Makefile has no PY_PACKAGES"
    expected = {vm.REPO_ROOT / name for name in packages.group(1).split()}
    assert expected == set(vm.PYTHON_TREES[2:]), (sorted(expected), vm.PYTHON_TREES[2:])
