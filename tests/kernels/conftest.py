"""The kernel tier's guests run side by side (guest_runs.py): at the tier's first test, every guest run the
session's selected tests need starts; each test then waits for its own run and checks what it printed. A test
names its run with `@pytest.mark.guest_run(run=FUNCTION)`: FUNCTION(version, tmp_path_factory) boots the
guest and returns what the test checks. The first test to wait shows the wait in --durations."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from guest_runs import GuestRuns, run_of


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "guest_run(run): the guest run a kernel test checks (tests/kernels)")


@pytest.fixture(scope="session")
def guest_runs(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GuestRuns]:
    """Every guest run the session's selected tests wait for, started at the first request."""
    runs = dict(found for item in request.session.items if (found := run_of(item)) is not None)
    pool = GuestRuns(runs, tmp_path_factory)
    try:
        yield pool
    finally:
        pool.close()


@pytest.fixture
def guest_run(request: pytest.FixtureRequest, guest_runs: GuestRuns) -> Any:
    """The result of this test's guest run (its `guest_run` marker), waited for."""
    found = run_of(request.node)
    assert found is not None, f"{request.node.nodeid} has no guest_run marker"
    return guest_runs.result(found[0])
