"""`hoptrace iron`: network softirq CPU per container, as caused by its traffic and as charged to its tasks.

Runs the local agent's ``iron`` preset (``hoptrace-agent iron``, Iron's accounting in eBPF) for a bounded time
and prints, per container (network namespace), the softirq time its packets caused, the softirq time its tasks
were charged because they were the ones interrupted, and the difference. ``--influx-url`` also writes the
``net_cpu`` measurement. A remote ``--node`` runs through the dispatcher (``Hoptrace.RunPreset``).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections.abc import Sequence
from typing import Any

from hoptrace.cli.api import CliError, run_standalone
from hoptrace.cli.mace import agent_binary, is_remote, run_remote_preset
from hoptrace.common.grpcutil import INFLUX_TOKEN_ENV, add_secret_argument, secret_from


def run_iron(
    duration_s: float, host_netns: str | None = None, influx: dict[str, str] | None = None
) -> dict[str, Any]:
    """Account for ``duration_s`` seconds; return {"containers": [...], "tasks": [...], "summary": {...}}."""
    binary = agent_binary()
    if not binary.exists():
        raise RuntimeError(f"{binary} is missing: run `make agent`")
    cmd = [str(binary), "iron", "--duration", f"{duration_s}s"]
    if host_netns:
        cmd += ["--host-netns", host_netns]
    for key, value in (influx or {}).items():
        if value:
            cmd += [f"--influx-{key}", value]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=duration_s + 60)
    if proc.returncode != 0:
        raise RuntimeError(f"hoptrace-agent iron: {proc.stderr.strip()}")
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]
    return {
        "containers": [x for x in lines if x["type"] == "container"],
        "tasks": [x for x in lines if x["type"] == "task"],
        "summary": next(x for x in lines if x["type"] == "summary"),
    }


def report_of_summary(summary: dict[str, Any]) -> dict[str, Any]:
    """A remote run's summary (RunPreset: with per_container, per_task) as run_iron's report."""
    summary = dict(summary)
    return {
        "containers": summary.pop("per_container", None) or [],
        "tasks": summary.pop("per_task", None) or [],
        "summary": summary,
    }


def format_report(report: dict[str, Any]) -> str:
    """Per-container table (ms), then the most charged tasks."""
    s = report["summary"]
    rows = [
        f"Iron on {s['node']}, {s['seconds']:.1f} s (softirq CPU, ms)",
        f"{'container':<28}{'caused':>10}{'charged':>10}{'diff':>10}{'packets':>10}  cgroups",
    ]
    for c in sorted(report["containers"], key=lambda c: -c["charged_ns"] - c["caused_ns"]):
        rows.append(
            f"{c['container'][:27]:<28}{c['caused_ns'] / 1e6:>10.2f}{c['charged_ns'] / 1e6:>10.2f}"
            f"{c['diff_ns'] / 1e6:>10.2f}{c['packets']:>10}  {','.join(c['cgroups'])}"
        )
    rows.append("most charged tasks:")
    for t in report["tasks"][:5]:
        rows.append(
            f"  {t['tgid']:>7} {t['comm']:<16} {t['kind']:<10} {t['container']:<20}"
            f" {t['charged_ns'] / 1e6:.2f}"
        )
    if s.get("influx"):
        rows.append(f"influx: {s['influx']}")
    return "\n".join(rows)


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``iron`` on a subparsers object (cli/main.py)."""
    parser = subparsers.add_parser(
        "iron",
        help="network softirq CPU per container: caused vs charged (Iron)",
        description="Per container: softirq CPU its traffic caused, softirq CPU its tasks were charged.",
    )
    parser.add_argument("--node", help="node (default: this machine; another runs through the dispatcher)")
    parser.add_argument("--duration", type=float, default=10.0, help="seconds to account (default 10)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--host-netns", help="the host's netns (default: the agent's)")
    parser.add_argument("--influx-url", help="write net_cpu to this InfluxDB")
    parser.add_argument("--influx-bucket", default="hoptrace/autogen", help="bucket (1.8: db/rp)")
    parser.add_argument("--influx-org", default="-", help="organization")
    add_secret_argument(parser, "influx-token", INFLUX_TOKEN_ENV, "the InfluxDB token (1.8: USER:PASSWORD)")
    parser.set_defaults(func=cmd_iron)
    return parser


def cmd_iron(args: argparse.Namespace) -> int:
    """Run ``hoptrace iron``: on this machine, or with a remote ``--node`` through the dispatcher."""
    influx = (
        {
            "url": args.influx_url,
            "bucket": args.influx_bucket,
            "org": args.influx_org,
            "token": secret_from(args, "influx-token", INFLUX_TOKEN_ENV),
        }
        if args.influx_url
        else None
    )
    if is_remote(args.node):
        if influx:  # a node's root agent posts only where whoever runs it on the node says
            print("error: --influx-url is for local runs only (run hoptrace iron there)", file=sys.stderr)
            return 2
        remote_args = {"duration": f"{args.duration}s", "host-netns": args.host_netns or ""}
        report = report_of_summary(run_remote_preset(args, "iron", remote_args))
        print(json.dumps(report, indent=2) if args.json else format_report(report))
        return 0
    try:
        report = run_iron(args.duration, args.host_netns, influx)
    except (RuntimeError, subprocess.TimeoutExpired) as error:
        raise CliError(str(error)) from None
    print(json.dumps(report, indent=2) if args.json else format_report(report))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Standalone entry point: ``python -m hoptrace.cli.iron ARGS``."""
    return run_standalone(add_parser, "iron", argv)


if __name__ == "__main__":
    sys.exit(main())
