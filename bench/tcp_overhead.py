"""TCP (or UDP) throughput under tracing, cost by cost (issue 13).

iperf3 c1 -> c2 over the reference VXLAN path (8 hops), or with `--path veth` c1 -> host-a over c1's one
veth (a hop at each end: the issue's 2-hop measurement); conditions interleaved in rounds (order rotated):

- `none`: nothing traces;
- `hops`: the 8 hop programs attached, TCP not tagged (every segment parsed at every hop, none recorded);
- `tag_none`: the 8 hops and the sock_ops tagger, sampling 1 segment in 10^9 (the MSS keeps room for the
  option, sock_ops runs for every segment, none carries the option: the tagger's presence without records);
- `tag_s100`: the 8 hops and the tagger, 1 segment in 100 tagged and recorded;
- `tag_all`: the same, every segment tagged and recorded.

Each ratio is the condition's throughput over the same round's `none`: median, min..max over rounds. With
`--perf COND`, `perf record -a -g` runs during that condition's first iperf3 run and `perf report` prints the
top symbols (finding the cost before changing code). Each run also logs the receiver's TCP counters (nstat in
c2: out-of-order queueing, header prediction hits, coalescing).

    .venv/bin/python bench/tcp_overhead.py --rounds 4 --seconds 5 [--path veth] [--udp] [--perf tag_s100]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from overhead import iperf3

from common import PlanAgent, RecordSink, bpftool_json, log, median, path_agents, path_plans
from hoptrace.lab.reference import set_c1_tagging, spec_plans
from hoptrace.lab.topology import TwoHostTopology

CONDITIONS = ["none", "hops", "tag_none", "tag_s100", "tag_all"]
SAMPLE = {"tag_none": 10**9, "tag_s100": 100}


# Where iperf3's server listens on each path: c2 across the VXLAN path, or host-a's bridge address across
# c1's veth (the issue's measurement: one veth, a hop at each of its ends).
SERVER = {"vxlan": ("c2", None), "veth": ("host-a", "br0")}


def veth_plan(topo: TwoHostTopology, trace: str, dst: str, sample: int, tagging: bool) -> dict[str, Any]:
    """host-a's plan for c1 -> host-a over c1's veth: a hop at each end, tagging (UDP and TCP) as asked."""
    plan = spec_plans(
        {
            "name": trace,
            "filter": {"dst": dst},
            "sample": sample,
            "hops": [
                {"name": "c1-eth0-out", "node": "host-a", "at": "tc-egress", "dev": "eth0", "netns": topo.c1},
                {"name": "a-veth-in", "node": "host-a", "at": "tc-ingress", "dev": "veth-c1"},
            ],
        }
    )["host-a"]
    set_c1_tagging(topo, plan, tagging, tagging)
    return plan


@contextlib.contextmanager
def condition(name: str, topo: TwoHostTopology, workdir: Path, sink: RecordSink, path: str) -> Iterator[None]:
    """Tracing as condition `name` on `path` for the block."""
    if name == "none":
        yield
        return
    sample, tagging = SAMPLE.get(name, 1), name != "hops"
    server, server_iface = SERVER[path]
    dst = topo.addr(server, iface=server_iface)
    if path == "veth":
        agent = PlanAgent(
            veth_plan(topo, f"tcpo-{name.replace('_', '-')}", dst, sample, tagging),
            "host-a",
            topo.host_a,
            sink.addr,
            workdir,
            "--clock-server",
            "off",
        ).start()
        try:
            yield
        finally:
            agent.stop()
        return
    plans = path_plans(
        topo, f"tcpo-{name}", {"dst": dst}, sample=sample, tag_udp=tagging, tcp_tagging=tagging
    )
    with path_agents(topo, sink.addr, workdir, plans):
        yield


@contextlib.contextmanager
def perf_record(out: Path) -> Iterator[None]:
    """`perf record -a -g` for the block."""
    proc = subprocess.Popen(
        ["perf", "record", "-a", "-g", "-o", str(out), "--", "sleep", "3600"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        yield
    finally:
        proc.send_signal(signal.SIGINT)  # perf stops its workload and writes the data
        proc.wait(60)


def perf_top(data: Path, lines: int = 45) -> str:
    """The top symbols of a recording, by self time."""
    out = subprocess.run(
        ["perf", "report", "-i", str(data), "--no-children", "--sort", "sym", "--stdio", "-g", "none"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout
    rows = [line for line in out.splitlines() if line.strip() and not line.startswith("#")]
    return "\n".join(rows[:lines])


def prog_stats() -> dict[str, tuple[int, int]]:
    """(run_time_ns, run_cnt) summed per BPF program name (bpf_stats must be on)."""
    totals: dict[str, tuple[int, int]] = {}
    for prog in bpftool_json("prog", "show"):
        name = prog.get("name", "?")
        t, c = totals.get(name, (0, 0))
        totals[name] = (t + prog.get("run_time_ns", 0), c + prog.get("run_cnt", 0))
    return totals


def stats_growth(before: dict[str, tuple[int, int]], after: dict[str, tuple[int, int]]) -> str:
    """Each program's runs and ns per run between two snapshots, busiest first."""
    rows = []
    for name, (t, c) in after.items():
        t0, c0 = before.get(name, (0, 0))
        if c > c0:
            rows.append((t - t0, name, c - c0))
    rows.sort(reverse=True)
    return "; ".join(f"{name} {runs} runs {total / runs:.0f} ns" for total, name, runs in rows[:8])


# Receiver counters that tell how TCP took the flow (nstat names).
NSTAT_KEYS = ("TcpInSegs", "TcpExtTCPOFOQueue", "TcpExtTCPHPHits", "TcpExtTCPRcvCoalesce")


def nstat(topo: TwoHostTopology, role: str) -> dict[str, int]:
    """The TCP counters of a role's namespace (`nstat -a -z -j`), flattened."""
    out = topo.run(role, "nstat", "-a", "-z", "-j", check=False).stdout
    flat: dict[str, int] = {}
    for table in json.loads(out or "{}").values():
        flat.update(table)
    return flat


def run(
    rounds: int, seconds: int, perf: str | None, conditions: list[str], path: str, udp: bool, bpf_stats: bool
) -> dict[str, Any]:
    """Interleaved rounds of `conditions` (`none` first); throughput ratios to `none`."""
    sink = RecordSink()
    topo = TwoHostTopology(f"tco{os.getpid() % 1000}", overlay="vxlan")
    server, server_iface = SERVER[path]
    raw: list[dict[str, float]] = []
    profiled = False
    # bpf_stats reads the clock twice per program run: a cost of the measurement, so it can be left off.
    subprocess.run(["sysctl", "-qw", f"kernel.bpf_stats_enabled={int(bpf_stats)}"], check=True)

    def measure() -> float:
        return iperf3(topo, seconds, udp=udp, server=server, server_iface=server_iface)

    try:
        topo.create()
        with tempfile.TemporaryDirectory(prefix="hoptrace-tcpo-") as tmp:
            for r in range(rounds):
                order = conditions[r % len(conditions) :] + conditions[: r % len(conditions)]
                measured: dict[str, float] = {}
                for name in order:
                    with condition(name, topo, Path(tmp), sink, path):
                        if name == perf and not profiled:
                            data = Path(tmp) / "perf.data"
                            with perf_record(data):
                                measured[name] = measure()
                            print(f"perf, condition {name}:\n{perf_top(data)}", flush=True)
                            profiled, grown = True, "profiled (no program or TCP counters)"
                        else:
                            before, counters = prog_stats(), nstat(topo, server)
                            measured[name] = measure()
                            programs = stats_growth(before, prog_stats())
                            after = nstat(topo, server)
                            receiver = f"{server} " + ", ".join(
                                f"{k} {after.get(k, 0) - counters.get(k, 0)}" for k in NSTAT_KEYS
                            )
                            grown = "; ".join(filter(None, [programs, receiver]))
                    log(f"round {r + 1} {name}: {measured[name]:.0f} Mbit/s; {grown}")
                raw.append(measured)
    finally:
        subprocess.run(["sysctl", "-qw", "kernel.bpf_stats_enabled=0"], check=False)
        topo.destroy()
        sink.close()
    ratios = {}
    for name in conditions:
        values = [rd[name] / rd["none"] for rd in raw]
        ratios[name] = {"median": median(values), "min": min(values), "max": max(values)}
        mbps = median([rd[name] for rd in raw])
        print(
            f"{name:9s} {mbps:8.0f} Mbit/s  x{ratios[name]['median']:.3f} "
            f"({ratios[name]['min']:.3f}..{ratios[name]['max']:.3f})"
        )
    return {"raw": raw, "ratios": ratios}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--seconds", type=int, default=5)
    ap.add_argument("--perf", choices=CONDITIONS, help="profile this condition's first run")
    ap.add_argument(
        "--conditions", default=",".join(CONDITIONS), help="comma-separated, of " + ", ".join(CONDITIONS)
    )
    ap.add_argument(
        "--path",
        choices=sorted(SERVER),
        default="vxlan",
        help="c1 -> c2 over VXLAN (8 hops) or c1 -> host-a over one veth (2 hops)",
    )
    ap.add_argument(
        "--udp", action="store_true", help="iperf3 UDP (1400-byte datagrams, unlimited rate) instead of TCP"
    )
    ap.add_argument(
        "--no-bpf-stats",
        action="store_true",
        help="leave kernel.bpf_stats_enabled off (no per-program ns: the ratios without its clock reads)",
    )
    args = ap.parse_args()
    conditions = ["none"] + [c for c in args.conditions.split(",") if c and c != "none"]
    unknown = [c for c in conditions if c not in CONDITIONS]
    if unknown:
        ap.error(f"unknown conditions {unknown}: choose from {', '.join(CONDITIONS)}")
    run(args.rounds, args.seconds, args.perf, conditions, args.path, args.udp, not args.no_bpf_stats)
    return 0


if __name__ == "__main__":
    sys.exit(main())
