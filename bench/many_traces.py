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
  is refused (ERANGE), so N = 200 runs with 63;
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

With one trace applied, `--prototype N,...` measures the design of docs/design.md ("Many traces on a device")
at the two tc hooks: DISPATCH_SOURCE, one program that finds a packet's traces among N traces' filters,
beside the matching trace's hop; then N - 1 empty programs there instead: what N programs cost at the least.

The per-packet cost in place is the figure to draw conclusions from: it counts only the programs' own CPU
time (run in softirq, not preempted), so a neighbour's load on this 2-vCPU machine moves it little, while a
throughput ratio moves with every neighbour (docs/benchmarks.md, "How costs are measured").

    .venv/bin/python bench/many_traces.py [--traces 1,10,50,200] [--seconds 5] [--sample 100] \
        [--prototype 1,10,50,200] [--perf] [--json]
    .venv/bin/python bench/run.py --full --only many_traces   # --quick: 1 and 2 traces, TCP alone

Targets (reported, not asserted): 200 non-matching traces on a device cost at most twice one trace per
packet; the 200-trace node's agent at most 2 % of a core idle and 100 MB RSS.
"""

from __future__ import annotations

import argparse
import contextlib
import ipaddress
import json
import os
import re
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
from bpf_cost import EMPTY_TC_SOURCE, tc_programs
from overhead import iperf3
from ring_cost import build_bpf
from tcp_overhead import perf_record

from common import (
    REPO,
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
PROGRAM_NAME = {"veth-c1 netif_receive_skb": "hop_tp_btf", "c1 sock_ops": "tag_tcp"}


DISPATCH_SOURCE = """\
// SPDX-License-Identifier: GPL-2.0
/*
 * The prototype of one program per device and direction: it parses a packet once, finds the traces
 * whose filter takes it, and runs only those traces' hop bodies (here: counts the packet per trace
 * slot). Bit-vector classification on the fields most filters name: the protocol and each port index
 * arrays (lookups the verifier inlines) holding the set of traces that take that value; the AND of the
 * sets leaves the candidates, usually none or one, whose whole filter (addresses and masks, as
 * hop.bpf.h's flow_match) is then checked from their slot's entry in `filters`. Nothing of the
 * per-packet work grows with the traces that do not take the packet's protocol and ports.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#define TC_ACT_UNSPEC_ (-1)
#define ETH_P_IP_ 0x0800
#define TRACE_WORDS 4 /* 256 trace slots */
#define MAX_MATCHED 8 /* candidates and hop bodies one packet runs at most */
#define NO_TRACE (TRACE_WORDS * 64)

struct trace_set {
	__u64 w[TRACE_WORDS];
};
/* The traces that take any source / destination port. */
struct wildcards {
	struct trace_set sport, dport;
};
/* A trace's filter, as hop.bpf.h's filter_* constants (addresses and masks in network order). */
struct filter {
	__u32 src[4], src_mask[4], dst[4], dst_mask[4];
	__u16 sport, dport;
	__u8 proto, family, pad[2];
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 256);
	__type(key, __u32);
	__type(value, struct trace_set);
} by_proto SEC(".maps");
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 65536);
	__type(key, __u32);
	__type(value, struct trace_set);
} by_sport SEC(".maps");
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 65536);
	__type(key, __u32);
	__type(value, struct trace_set);
} by_dport SEC(".maps");
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, NO_TRACE);
	__type(key, __u32);
	__type(value, struct filter);
} filters SEC(".maps");
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct wildcards);
} any SEC(".maps");
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, NO_TRACE + 1);
	__type(key, __u32);
	__type(value, __u64);
} matched SEC(".maps");

static const __u8 debruijn64[64] = {
	0,  1,	48, 2,	57, 49, 28, 3,	61, 58, 50, 42, 38, 29, 17, 4,	62, 55, 59, 36, 53, 51,
	43, 22, 45, 39, 33, 30, 24, 18, 12, 5,	63, 47, 56, 27, 60, 41, 37, 16, 54, 35, 52, 21,
	44, 32, 23, 11, 46, 26, 40, 15, 34, 20, 31, 10, 25, 14, 19, 9,	13, 8,	7,  6,
};

static __always_inline void bump(__u32 slot)
{
	__u64 *n = bpf_map_lookup_elem(&matched, &slot);

	if (n)
		*n += 1;
}

/* acc &= (set | wild); whether any trace is left. */
static __always_inline bool take(struct trace_set *acc, const struct trace_set *set,
					const struct trace_set *wild)
{
	__u64 left = 0;

	for (int i = 0; i < TRACE_WORDS; i++) {
		acc->w[i] &= (set ? set->w[i] : 0) | wild->w[i];
		left |= acc->w[i];
	}
	return left;
}

static __always_inline bool addr_match(const __u32 *want, const __u32 *mask, __be32 addr)
{
	return (addr & mask[0]) == want[0]; /* IPv4: the first word (the prototype parses IPv4 only) */
}

/* The candidate trace's whole filter, as hop.bpf.h's flow_match. */
static __always_inline bool filter_takes(__u32 slot, const struct iphdr *ip, __u16 sport, __u16 dport)
{
	struct filter *f = bpf_map_lookup_elem(&filters, &slot);

	if (!f)
		return false;
	if (f->proto && f->proto != ip->protocol)
		return false;
	if (f->family && (f->family != 4 || !addr_match(f->src, f->src_mask, ip->saddr) ||
				!addr_match(f->dst, f->dst_mask, ip->daddr)))
		return false;
	return (!f->sport || f->sport == sport) && (!f->dport || f->dport == dport);
}

SEC("tc")
int trace_dispatch(struct __sk_buff *skb)
{
	void *data = (void *)(long)skb->data, *end = (void *)(long)skb->data_end;
	struct ethhdr *eth = data;
	struct iphdr *ip = (void *)(eth + 1);
	struct trace_set acc, *s;
	struct wildcards *wild;
	__u32 key = 0, n = 0, sport = 0, dport = 0;

	if ((void *)(ip + 1) > end || eth->h_proto != bpf_htons(ETH_P_IP_))
		goto none;
	if (ip->protocol == IPPROTO_TCP || ip->protocol == IPPROTO_UDP) {
		__u16 *ports = (void *)ip + ip->ihl * 4;

		if ((void *)(ports + 2) > end)
			goto none;
		sport = bpf_ntohs(ports[0]);
		dport = bpf_ntohs(ports[1]);
	}
	wild = bpf_map_lookup_elem(&any, &key);
	key = ip->protocol;
	s = bpf_map_lookup_elem(&by_proto, &key);
	if (!wild || !s)
		goto none;
	acc = *s;
	if (!take(&acc, bpf_map_lookup_elem(&by_dport, &dport), &wild->dport) ||
		!take(&acc, bpf_map_lookup_elem(&by_sport, &sport), &wild->sport))
		goto none;
	for (int i = 0; i < TRACE_WORDS; i++) {
		__u64 w = acc.w[i];

		for (int j = 0; j < MAX_MATCHED && w && n < MAX_MATCHED; j++) {
			__u32 slot = i * 64 + debruijn64[((w & -w) * 0x03f79d71b4cb0a89ULL) >> 58];

			w &= w - 1;
			if (filter_takes(slot, ip, sport, dport)) {
				bump(slot); /* the design runs the trace's hop body here */
				n++;
			}
		}
	}
	if (n)
		return TC_ACT_UNSPEC_;
none:
	bump(NO_TRACE);
	return TC_ACT_UNSPEC_;
}

char LICENSE[] SEC("license") = "GPL";
"""

# The prototype's tc hooks: hook -> (role, device, direction), as bpf_cost.tc_programs takes them.
PROTOTYPE_HOOKS = {
    "c1 eth0 tc egress": ("c1", "eth0", "egress"),
    "veth-c1 tc ingress": ("host-a", "veth-c1", "ingress"),
}
PROTOCOLS = {"tcp": 6, "udp": 17}


def trace_bits(slots: Any) -> bytes:
    """A struct trace_set of the trace slots `slots` (4 little-endian u64)."""
    value = 0
    for slot in slots:
        value |= 1 << slot
    return value.to_bytes(32, "little")


def filter_entry(f: trace_pb2.Filter) -> bytes:
    """A trace's filter as the prototype's `struct filter` (hop.bpf.h's filter_* constants)."""
    family, words = 0, []
    for cidr in (f.src, f.dst):
        net = ipaddress.ip_network(cidr or "0.0.0.0/0")
        family = family or (net.version if cidr else 0)
        words += [net.network_address.packed.ljust(16, b"\0"), net.netmask.packed.ljust(16, b"\0")]
    return b"".join(words) + struct.pack(
        "<HHBB2x", f.src_port, f.dst_port, PROTOCOLS[f.protocol] if f.protocol else 0, family
    )


def dispatch_entries(filters: list[trace_pb2.Filter]) -> dict[str, list[tuple[bytes, bytes]]]:
    """The prototype's map entries for `filters` (trace i in slot i): map name -> (key, value) bytes. Every
    protocol's and each named port's entry holds the traces that take it (for protocols, those that name
    none too); `any` the traces that take any port; `filters` each trace's whole filter."""

    def slots(takes: Any) -> bytes:
        return trace_bits(i for i, f in enumerate(filters) if takes(f))

    def key(value: int) -> bytes:
        return struct.pack("<I", value)

    out = {
        "by_proto": [
            (key(p), slots(lambda f, p=p: not f.protocol or PROTOCOLS[f.protocol] == p)) for p in range(256)
        ],
        "any": [(key(0), slots(lambda f: not f.src_port) + slots(lambda f: not f.dst_port))],
        "filters": [(key(i), filter_entry(f)) for i, f in enumerate(filters)],
    }
    for name, field in (("by_sport", "src_port"), ("by_dport", "dst_port")):
        ports = sorted({getattr(f, field) for f in filters} - {0})
        out[name] = [(key(v), slots(lambda f, v=v, field=field: getattr(f, field) == v)) for v in ports]
    return out


def fill_dispatch_maps(prog_id: int, entries: dict[str, list[tuple[bytes, bytes]]], workdir: Path) -> int:
    """Write `entries` into the maps of program `prog_id` (one bpftool batch); the id of its `matched`."""
    ids = bpftool_json("prog", "show", "id", str(prog_id))["map_ids"]
    maps = {m["name"]: m["id"] for m in bpftool_json("map", "show") if m["id"] in ids}
    batch = workdir / f"dispatch-{prog_id}.batch"
    batch.write_text(
        "".join(
            f"map update id {maps[name]} key hex {key.hex(' ')} value hex {value.hex(' ')}\n"
            for name, rows in entries.items()
            for key, value in rows
        )
    )
    subprocess.run(["bpftool", "batch", "file", str(batch)], check=True, capture_output=True, timeout=60)
    return maps["matched"]


def matched_counts(map_id: int) -> dict[int, int]:
    """The prototype's packets per trace slot (NO_TRACE: packets no trace took), summed over CPUs."""
    return {
        e["formatted"]["key"]: sum(v["value"] for v in e["formatted"]["values"])
        for e in bpftool_json("map", "dump", "id", str(map_id))
        if any(v["value"] for v in e["formatted"]["values"])
    }


@contextlib.contextmanager
def empty_programs(topo: TwoHostTopology, obj: Path, count: int) -> Iterator[dict[str, set[int]]]:
    """`count` empty tc programs (clsact, bpf_cost's EMPTY_TC_SOURCE) at each tc hook of PROTOTYPE_HOOKS;
    hook -> their ids. The qdiscs are removed after."""
    ids: dict[str, set[int]] = {}
    try:
        for hook, (role, dev, direction) in PROTOTYPE_HOOKS.items():
            ns = topo.netns(role)
            subprocess.run(["tc", "-n", ns, "qdisc", "add", "dev", dev, "clsact"], check=True)
            for _ in range(count):
                subprocess.run(
                    ["tc", "-n", ns, "filter", "add", "dev", dev, direction,
                     "bpf", "da", "obj", str(obj), "sec", "tc"],
                    check=True,
                )  # fmt: skip
            shown = subprocess.run(
                ["tc", "-n", ns, "filter", "show", "dev", dev, direction],
                capture_output=True,
                text=True,
                check=True,
            ).stdout
            ids[hook] = {int(i) for i in re.findall(r" id (\d+) name empty_tc", shown)}
        yield ids
    finally:
        for role, dev, _ in PROTOTYPE_HOOKS.values():
            subprocess.run(
                ["tc", "-n", topo.netns(role), "qdisc", "del", "dev", dev, "clsact"], capture_output=True
            )


def hook_cost(topo: TwoHostTopology, hooks: dict[str, set[int]], seconds: int) -> dict[str, dict[str, Any]]:
    """per_packet_cost of `hooks` over sockperf UDP at the in-place rate."""
    every = set().union(*hooks.values())
    with bpf_stats_enabled():
        s0 = run_stats(every)
        sockperf(
            topo, "throughput", seconds, "--mps", str(IN_PLACE_MPS), "-m", "64",
            server="host-a", port=SOCKPERF_PORT,
        )  # fmt: skip
        s1 = run_stats(every)
    out = per_packet_cost(hooks, s0, s1)
    for hook, ids in hooks.items():
        out[hook]["ns_per_run_each"] = {
            i: per_packet_cost({hook: {i}}, s0, s1)[hook]["ns_per_packet"] for i in ids
        }
    return out


def prototype_in_place(
    topo: TwoHostTopology, agent_pid: int, counts: tuple[int, ...], seconds: int, workdir: Path
) -> dict[int, Any]:
    """With only the matching trace applied, for each N of `counts`, at both tc hooks: the dispatching
    prototype, its maps holding the filters of N traces (the matching one among them): the hook's cost per
    packet (the matching trace's hop program and the prototype) and what the prototype matched; then N - 1
    empty programs beside the hop instead: what N programs cost at the least."""
    src, obj = workdir / "dispatch.bpf.c", workdir / "dispatch.bpf.o"
    src.write_text(DISPATCH_SOURCE)
    build_bpf(src, REPO / "kernel-patch" / "include", obj)
    empty_src, empty_obj = workdir / "empty_tc.bpf.c", workdir / "empty_tc.bpf.o"
    empty_src.write_text(EMPTY_TC_SOURCE)
    subprocess.run(["clang", "-O2", "-target", "bpf", "-c", str(empty_src), "-o", str(empty_obj)], check=True)
    hooks = {hook: ids for hook, ids in hook_programs(agent_pid).items() if hook in PROTOTYPE_HOOKS}
    out: dict[int, Any] = {}
    for n in counts:
        filters = [trace_spec(topo, i, 1).filter for i in range(n)]
        with tc_programs(topo, PROTOTYPE_HOOKS, obj, "trace_dispatch") as ids:
            matched = {
                hook: fill_dispatch_maps(ids[hook], dispatch_entries(filters), workdir) for hook in ids
            }
            cost = hook_cost(topo, {hook: hooks[hook] | {ids[hook]} for hook in ids}, seconds)
            for hook in ids:
                cost[hook]["prototype_ns_per_run"] = cost[hook]["ns_per_run_each"][ids[hook]]
                cost[hook]["matched"] = matched_counts(matched[hook])
        with empty_programs(topo, empty_obj, n - 1) as empties:
            empty = hook_cost(topo, {hook: hooks[hook] | empties[hook] for hook in hooks}, seconds)
            for hook in hooks:
                runs = [empty[hook]["ns_per_run_each"][i] for i in empties[hook]]
                cost[hook]["with_empties_ns_per_packet"] = empty[hook]["ns_per_packet"]
                cost[hook]["empty_ns_per_run"] = median([r for r in runs if r is not None])
        out[n] = cost
    return out


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
def one_host_cluster(ctx: BenchContext, topo: TwoHostTopology) -> Iterator[LocalCluster]:
    """Dispatcher, collector and host-a's agent (owning c1's namespace), objects from the lab's BPF cache."""
    cluster = LocalCluster(
        influx_url=ctx.influx().url, workdir=ctx.workdir / "many-traces", bpf_cache_dir=writable_bpf_cache()
    )
    try:
        cluster.start_dispatcher()
        cluster.start_collector()
        cluster.wait_listening()
        start_cluster_agent(cluster, "host-a", topo.host_a, "--netns-owned", topo.c1)
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
        for hook, name in PROGRAM_NAME.items():
            if prog["id"] in held and prog.get("name") == name:
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
    prototype: tuple[int, ...] = (),
    perf: bool = False,
    protocols: tuple[str, ...] = ("tcp", "udp"),
) -> dict:
    """Every level of traces in one run (module docstring); with the one matching trace applied, the
    dispatching prototype with the filters of each number of traces in `prototype`; with `perf`, a profile of
    each number's in-place traffic."""
    topo = TwoHostTopology(ctx.prefix(), overlay="routed")
    result: dict[str, Any] = {"levels": {}, "untraced": [], "load": []}
    try:
        topo.create()
        with one_host_cluster(ctx, topo) as cluster:
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
                if n == 1 and prototype:
                    result["prototype"] = prototype_in_place(topo, agent_pid, prototype, seconds, ctx.workdir)
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


def tables(result: dict[str, Any]) -> dict[str, Any]:
    """The prototype's table, when it ran: per-packet cost at the tc hooks with one dispatching program."""
    if not result.get("prototype"):
        return {}
    one = result["levels"][1]["in_place"]
    rows = []
    for n, cost in result["prototype"].items():
        for hook in PROTOTYPE_HOOKS:
            level = result["levels"].get(n, {})
            today = level.get("in_place", {}).get(hook, {}).get("ns_per_packet")
            if today is not None and level["applied"] != n:
                today = f"{today:,.0f} ({level['applied']} traces)"
            rows.append(
                [
                    n,
                    hook,
                    cost[hook]["ns_per_packet"],
                    cost[hook]["prototype_ns_per_run"],
                    cost[hook]["ns_per_packet"] / one[hook]["ns_per_packet"],
                    today,
                    cost[hook]["with_empties_ns_per_packet"],
                    cost[hook]["empty_ns_per_run"],
                    " ".join(f"{slot}:{count}" for slot, count in sorted(cost[hook]["matched"].items())),
                ]
            )
    return {
        "prototype: one dispatching program per hook": {
            "columns": [
                "traces",
                "hook",
                "ns/packet (1 hop program + prototype)",
                "prototype ns/run",
                "× one trace today",
                "N hop programs today, ns/packet",
                "1 hop + N-1 empty programs, ns/packet",
                "empty ns/run",
                "packets by trace slot (256: none)",
            ],
            "rows": rows,
        }
    }


def targets(result: dict[str, Any]) -> list[dict[str, Any]]:
    """The issue's targets against the largest N of the run."""
    levels = result["levels"]
    first, asked = min(levels), max(levels)
    last = levels[asked]["applied"]
    out = []
    for hook in HOOKS[:3] if asked != first else ():
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
    """bench/run.py's entry: 1 and 2 traces and TCP alone with --quick, 1, 10, 50 and 200 with --full; the
    prototype with the largest number."""
    levels = ctx.size(QUICK_TRACES, FULL_TRACES)
    result = measure(
        ctx,
        levels,
        ctx.size(1, 5),
        ctx.size(0.5, 10.0),
        100,
        prototype=levels[-1:],
        protocols=ctx.size(("tcp",), ("tcp", "udp")),
    )
    return {**result, "table": table(result), "tables": tables(result), "targets": targets(result)}


def main() -> int:
    """Run on its own, with its own sizes."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--traces", default=",".join(map(str, FULL_TRACES)), help="numbers of traces, in order")
    ap.add_argument("--seconds", type=int, default=5, help="each traffic run")
    ap.add_argument("--idle", type=float, default=10.0, help="the idle agent's measurement, seconds")
    ap.add_argument("--sample", type=int, default=100, help="the matching trace's sample")
    ap.add_argument(
        "--prototype",
        default="",
        help="numbers of traces the dispatching prototype is measured with (1 in --traces)",
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
    try:
        levels = tuple(int(n) for n in args.traces.split(","))
        prototype = tuple(int(n) for n in args.prototype.split(",") if n)
        result = measure(ctx, levels, args.seconds, args.idle, args.sample, prototype, args.perf)
    finally:
        ctx.close()
    print(md_table(table(result)))
    print()
    for level in result["levels"].values():
        if level.get("idle_profile"):
            print(f"perf, {level['applied']} traces, the idle agent's CPU by function (with callees):")
            print("\n".join(level["idle_profile"]) + "\n")
        if level.get("perf"):
            kinds = ", ".join(f"{kind} {share:.1f} %" for kind, share in level["perf"]["kinds"].items())
            print(f"perf, {level['applied']} traces, sockperf's kernel time: {kinds}")
            print("\n".join(level["perf"]["top"]) + "\n")
    for name, sub in tables(result).items():
        print(f"{name}\n\n{md_table(sub)}\n")
    print(md_targets(targets(result)))
    if args.json:
        print(json.dumps(result, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
