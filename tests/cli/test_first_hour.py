"""The first hour of a new user: every mistake gets one line on stderr naming the flag, file or field, with
the cause; never a traceback, never an echoed secret. Each program runs as a child, as a user runs it."""

from __future__ import annotations

import os
import resource
import subprocess
import sys

import pytest
from test_cli_output import cli

pytestmark = pytest.mark.unit  # no root, no server: make test-unit runs it without root

SECRET = "ht_s3cr3t-never-shown"
# No dispatcher listens here: a command that gets as far as calling it fails at once.
NOWHERE = ["--dispatcher", "127.0.0.1:9", "--insecure"]


def module(name: str, *args: str) -> list[str]:
    """argv of `python -m NAME ARGS` with the site directories of cli() and no others."""
    sites = [path for path in sys.path if path.endswith("site-packages")]
    code = (
        f"import runpy, site, sys; [site.addsitedir(p) for p in {sites!r}]; sys.argv[0] = {name!r}; "
        f"runpy.run_module({name!r}, run_name='__main__')"
    )
    return [sys.executable, "-S", "-c", code, *args]


def _limit_memory() -> None:
    # A regression that reads a whole endless file fails at 2 GiB instead of filling the machine.
    resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))


def run(argv: list[str], stdin: int | None = subprocess.DEVNULL, **env: str) -> subprocess.CompletedProcess:
    """Run `argv` with `env` added (HOPTRACE_* of the caller removed), limited to 2 GiB and 60 s."""
    environ = {key: value for key, value in os.environ.items() if not key.startswith("HOPTRACE_")}
    environ.update(env)
    return subprocess.run(
        argv,
        stdin=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=environ,
        preexec_fn=_limit_memory,
    )


def one_line_error(result: subprocess.CompletedProcess, status: int, *words: str) -> str:
    """The stderr line that says what failed: exit `status`, no traceback, no secret, each of `words`
    on the one line that starts with `error:` (argparse: `PROG: error:`)."""
    stderr = result.stderr
    assert result.returncode == status, (result.returncode, stderr)
    assert "Traceback" not in stderr, stderr
    assert SECRET not in stderr and SECRET not in result.stdout, stderr
    errors = [line for line in stderr.splitlines() if "error:" in line]
    assert len(errors) == 1, stderr
    for word in words:
        assert word in errors[0], (word, stderr)
    return errors[0]


# ---- durations: a range longer than 10 years ----------------------------------------------------------


@pytest.mark.parametrize("command", ["report", "packets"])
def test_a_range_longer_than_ten_years_is_refused_naming_the_flag(command: str) -> None:
    """--since 999999999h started before year 1: OverflowError."""
    result = run(cli(command, "t", "--since", "999999999h", *NOWHERE))
    one_line_error(result, 2, "--since", "'999999999h' is longer than the limit of 10 years")
