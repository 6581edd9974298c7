"""``hoptrace report`` (per-segment latency of a trace) and ``hoptrace packets`` (per-packet waterfalls),
printed with hoptrace.results' views, the same as the web's and --json's."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from hoptrace.cli.api import client_of
from hoptrace.common.client import QUERY_TIMEOUT_S
from hoptrace.common.durations import parse_duration
from hoptrace.common.entry import CliError
from hoptrace.results.packets_view import packets_from_proto, render_packets_text
from hoptrace.results.pcap import captured_request, write_pcapng
from hoptrace.results.report_view import render_text, report_from_proto
from hoptrace.results.store_captures import MAX_CAPTURED
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


def limit_argument(text: str) -> int:
    """--limit: how many captured packets, 1 to MAX_CAPTURED."""
    if not text.isdigit() or not 1 <= int(text) <= MAX_CAPTURED:
        raise argparse.ArgumentTypeError(f"{text!r}: a number of packets from 1 to {MAX_CAPTURED}")
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
    waterfalls; with --pcap FILE, the captured packets as pcap-ng instead."""
    if args.pcap:
        return write_captured(args)
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


def write_captured(args: argparse.Namespace) -> int:
    """hoptrace packets NAME --pcap FILE [--limit N] [--id ID]: the packets hops captured in the range (a
    hop's capture action), written as pcap-ng (hoptrace.results.pcap)."""
    request = captured_request(
        args.name,
        args.limit,
        since_s=args.since,
        start_ns=args.start,
        end_ns=args.end,
        packet_id=args.id or 0,
    )
    answer = client_of(args).call("GetPackets", request, timeout=QUERY_TIMEOUT_S)
    if not answer.packets:
        raise CliError(
            f"packet 0x{args.id:08x} was not captured in the range"
            if args.id
            else f"no packet of {args.name} was captured in the range (a hop's capture: N action keeps them)"
        )
    try:
        with open(args.pcap, "wb") as out:
            written = write_pcapng(answer, out)
    except OSError as error:
        raise CliError(f"--pcap {args.pcap}: {error.strerror or error}") from None
    print(
        f"{args.pcap}: {len(answer.packets)} packets, {written} captures at {len(answer.capture_hops)} hops"
        f" ({', '.join(answer.capture_hops)})"
    )
    if answer.truncated:
        print(f"more packets were captured in the range: the first {args.limit} are written (--limit)")
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
    packets.add_argument(
        "--pcap",
        metavar="FILE",
        help="write the packets hops captured (capture: N) to FILE as pcap-ng, one interface per hop",
    )
    packets.add_argument(
        "--limit",
        type=limit_argument,
        default=10_000,
        metavar="N",
        help=f"with --pcap: the first N packets captured in the range (10000; at most {MAX_CAPTURED})",
    )
    packets.set_defaults(func=run_packets)
