"""``hoptrace discover``: the devices a flow's packets cross, in path order, as a trace spec.

Runs ``Hoptrace.Discover`` on the dispatcher (dispatcher/discover.py): every node's agent tags the flow where
it is sent and records each device crossing in its own namespaces; progress goes to stderr while it looks,
the spec (YAML, or JSON with every path and its share) to stdout. ``--apply NAME`` applies it at once.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from google.protobuf import json_format

from hoptrace.cli.api import CliError, client_of
from hoptrace.cli.traces import read_spec_file
from hoptrace.common.durations import parse_duration
from hoptrace.results.path_view import path_data, paths_text, segment_data
from hoptrace.spec import SpecError, load_spec, spec_to_data, spec_to_yaml
from hoptrace.v1 import api_pb2, trace_pb2


def duration_argument(text: str) -> float:
    """A --duration value (5s, 500ms, 1m) in seconds, more than 0."""
    try:
        seconds = parse_duration(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(f"{error}; want a duration such as 5s or 500ms") from None
    if seconds <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: want a duration > 0")
    return seconds


def count_argument(text: str) -> int:
    """A --packets value: a whole number, more than 0."""
    if not text.isdigit() or int(text) <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: want a number of packets > 0")
    return int(text)


def port_argument(text: str) -> int:
    """A --src-port/--dst-port value: 1 to 65535."""
    if not text.isdigit() or not 0 < int(text) < 1 << 16:
        raise argparse.ArgumentTypeError(f"{text!r}: want a port from 1 to 65535")
    return int(text)


def add_parser(subparsers: Any, client: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Register ``discover`` on a subparsers object (cli/main.py)."""
    parser = subparsers.add_parser(
        "discover",
        parents=[client],
        help="find the devices a flow crosses, in order, as a trace spec",
        description="Tag the flow where it is sent and record every device its packets cross on the nodes; "
        "print a trace spec whose hops are those devices in path order (every path, with its share, in "
        "--json and on stderr).",
    )
    parser.add_argument(
        "-f", "--file", help="take the filter from this spec (its hops are ignored; - = stdin)"
    )
    parser.add_argument("--protocol", choices=("udp", "tcp"), help="the flow's protocol")
    parser.add_argument("--src", help="source address or CIDR (required: the sender's namespace tags)")
    parser.add_argument("--dst", help="destination address or CIDR")
    parser.add_argument("--src-port", type=port_argument, default=0, help="source port")
    parser.add_argument("--dst-port", type=port_argument, default=0, help="destination port")
    parser.add_argument(
        "--node", action="append", default=[], help="look on this node (repeat; default: all)"
    )
    parser.add_argument(
        "--duration", type=duration_argument, default=5.0, help="how long to look (default 5s)"
    )
    parser.add_argument(
        "--packets", type=count_argument, default=0, metavar="N", help="stop once N tagged packets were seen"
    )
    parser.add_argument("--name", default="", help="name of the printed spec (default: discovered)")
    parser.add_argument("--apply", metavar="NAME", help="apply the discovered spec as trace NAME")
    parser.add_argument("--json", action="store_true", help="print JSON: the spec and every path")
    parser.add_argument("--quiet", action="store_true", help="no progress on stderr")
    parser.set_defaults(func=cmd_discover)
    return parser


def request_of(args: argparse.Namespace) -> api_pb2.DiscoverRequest:
    """The DiscoverRequest the flags describe (flags override the filter of -f)."""
    flt = trace_pb2.Filter()
    if args.file:
        text = read_spec_file(args.file)
        try:
            # A spec without hops is not valid as a trace, but its filter is all discover needs.
            flt.CopyFrom(load_spec(text).filter)
        except SpecError as error:
            problems = [line for line in str(error).splitlines() if "hops" not in line]
            if problems:
                raise CliError(f"invalid spec ({args.file}):\n{error}") from None
            flt.CopyFrom(_filter_only(text))
    for key in ("protocol", "src", "dst", "src_port", "dst_port"):
        value = getattr(args, key)
        if value:
            setattr(flt, key, value)
    name = args.apply or args.name
    return api_pb2.DiscoverRequest(
        filter=flt,
        nodes=args.node,
        duration_ms=int(round(args.duration * 1000)),
        packets=args.packets,
        name=name,
    )


def _filter_only(text: bytes) -> trace_pb2.Filter:
    import yaml

    data = yaml.safe_load(text) or {}
    flt = trace_pb2.Filter()
    json_format.ParseDict((data.get("filter") or {}) if isinstance(data, dict) else {}, flt)
    return flt


def cmd_discover(args: argparse.Namespace) -> int:
    """hoptrace discover [FILTER | -f SPEC] [--node N]... [--duration D] [--packets N] [--apply NAME]."""
    request = request_of(args)
    result: api_pb2.DiscoverResult | None = None
    client = client_of(args)
    for event in client.discover(request):
        if event.HasField("progress") and not args.quiet:
            print(f"discover: {event.progress.message}", file=sys.stderr, flush=True)
        elif event.HasField("result"):
            result = event.result
    if result is None:
        raise CliError("the dispatcher ended the discovery without a result")
    if not result.paths:
        raise CliError(result.message or "no packet of the flow was seen")
    if not args.quiet:
        print(paths_text(result), file=sys.stderr)
    if args.json:
        print(
            json.dumps(
                {
                    "spec": spec_to_data(result.spec),
                    "packets": result.packets,
                    "nodes": list(result.nodes),
                    "paths": [path_data(p) for p in result.paths],
                    "segments": [segment_data(s) for s in result.segments],
                },
                indent=2,
            )
        )
    else:
        sys.stdout.write(spec_to_yaml(result.spec))
    if args.apply:
        trace = client.apply(result.spec)
        print(f"applied {trace.spec.name} (generation {trace.generation})", file=sys.stderr)
    return 0
