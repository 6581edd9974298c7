"""What every hoptrace program does at its edge: parse flags without abbreviations and turn every failure into
one line on stderr.

Each program (`hoptrace` and its commands, `hoptrace collector`, `hoptrace web`, `hoptrace demo`) parses with
`ArgumentParser` and runs its command through `run_command`:

- a failure the user can act on (`CliError`, an OSError such as a missing file, a ValueError such as a
  certificate of another CA: `hoptrace.common.tlscheck.TLSFileError`) prints ``error: <message>``, exit 1;
- anything else prints ``error: internal error: <type>: <message> (set HOPTRACE_DEBUG=1 for the
  traceback)``, exit 1; the traceback only with HOPTRACE_DEBUG=1;
- Ctrl-C exits 130 and a reader that left (``| head``) 141, both quietly;
- usage errors stay argparse's (exit 2).

Nothing here prints the command line: a secret passed on it by mistake is never echoed.
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from collections.abc import Callable
from typing import Any, NoReturn

DEBUG_ENV = "HOPTRACE_DEBUG"


class CliError(Exception):
    """A failure the user can act on, said in the message; the program exits 1."""


class ArgumentParser(argparse.ArgumentParser):
    """argparse without abbreviated flags (`--dispatcher-token X` must never be taken for
    `--dispatcher-token-file X`, nor `--sin` for `--since`); subparsers are of this class too.

    An unrecognized argument's message names the unknown flags but not the values given with them: a value
    next to a mistyped secret flag is the secret."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        """Print the usage and `message` (values of unrecognized arguments left out), exit 2."""
        prefix = "unrecognized arguments: "
        if message.startswith(prefix):
            words = message.removeprefix(prefix).split()
            flags = [word.partition("=")[0] for word in words if word.startswith("-")]
            hidden = len(words) - len(flags) + sum("=" in word for word in words if word.startswith("-"))
            message = prefix + " ".join(flags or ["(values only)"])
            if hidden:
                message += f" (and {hidden} value{'s' if hidden > 1 else ''}, not shown)"
        super().error(message)


def one_line(error: BaseException) -> str:
    """`error`'s message, for the line after ``error: ``."""
    if isinstance(error, OSError) and error.strerror and not isinstance(error, CliError):
        where = error.filename if error.filename is not None else ""
        return f"{where}: {error.strerror}" if where else error.strerror
    return str(error) or type(error).__name__


def run_command(command: Callable[[], int | None]) -> int:
    """Run `command` and return the program's exit status: its own, or 1 with one line on stderr for a
    failure (see the module's docstring), 130 for Ctrl-C, 141 when stdout's reader left."""
    try:
        return command() or 0
    except (CliError, OSError, ValueError) as error:
        if isinstance(error, BrokenPipeError):
            return _reader_left()
        _debug_traceback()
        print(f"error: {one_line(error)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except Exception as error:  # noqa: BLE001 - the one place an unexpected failure is said to the user
        if _debug_traceback():
            return 1
        print(
            f"error: internal error: {type(error).__name__}: {error} (set {DEBUG_ENV}=1 for the traceback)",
            file=sys.stderr,
        )
        return 1


def _debug_traceback() -> bool:
    """Print the current exception's traceback when HOPTRACE_DEBUG is set; whether it did."""
    if os.environ.get(DEBUG_ENV, "") not in ("", "0"):
        traceback.print_exc()
        return True
    return False


def _reader_left() -> int:
    # The reader left (`hoptrace report --json | head`): stop quietly, as other Unix tools do. Point stdout
    # at /dev/null so the interpreter's own flush at exit raises nothing either.
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 141
