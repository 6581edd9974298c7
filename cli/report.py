"""``hoptrace report`` (per-segment latency of a trace) and ``hoptrace packets`` (per-packet waterfalls),
printed with hoptrace.results' views, the same as the web's and --json's."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from hoptrace.cli.api import client_of
from hoptrace.common.durations import parse_duration
from hoptrace.results.packets_view import packets_from_proto, render_packets_text
from hoptrace.results.report_view import render_text, report_from_proto
from hoptrace.results.timerange import parse_time


def since_duration(text: str) -> float:
    """`--since`: seconds of a duration such as 30s, 10m, 1h30m, 2d (hoptrace.common.durations)."""
    try:
        return parse_duration(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def time_argument(text: str) -> int:
    """`--start`, `--end`: ns since the epoch of an ISO 8601 time (UTC unless it names a zone) or of a
    duration ago (hoptrace.results.timerange)."""
    try:
        return parse_time(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def add_range_arguments(parser: argparse.ArgumentParser, default: str) -> None:
    """--since or --start, and --end: the range of a report or a packet list. The dispatcher checks that
    the range holds time (an end before its start is refused there, for every client alike)."""
    start = parser.add_mutually_exclusive_group()
    start.add_argument(
        "--since", type=since_duration, help=f"time range ending now, e.g. 30s, 10m, 1h ({default})"
    )
    start.add_argument(
        "--start",
        type=time_argument,
        metavar="TIME",
        help="range start: 2025-03-01T14:05:00Z (UTC) or 2h (ago)",
    )
    parser.add_argument(
        "--end", type=time_argument, metavar="TIME", help="range end, as --start (default now)"
    )


def packet_id_argument(text: str) -> int:
    """--id: a packet ID as shown (0x07000123) or in decimal; 32-bit, never 0."""
    try:
        value = int(text, 0)
    except ValueError:
        value = 0
    if not 0 < value < 1 << 32:
        raise argparse.ArgumentTypeError(f"{text!r} is not a packet ID (e.g. 0x07000123)")
    return value


def slowest_argument(text: str) -> int:
    """--slowest: how many packets, 1 to 50."""
    if not text.isdigit() or not 1 <= int(text) <= 50:
        raise argparse.ArgumentTypeError(f"{text!r}: a number of packets from 1 to 50")
    return int(text)


def run_report(args: argparse.Namespace) -> int:
    """hoptrace report NAME [--since DURATION | --start TIME] [--end TIME] [--json]."""
    answer = client_of(args).report(args.name, args.since, start_ns=args.start, end_ns=args.end)
    report = report_from_proto(answer)
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    sys.stdout.write(render_text(report))
    return 0


def run_packets(args: argparse.Namespace) -> int:
    """hoptrace packets NAME [--since D | --start T] [--end T] [--slowest N | --id ID] [--json]: per-packet
    waterfalls."""
    answer = client_of(args).packets(
        args.name,
        args.since,
        packet_id=args.id or 0,
        slowest=args.slowest,
        start_ns=args.start,
        end_ns=args.end,
    )
    packets = packets_from_proto(answer)
    if args.json:
        print(json.dumps(packets, indent=2))
        return 0
    if not packets:
        print(
            f"packet 0x{args.id:08x} was not seen" if args.id else f"no packet of {args.name} went end to end"
        )
        return 0
    sys.stdout.write(render_packets_text(packets))
    return 0


def add_parser(subparsers: Any, client: argparse.ArgumentParser) -> None:
    """Register ``report`` and ``packets`` on a subparsers object (cli/main.py)."""
    report = subparsers.add_parser(
        "report",
        parents=[client],
        help="per-hop latency decomposition of a trace",
        description="Per-segment latency (count, mean, p50/p90/p99, max, incomplete) in path order.",
    )
    report.add_argument("name", help="trace name")
    add_range_arguments(report, "default 1h")
    report.add_argument("--json", action="store_true", help="print one JSON object")
    report.set_defaults(func=run_report)

    packets = subparsers.add_parser(
        "packets",
        parents=[client],
        help="per-packet waterfalls: the slowest packets or one by ID",
        description="Each packet's passage, segment by segment: the slowest end to end (default 10), or one "
        "packet by its ID.",
    )
    packets.add_argument("name", help="trace name")
    add_range_arguments(packets, "default 1h")
    which = packets.add_mutually_exclusive_group()
    which.add_argument(
        "--slowest", type=slowest_argument, default=10, metavar="N", help="the N slowest (at most 50)"
    )
    which.add_argument("--id", type=packet_id_argument, metavar="ID", help="one packet, e.g. 0x07000123")
    packets.add_argument("--json", action="store_true", help="print JSON")
    packets.set_defaults(func=run_packets)
