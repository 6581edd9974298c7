"""vNetTracer case study 3, the container overlay: container to container over VXLAN versus host to host.

One VXLAN TwoHostTopology carries both flows on the same wire (the veth pair host-a wire0 - host-b wire0):
- **overlay**: sockperf c1 -> c2 (the containers' addresses), traced on the 8 hops of ``hoptrace demo``'s
  VXLAN path (``vxlan_path_spec``: c1 eth0, veth-c1, vxlan0, wire0 on host-a; wire0, vxlan0, veth-c2, c2
  eth0 on host-b), trace ``co-overlay``;
- **host**: sockperf host-a -> host-b (the wire0 addresses, no container, no tunnel), traced on the hosts'
  own wire0 (host-a egress, host-b ingress), trace ``co-host``.
Hops in examples/case-studies/container-overlay{,-host}.yaml. Same sockperf load (UDP ping-pong, --mps).
Before the traces exist (so the agents' records add no loopback traffic): an idle interval (the background
softirq rate), sockperf over each path and an iperf3 TCP stream over each (throughput, vNetTracer's Fig. 12),
with the NET_RX and NET_TX softirqs per CPU before and after each, counted by hoptrace itself (an
events-only trace, co-softirqs: irq:softirq_entry where vec == 3 / 2, count by cpu). Then sockperf again
under each trace.
Writes bench/results/<time>-container-overlay.json (everything).

    sudo .venv/bin/python bench/case_container_overlay.py [--seconds 8] [--mps 1000] [--iperf-seconds 3] \\
        [--path overlay|host ...]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime
from typing import Any

from case_common import (
    REPO,
    SOCKPERF_PORT,
    TwoHostTopology,
    report,
    require_root,
    sockperf,
    spec,
    traced_topology,
)

from hoptrace.lab.reference import vxlan_path_spec
from hoptrace.spec import load_spec

RESULTS = REPO / "bench" / "results"
HOST_HOPS = [
    ("a-wire-out", "host-a", "tc-egress", "wire0", ""),
    ("b-wire-in", "host-b", "tc-ingress", "wire0", ""),
]
# The overlay's segments, named by what the packet goes through between the two hops.
OVERLAY_SEGMENTS = {
    "a-c1-eth0-out>a-veth-in": "veth c1 → host-a (backlog)",
    "a-veth-in>a-vxlan-out": "bridge + routing, host-a",
    "a-vxlan-out>a-wire-out": "VXLAN encapsulation",
    "a-wire-out>b-wire-in": "wire",
    "b-wire-in>b-vxlan-in": "VXLAN decapsulation",
    "b-vxlan-in>b-veth-out": "routing + bridge, host-b",
    "b-veth-out>b-c2-eth0-in": "veth host-b → c2",
}
IPERF_PORT = 5301
SOFTIRQS = ("NET_RX", "NET_TX")


SOFTIRQ_SPEC = REPO / "examples" / "case-studies" / "container-overlay-softirqs.yaml"
SOFTIRQ_EVENTS = {"net-rx": "NET_RX", "net-tx": "NET_TX"}


class SoftirqCounter:
    """NET_RX and NET_TX handler runs per CPU, counted by hoptrace's event probes (irq:softirq_entry, trace
    co-softirqs, examples/case-studies/container-overlay-softirqs.yaml): cumulative since the trace was
    applied, read from `hoptrace report --json`."""

    def __init__(self, cluster: Any) -> None:
        self.cluster = cluster
        cluster.apply(load_spec(SOFTIRQ_SPEC.read_text()))

    def _totals(self) -> dict[str, list[int]]:
        data = json.loads(self.cluster.hoptrace("report", "co-softirqs", "--since", "1h", "--json").stdout)
        cpus = os.cpu_count() or 1
        counts = {name: [0] * cpus for name in SOFTIRQ_EVENTS.values()}
        for event in data.get("events", []):
            name = SOFTIRQ_EVENTS.get(event["name"])
            for cpu, n in (event["by"] if name else {}).items():
                counts[name][int(cpu)] += n
        return counts

    def __call__(self) -> dict[str, list[int]]:
        """The counts as of the agent's first counters sample after this call: they come once a second,
        so wait until the report moves past what it said at the call, at most 3 s."""
        first = self._totals()
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            time.sleep(0.25)
            now = self._totals()
            if now != first:
                return now
        return first


def softirq_delta(before: dict[str, list[int]], after: dict[str, list[int]]) -> dict[str, list[int]]:
    """After - before, per softirq and CPU."""
    return {k: [a - b for a, b in zip(after[k], before[k], strict=True)] for k in SOFTIRQS}


def iperf3(
    topo: TwoHostTopology, client: str, server: str, seconds: float, softirqs: SoftirqCounter
) -> dict[str, Any]:
    """One iperf3 TCP stream ``client`` -> ``server``: received Gbit/s and the softirqs meanwhile."""
    srv = topo.popen(
        server,
        "iperf3",
        "-s",
        "-1",
        "-p",
        str(IPERF_PORT),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        time.sleep(0.5)
        before, start = softirqs(), time.monotonic()
        out = topo.run(
            client, "iperf3", "-c", topo.addr(server), "-p", str(IPERF_PORT), "-t", str(int(seconds)), "-J",
            timeout=seconds + 30,
        ).stdout  # fmt: skip
        delta = softirq_delta(before, softirqs())  # the window: from one counters sample to another
        elapsed = time.monotonic() - start
    finally:
        if srv.poll() is None:
            srv.send_signal(signal.SIGINT)
        srv.wait(5)
    end = json.loads(out)["end"]
    received = end["sum_received"]
    return {
        "gbit_per_s": received["bits_per_second"] / 1e9,
        "bytes": received["bytes"],
        "retransmits": end["sum_sent"].get("retransmits", 0),
        "seconds": elapsed,
        "softirqs": delta,
    }


def overlay_spec(topo: TwoHostTopology, name: str) -> Any:
    """The c1 -> c2 sockperf flow on the VXLAN path (the demo's 8 hops)."""
    return vxlan_path_spec(topo, name, port=SOCKPERF_PORT)


def host_spec(topo: TwoHostTopology, name: str) -> Any:
    """The host-a -> host-b sockperf flow on the hosts' wire0."""
    return spec(name, topo, HOST_HOPS, src=topo.addr("host-a"), dst=topo.addr("host-b"))


def counted_sockperf(
    topo: TwoHostTopology, client: str, server: str, seconds: float, mps: int, softirqs: SoftirqCounter
) -> dict[str, Any]:
    """sockperf ``client`` -> ``server``: its numbers and the softirqs during the run."""
    before, start = softirqs(), time.monotonic()
    app = sockperf(topo, seconds, mps, client=client, server=server)
    delta = softirq_delta(before, softirqs())  # the window: from one counters sample to another
    elapsed = time.monotonic() - start
    return {"sockperf": app, "softirqs": delta, "seconds": elapsed, "round_trips": int(mps * int(seconds))}


PATHS = {"overlay": ("c1", "c2"), "host": ("host-a", "host-b")}
PATH_SPECS = {"overlay": overlay_spec, "host": host_spec}


def run(
    seconds: float = 8, mps: int = 1000, iperf_seconds: float = 3, paths: list[str] | None = None
) -> dict[str, Any]:
    """The `paths` (default: both of PATHS) on one VXLAN topology.

    Untraced first (no trace applied, so the agents send nothing): the idle softirq rate, sockperf and
    iperf3 over each path with the softirqs they cause. Then each path's sockperf again under its trace.
    """
    selected = {path: ends for path, ends in PATHS.items() if paths is None or path in paths}
    with traced_topology("vxlan") as (topo, cluster):
        softirqs = SoftirqCounter(cluster)
        before, start = softirqs(), time.monotonic()
        time.sleep(2)
        idle_delta = softirq_delta(before, softirqs())
        idle = {"seconds": time.monotonic() - start, "softirqs": idle_delta}
        untraced = {
            path: counted_sockperf(topo, client, server, max(seconds / 2, 2), mps, softirqs)
            for path, (client, server) in selected.items()
        }
        throughput = {}
        if iperf_seconds > 0:
            throughput = {
                path: iperf3(topo, client, server, iperf_seconds, softirqs)
                for path, (client, server) in selected.items()
            }
        for path in selected:
            cluster.apply(PATH_SPECS[path](topo, f"co-{path}"))
        traced = {}
        for path, (client, server) in selected.items():
            app = sockperf(topo, seconds, mps, client=client, server=server)
            traced[path] = {"sockperf": app, "report": report(cluster, f"co-{path}", app)}
    return {"mps": mps, "idle": idle, "untraced": untraced, "iperf3": throughput, "traced": traced}


def _per_s(delta: dict[str, list[int]], seconds: float) -> dict[str, float]:
    return {k: sum(v) / seconds for k, v in delta.items()}


def net_softirqs(run: dict[str, Any], idle: dict[str, Any]) -> dict[str, Any]:
    """A run's NET_RX/NET_TX: per CPU as counted, and the total less the idle background rate."""
    idle_rate = _per_s(idle["softirqs"], idle["seconds"])
    return {
        k: {"per_cpu": run["softirqs"][k], "net": sum(run["softirqs"][k]) - idle_rate[k] * run["seconds"]}
        for k in SOFTIRQS
    }


def _seg(s: dict[str, Any]) -> str:
    return f"{s['mean_ns'] / 1e3:.1f} / {s['p99_ns'] / 1e3:.1f}"


def _rtt(app: dict[str, float]) -> str:
    return f"{app.get('avg_us', 0):.1f} / {app.get('p50.000_us', 0):.1f} / {app.get('p99.000_us', 0):.1f}"


def table(result: dict[str, Any]) -> str:
    """Markdown tables: the overlay's segments, the paths side by side, per-hop rates, softirqs, iperf3."""
    traced_paths = result["traced"]
    lines = ["| segment (overlay c1 → c2) | mean / p99 µs | count |", "|---|---|---|"]
    for s in traced_paths.get("overlay", {}).get("report", {}).get("segments", []):
        label = OVERLAY_SEGMENTS.get(f"{s['from']}>{s['to']}", f"{s['from']} → {s['to']}")
        lines.append(f"| {label} (`{s['from']}` → `{s['to']}`) | {_seg(s)} | {s['count']} |")
    for s in traced_paths.get("host", {}).get("report", {}).get("segments", []):
        lines.append(f"| host path: wire (`{s['from']}` → `{s['to']}`) | {_seg(s)} | {s['count']} |")
    lines += [
        "",
        "| path | sockperf RTT avg / p50 / p99 µs, traced | untraced | device path one way mean / p99 µs "
        "| complete / packets | NET_RX per round trip, untraced (net of idle) | NET_RX per CPU (raw) |",
        "|---|---|---|---|---|---|---|",
    ]
    for path, label in (("overlay", "overlay c1 → c2"), ("host", "host-a → host-b")):
        if path not in traced_paths:
            continue
        traced, untraced = traced_paths[path], result["untraced"][path]
        rep = traced["report"]
        irq = net_softirqs(untraced, result["idle"])
        lines.append(
            f"| {label} | {_rtt(traced['sockperf'])} | {_rtt(untraced['sockperf'])}"
            f" | {_seg(rep['end_to_end'])} | {rep['complete']} / {rep['packets']} "
            f"| {irq['NET_RX']['net'] / untraced['round_trips']:.2f} | {irq['NET_RX']['per_cpu']} |"
        )
    lines += ["", "| hop | packets/s | bytes/s | bytes/packet |", "|---|---|---|---|"]
    for p in traced_paths.values():
        for h in p["report"]["hops"]:
            pps, bps = h["packets_per_s"], h["bytes_per_s"]
            lines.append(f"| `{h['hop']}` | {pps:.0f} | {bps:.0f} | {bps / pps if pps else 0:.0f} |")
    if result["iperf3"]:
        lines += [
            "",
            "| iperf3 TCP, untraced | Gbit/s | retransmits | NET_RX per CPU (raw) "
            "| NET_RX per MB (net of idle) |",
            "|---|---|---|---|---|",
        ]
        for label, t in result["iperf3"].items():
            irq = net_softirqs(t, result["idle"])
            mb = t["bytes"] / 1e6
            lines.append(
                f"| {label} | {t['gbit_per_s']:.2f} | {t['retransmits']} | {irq['NET_RX']['per_cpu']} "
                f"| {irq['NET_RX']['net'] / mb:.2f} |"
            )
    idle = result["idle"]
    lines.append(f"\nidle background: {json.dumps(_per_s(idle['softirqs'], idle['seconds']))} per s")
    return "\n".join(lines)


def main() -> int:
    """Command line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=8, help="sockperf run per path (default 8)")
    parser.add_argument("--mps", type=int, default=1000, help="sockperf messages per second (default 1000)")
    parser.add_argument("--iperf-seconds", type=float, default=3, help="iperf3 per path, 0: none (default 3)")
    parser.add_argument(
        "--path",
        action="append",
        choices=list(PATHS),
        help="measure this path only (repeatable; default: both)",
    )
    parser.add_argument("--json", action="store_true", help="print everything as JSON instead of the tables")
    args = parser.parse_args()
    require_root()
    result = run(args.seconds, args.mps, args.iperf_seconds, args.path)
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / (datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ") + "-container-overlay.json")
    path.write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=2) if args.json else f"{table(result)}\nwrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
