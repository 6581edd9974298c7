"""`hoptrace`: run the dispatcher, the collector or the web UI, and manage traces through the dispatcher's
API. Each group of commands is a module of its own with `add_parser(subparsers, ...)` and its `run_*`
functions: traces.py, report.py, agents.py, audit.py, servers.py, certs.py, discover.py, mace.py, iron.py,
importer.py.

Exit status: 0 success, 1 a failed request or invalid spec (one line on stderr, hoptrace.common.entry), 2 bad
usage, 130 interrupted.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence

from hoptrace.cli import agents, audit, certs, discover, importer, iron, mace, report, servers, traces
from hoptrace.cli.servers import DEFAULT_DISPATCHER
from hoptrace.common.entry import ArgumentParser, run_command
from hoptrace.common.grpcutil import (
    CA_ENV,
    CERT_ENV,
    DISPATCHER_ENV,
    KEY_ENV,
    TOKEN_ENV,
    TOKEN_FILE_ENV,
    SecretOnCommandLine,
)


def _add_client_security_arguments(parser: argparse.ArgumentParser, *, top_level: bool) -> None:
    """--token/--ca/--cert/--key/--insecure of the user API clients; after the subcommand they override."""

    def default(env: str) -> str | None:
        return (os.environ.get(env) or None) if top_level else argparse.SUPPRESS

    # --token used to take the token itself; say why it does not any more (and never read it as a file).
    parser.add_argument(
        "--token",
        action=SecretOnCommandLine,
        use=f"--token-file FILE or ${TOKEN_ENV}",
        dest=argparse.SUPPRESS,
    )
    parser.add_argument(
        "--token-file",
        metavar="FILE",
        default=default(TOKEN_FILE_ENV),
        help=f"file holding the user API token (or put the token in ${TOKEN_ENV}; never on the command line)",
    )
    parser.add_argument("--ca", default=default(CA_ENV), metavar="PEM", help=f"CA certificate (${CA_ENV})")
    parser.add_argument("--cert", default=default(CERT_ENV), metavar="PEM", help=f"client cert (${CERT_ENV})")
    parser.add_argument("--key", default=default(KEY_ENV), metavar="PEM", help=f"client key (${KEY_ENV})")
    parser.add_argument(
        "--insecure",
        action="store_true",
        default=False if top_level else argparse.SUPPRESS,
        help="plaintext, for a dispatcher started with --insecure",
    )


# ---- parser --------------------------------------------------------------------------------------------


def _command_of(argv: Sequence[str]) -> str | None:
    """The subcommand in argv (skipping the client options' values), without parsing everything."""
    skip = False
    for argument in argv:
        if skip:
            skip = False
        elif argument in ("--dispatcher", "--token-file", "--ca", "--cert", "--key"):
            skip = True
        elif not argument.startswith("-"):
            return argument
    return None


def build_parser(argv: Sequence[str] = ()) -> argparse.ArgumentParser:
    """The `hoptrace` argument parser (argv decides whether the collector's own flags are loaded)."""
    default_dispatcher = os.environ.get(DISPATCHER_ENV) or DEFAULT_DISPATCHER
    # Every subparser is an ArgumentParser too (add_subparsers' parser_class): no abbreviated flags anywhere.
    parser = ArgumentParser(
        prog="hoptrace", description="hoptrace: per-hop latency of the same packets across layers and hosts."
    )
    parser.add_argument(
        "--dispatcher",
        default=default_dispatcher,
        metavar="ADDR",
        help=f"dispatcher address (default ${DISPATCHER_ENV} or {DEFAULT_DISPATCHER})",
    )
    _add_client_security_arguments(parser, top_level=True)
    # Client commands accept --dispatcher after the subcommand too; SUPPRESS keeps the top-level value.
    client = ArgumentParser(add_help=False)
    client.add_argument("--dispatcher", default=argparse.SUPPRESS, metavar="ADDR", help="dispatcher address")
    _add_client_security_arguments(client, top_level=False)
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    servers.add_parser(subparsers, client, _command_of(argv))
    certs.add_parser(subparsers)
    traces.add_parser(subparsers, client)
    agents.add_parser(subparsers, client)
    audit.add_parser(subparsers, client)
    report.add_parser(subparsers, client)
    importer.add_parser(subparsers)
    # Presets (ready-made traces on one node) and path discovery.
    mace.add_parser(subparsers)
    iron.add_parser(subparsers)
    discover.add_parser(subparsers, client)

    completion = subparsers.add_parser(
        "completion",
        help="shell completion script: bash, zsh or tcsh",
        description="Print a completion script for SHELL, e.g. `hoptrace completion bash > "
        "/etc/bash_completion.d/hoptrace`, or `source <(hoptrace completion bash)` in a running shell.",
    )
    completion.add_argument("shell", choices=("bash", "zsh", "tcsh"))
    completion.set_defaults(func=run_completion)
    return parser


def run_completion(args: argparse.Namespace) -> int:
    """hoptrace completion SHELL: the script, generated from this very parser (every command and flag, the
    collector's included), so it cannot drift from the CLI."""
    import shtab

    print(shtab.complete(build_parser(["collector"]), shell=args.shell, root_prefix="hoptrace"))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `hoptrace` console script."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser(argv).parse_args(argv)
    func: Callable[[argparse.Namespace], int] = args.func
    return run_command(lambda: func(args))  # an ApiError is a CliError: the dispatcher's words, one line


if __name__ == "__main__":
    sys.exit(main())
