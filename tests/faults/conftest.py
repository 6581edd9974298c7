"""The fault matrix prints what its cells measured at the end of the run (docs/reliability.md's table)."""

from __future__ import annotations

import pytest
from faults_helpers import RESULTS

HEADER = (
    "| component | fault | outage | sent | delivered | complete | counted | unaccounted | duplicates "
    "| time to whole | note |\n|---|---|---|---|---|---|---|---|---|---|---|"
)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """The matrix as measured, one row per cell that ran."""
    if RESULTS:
        terminalreporter.section("fault matrix (tests/faults)")
        terminalreporter.write_line(HEADER)
        for result in RESULTS:
            terminalreporter.write_line(result.row())
