"""The kernel tier checks guest runs that ran in the background of the session (tests/guest_runs.py: the
session's first test starts them, tests/conftest.py orders these tests after the host's own). A test names
its run with `@pytest.mark.guest_run(run=FUNCTION)` and waits for it here; the first to wait shows the wait
in --durations."""

from __future__ import annotations

from typing import Any

import pytest
from guest_runs import GuestRuns, run_of


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "guest_run(run): the guest run a kernel test checks (tests/kernels)")


@pytest.fixture
def guest_run(request: pytest.FixtureRequest, guest_runs: GuestRuns | None) -> Any:
    """The result of this test's guest run (its `guest_run` marker), waited for. The host's own tests are
    done by now (they run first), so every core may run a guest."""
    found = run_of(request.node)
    assert found is not None and guest_runs is not None, f"{request.node.nodeid} has no guest_run marker"
    guest_runs.widen()
    return guest_runs.result(found[0])
