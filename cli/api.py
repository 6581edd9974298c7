"""The CLI's side of the user API: the ApiClient (hoptrace.common.client) the client flags describe, and
CliError (hoptrace.common.entry), which `hoptrace` prints as one line, exit 1."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from typing import Any

from hoptrace.common.client import ApiClient
from hoptrace.common.entry import ArgumentParser, CliError, run_command
from hoptrace.common.grpcutil import TOKEN_ENV, api_channel, secret_from
from hoptrace.common.tlscheck import check_tls_files

__all__ = ["CliError", "client_of", "run_standalone"]


def client_of(args: argparse.Namespace) -> ApiClient:
    """The API client the flags describe (--dispatcher, --ca/--cert/--key, --token-file, --insecure); its
    failures are ApiError, which `hoptrace` prints as one line."""

    def channel() -> Any:
        try:
            if not args.insecure and args.ca and args.cert and args.key:
                check_tls_files(args.ca, args.cert, args.key)  # names a file its dispatcher would refuse
            return api_channel(
                args.dispatcher,
                ca=args.ca,
                cert=args.cert,
                key=args.key,
                token=secret_from(args, "token", TOKEN_ENV) or None,
                insecure=args.insecure,
            )
        except (OSError, ValueError) as error:
            raise CliError(f"cannot set up the connection to {args.dispatcher}: {error}") from None

    return ApiClient(args.dispatcher, channel)


def run_standalone(add_parser: Callable[[Any], Any], command: str, argv: Sequence[str] | None) -> int:
    """A command group's own entry point (``python -m hoptrace.cli.mace ARGS``): `argv` (default
    sys.argv[1:]) parsed as ``hoptrace COMMAND ARGS`` by the parser `add_parser` registers, then run as
    `hoptrace` runs it."""
    parser = ArgumentParser(prog="hoptrace")
    add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args([command, *(sys.argv[1:] if argv is None else argv)])
    return run_command(lambda: args.func(args))
