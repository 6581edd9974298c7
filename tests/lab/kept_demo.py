"""The demo kept up (`hoptrace demo --keep`), as the tests of tests/lab start it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

# The line the demo prints once everything is up.
READY = "everything stays up"


def start_kept_demo(*args: str, cwd: Path | None = None) -> tuple[subprocess.Popen[str], list[str]]:
    """`hoptrace demo --keep ARGS`, read until it says everything is up (nothing is slept on): the process,
    still running, and the lines it printed so far. The caller stops it."""
    demo = subprocess.Popen(
        [sys.executable, "-m", "hoptrace.cli.demo", "--keep", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=cwd,
    )
    output: list[str] = []
    assert demo.stdout is not None
    for line in demo.stdout:
        output.append(line)
        if READY in line:
            break
    assert any(READY in line for line in output), "".join(output[-40:])
    return demo, output
