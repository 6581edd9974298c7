"""Many traces on the same devices: how hoptrace's cost grows with the number of applied traces.

One emulated host (TwoHostTopology's host-a, its agent in a LocalCluster) and the flow c1 -> host-a over c1's
veth. Every trace has the same three hops on that flow's way: tc egress of c1's eth0, the
`net:netif_receive_skb` tracepoint on host-a's veth-c1 (a `tp_btf` program, the kernel-hook kind this kernel
has: no kprobes here) and tc ingress of veth-c1. One trace matches the flow (src c1, any protocol and port,
`sample: 100` by default); the others name c1 and another destination port each (every hop parses the packet
down to its ports before it refuses it), half of them UDP, half TCP (a TCP trace also puts its sock_ops
tagger on c1's namespace).

For each number of traces N (1, 10, 50, 200), in one run, side by side:

- untraced: iperf3 TCP and UDP c1 -> host-a (pinned: client CPU 0, server CPU 1), no trace applied;
- apply: N traces one after another, each `ApplyTrace` timed (it returns once the agent has loaded and
  attached the trace's hops: apply -> active); the Nth trace's time is that of a node that already runs N-1.
  The first trace the agent cannot attach ends the applies: on tcx the 64th program on a device and direction
  is refused (ERANGE), so N = 200 runs with 63 without `--hooks`;
- idle: the agent's CPU share and RSS with N traces and no traffic, and its programs' and maps' kernel memory
  (with `--perf`, then a profile of the idle agent alone);
- in place: with `kernel.bpf_stats_enabled`, sockperf UDP c1 -> host-a at a fixed rate, then iperf3 TCP: the
  per-packet BPF cost at each hook is the sum of `run_time_ns` of every program there over the packets that
  crossed it (`run_cnt` of one of them: every program of a tcx chain and of a tracepoint runs once per
  packet). Which program belongs to which hook: tcx links by their attach type (the agent's link fdinfo),
  the tracepoint and sock_ops programs by name. With `--perf`, `perf record -a -g` meanwhile;
- traced: iperf3 TCP and UDP again (bpf_stats off), the agent's CPU and RSS meanwhile, and the records the
  collector received (`hoptrace_collector_records_received_total`) per second;
- the N traces deleted, and the next N's untraced runs bracket this N's traced runs: each ratio is the traced
  throughput over the mean of the untraced runs either side.

All of it twice: with every hop its own program, and with the agent's `--hooks` (docs/design.md, "Many
traces on a device"), where the tc hops of every trace at a device and direction are slots of one program,
the tracepoint hops of every trace at a device and event slots of one program, and the TCP taggers of
every trace in a cgroup slots of one sock_ops program.

The per-packet cost in place is the figure to draw conclusions from: it counts only the programs' own CPU
time (run in softirq, not preempted), so a neighbour's load on this 2-vCPU machine moves it little, while a
throughput ratio moves with every neighbour (docs/benchmarks.md, "How costs are measured").

    .venv/bin/python bench/many_traces.py [--traces 1,10,50,200] [--seconds 5] [--sample 100] \
        [--modes programs,hooks] [--perf] [--json]
    .venv/bin/python bench/run.py --full --only many_traces   # --quick: 1 and 2 traces, TCP alone

Targets (reported, not asserted): 200 non-matching traces on a device cost at most twice one trace per
packet; the 200-trace node's agent at most 2 % of a core idle and 100 MB RSS.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
from overhead import iperf3
from tcp_overhead import perf_record

from common import (
    BenchContext,
    UsageSampler,
    bpf_stats_enabled,
    bpftool_json,
    log,
    median,
    metric_sum,
    start_cluster_agent,
    target,
)
from hoptrace.lab.localcluster import LocalCluster, writable_bpf_cache
from hoptrace.lab.prometheus import scrape
from hoptrace.lab.topology import TwoHostTopology
from hoptrace.lab.workloads import sockperf
from hoptrace.v1 import api_pb2, trace_pb2

FULL_TRACES = (1, 10, 50, 200)
QUICK_TRACES = (1, 2)
# The non-matching traces' destination ports: one each, none the flow's (iperf3 5201, sockperf 11111).
OTHER_PORTS = 20000
SOCKPERF_PORT = 11111
IN_PLACE_MPS = 20_000
PINNED = (0, 1)  # iperf3's client and server CPUs
# After a traced run, until the agent has shipped its last records (it reads its ring every 100 ms at most).
FLUSH_S = 0.5
# The hooks every trace puts a program on, in the flow's order: (label, how its programs are found).
HOOKS = ("c1 eth0 tc egress", "veth-c1 netif_receive_skb", "veth-c1 tc ingress", "c1 sock_ops")
# Each hook's programs: tcx links by attach type (enum bpf_attach_type: BPF_TCX_INGRESS 46, BPF_TCX_EGRESS
# 47), the others by program name.
TCX_ATTACH_TYPE = {"c1 eth0 tc egress": 47, "veth-c1 tc ingress": 46}
SERVED = HOOKS  # the targets' hooks: those --hooks serves
PROGRAM_NAMES = {
    "veth-c1 netif_receive_skb": ("hop_tp_btf", "hook_tp_btf"),
    "c1 sock_ops": ("tag_tcp", "hook_sock_ops"),
}


def trace_spec(topo: TwoHostTopology, index: int, sample: int) -> trace_pb2.TraceSpec:
    """Trace `index` of a run: 0 matches every flow from c1 (any protocol and port), the others each another
    destination port, UDP for odd indexes and TCP for even ones (a packet of the flows is refused at its
    protocol or its port, after the whole parse)."""
    if index == 0:
        filter_ = trace_pb2.Filter(src=topo.addr("c1"))
    else:
        filter_ = trace_pb2.Filter(
            protocol="udp" if index % 2 else "tcp",
            src=topo.addr("c1"),
            dst_port=OTHER_PORTS + index,
        )
    hops = [
        ("c1-out", "tc-egress", "eth0", topo.c1),
        ("a-veth-rx", "tracepoint:net:netif_receive_skb", "veth-c1", ""),
        ("a-veth-in", "tc-ingress", "veth-c1", ""),
    ]
    return trace_pb2.TraceSpec(
        name=f"many-{index:03d}",
        filter=filter_,
        sample=sample if index == 0 else 1,
        hops=[trace_pb2.HopSpec(name=n, node="host-a", at=at, dev=dev, netns=ns) for n, at, dev, ns in hops],
    )


@contextlib.contextmanager
def one_host_cluster(ctx: BenchContext, topo: TwoHostTopology, hooks: bool) -> Iterator[LocalCluster]:
    """Dispatcher, collector and host-a's agent (owning c1's namespace; `hooks`: with --hooks), objects
    from the lab's BPF cache."""
    cluster = LocalCluster(
        influx_url=ctx.influx().url, workdir=ctx.workdir / "many-traces", bpf_cache_dir=writable_bpf_cache()
    )
    try:
        cluster.start_dispatcher()
        cluster.start_collector()
        cluster.wait_listening()
        start_cluster_agent(
            cluster, "host-a", topo.host_a, "--netns-owned", topo.c1, *(["--hooks"] if hooks else [])
        )
        cluster.wait_agents(["host-a"])
        yield cluster
    finally:
        cluster.stop()


def fdinfo(pid: int) -> list[dict[str, str]]:
    """The fdinfo of every BPF object (map, program, link) `pid` holds an fd of."""
    out = []
    for fd in os.listdir(f"/proc/{pid}/fdinfo"):
        with contextlib.suppress(OSError), open(f"/proc/{pid}/fdinfo/{fd}") as f:
            info = {k.strip(): v.strip() for k, _, v in (line.partition(":") for line in f)}
            if {"map_id", "prog_id", "link_id"} & info.keys():
                out.append(info)
    return out


def hook_programs(agent_pid: int) -> dict[str, set[int]]:
    """hook -> ids of the agent's programs there."""
    hooks: dict[str, set[int]] = {hook: set() for hook in HOOKS}
    held = set()
    for info in fdinfo(agent_pid):
        if "link_id" not in info and "prog_id" in info:
            held.add(int(info["prog_id"]))
        if info.get("link_type") == "tcx":
            for hook, attach_type in TCX_ATTACH_TYPE.items():
                if info.get("attach_type", "").split(" ")[0] == str(attach_type):
                    hooks[hook].add(int(info["prog_id"]))
    for prog in bpftool_json("prog", "show"):
        for hook, names in PROGRAM_NAMES.items():
            if prog["id"] in held and prog.get("name") in names:
                hooks[hook].add(prog["id"])
    return hooks


def kernel_bytes(agent_pid: int) -> int:
    """Kernel memory of the agent's BPF programs and maps (`bytes_memlock`, charged to its cgroup)."""
    infos = fdinfo(agent_pid)
    progs = {int(i["prog_id"]) for i in infos if "prog_id" in i and "link_id" not in i}
    maps = {int(i["map_id"]) for i in infos if "map_id" in i}
    return sum(p.get("bytes_memlock", 0) for p in bpftool_json("prog", "show") if p["id"] in progs) + sum(
        m.get("bytes_memlock", 0) for m in bpftool_json("map", "show") if m["id"] in maps
    )


def run_stats(ids: set[int]) -> dict[int, tuple[int, int]]:
    """program id -> (run_time_ns, run_cnt) now."""
    return {
        p["id"]: (p.get("run_time_ns", 0), p.get("run_cnt", 0))
        for p in bpftool_json("prog", "show")
        if p["id"] in ids
    }


def per_packet_cost(
    hooks: dict[str, set[int]], before: dict[int, tuple[int, int]], after: dict[int, tuple[int, int]]
) -> dict[str, dict[str, Any]]:
    """Each hook's BPF ns per packet (all its programs' run time over the packets, the most runs of one of
    them) and its programs' ns per run."""
    out: dict[str, dict[str, Any]] = {}
    for hook, ids in hooks.items():
        runs = {i: after[i][1] - before[i][1] for i in ids if i in before and i in after}
        ns = {i: after[i][0] - before[i][0] for i in runs}
        packets = max(runs.values(), default=0)
        per_run = sorted(ns[i] / runs[i] for i in runs if runs[i])
        out[hook] = {
            "programs": len(ids),
            "packets": packets,
            "ns_per_packet": sum(ns.values()) / packets if packets else None,
            "ns_per_run_median": median(per_run),
        }
    return out


def throughput(topo: TwoHostTopology, seconds: int, udp: bool) -> float:
    """iperf3 c1 -> host-a's bridge address, pinned, in Mbit/s."""
    return iperf3(topo, seconds, udp, server="host-a", server_iface="br0", cpus=PINNED)


def records_received(cluster: LocalCluster) -> float:
    """Records the collector has received so far."""
    return metric_sum(scrape(cluster.metrics_addr("collector")), "hoptrace_collector_records_received_total")


def traced_throughput(
    cluster: LocalCluster, topo: TwoHostTopology, agent_pid: int, seconds: int, udp: bool
) -> dict[str, Any]:
    """One traced iperf3 run: Mbit/s, the agent's CPU and peak RSS meanwhile, records/s at the collector."""
    before = records_received(cluster)
    sampler = UsageSampler(agent_pid)
    t0 = time.monotonic()
    mbps = throughput(topo, seconds, udp)
    usage = sampler.stop()
    elapsed = time.monotonic() - t0
    time.sleep(FLUSH_S)
    records = records_received(cluster) - before
    if not records:
        raise RuntimeError(
            f"the collector received no records of the matching trace ({'UDP' if udp else 'TCP'})"
        )
    return {
        "mbps": mbps,
        "agent_cpu": usage["cpu_cores"],
        "agent_rss": usage["peak_rss_bytes"],
        "records_per_s": records / elapsed,
    }


def untraced(topo: TwoHostTopology, seconds: int, protocols: tuple[str, ...]) -> dict[str, float]:
    """Mbit/s of each of `protocols` ("tcp", "udp") with nothing traced."""
    return {proto: throughput(topo, seconds, proto == "udp") for proto in protocols}


def apply_traces(
    cluster: LocalCluster, topo: TwoHostTopology, count: int, sample: int
) -> tuple[list[float], str]:
    """Apply traces 0..count-1 one after another: each apply's seconds (apply -> active on the agent), and
    the dispatcher's refusal of the first one the agent could not attach ("" when all were), after which
    none more is tried. On tcx, the 64th program on a device and direction is refused (ERANGE: the kernel's
    bpf_mprog holds at most 63)."""
    times = []
    for index in range(count):
        t0 = time.monotonic()
        try:
            trace = cluster.apply(trace_spec(topo, index, sample), timeout_s=120)
        except grpc.RpcError as err:
            if err.code() != grpc.StatusCode.FAILED_PRECONDITION:
                raise
            return times, f"trace {index}: {err.details()}"
        times.append(time.monotonic() - t0)
        if not all(node.active for node in trace.nodes):
            raise RuntimeError(f"trace {index} applied but not active: {trace.nodes}")
    return times, ""


def delete_traces(cluster: LocalCluster, count: int) -> float:
    """Delete traces 0..count-1; the seconds it took."""
    t0 = time.monotonic()
    for index in range(count):
        cluster.api().DeleteTrace(api_pb2.DeleteTraceRequest(name=f"many-{index:03d}"), timeout=120)
    return time.monotonic() - t0


# perf symbols of the hooks' work, by what they do (perf_profile's summary).
PERF_KINDS = {
    "hop programs": ("bpf_prog_",),
    "tracepoint dispatch": ("bpf_trace_run", "__traceiter_", "__bpf_trace_"),
    "tracepoint hops' packet copy": ("bpf_probe_read_kernel", "copy_from_kernel_nofault"),
    "return and indirect-call thunks": ("srso_", "__x86_return_thunk", "__x86_indirect_thunk"),
}


def perf_profile(topo: TwoHostTopology, seconds: int, workdir: Path, lines: int = 25) -> dict[str, Any]:
    """`perf record -a -g` while sockperf sends UDP at the in-place rate (bpf_stats off), read in sockperf's
    processes, whose softirqs run the hooks (veth hands a packet to its peer's backlog, processed on the
    sender's CPU): each PERF_KINDS's share of their kernel samples, and the top kernel symbols."""
    data = workdir / "many-traces-perf.data"
    with perf_record(data):
        sockperf(
            topo, "throughput", seconds, "--mps", str(IN_PLACE_MPS), "-m", "64",
            server="host-a", port=SOCKPERF_PORT,
        )  # fmt: skip
    out = subprocess.run(
        ["perf", "report", "-i", str(data), "--comm", "sockperf", "--no-children", "--sort", "sym", "--stdio",
         "-g", "none", "--percentage", "relative"],
        capture_output=True, text=True, check=False,
    ).stdout  # fmt: skip
    data.unlink(missing_ok=True)
    rows = [row.split(None, 2) for row in out.splitlines() if row.strip() and not row.startswith("#")]
    # The kernel's part only: sockperf's client spins between sends at a fixed rate.
    kernel = [(float(r[0].rstrip("%")), r[2]) for r in rows if len(r) == 3 and r[1] == "[k]"]
    total = sum(share for share, _ in kernel) or 1.0
    shares = [(share * 100 / total, sym) for share, sym in kernel]
    kinds = {
        kind: sum(share for share, sym in shares if sym.startswith(prefixes))
        for kind, prefixes in PERF_KINDS.items()
    }
    return {"kinds": kinds, "top": [f"{share:5.2f}%  {sym}" for share, sym in shares[:lines]]}


def idle_profile(agent_pid: int, seconds: float, workdir: Path, lines: int = 25) -> list[str]:
    """`perf record -g` of the idle agent alone: the functions its idle CPU goes to, by their share with
    what they call (Go keeps frame pointers, so the call graph needs no DWARF), the agent's own first."""
    data = workdir / "many-traces-idle.data"
    subprocess.run(
        ["perf", "record", "-g", "-p", str(agent_pid), "-o", str(data), "--", "sleep", str(seconds)],
        capture_output=True, check=False,
    )  # fmt: skip
    out = subprocess.run(
        ["perf", "report", "-i", str(data), "--children", "--sort", "sym", "--stdio", "-g", "none",
         "--percentage", "relative"],
        capture_output=True, text=True, check=False,
    ).stdout  # fmt: skip
    data.unlink(missing_ok=True)
    rows = [row.split(None, 3) for row in out.splitlines() if row.strip() and not row.startswith("#")]
    shares = [(r[0], r[1], r[3]) for r in rows if len(r) == 4 and r[0].endswith("%")]
    own = [f"{total:>7}  {sym}" for total, _, sym in shares if "hoptrace/" in sym][:lines]
    by_self = sorted(shares, key=lambda row: -float(row[1].rstrip("%")))[: lines // 2]
    return own + ["", "by its own time:"] + [f"{own_share:>7}  {sym}" for _, own_share, sym in by_self]


def in_place(topo: TwoHostTopology, agent_pid: int, seconds: int) -> dict[str, Any]:
    """Per-packet BPF cost at each hook: UDP at a fixed rate for the tc and tracepoint hooks, then TCP for the
    sock_ops taggers."""
    hooks = hook_programs(agent_pid)
    ids = set().union(*hooks.values())
    with bpf_stats_enabled():
        s0 = run_stats(ids)
        sockperf(
            topo, "throughput", seconds, "--mps", str(IN_PLACE_MPS), "-m", "64",
            server="host-a", port=SOCKPERF_PORT,
        )  # fmt: skip
        s1 = run_stats(ids)
        throughput(topo, max(1, seconds // 2), udp=False)
        s2 = run_stats(ids)
    udp_hooks = {h: v for h, v in hooks.items() if h != "c1 sock_ops"}
    cost = per_packet_cost(udp_hooks, s0, s1)
    cost |= per_packet_cost({"c1 sock_ops": hooks["c1 sock_ops"]}, s1, s2)
    if missing := [hook for hook, c in cost.items() if not c["packets"]]:
        raise RuntimeError(f"no program ran at {missing}: {hooks}")
    return cost


def measure(
    ctx: BenchContext,
    levels: tuple[int, ...],
    seconds: int,
    idle_s: float,
    sample: int,
    hooks: bool = False,
    perf: bool = False,
    protocols: tuple[str, ...] = ("tcp", "udp"),
) -> dict:
    """Every level of traces in one run (module docstring), the agent with --hooks or without; with
    `perf`, a profile of each number's in-place traffic."""
    topo = TwoHostTopology(ctx.prefix(), overlay="routed")
    result: dict[str, Any] = {"levels": {}, "untraced": [], "load": []}
    try:
        topo.create()
        with one_host_cluster(ctx, topo, hooks) as cluster:
            agent_pid = cluster.components["agent-host-a"].process.pid
            result["untraced"].append(untraced(topo, seconds, protocols))
            for n in levels:
                level: dict[str, Any] = {"load_before": os.getloadavg()[0]}
                log(f"many_traces: applying {n} traces (load {level['load_before']:.1f})")
                took, error = apply_traces(cluster, topo, n, sample)
                level |= {"apply_s": took, "apply_error": error, "applied": len(took)}
                log(f"many_traces: {len(took)} applied, {sum(took):.1f} s, the last {took[-1]:.2f} s {error}")
                sampler = UsageSampler(agent_pid)
                time.sleep(idle_s)
                level["idle"] = sampler.stop()
                level["kernel_bytes"] = kernel_bytes(agent_pid)
                if perf:
                    level["idle_profile"] = idle_profile(agent_pid, idle_s, ctx.workdir)
                level["in_place"] = in_place(topo, agent_pid, seconds)
                if perf:
                    level["perf"] = perf_profile(topo, seconds, ctx.workdir)
                for proto in protocols:
                    level[proto] = traced_throughput(cluster, topo, agent_pid, seconds, udp=proto == "udp")
                level["delete_s"] = delete_traces(cluster, level["applied"])
                level["load_after"] = os.getloadavg()[0]
                result["untraced"].append(untraced(topo, seconds, protocols))
                result["levels"][n] = level
    finally:
        topo.destroy()
    for i, level in enumerate(result["levels"].values()):
        either_side = result["untraced"][i : i + 2]
        for proto in protocols:
            level[proto]["ratio"] = level[proto]["mbps"] / (sum(u[proto] for u in either_side) / 2)
    return result


def table(result: dict[str, Any]) -> dict[str, Any]:
    """The results table: one row per number of traces."""
    rows = []
    for n, level in result["levels"].items():
        cost = level["in_place"]
        flows = [level[proto] for proto in ("tcp", "udp") if proto in level]
        rows.append(
            [
                n if level["applied"] == n else f"{level['applied']} of {n}",
                *(cost[h]["ns_per_packet"] for h in HOOKS),
                level.get("tcp", {}).get("ratio"),
                level.get("udp", {}).get("ratio"),
                level["idle"]["cpu_cores"] * 100,
                level["idle"]["peak_rss_bytes"] / 1e6,
                level["kernel_bytes"] / 1e6,
                max(flow["agent_cpu"] for flow in flows) * 100,
                max(flow["agent_rss"] for flow in flows) / 1e6,
                level["apply_s"][-1],
                sum(level["apply_s"]),
                level.get("tcp", {}).get("records_per_s"),
                level.get("udp", {}).get("records_per_s"),
                f"{level['load_before']:.1f}-{level['load_after']:.1f}",
            ]
        )
    return {
        "columns": [
            "traces",
            *(f"{h}, ns/packet" for h in HOOKS),
            "TCP ×untraced",
            "UDP ×untraced",
            "agent idle, % core",
            "idle RSS MB",
            "BPF kernel MB",
            "agent under flow, % core",
            "RSS under flow MB",
            "Nth apply -> active s",
            "all N applied s",
            "records/s TCP",
            "records/s UDP",
            "load",
        ],
        "rows": rows,
    }


def targets(result: dict[str, Any]) -> list[dict[str, Any]]:
    """The targets against the largest N of the run: the hooks --hooks serves per packet, the idle agent."""
    levels = result["levels"]
    first, asked = min(levels), max(levels)
    last = levels[asked]["applied"]
    out = []
    for hook in SERVED if asked != first else ():
        one, many = (
            levels[first]["in_place"][hook]["ns_per_packet"],
            levels[asked]["in_place"][hook]["ns_per_packet"],
        )
        out.append(
            target(f"{hook}: {last} traces over {first}", many / one if one and many else None, 2.0, "×")
        )
    idle = levels[asked]["idle"]
    out.append(target(f"agent idle with {last} traces", idle["cpu_cores"] * 100, 2.0, "% core"))
    out.append(target(f"agent RSS with {last} traces", idle["peak_rss_bytes"] / 1e6, 100, "MB"))
    return out


def run(ctx: BenchContext) -> dict[str, Any]:
    """bench/run.py's entry: 1 and 2 traces and TCP alone with --quick, 1, 10, 50 and 200 with --full; each
    without and with --hooks. The targets are the hooks'."""
    levels = ctx.size(QUICK_TRACES, FULL_TRACES)
    modes = {
        hooks: measure(
            ctx,
            levels,
            ctx.size(1, 5),
            ctx.size(0.5, 10.0),
            100,
            hooks=hooks,
            protocols=ctx.size(("tcp",), ("tcp", "udp")),
        )
        for hooks in (False, True)
    }
    return {
        "programs": modes[False],
        "hooks": modes[True],
        "table": table(modes[False]),
        "tables": {"with --hooks": table(modes[True])},
        "targets": targets(modes[True]),
    }


def main() -> int:
    """Run on its own, with its own sizes."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--traces", default=",".join(map(str, FULL_TRACES)), help="numbers of traces, in order")
    ap.add_argument("--seconds", type=int, default=5, help="each traffic run")
    ap.add_argument("--idle", type=float, default=10.0, help="the idle agent's measurement, seconds")
    ap.add_argument("--sample", type=int, default=100, help="the matching trace's sample")
    ap.add_argument(
        "--modes", default="programs,hooks", help="each hop its own program (programs), --hooks, or both"
    )
    ap.add_argument(
        "--perf", action="store_true", help="profile the idle agent and each number's in-place traffic"
    )
    ap.add_argument("--json", action="store_true", help="print the result as one JSON line too")
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("many_traces.py: run as root", file=sys.stderr)
        return 2
    from run import md_table, md_targets  # bench/run.py's table format

    ctx = BenchContext(quick=False)
    modes = args.modes.split(",")
    if unknown := set(modes) - {"programs", "hooks"}:
        print(f"many_traces.py: --modes: {', '.join(sorted(unknown))}? (programs, hooks)", file=sys.stderr)
        return 2
    levels = tuple(int(n) for n in args.traces.split(","))
    results = {}
    try:
        for mode in modes:
            hooks = mode == "hooks"
            results[mode] = measure(ctx, levels, args.seconds, args.idle, args.sample, hooks, args.perf)
    finally:
        ctx.close()
    for mode, result in results.items():
        print_result(mode, result, md_table, md_targets)
    if args.json:
        print(json.dumps(results, default=str))
    return 0


def print_result(mode: str, result: dict[str, Any], md_table: Any, md_targets: Any) -> None:
    """One mode's table, profiles and targets, as main prints them."""
    print(f"{mode}\n\n{md_table(table(result))}\n")
    for level in result["levels"].values():
        if level.get("idle_profile"):
            print(f"perf, {level['applied']} traces, the idle agent's CPU by function (with callees):")
            print("\n".join(level["idle_profile"]) + "\n")
        if level.get("perf"):
            kinds = ", ".join(f"{kind} {share:.1f} %" for kind, share in level["perf"]["kinds"].items())
            print(f"perf, {level['applied']} traces, sockperf's kernel time: {kinds}")
            print("\n".join(level["perf"]["top"]) + "\n")
    print(md_targets(targets(result)))


if __name__ == "__main__":
    sys.exit(main())
