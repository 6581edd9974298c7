"""BPF cost per hop: kernel run time per program invocation on the 8-hop VXLAN path.

With `kernel.bpf_stats_enabled=1` the kernel adds each program's run time to `run_time_ns` and counts its
runs in
`run_cnt` (`bpftool prog show`). Two standalone agents attach the 8-hop c1 -> c2 path; sockperf sends UDP
c1 -> c2
at a fixed rate. Two conditions, same hops:

- matching: the filter is the flow's port, every packet is tagged at the first hop and recorded at all eight;
- non-matching: the filter names another port, so every hop parses the packet, fails the filter and returns.

A third condition, `empty`, attaches a tc program that only returns (clsact, no agents) at the same six tc
hops and sends the same traffic: what running any program there costs in place (the dispatch, bpf_stats' own
clock reads, the cold cache lines), so the hop programs' figures can be read above that floor.

Program ids are mapped to hops exactly: tc hops from the tcx attachments of each device (`bpftool net show`
inside its namespace), tracepoint hops by program name (one `netif_receive_skb` and one `net_dev_xmit` hop).
Tracepoint programs run for every packet of the whole machine (other namespaces included) and return after
the device check for packets of other devices, so their mean is over all of those runs.
"""

from __future__ import annotations

import contextlib
import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from common import (
    PINNED_CPU,
    SOCKPERF_PORT,
    BenchContext,
    RecordSink,
    TwoHostTopology,
    bpf_stats_enabled,
    bpftool_json,
    log,
    median,
    path_agents,
    path_plans,
    progs_of,
    target,
    tcx_prog_ids,
)
from hoptrace.lab.workloads import sockperf

TC_HOPS = {  # hop name -> (role, device, direction)
    "a-c1-eth0-out": ("c1", "eth0", "egress"),
    "a-vxlan-out": ("host-a", "vxlan0", "egress"),
    "a-wire-out": ("host-a", "wire0", "egress"),
    "b-wire-in": ("host-b", "wire0", "ingress"),
    "b-vxlan-in": ("host-b", "vxlan0", "ingress"),
    "b-c2-eth0-in": ("c2", "eth0", "ingress"),
}
TP_HOPS = {"a-veth-in": ("host-a", "hop_tp_btf"), "b-veth-out": ("host-b", "hop_tp_btf_xmit")}
OTHER_PORT = 22222


def hop_prog_ids(topo: TwoHostTopology, pids: dict[str, int]) -> dict[str, int]:
    """hop name -> BPF program id, for the two agents' programs."""
    ids: dict[str, int] = {}
    for hop, (role, dev, direction) in TC_HOPS.items():
        found = tcx_prog_ids(topo, role, dev)[direction]
        ours = progs_of({pids["host-a"], pids["host-b"]})
        mine = [pid for pid in found if pid in ours]
        if len(mine) != 1:
            raise RuntimeError(
                f"{hop}: expected one hoptrace program on {role}/{dev} {direction}, got {found}"
            )
        ids[hop] = mine[0]
    for hop, (node, name) in TP_HOPS.items():
        progs = [p["id"] for p in progs_of({pids[node]}).values() if p.get("name") == name]
        if len(progs) != 1:
            raise RuntimeError(f"{hop}: expected one {name} program held by {node}'s agent, got {progs}")
        ids[hop] = progs[0]
    return ids


def prog_stats(ids: dict[str, int]) -> dict[str, tuple[int, int]]:
    """hop -> (run_time_ns, run_cnt) now."""
    by_id = {p["id"]: p for p in bpftool_json("prog", "show")}
    return {hop: (by_id[pid].get("run_time_ns", 0), by_id[pid].get("run_cnt", 0)) for hop, pid in ids.items()}


EMPTY_TC_SOURCE = """\
struct __sk_buff;
/* Returns at once (TC_ACT_UNSPEC: the next program, then the stack). */
__attribute__((section("tc"), used)) int empty_tc(struct __sk_buff *skb) { return -1; }
char LICENSE[] __attribute__((section("license"), used)) = "GPL";
"""


@contextlib.contextmanager
def empty_tc_programs(
    topo: TwoHostTopology, workdir: Path, hops: dict[str, tuple[str, str, str]] = TC_HOPS
) -> Iterator[dict[str, int]]:
    """An empty tc program (clsact) at each of `hops` (name -> role, device, direction); hop -> program id.
    The qdiscs are removed after."""
    src, obj = workdir / "empty_tc.bpf.c", workdir / "empty_tc.bpf.o"
    src.write_text(EMPTY_TC_SOURCE)
    subprocess.run(["clang", "-O2", "-target", "bpf", "-c", str(src), "-o", str(obj)], check=True)
    with tc_programs(topo, hops, obj, "empty_tc") as ids:
        yield ids


@contextlib.contextmanager
def tc_programs(
    topo: TwoHostTopology, hops: dict[str, tuple[str, str, str]], obj: Path, name: str
) -> Iterator[dict[str, int]]:
    """Program `name` of `obj` (section "tc") attached with clsact at each of `hops` (name -> role, device,
    direction); hop -> program id. The qdiscs are removed after."""
    devices = sorted({(role, dev) for role, dev, _ in hops.values()})
    try:
        for role, dev in devices:
            subprocess.run(["tc", "-n", topo.netns(role), "qdisc", "add", "dev", dev, "clsact"], check=True)
        ids = {}
        for hop, (role, dev, direction) in hops.items():
            subprocess.run(
                ["tc", "-n", topo.netns(role), "filter", "add", "dev", dev, direction,
                 "bpf", "da", "obj", str(obj), "sec", "tc"],
                check=True,
            )  # fmt: skip
            shown = subprocess.run(
                ["tc", "-n", topo.netns(role), "filter", "show", "dev", dev, direction],
                check=True,
                capture_output=True,
                text=True,
            ).stdout
            found = re.findall(rf" id (\d+) name {name}", shown)
            if len(found) != 1:
                raise RuntimeError(f"{hop}: expected one {name} on {role}/{dev} {direction}: {shown}")
            ids[hop] = int(found[0])
        yield ids
    finally:
        for role, dev in devices:
            subprocess.run(
                ["tc", "-n", topo.netns(role), "qdisc", "del", "dev", dev, "clsact"],
                check=False,
                capture_output=True,
            )


def hop_run_times(
    ids: dict[str, int], topo: TwoHostTopology, seconds: int, mps: int, pinned: bool = False
) -> dict[str, Any]:
    """The traffic, and each hop's runs and ns per run by bpf_stats meanwhile."""
    before = prog_stats(ids)
    t0 = time.monotonic()
    traffic = sockperf_throughput(topo, seconds, mps, pinned)
    dt = time.monotonic() - t0
    time.sleep(0.5)  # the agents flush their last batches
    after = prog_stats(ids)
    hops = {}
    for hop in ids:
        d_ns = after[hop][0] - before[hop][0]
        d_cnt = after[hop][1] - before[hop][1]
        hops[hop] = {
            "prog_id": ids[hop],
            "kind": "tracepoint" if hop in TP_HOPS else "tc",
            "runs": d_cnt,
            "ns_per_run": d_ns / d_cnt if d_cnt else None,
        }
    return {"hops": hops, "sent": traffic["sent"], "duration_s": dt}


def sockperf_throughput(
    topo: TwoHostTopology, seconds: int, mps: int, pinned: bool = False
) -> dict[str, Any]:
    """sockperf UDP throughput c1 -> c2 for `seconds` at `mps` messages/s (64-byte messages); with `pinned`,
    client and server on one vCPU."""
    prefix = ("taskset", "-c", PINNED_CPU) if pinned else ()
    text = sockperf(
        topo, "throughput", seconds, "--mps", str(mps), "-m", "64", client_prefix=prefix, server_prefix=prefix
    )
    sent = re.search(r"Total of (\d+) messages sent", text)
    if not sent:
        raise RuntimeError(f"sockperf throughput: no SentMessages in {text[-1500:]}")
    return {"sent": int(sent.group(1))}


def run(ctx: BenchContext) -> dict[str, Any]:
    """Run both conditions; returns per-hop ns/run and the targets."""
    seconds = ctx.size(2, 10)
    mps = ctx.size(10_000, 20_000)
    results: dict[str, Any] = {"seconds": seconds, "mps": mps, "conditions": {}}
    sink = RecordSink()
    topo = TwoHostTopology(ctx.prefix(), overlay="vxlan")
    try:
        topo.create()
        with bpf_stats_enabled():
            for condition, port in (("matching", SOCKPERF_PORT), ("non_matching", OTHER_PORT)):
                filter_ = {"protocol": "udp", "dst": topo.addr("c2"), "dstPort": port}
                plans = path_plans(topo, f"bpfcost-{condition}", filter_)
                with path_agents(topo, sink.addr, ctx.workdir, plans) as (agent_a, agent_b):
                    ids = hop_prog_ids(topo, {"host-a": agent_a.pid, "host-b": agent_b.pid})
                    records_before = sink.count()
                    data = hop_run_times(ids, topo, seconds, mps)
                    data["records"] = sink.count() - records_before
                    results["conditions"][condition] = data
                    log(
                        f"bpf_cost {condition}: "
                        + ", ".join(
                            f"{h} {v['ns_per_run']:.0f} ns"
                            for h, v in data["hops"].items()
                            if v["ns_per_run"]
                        )
                    )
            with empty_tc_programs(topo, ctx.workdir) as ids:
                results["empty_tc"] = hop_run_times(ids, topo, seconds, mps)
                log(
                    "bpf_cost empty tc: "
                    + ", ".join(
                        f"{h} {v['ns_per_run']:.0f} ns" for h, v in results["empty_tc"]["hops"].items()
                    )
                )
    finally:
        topo.destroy()
        sink.close()

    summary: dict[str, Any] = {}
    for condition, data in results["conditions"].items():
        values = [h["ns_per_run"] for h in data["hops"].values() if h["ns_per_run"] is not None]
        for kind in ("tc", "tracepoint"):
            runs = sum(h["runs"] for h in data["hops"].values() if h["kind"] == kind)
            ns = sum(h["runs"] * (h["ns_per_run"] or 0) for h in data["hops"].values() if h["kind"] == kind)
            summary[f"{condition}_{kind}_mean_ns"] = ns / runs if runs else None
        summary[f"{condition}_median_hop_ns"] = median(values)
        # every hop of a tagged packet but the tagger (it also grows the packet: reported alone)
        summary[f"{condition}_median_hop_ns_excl_tagger"] = median(
            [h["ns_per_run"] for n, h in data["hops"].items() if n != "a-c1-eth0-out" and h["ns_per_run"]]
        )
    # In place, above what an empty program costs at the same tc hops in the same run.
    empty = {h: v["ns_per_run"] for h, v in results["empty_tc"]["hops"].items()}
    summary["empty_tc_median_ns"] = median([v for v in empty.values() if v is not None])
    for condition, data in results["conditions"].items():
        summary[f"{condition}_tc_median_above_empty_ns"] = median(
            [
                h["ns_per_run"] - empty[n]
                for n, h in data["hops"].items()
                if n in empty and h["ns_per_run"] and empty[n] is not None
            ]
        )
    results["summary"] = summary
    results["targets"] = [
        target(
            "BPF run time per traced packet per hop (median of hops)",
            summary["matching_median_hop_ns"],
            100,
            "ns",
        ),
        target(
            "BPF run time per non-matching packet per hop (median of hops)",
            summary["non_matching_median_hop_ns"],
            20,
            "ns",
        ),
        target(
            "BPF run time per traced packet per tc hop above an empty program there (median of hops)",
            summary["matching_tc_median_above_empty_ns"],
            100,
            "ns",
        ),
        target(
            "BPF run time per non-matching packet per tc hop above an empty program there (median of hops)",
            summary["non_matching_tc_median_above_empty_ns"],
            20,
            "ns",
        ),
    ]
    m, n = results["conditions"]["matching"]["hops"], results["conditions"]["non_matching"]["hops"]
    results["table"] = {
        "columns": ["hop", "kind", "matching ns/run", "runs", "non-matching ns/run", "runs", "empty ns/run"],
        "rows": [
            [
                hop,
                m[hop]["kind"],
                m[hop]["ns_per_run"],
                m[hop]["runs"],
                n[hop]["ns_per_run"],
                n[hop]["runs"],
                empty.get(hop),
            ]
            for hop in m
        ],
    }
    return results
