"""``hoptrace dispatcher``, ``hoptrace collector``, ``hoptrace web``: the servers, until SIGINT/SIGTERM."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from typing import Any

from hoptrace.cli.api import CliError
from hoptrace.common.grpcutil import (
    INFLUX_TOKEN_ENV,
    add_secret_argument,
    add_server_tls_arguments,
    secret_from,
    server_tls_from_args,
)
from hoptrace.common.timeouts import DEFAULT_ACK_TIMEOUT_S, scaled

DEFAULT_DISPATCHER = "127.0.0.1:7070"


def setup_logging(level: str) -> None:
    """Log lines to stderr at `level` (DEBUG, INFO, WARNING, ERROR)."""
    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )


def run_dispatcher(args: argparse.Namespace) -> int:
    """hoptrace dispatcher: serve the user API and the agent sessions until SIGINT/SIGTERM."""
    from hoptrace.dispatcher.server import DispatcherServer

    setup_logging(args.log_level)
    try:
        tls = server_tls_from_args(args)
    except ValueError as error:
        raise CliError(f"dispatcher: {error}") from None
    if tls is not None and not args.tokens:
        raise CliError("dispatcher: TLS needs --tokens FILE for the user API (`hoptrace certs` writes one)")
    report_provider = window_provider = clock_provider = packets_provider = None
    if args.influx_url:
        from hoptrace.dispatcher.reports import (
            influx_clock_provider,
            influx_packets_provider,
            influx_report_provider,
            influx_window_provider,
        )

        influx = (
            args.influx_url,
            args.influx_bucket,
            args.influx_org,
            secret_from(args, "influx-token", INFLUX_TOKEN_ENV),
        )
        report_provider = influx_report_provider(*influx)
        window_provider = influx_window_provider(*influx)
        clock_provider = influx_clock_provider(*influx)
        packets_provider = influx_packets_provider(*influx)
    try:
        server = DispatcherServer(
            args.listen,
            args.state_dir,
            report_provider=report_provider,
            window_provider=window_provider,
            clock_provider=clock_provider,
            packets_provider=packets_provider,
            ack_timeout=args.ack_timeout,
            tls=tls,
            tokens_file=args.tokens,
            bpf_cache_dir=args.bpf_cache_dir,
            command_ttl_s=args.command_ttl,
        ).start()
    except (OSError, RuntimeError, ValueError) as error:
        raise CliError(f"dispatcher: {error}") from None

    def stop(signum: int, frame: object) -> None:
        logging.getLogger("hoptrace.dispatcher").info("signal %d: stopping", signum)
        server.stop(grace=1.0)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    server.wait_for_termination()
    return 0


def run_web(args: argparse.Namespace) -> int:
    """hoptrace web: serve the web UI (hoptrace.web) until SIGINT/SIGTERM."""
    from hoptrace.web.cli import run

    return run(args)


def _collector_module() -> Any:
    """hoptrace.collector.main, or None when it is not installed (it is built in parallel)."""
    try:
        from hoptrace.collector import main as collector_main
    except ImportError:
        return None
    if not hasattr(collector_main, "add_arguments") or not hasattr(collector_main, "run"):
        return None
    return collector_main


def _add_collector_parser(subparsers: Any, command: str | None) -> None:
    parser = subparsers.add_parser(
        "collector",
        help="run the collector (record ingest, InfluxDB export)",
        description="Run the collector: receive agents' records, join and aggregate them, write InfluxDB.",
    )
    module = _collector_module() if command == "collector" else None
    if module is not None:
        module.add_arguments(parser)
        parser.set_defaults(func=lambda args: module.run(args) or 0)
        return
    # The contract's flags, for --help and when the collector package is missing.
    parser.add_argument("--listen", default="127.0.0.1:7071", help="gRPC address for agents (HOST:PORT)")
    parser.add_argument("--influx-url", required=command == "collector", help="InfluxDB URL")
    parser.add_argument("--influx-bucket", required=command == "collector", help="InfluxDB bucket (db/rp)")
    parser.add_argument("--influx-org", default="-", help="InfluxDB organization")
    add_secret_argument(parser, "influx-token", INFLUX_TOKEN_ENV, "the InfluxDB token (1.8: USER:PASSWORD)")

    def unavailable(args: argparse.Namespace) -> int:
        raise CliError("the collector is not installed (hoptrace.collector.main is missing)")

    parser.set_defaults(func=unavailable)


def add_parser(subparsers: Any, client: argparse.ArgumentParser, command: str | None) -> None:
    """Register ``dispatcher``, ``collector`` and ``web`` on a subparsers object (cli/main.py); the
    collector's own flags are loaded only when `command` is ``collector``."""
    dispatcher = subparsers.add_parser(
        "dispatcher", help="run the dispatcher", description="Serve the user API and the agent sessions."
    )
    dispatcher.add_argument("--listen", default=DEFAULT_DISPATCHER, help="gRPC address (HOST:PORT)")
    dispatcher.add_argument(
        "--state-dir", default="/var/lib/hoptrace/dispatcher", help="where applied specs are kept"
    )
    dispatcher.add_argument(
        "--bpf-cache-dir",
        metavar="DIR",
        help="where compiled BPF objects are kept, by content hash (default: STATE_DIR/cache); dispatchers "
        "of the same sources may share one",
    )
    dispatcher.add_argument("--influx-url", help="collector's InfluxDB, for reports (unset: no GetReport)")
    dispatcher.add_argument("--influx-bucket", default="hoptrace/autogen", help="InfluxDB bucket (db/rp)")
    dispatcher.add_argument("--influx-org", default="-", help="InfluxDB organization")
    add_secret_argument(
        dispatcher, "influx-token", INFLUX_TOKEN_ENV, "the InfluxDB token (1.8: USER:PASSWORD)"
    )
    dispatcher.add_argument(
        "--ack-timeout",
        type=float,
        default=scaled(DEFAULT_ACK_TIMEOUT_S),
        help=f"seconds to wait for each agent's status on apply or delete ({DEFAULT_ACK_TIMEOUT_S:g}, times"
        " HOPTRACE_TIMEOUT_SCALE)",
    )
    dispatcher.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING, ERROR")
    dispatcher.add_argument(
        "--command-ttl",
        type=float,
        default=60.0,
        metavar="SECONDS",
        help="how long agents may act on a signed command after it was signed (at most 600; agents allow "
        "their --max-clock-skew on top): it bounds the replay of a command after an agent restarts",
    )
    dispatcher.add_argument(
        "--tokens", metavar="FILE", help="user API tokens, NAME:ROLE:SHA256HEX lines (required with TLS)"
    )
    add_server_tls_arguments(dispatcher)
    dispatcher.set_defaults(func=run_dispatcher)

    _add_collector_parser(subparsers, command)

    from hoptrace.web.cli import add_arguments as add_web_arguments

    web = subparsers.add_parser(
        "web", parents=[client], help="serve the web UI", description="Serve the web UI."
    )
    add_web_arguments(web)
    web.set_defaults(func=run_web)
