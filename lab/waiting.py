"""Waiting for an event instead of sleeping for it: the one polling wait of the lab and the tests."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

from hoptrace.common.timeouts import scaled

T = TypeVar("T")


class WaitTimeout(AssertionError):
    """A condition did not hold in time. An AssertionError, so a test reports it as a failed check."""


def wait_until(condition: Callable[[], T], what: str, timeout_s: float, interval_s: float = 0.1) -> T:
    """Call `condition()` every `interval_s` until it returns something true, and return that.

    `timeout_s` is stretched by HOPTRACE_TIMEOUT_SCALE (a guest under TCG runs 5-15x slower); past it,
    raises WaitTimeout naming `what` (say what is awaited: "the agent's first record"). The condition is
    checked once more at the deadline, so a slow last poll still counts.
    """
    deadline = time.monotonic() + scaled(timeout_s)
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise WaitTimeout(f"{what}: not within {timeout_s:g} s")
        time.sleep(min(interval_s, max(deadline - time.monotonic(), 0.0)))
