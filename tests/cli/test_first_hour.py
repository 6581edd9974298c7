"""The first hour of a new user: every mistake gets one line on stderr naming the flag, file or field, with
the cause; never a traceback, never an echoed secret. Each program runs as a child, as a user runs it."""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from test_cli_output import cli

from hoptrace.lab.waiting import wait_until
from hoptrace.spec.spec import MAX_SPEC_BYTES

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


# ---- no abbreviations; a secret flag's value never echoed ---------------------------------------------


def test_a_token_on_the_collectors_command_line_is_refused_without_echoing_it() -> None:
    """`--dispatcher-token X` was taken as `--dispatcher-token-file X`: X read as a path, and the traceback
    printed it."""
    for argv in (
        cli("collector", "--insecure", "--dispatcher", "127.0.0.1:9", "--dispatcher-token", SECRET),
        module(
            "hoptrace.collector.main",
            "--insecure",
            "--dispatcher",
            "127.0.0.1:9",
            f"--dispatcher-token={SECRET}",
        ),
        cli("dispatcher", "--insecure", "--influx-url", "http://127.0.0.1:9", "--influx-token", SECRET),
        cli("trace", "ls", *NOWHERE, "--token", SECRET),
        cli("web", *NOWHERE, "--secret-key", SECRET),
    ):
        line = one_line_error(run(argv), 2, "is not taken on the command line")
        assert "-file FILE" in line, line


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["report", "t", "--sin", "5m"], "--sin"),
        (["packets", "t", "--slow", "3"], "--slow"),
        (["trace", "validate", "--off", "-f", "x.yaml"], "--off"),
        (["collector", "--insecure", "--dispatcher-tok", SECRET], "--dispatcher-tok"),
    ],
)
def test_an_abbreviated_flag_is_refused_and_its_values_not_echoed(argv: list[str], flag: str) -> None:
    """`--sin` and `--slow` were silently taken for --since and --slowest."""
    one_line_error(run(cli(*argv, *NOWHERE[:2])), 2, f"unrecognized arguments: {flag}")


def test_the_web_refuses_an_abbreviated_flag() -> None:
    one_line_error(run(cli("web", "--insecure", "--users", "/nope")), 2, "unrecognized arguments: --users")


# ---- token files that cannot be read ------------------------------------------------------------------


def test_a_missing_token_file_is_named_with_its_flag_and_the_cause(tmp_path: Path) -> None:
    """A token file that cannot be read was a traceback (collector, dispatcher) or a bare errno."""
    collector = ["collector", "--insecure", "--dispatcher", "127.0.0.1:9"]
    dispatcher = ["dispatcher", "--insecure", "--influx-url", "http://127.0.0.1:9"]
    cases = [
        (cli("trace", "ls", *NOWHERE, "--token-file", "/nope"), {}, "--token-file /nope: No such file"),
        (
            cli("trace", "ls", *NOWHERE),
            {"HOPTRACE_TOKEN_FILE": "/nope"},
            "--token-file /nope ($HOPTRACE_TOKEN_FILE): No such file",
        ),
        (
            cli(*collector, "--dispatcher-token-file", "/nope"),
            {},
            "--dispatcher-token-file /nope: No such file",
        ),
        (cli(*dispatcher, "--influx-token-file", "/nope"), {}, "--influx-token-file /nope: No such file"),
        (cli("web", *NOWHERE, "--token-file", str(tmp_path)), {}, f"--token-file {tmp_path}: Is a directory"),
        (cli("web", *NOWHERE, "--secret-key-file", "/nope"), {}, "--secret-key-file /nope: No such file"),
        (cli("web", *NOWHERE, "--users-file", "/nope"), {}, "--users-file /nope: No such file"),
    ]
    for argv, env, words in cases:
        one_line_error(run(argv, **env), 1, words)


# ---- spec files: at most MAX_SPEC_BYTES read ----------------------------------------------------------


def test_an_endless_spec_file_is_refused_after_the_limit() -> None:
    """`trace apply -f /dev/zero` read until MemoryError."""
    limit = f"more than {MAX_SPEC_BYTES} bytes"
    one_line_error(run(cli("trace", "validate", "--offline", "-f", "/dev/zero")), 1, "/dev/zero", limit)
    one_line_error(run(cli("trace", "apply", *NOWHERE, "-f", "/dev/zero")), 1, "/dev/zero", limit)
    with open("/dev/zero", "rb") as zero:
        one_line_error(
            run(cli("trace", "validate", "--offline", "-f", "-"), stdin=zero.fileno()), 1, "stdin", limit
        )
    with open("/dev/zero", "rb") as zero:
        one_line_error(
            run(cli("discover", *NOWHERE, "--src", "198.18.0.1", "-f", "-"), stdin=zero.fileno()),
            1,
            "stdin",
            limit,
        )


# ---- one error path per program -----------------------------------------------------------------------


def test_an_expected_failure_is_one_line_and_an_unexpected_one_says_how_to_see_more(capsys) -> None:
    from hoptrace.common.entry import CliError, run_command

    def unexpected() -> int:
        raise KeyError("nobody expected this")

    def expected() -> int:
        raise CliError("--flag x: what went wrong")

    assert run_command(expected) == 1
    assert capsys.readouterr().err == "error: --flag x: what went wrong\n"
    assert run_command(unexpected) == 1
    assert capsys.readouterr().err == (
        "error: internal error: KeyError: 'nobody expected this' (set HOPTRACE_DEBUG=1 for the traceback)\n"
    )
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HOPTRACE_DEBUG", "1")
        assert run_command(unexpected) == 1
    assert "Traceback" in capsys.readouterr().err

    def interrupted() -> int:
        raise KeyboardInterrupt

    assert run_command(interrupted) == 130
    assert capsys.readouterr().err == ""


# The collector's spool cannot be made: it fails before it serves anything.
UNUSABLE_SPOOL = ["--insecure", "--listen", "127.0.0.1:0", "--clock-listen=", "--metrics-listen="]
UNUSABLE_SPOOL += ["--spool-dir", "/dev/null/spool"]


@pytest.mark.parametrize(
    "argv", [cli("collector", *UNUSABLE_SPOOL), module("hoptrace.collector.main", *UNUSABLE_SPOOL)]
)
def test_a_server_that_cannot_start_says_why_in_one_line(argv: list[str]) -> None:
    one_line_error(run(argv), 1, "/dev/null/spool")


def test_the_web_says_a_bad_certificate_in_one_line(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("not a certificate\n")
    one_line_error(
        run(cli("web", "--dispatcher", "127.0.0.1:9", "--ca", str(ca), "--cert", str(ca), "--key", str(ca))),
        1,
        str(ca),
    )


def test_ctrl_c_ends_a_command_quietly_with_130() -> None:
    """A spec read from stdin that never comes, interrupted."""
    process = subprocess.Popen(
        cli("trace", "validate", "--offline", "-f", "-"),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # A shell's background job (`make test &`, CI) ignores SIGINT, and its children inherit that:
        # give the CLI the terminal's default, as a user's Ctrl-C finds it.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        syscall = Path(f"/proc/{process.pid}/syscall")
        wait_until(lambda: syscall.read_text().startswith("0 0x0 "), "the CLI reading stdin", 30)
        process.send_signal(signal.SIGINT)
        # stdin stays open: an EOF would end the read too, and the test would race the signal against it.
        process.wait(timeout=30)
        stderr = process.stderr.read()
    finally:
        process.kill()
        process.stdin.close()
    assert process.returncode == 130 and stderr == "", (process.returncode, stderr)


@pytest.mark.parametrize(
    "argv",
    [
        ["trace", "ls"],
        ["report", "t"],
        ["packets", "t", "--since", "5m"],
        ["agents"],
        ["mace", "--node", "another-node", "--container", "container:web", "--duration", "1"],
        ["discover", "--src", "198.18.0.1", "--duration", "1s"],
    ],
)
def test_a_dispatcher_that_is_not_there_is_one_line_in_every_client_command(argv: list[str]) -> None:
    one_line_error(run(cli(*NOWHERE, *argv)), 1, "cannot reach the dispatcher at 127.0.0.1:9")


# ---- discover's counts and durations ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("--packets", "-1"),
        ("--packets", "0"),
        ("--duration", "0s"),
        ("--src-port", "-1"),
        ("--dst-port", "70000"),
    ],
)
def test_discover_refuses_a_count_or_duration_out_of_range_naming_the_flag(flag: str, value: str) -> None:
    result = run(cli("discover", *NOWHERE, "--src", "198.18.0.1", f"{flag}={value}"))
    one_line_error(result, 2, f"argument {flag}", repr(value))
