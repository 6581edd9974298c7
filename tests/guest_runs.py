"""Guest runs in the background of the session (tests/conftest.py starts them; tests/kernels checks them).

A kernel test names the guest run it checks with `@pytest.mark.guest_run(run=FUNCTION)`: FUNCTION(version,
tmp_path_factory) boots the guest and returns what the test checks. Every run the session's selected tests
need starts with the session's first test, longest first, and the tests waiting for them run after the
host's own (tests/conftest.py orders them): a guest under TCG keeps about one of its two vCPUs busy (the Go
test binaries run one test at a time, the verifier is single-threaded), so while the host's tests run, one
guest runs beside them on the other core; once the host's tests are done, GUESTS_AT_ONCE guests run at
once, one per core (HOPTRACE_GUESTS_AT_ONCE overrides it; 1 runs them one after the other). A guest sharing
the machine runs slower, so its limits (the guest's and each Go test package's, both there to catch a hang)
are stretched by SHARED_STRETCH; it runs at GUEST_NICE, so the host's tests, some of which measure time, come
first.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

import pytest

GUESTS_AT_ONCE = max(1, int(os.environ.get("HOPTRACE_GUESTS_AT_ONCE", os.cpu_count() or 1)))
SHARED_STRETCH = 1.5
# A guest's niceness: beside the host's tests, which measure time, it takes the CPU they leave idle.
GUEST_NICE = 10

# Seconds each run took alone (2 cores, TCG; the matrices in CI, the demo here with its BPF objects compiled
# on the host first): the longest starts first, so the queues end close together.
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
    """The session's guest runs, longest first: `at_once` of them at a time until `widen`, then
    GUESTS_AT_ONCE."""

    def __init__(
        self, runs: dict[RunKey, Callable[..., Any]], factory: pytest.TempPathFactory, at_once: int
    ) -> None:
        self._slots = threading.Condition()
        self._at_once = at_once
        self._running = 0
        self._closed = False
        self._pool = ThreadPoolExecutor(max_workers=GUESTS_AT_ONCE, thread_name_prefix="guest")
        order = sorted(runs, key=lambda key: EXPECTED_S.get(key, 0), reverse=True)
        self._futures: dict[RunKey, Future[Any]] = {
            key: self._pool.submit(self._run, runs[key], key[1], factory) for key in order
        }

    @contextmanager
    def _slot(self) -> Iterator[None]:
        with self._slots:
            self._slots.wait_for(lambda: self._closed or self._running < self._at_once)
            if self._closed:
                raise RuntimeError("the session ended before this guest run started")
            self._running += 1
        try:
            yield
        finally:
            with self._slots:
                self._running -= 1
                self._slots.notify_all()

    def _run(self, run: Callable[..., Any], version: str, factory: pytest.TempPathFactory) -> Any:
        with self._slot():
            return run(version, factory)

    def widen(self) -> None:
        """The host's own tests are done: the machine's every core may run a guest."""
        with self._slots:
            self._at_once = GUESTS_AT_ONCE
            self._slots.notify_all()

    def result(self, key: RunKey) -> Any:
        """What the run returned (its exception re-raised), once it has ended."""
        return self._futures[key].result()

    def close(self) -> None:
        """Runs not started yet are dropped; the ones running end at their own limits."""
        with self._slots:
            self._closed = True
            self._slots.notify_all()
        self._pool.shutdown(wait=True, cancel_futures=True)
