"""`hoptrace mace`: the latency a container adds to each of its packets (MACE, Misa et al.).

Runs the local agent's ``mace`` preset (``hoptrace-agent mace``), which pairs each packet's container-side
event with the host's outer device event in the kernel, and prints the per-direction overheads, coverage and
collisions. With ``--ping ADDR`` it also pings from inside the container (its own ICMP echo, no ping binary
needed) and prints the **corrected RTT** = container RTT - egress - ingress overhead of the same echo; with
``--compare-host`` the host namespace pings the same address in turn, for the native RTT beside it.

``--node`` other than this machine goes through the dispatcher (``Hoptrace.RunPreset``): that node's agent
runs the preset for ``--duration`` and the same report is printed (``--ping``, ``--packets``: local only).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import select
import signal
import socket
import statistics
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hoptrace.cli.api import CliError, client_of, run_standalone
from hoptrace.common.netns import inet_checksum, netns_path, socket_in_netns

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_AGENT = REPO_ROOT / "agent" / "bin" / "hoptrace-agent"
AGENT_ENV = "HOPTRACE_AGENT"
PATHS = ("inner-dev", "max-dev", "syscalls")


def agent_binary() -> Path:
    """The agent binary: $HOPTRACE_AGENT, else agent/bin/hoptrace-agent of this repository."""
    return Path(os.environ.get(AGENT_ENV) or DEFAULT_AGENT)


@dataclass
class Pinger:
    """ICMP echo over a raw socket in one namespace, with a fixed identifier so MACE can find each echo."""

    netns: str
    dst: str
    ident: int = field(default_factory=lambda: random.randrange(1, 0xFFFF))
    timeout_s: float = 1.0

    def __post_init__(self) -> None:
        self.v6 = ":" in self.dst
        family, proto = (socket.AF_INET6, socket.IPPROTO_ICMPV6) if self.v6 else (socket.AF_INET, 1)
        self.sock = socket_in_netns(netns_path(self.netns), family, socket.SOCK_RAW, proto)

    def close(self) -> None:
        """Close the socket."""
        self.sock.close()

    def echo(self, seq: int) -> int | None:
        """One echo request with sequence ``seq``; the round trip in ns, or None without a reply."""
        request, reply = (128, 129) if self.v6 else (8, 0)
        payload = os.urandom(32)
        header = struct.pack("!BBHHH", request, 0, 0, self.ident, seq & 0xFFFF)
        csum = 0 if self.v6 else inet_checksum(header + payload)  # the kernel fills ICMPv6's (RFC 4443)
        packet = struct.pack("!BBHHH", request, 0, csum, self.ident, seq & 0xFFFF) + payload
        sent = time.monotonic_ns()
        self.sock.sendto(packet, (self.dst, 0))
        deadline = sent + int(self.timeout_s * 1e9)
        while (left := deadline - time.monotonic_ns()) > 0:
            if not select.select([self.sock], [], [], left / 1e9)[0]:
                return None
            data = self.sock.recv(65535)
            now = time.monotonic_ns()
            if not self.v6:
                data = data[(data[0] & 0x0F) * 4 :]  # raw IPv4 sockets deliver the IP header
            if len(data) >= 8:
                kind, _, _, ident, rseq = struct.unpack("!BBHHH", data[:8])
                if kind == reply and ident == self.ident and rseq == seq & 0xFFFF and data[8:] == payload:
                    return now - sent
        return None


class MaceAgent:
    """``hoptrace-agent mace`` as a subprocess: started, read line by line, stopped with SIGINT."""

    def __init__(self, args: Sequence[str], agent: Path | None = None) -> None:
        """Start the agent with these ``mace`` arguments and wait for its "ready" line."""
        binary = agent or agent_binary()
        if not binary.exists():
            raise RuntimeError(f"{binary} is missing: run `make agent`")
        self.proc = subprocess.Popen(
            [str(binary), "mace", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        self.lines: list[dict[str, Any]] = []
        line = self.proc.stdout.readline() if self.proc.stdout else ""
        if not line:
            err = self.proc.stderr.read() if self.proc.stderr else ""
            self.proc.wait()
            raise RuntimeError(f"hoptrace-agent mace failed: {err.strip()}")
        self.ready = json.loads(line)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.strip():
                self.lines.append(json.loads(line))

    def stop(self, timeout_s: float = 10.0) -> dict[str, Any]:
        """Stop tracing (SIGINT) and return the summary line."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._reader.join(timeout_s)
        err = self.proc.stderr.read() if self.proc.stderr else ""
        summary = next((x for x in self.lines if x.get("type") == "summary"), None)
        if summary is None:
            raise RuntimeError(
                f"hoptrace-agent mace ended without a summary (exit {self.proc.returncode}): {err}"
            )
        return summary

    def echoes(self) -> dict[tuple[int, int], dict[str, Any]]:
        """The echo corrections seen so far, by (identifier, sequence)."""
        return {(e["id"], e["seq"]): e for e in list(self.lines) if e.get("type") == "echo"}

    def close(self) -> None:
        """Kill the agent if it still runs (cleanup after a failure)."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@contextlib.contextmanager
def mace_agent(args: Sequence[str], agent: Path | None = None) -> Iterator[MaceAgent]:
    """A running MaceAgent, killed on exit if not stopped."""
    runner = MaceAgent(args, agent)
    try:
        yield runner
    finally:
        runner.close()


def stats_ns(values: Sequence[float]) -> dict[str, float]:
    """count, mean, p50, p99 (nearest rank) of values in ns."""
    if not values:
        return {"count": 0, "mean_ns": 0.0, "p50_ns": 0.0, "p99_ns": 0.0}
    ordered = sorted(values)

    def rank(p: float) -> float:
        return ordered[min(len(ordered), max(1, -(-len(ordered) * p // 100))) - 1]

    return {
        "count": len(ordered),
        "mean_ns": statistics.fmean(ordered),
        "p50_ns": rank(50),
        "p99_ns": rank(99),
    }


def corrected_rtts(
    rtts: dict[int, int | None], echoes: dict[tuple[int, int], dict[str, Any]], ident: int
) -> list[dict[str, int]]:
    """Per echo with a reply and a MACE correction: its RTT, correction and corrected RTT (ns)."""
    out = []
    for seq, rtt in sorted(rtts.items()):
        echo = echoes.get((ident, seq & 0xFFFF))
        if rtt is None or echo is None:
            continue
        out.append(
            {
                "seq": seq,
                "rtt_ns": rtt,
                "correction_ns": echo["correction_ns"],
                "corrected_ns": rtt - echo["correction_ns"],
            }
        )
    return out


def ping_interleaved(
    container: str, host: str | None, dst: str, count: int, interval_s: float
) -> tuple[Pinger, dict[int, int | None], dict[int, int | None]]:
    """Ping ``dst`` ``count`` times from the container and, alternately, from the host netns (if given)."""
    inside = Pinger(container, dst)
    outside = Pinger(host, dst) if host is not None else None
    rtts_c: dict[int, int | None] = {}
    rtts_h: dict[int, int | None] = {}
    try:
        for seq in range(count):
            # Each echo after the same pause: the first packet after an idle gap is slower (idle CPU,
            # cold caches), so back-to-back echoes would bias the comparison.
            rtts_c[seq] = inside.echo(seq)
            time.sleep(interval_s)
            if outside is not None:
                rtts_h[seq] = outside.echo(seq)
                time.sleep(interval_s)
    finally:
        inside.close()
        if outside is not None:
            outside.close()
    return inside, rtts_c, rtts_h


def is_remote(node: str | None) -> bool:
    """Whether ``--node`` names another machine than this one (presets then run through the dispatcher)."""
    return bool(node) and node not in (socket.gethostname(), "localhost")


def run_remote_preset(args: argparse.Namespace, preset: str, preset_args: dict[str, str]) -> dict[str, Any]:
    """Run ``preset`` on ``args.node`` through the dispatcher (RunPreset); its summary object."""
    from hoptrace.v1 import api_pb2

    if not hasattr(args, "dispatcher"):
        raise CliError(f"--node {args.node}: a remote node needs the dispatcher: run `hoptrace {preset}`")
    request = api_pb2.RunPresetRequest(
        node=args.node, preset=preset, args={k: v for k, v in preset_args.items() if v}
    )
    # The dispatcher answers after the preset's duration (plus its own grace for loading and reading).
    result = client_of(args).run_preset(request, args.duration)
    return json.loads(result.summary_json)


def remote_mace_args(args: argparse.Namespace) -> dict[str, str]:
    """The RunPreset args of ``hoptrace mace`` (flags without dashes)."""
    out = {"container": args.container, "path": args.path, "duration": f"{args.duration}s"}
    for flag in ("host_netns", "inner", "outer", "peer"):
        if getattr(args, flag):
            out[flag.replace("_", "-")] = getattr(args, flag)
    return out


def agent_args(args: argparse.Namespace) -> list[str]:
    """The ``hoptrace-agent mace`` arguments for these CLI arguments."""
    out = ["--container", args.container, "--path", args.path]
    for flag in ("host_netns", "inner", "outer", "node"):
        value = getattr(args, flag)
        if value:
            out += [f"--{flag.replace('_', '-')}", value]
    peer = args.peer or args.ping
    if peer:
        out += ["--peer", peer]
    if args.packets:
        out.append("--packets")
    return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Trace (and ping, with --ping); return the report as one dict."""
    with mace_agent(agent_args(args)) as agent:
        report: dict[str, Any] = {}
        if args.ping:
            host = (args.host_netns or "/proc/1/ns/net") if args.compare_host else None
            pinger, rtts_c, rtts_h = ping_interleaved(
                args.container, host, args.ping, args.count, args.interval
            )
            # The agent drains its ring buffer every MacePollInterval and once more when stopped: the
            # last echoes are certain to be there only after the summary.
            report["summary"] = agent.stop()
            corrected = corrected_rtts(rtts_c, agent.echoes(), pinger.ident)
            report["ping"] = {
                "target": args.ping,
                "sent": args.count,
                "container_rtt": stats_ns([r for r in rtts_c.values() if r is not None]),
                "corrected_rtt": stats_ns([c["corrected_ns"] for c in corrected]),
                "corrected_of_rtt": stats_ns([c["rtt_ns"] for c in corrected]),
                "echoes": corrected,
            }
            if rtts_h:
                host_rtts = [r for r in rtts_h.values() if r is not None]
                report["ping"]["host_rtt"] = stats_ns(host_rtts)
                report["ping"]["host_rtts"] = host_rtts
        else:
            deadline = time.monotonic() + args.duration if args.duration else None
            try:
                while deadline is None or time.monotonic() < deadline:
                    time.sleep(0.1)
            except KeyboardInterrupt:
                pass
        if "summary" not in report:
            report["summary"] = agent.stop()
        if args.packets:
            report["packets"] = [x for x in agent.lines if x.get("type") == "packet"]
    return report


def _us(ns: float) -> str:
    return f"{ns / 1000:.1f}"


def format_report(report: dict[str, Any]) -> str:
    """The report as a table."""
    s = report["summary"]
    lines = [
        f"MACE {s['path']} on {s['node']}: container {s['container']} "
        f"(inner {s['inner']['name']}, outer {s['outer']['name']}: {s['outer']['resolved']}),"
        f" {s['seconds']:.1f} s",
        f"{'direction':<10}{'packets':>9}{'mean µs':>10}{'p50 µs':>9}{'p99 µs':>9}"
        f"{'coverage':>10}{'collisions':>12}",
    ]
    for name in ("egress", "ingress"):
        d = s[name]
        lines.append(
            f"{name:<10}{d['count']:>9}{_us(d['mean_ns']):>10}{_us(d['p50_ns']):>9}{_us(d['p99_ns']):>9}"
            f"{d['coverage'] * 100:>9.1f}%{d['collisions']:>12}"
        )
    ping = report.get("ping")
    if ping:
        lines.append(f"ping {ping['target']}: {ping['container_rtt']['count']}/{ping['sent']} replies")
        rows = [("container RTT", ping["container_rtt"]), ("corrected RTT", ping["corrected_rtt"])]
        if "host_rtt" in ping:
            rows.append(("host RTT", ping["host_rtt"]))
        for label, st in rows:
            lines.append(
                f"  {label:<15} mean {_us(st['mean_ns'])} µs"
                f"  p50 {_us(st['p50_ns'])}  p99 {_us(st['p99_ns'])}"
            )
    return "\n".join(lines)


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``mace`` on a subparsers object (cli/main.py)."""
    parser = subparsers.add_parser(
        "mace",
        help="latency a container adds to each packet (MACE)",
        description="Per-packet egress and ingress overhead of a container, on MACE's event paths.",
    )
    parser.add_argument(
        "--container",
        required=True,
        metavar="NETNS_OR_PID",
        help="netns name/path or a PID in it; with --node also container:NAME or pod:NAMESPACE/NAME",
    )
    parser.add_argument("--path", choices=PATHS, default="inner-dev", help="event path (default inner-dev)")
    parser.add_argument("--node", help="node (default: this machine; another runs through the dispatcher)")
    parser.add_argument(
        "--duration", type=float, default=10.0, help="seconds to trace without --ping (default 10)"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--host-netns", help="the container host's netns (default: the agent's)")
    parser.add_argument("--inner", help="container-side device (default: its default route's device)")
    parser.add_argument("--outer", help="host device toward the wire (default: host route to --peer)")
    parser.add_argument("--peer", help="address to resolve the outer device by (default: --ping's)")
    parser.add_argument("--ping", metavar="ADDR", help="ping ADDR from the container and correct its RTTs")
    parser.add_argument("--count", type=int, default=100, help="echo requests with --ping (default 100)")
    parser.add_argument("--interval", type=float, default=0.01, help="seconds between echoes (default 0.01)")
    parser.add_argument(
        "--compare-host", action="store_true", help="also ping from the host netns, alternately"
    )
    parser.add_argument("--packets", action="store_true", help="include every packet (with --json)")
    parser.set_defaults(func=cmd_mace)
    return parser


def cmd_mace(args: argparse.Namespace) -> int:
    """Run ``hoptrace mace``: on this machine, or with a remote ``--node`` through the dispatcher."""
    if is_remote(args.node):
        if args.ping or args.packets:
            raise CliError(f"--node {args.node}: --ping and --packets run on this machine only")
        report = {"summary": run_remote_preset(args, "mace", remote_mace_args(args))}
        print(json.dumps(report, indent=2) if args.json else format_report(report))
        return 0
    if args.container.startswith(("container:", "pod:")):
        # Names of workloads are the agents' inventories, which the dispatcher holds: not this process.
        raise CliError(
            f"--container {args.container}: a container or pod is resolved by the dispatcher from "
            "the node's inventory: add --node NODE (and the dispatcher's flags), or pass its netns or a PID"
        )
    try:
        report = run(args)
    except RuntimeError as error:
        raise CliError(str(error)) from None
    print(json.dumps(report, indent=2) if args.json else format_report(report))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Standalone entry point: ``python -m hoptrace.cli.mace ARGS``."""
    return run_standalone(add_parser, "mace", argv)


if __name__ == "__main__":
    sys.exit(main())
