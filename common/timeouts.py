"""One knob for slow machines: ``HOPTRACE_TIMEOUT_SCALE`` stretches every deadline hoptrace's clients, the
dispatcher's apply and the lab wait on (a TCG guest runs 5-15x slower; a loaded CI machine a little)."""

from __future__ import annotations

import os


def timeout_scale() -> float:
    """HOPTRACE_TIMEOUT_SCALE as a factor of at least 1 (unset or not a number: 1)."""
    try:
        return max(1.0, float(os.environ.get("HOPTRACE_TIMEOUT_SCALE", "1")))
    except ValueError:
        return 1.0


def scaled(seconds: float) -> float:
    """`seconds` stretched by HOPTRACE_TIMEOUT_SCALE."""
    return seconds * timeout_scale()


# How long a dispatcher's apply or delete waits for each agent's status: loading and verifying a trace's
# programs takes seconds on a loaded node (5-7 s measured at load 9-10 on this project's 2-core VM).
DEFAULT_ACK_TIMEOUT_S = 15.0
