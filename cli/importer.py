"""`hoptrace import FILE...`: agents' recorded JSON lines (`hoptrace-agent ... --out FILE`) into InfluxDB,
through the collector's own pipeline (`hoptrace.collector.file_input`), so that `hoptrace report`, the web UI
and Grafana show them as if a collector had received them live. Every node's file of a trace goes in one
command: the join needs them all.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from hoptrace.common.grpcutil import INFLUX_TOKEN_ENV, add_secret_argument, secret_from


def add_parser(subparsers: Any) -> None:
    """Register ``import`` on a subparsers object (cli/main.py)."""
    parser = subparsers.add_parser(
        "import",
        help="import agents' recorded files (hoptrace-agent --out FILE) into InfluxDB for reports",
        description="Run the records, counters and clocks that agents wrote with --out FILE through the "
        "collector's pipeline into InfluxDB, as a collector would have taken them live; then `hoptrace "
        "report TRACE` (a dispatcher reading the same bucket) shows them. Give every node's file of a trace "
        "at once. Import into a bucket no collector received these records in: there they would count twice.",
    )
    parser.add_argument("files", nargs="+", metavar="FILE", help="an agent's JSON lines, one file per node")
    parser.add_argument("--influx-url", default="http://127.0.0.1:8086", help="InfluxDB URL")
    parser.add_argument(
        "--influx-bucket", default="hoptrace/autogen", help="bucket; InfluxDB 1.8: DATABASE/RETENTION-POLICY"
    )
    parser.add_argument("--influx-org", default="-", help="organization (InfluxDB 1.8: ignored, '-')")
    add_secret_argument(parser, "influx-token", INFLUX_TOKEN_ENV, "the InfluxDB token (1.8: USER:PASSWORD)")
    parser.add_argument(
        "--join-window",
        type=float,
        default=2.0,
        metavar="SECONDS",
        help="reorder window of the join (as the collector's --join-window)",
    )
    parser.set_defaults(func=run_import)


def run_import(args: argparse.Namespace) -> int:
    """hoptrace import: check every file, import them, print what each trace got."""
    from hoptrace.collector.file_input import InfluxConfig, import_files

    if args.join_window <= 0:
        print("hoptrace import: --join-window must be positive", file=sys.stderr)
        return 2
    influx = InfluxConfig(
        url=args.influx_url,
        bucket=args.influx_bucket,
        org=args.influx_org,
        token=secret_from(args, "influx-token", INFLUX_TOKEN_ENV),
    )
    summary = import_files(args.files, influx, join_window_ns=int(args.join_window * 1e9))
    for warning in summary.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    stats = summary.stats
    print(
        f"imported {summary.records} records of {summary.files} file{'s' if summary.files != 1 else ''}: "
        f"{stats.get('packets', 0)} packets, {stats.get('complete', 0)} complete; "
        f"{summary.points} points to {args.influx_url} {args.influx_bucket}"
    )
    for path in summary.paths:
        hops = ", ".join(
            f"{name} ({node})" for name, node in zip(path.hop_names, path.hop_nodes, strict=True)
        )
        drops = "".join(f"; {drop.name}" for drop in path.drop_hops)
        print(f"trace {path.trace}: {hops}{drops}")
    return 0
