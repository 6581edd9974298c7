"""Every test has its tier (tests/conftest.py): one of unit and root, and what else it needs, so that each
make target of docs/testing.md runs what it says and `make test-unit` runs unprivileged."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

TESTS = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def tiers(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[str]]:
    """Each collected test's tiers, as a collection of the whole tests/ folder gives them."""
    listing = tmp_path_factory.mktemp("tiers") / "tiers.json"
    # This interpreter with its own path and site directories (.pth files: the editable hoptrace):
    # make test-unit runs Debian's python3 -S with the venv's site-packages added.
    collect = (
        "import site, sys; "
        f"[site.addsitedir(p) for p in {[p for p in sys.path if p.endswith('-packages')]!r}]; "
        "import pytest; "
        f"sys.exit(pytest.main(['--collect-only', '-q', '-p', 'no:cacheprovider', {str(TESTS)!r}]))"
    )
    collected = subprocess.run(
        [sys.executable, "-S", "-c", collect],
        cwd=TESTS.parent,
        env=dict(os.environ, HOPTRACE_LIST_TIERS=str(listing)),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert collected.returncode == 0, collected.stdout[-4000:] + collected.stderr[-2000:]
    return json.loads(listing.read_text())


def make_tiers() -> dict[str, str]:
    """The Makefile's tier selections (TIER_ROOT := root and not ...) and the unit tier's."""
    found = re.findall(r"^TIER_(\w+) := (.+)$", (TESTS.parent / "Makefile").read_text(), re.MULTILINE)
    return {"UNIT": "unit", **dict(found)}


def selects(expression: str, tiers: list[str]) -> bool:
    """Whether `pytest -m expression` selects a test with these tiers (and, or, not, parentheses)."""
    names = {name: name in tiers for name in re.findall(r"\w+", expression)}
    for keyword in ("and", "or", "not"):
        names.pop(keyword, None)
    return bool(eval(expression, {"__builtins__": {}}, names))


def test_every_test_is_in_exactly_one_make_target(tiers: dict[str, list[str]]) -> None:
    """No test is left without a tier, and none runs twice: make test-unit, test-root, test-vm,
    test-browser, test-docker and test-kafka together run each test once."""
    targets = make_tiers()
    assert {"ROOT", "VM", "BROWSER", "DOCKER", "KAFKA"} <= targets.keys(), targets
    assert len(tiers) > 500, f"only {len(tiers)} tests collected"
    wrong = {}
    for test, found in tiers.items():
        chosen = [target for target, expression in targets.items() if selects(expression, found)]
        if len(chosen) != 1:
            wrong[test] = (found, chosen)
    assert not wrong, f"tests in no make target or in several (tiers, targets): {wrong}"


def test_every_test_is_unit_or_root(tiers: dict[str, list[str]]) -> None:
    wrong = {test: found for test, found in tiers.items() if ("unit" in found) == ("root" in found)}
    assert not wrong, f"tests with neither or both of unit and root: {wrong}"


def test_every_registered_tier_has_tests(tiers: dict[str, list[str]]) -> None:
    """Each marker pyproject.toml registers is a tier some test has (no_tier aside): no rule is dead."""
    markers = tomllib.loads((TESTS.parent / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    registered = [line.split(":", 1)[0] for line in markers["markers"] if not line.startswith("no_tier:")]
    counts = {tier: sum(tier in found for found in tiers.values()) for tier in registered}
    assert {"unit", "root", "vm", "k8s"} <= set(counts) and all(counts.values()), f"tests per tier: {counts}"


def test_guests_and_needs_are_root(tiers: dict[str, list[str]]) -> None:
    """A test that boots guests, loads BPF or runs Docker or Kafka needs root: none of them is unit."""
    needs = {"kernel", "vm", "docker", "kafka"}
    unit = [test for test, found in tiers.items() if "unit" in found and needs & set(found)]
    assert not unit, unit
