"""The CLI's output ends cleanly when its reader leaves (`hoptrace report --json | head`)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.unit  # no root, no server: make test-unit runs it without root


def test_a_reader_that_left_gets_no_traceback() -> None:
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before the first line is written
    try:
        run = subprocess.run(
            [sys.executable, "-m", "hoptrace.cli.main", "version", "--dispatcher", "127.0.0.1:9"]
            + ["--insecure"],
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
            check=False,
        )
    finally:
        os.close(write_end)
    assert "Traceback" not in run.stderr and "BrokenPipeError" not in run.stderr, run.stderr
    assert run.returncode == 141, (run.returncode, run.stderr)
