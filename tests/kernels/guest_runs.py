"""Guest runs side by side (tests/kernels/conftest.py starts them; the tests check what they printed).

A guest's tests keep about one of its two vCPUs busy (the Go test binaries run one test at a time, the
verifier is single-threaded), so one guest alone leaves a core of this machine idle: GUESTS_AT_ONCE guests run
at once, one per core (HOPTRACE_GUESTS_AT_ONCE overrides it; 1 runs them one after the other). A guest sharing
the machine runs slower, so its limits (the guest's and each Go test package's, both there to catch a hang)
are stretched by SHARED_STRETCH.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import pytest

GUESTS_AT_ONCE = max(1, int(os.environ.get("HOPTRACE_GUESTS_AT_ONCE", os.cpu_count() or 1)))
SHARED_STRETCH = 1.5 if GUESTS_AT_ONCE > 1 else 1.0

# Seconds each run took alone (2 cores, TCG; the matrices in CI, the demo here with its BPF objects compiled
# on the host first): the longest starts first, so the queues end close together (here: 5.10's matrix then
# 6.12's, beside 5.10's demo then 6.1's matrix).
EXPECTED_S = {
    ("run_matrix", "5.10"): 483,
    ("run_demo", "5.10"): 307,
    ("run_matrix", "6.1"): 249,
    ("run_matrix", "6.12"): 247,
}

RunKey = tuple[str, str]


def run_of(item: pytest.Item) -> tuple[RunKey, Callable[..., Any]] | None:
    """The guest run a test waits for: (function name, kernel version) and the function, or None."""
    marker = item.get_closest_marker("guest_run")
    if marker is None:
        return None
    run = marker.kwargs["run"]
    return (run.__name__, item.callspec.params["version"]), run


class GuestRuns:
    """The session's guest runs, started at once in a pool of GUESTS_AT_ONCE workers, longest first."""

    def __init__(self, runs: dict[RunKey, Callable[..., Any]], factory: pytest.TempPathFactory) -> None:
        self._pool = ThreadPoolExecutor(max_workers=GUESTS_AT_ONCE, thread_name_prefix="guest")
        order = sorted(runs, key=lambda key: EXPECTED_S.get(key, 0), reverse=True)
        self._futures: dict[RunKey, Future[Any]] = {
            key: self._pool.submit(runs[key], key[1], factory) for key in order
        }

    def result(self, key: RunKey) -> Any:
        """What the run returned (its exception re-raised), once it has ended."""
        return self._futures[key].result()

    def close(self) -> None:
        """Runs not started yet are dropped; the ones running end at their own limits."""
        self._pool.shutdown(wait=True, cancel_futures=True)
