"""TCP (or UDP) throughput under tracing, cost by cost.

iperf3 c1 -> c2 over the reference VXLAN path (8 hops), or with `--path veth` c1 -> host-a over c1's one
veth (a hop at each end: the 2-hop case); conditions interleaved in rounds (order rotated):

- `none`: nothing traces;
- `empty`: a tc program that only returns at each tc hop, no agent (the cost of running any program there);
- `hops`: the 8 hop programs attached, TCP not tagged (every segment parsed at every hop, none recorded);
- `tag_none`: the 8 hops and the sock_ops tagger, sampling 1 segment in 10^9 (the MSS keeps room for the
  option, sock_ops runs for every segment, none carries the option: the tagger's presence without records);
- `tagger`: `tag_none` with the agents' tc links detached: the sock_ops tagger (and, on the VXLAN path, the
  two tracepoint hops) without the tc hop programs, to tell the tagger's effect on TCP from the hops' cost;
- `tagger_all`: the same sampling every segment: each carries the ID option, none is recorded at a tc hop;
- `mss8`: nothing traces, the server advertises an MSS 8 bytes smaller (a host route with `advmss`): the
  segment size the tagger's reserved option gives, without the tagger;
- `floor_tagger`: no agent; the least any in-band TCP tagger does (FLOOR_TAGGER_SOURCE, sock_ops on the root
  cgroup for c1's namespace): an 8-byte option of the ID's kind on every segment, a constant ID, no
  sampling, no state, no counters; to compare with `tagger_all`;
- `floor_s100`: `floor_tagger` on one skb in 100 and `empty` at every hop (the VXLAN path's tracepoint
  hops at tc, as `COND_tc`): the least any tracer at `sample: 100` does (a sampled tagger's sock_ops runs
  for every skb, a hop looks at every segment for the ID); to compare with `tag_s100` (`tag_s100_tc`);
- `floor_all`: `floor_tagger` and, at every hop (at tc, as `floor_s100`), `ring_cost`'s `floor_local`
  program (read 4 bytes of the packet, the clock, a record into a per-CPU slot; no parsing): the least a
  tracer of every segment does, to compare with `tag_all_local` (`tag_all_tc` on VXLAN);
- `floor_ring`: `floor_all` with `ring_cost`'s `floor` program instead, its records in the ring of the
  node's agent (running the `hops` trace, its tc links detached), under its trace's slot, so that the agent
  ships them to the collector as it ships its hops' records: the least a tracer of every segment does whose
  records reach a collector, to compare with `tag_all` (`tag_all_tc` on VXLAN);
- `floor_tag` (UDP): `floor_ring`, but at the path's first hop the least UDP tagger (LEAST_TAGGER_SOURCE)
  instead: each IPv4 UDP datagram grown by a 4-byte ID after its payload as hoptrace's tagger does, lengths
  and checksums fixed, the ID recorded in the agent's ring; the least a UDP tracer of every datagram does,
  to compare with `tag_all --udp` (bench/udp_tag_floor.py);
- `tag_s100`: the 8 hops and the tagger, 1 segment in 100 tagged and recorded;
- `tag_all`: the same, every segment tagged and recorded;
- `COND_stopped` (COND one of the above with agents): the same, the agents SIGSTOPped for the measurement
  with a 256 MiB ring the run's records fit in: the programs run and record as before, nothing reads them
  (the BPF side's cost without the agent's and the record sink's);
- `COND_local`: the same with `ring_cost`'s object whose records go to a per-CPU slot, not the ring (nothing
  reaches the agent: the hops' cost without the ring);
- `COND_tc` (VXLAN path): the same with the path's two tracepoint hops at their devices' tc instead
  (`vxlan_path_spec(tc_only=True)`): a system-wide tracepoint runs for every packet of the machine;
- `COND_emptytp`: the same with an object whose tracepoint hops return at once (EMPTY_TRACEPOINT): what the
  tracepoints' dispatch costs, whatever the program does;
- `COND_ab`: the same with the agent `--ab-agent` names and the hop object `--ab-object` names, either or
  both (another build: a change's before and after in one run).

Each ratio is the condition's throughput over the same round's `none`: median, min..max over rounds, and
the geometric mean with its 95 % bootstrap interval; then each condition over each one named before it,
paired round by round (`--conditions floor_s100,tag_s100`: hoptrace over the floor). With `--bracket`,
`none` runs between every two conditions and each ratio is to the mean of the `none` either side: this
VM's throughput drifts by a tenth or more over a round's minute (16-23 Gbit/s untraced in one run), more
than the 1-3 % to resolve, and a neighbour's drift cancels to first order (the price: about twice the
runs). Each run logs the agents' CPU time. kernel.bpf_stats_enabled stays off unless `--bpf-stats` (then
each run also logs each program's runs and ns per run): its two clock reads per program run cost 3-6 % of
the throughput here (a VM's clock source), more than some conditions differ by, and ratios with it on are
not what users run. With
`--perf COND`, `perf record -a -g` runs during that condition's first iperf3 run and `perf report` prints the
top symbols (finding the cost before changing code). Each run also logs the receiver's TCP counters (nstat in
c2: out-of-order queueing, header prediction hits, coalescing).

With `--pin`, iperf3's client runs on CPU 0 and its server on CPU 1 in every run. Free-running on a 2-vCPU VM,
where the two land (and where the path's softirqs run) changes throughput by up to a tenth from one run to
the next, and anything that changes the timing moves it: an MSS 8 bytes smaller alone measured x1.10, an
empty program x0.95. Pinned, those effects are within the spread, and the sending vCPU runs the whole path
(the sender, every hop, the receive softirq) and is the bottleneck: the ratio is close to the tracer's
share of that vCPU's work, the harsher of the two measures.

    .venv/bin/python bench/tcp_overhead.py --rounds 4 --seconds 5 [--path veth] [--udp] [--pin] \
        [--perf COND] [--bpf-stats] [--ab-agent BINARY] [--ab-object OBJECT] [--bracket]
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

from bpf_cost import TC_HOPS, empty_tc_programs, tc_programs
from overhead import iperf3
from ring_cost import (
    build_bpf,
    build_floor_object,
    build_local_object,
    build_patched_object,
    load_floor,
    records_map_id,
)

from common import (
    AGENT_BINARY,
    REPO,
    PlanAgent,
    RecordSink,
    bpf_stats_enabled,
    bpftool_json,
    log,
    median,
    path_agents,
    path_plans,
    progs_of,
    ratio_interval,
    tcx_prog_ids,
)
from hoptrace.lab.reference import set_c1_tagging, spec_plans
from hoptrace.lab.topology import TwoHostTopology

CONDITIONS = [
    "none",
    "empty",
    "mss8",
    "hops",
    "tagger",
    "tagger_all",
    "floor_tagger",
    "floor_all",
    "floor_ring",
    "floor_tag",
    "floor_s100",
    "tag_none",
    "tag_s100",
    "tag_all",
]
SAMPLE = {"tag_none": 10**9, "tagger": 10**9, "tag_s100": 100, "floor_s100": 100}
DETACHED = {"tagger", "tagger_all"}  # conditions whose agents' tc links are detached once they run
# Variants of a condition with agents (COND_variant).
VARIANTS = ("stopped", "local", "tc", "emptytp", "ab")
BIG_RING = str(1 << 28)  # `_stopped`: a stopped agent's records of a run fit, the programs keep recording

# `_emptytp`: the tracepoint hops' shared body (hop.bpf.h's hop_kernel_skb) returns before its first line.
EMPTY_TRACEPOINT = ("\tcount(HOPTRACE_C_SEEN, 1);\n\tif (!dev) {", "\treturn 0;\n\tif (!dev) {")

# `floor_tagger`: the option hoptrace's tagger writes (hoptrace.h: kind, length, ExID), with a constant ID,
# on every segment of c1's sockets (NETNS_COOKIE, given at build), or on one skb in SAMPLE_EVERY (a plain
# count, racy across CPUs: the least a sampling tagger does); nothing else.
FLOOR_TAGGER_SOURCE = """\
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include "hoptrace.h"

static __u64 sent;

SEC("sockops") int floor_tagger(struct bpf_sock_ops *skops)
{
	/* kind, length, ExID "HT" (HOPTRACE_TCPOPT_EXID), ID 1 */
	__u8 opt[HOPTRACE_TCPOPT_LEN] = {HOPTRACE_TCPOPT_KIND, HOPTRACE_TCPOPT_LEN, 0x48, 0x54, 0, 0, 0, 1};

	if (bpf_get_netns_cookie(skops) != NETNS_COOKIE)
		return 1;
	switch (skops->op) {
	case BPF_SOCK_OPS_ACTIVE_ESTABLISHED_CB:
	case BPF_SOCK_OPS_PASSIVE_ESTABLISHED_CB:
		bpf_sock_ops_cb_flags_set(skops, skops->bpf_sock_ops_cb_flags | BPF_SOCK_OPS_WRITE_HDR_OPT_CB_FLAG);
		break;
	case BPF_SOCK_OPS_HDR_OPT_LEN_CB:
		/* the MSS keeps room for the option; a segment asks for it when sampled */
		if (SAMPLE_EVERY == 1 || (skops->args[0] & BPF_WRITE_HDR_TCP_CURRENT_MSS) ||
			sent++ % SAMPLE_EVERY == 0)
			bpf_reserve_hdr_opt(skops, HOPTRACE_TCPOPT_LEN, 0);
		break;
	case BPF_SOCK_OPS_WRITE_HDR_OPT_CB:
		bpf_store_hdr_opt(skops, opt, sizeof(opt), 0);
		break;
	}
	return 1;
}
char LICENSE[] SEC("license") = "GPL";
"""

# `floor_tag`: the least tagger of every UDP datagram, in place of hoptrace's first hop. The ID goes where
# hoptrace's tagger puts it (hop.bpf.h, tag_udp_packet): after the UDP payload, in the surplus bytes UDP's
# length does not cover, which the receiver's UDP stack trims before the socket; the IPv4 length and header
# checksum grow with it, and a CHECKSUM_PARTIAL seed loses the ID's share. It refuses what it cannot tag
# correctly (another protocol, IPv4 options, fragments, padding, GSO, a frame past the device's MTU:
# MAX_LEN, given at build) and does nothing else: an ID from a per-CPU sequence (unique without a shared
# line: the CPU in the top bits), no filter, no counters; the record in the agent's ring (map `records`).
LEAST_TAGGER_SOURCE = """\
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_core_read.h>
#include "hoptrace.h"

extern void *bpf_cast_to_kern_ctx(void *obj) __ksym;

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 4096); /* replaced by the agent's ring at load */
} records SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
} id_seq SEC(".maps");

struct frame {
	struct ethhdr eth;
	struct iphdr ip;
	struct udphdr udp;
} __attribute__((packed));

SEC("tc") int least_tagger(struct __sk_buff *skb)
{
	struct frame *f = (void *)(long)skb->data;
	__u32 len = skb->len, key = 0, cpu, ip_end, share, *seq;
	struct hoptrace_record *rec;
	__be16 old_len, new_len;
	__u16 udp_len;
	__u32 sum;

	if ((void *)(f + 1) > (void *)(long)skb->data_end)
		return -1;
	if (f->eth.h_proto != bpf_htons(0x0800) || f->ip.ihl != 5 || f->ip.protocol != IPPROTO_UDP ||
		f->ip.frag_off & bpf_htons(0x3fff))
		return -1;
	old_len = f->ip.tot_len;
	udp_len = bpf_ntohs(f->udp.len);
	ip_end = sizeof(f->eth) + bpf_ntohs(old_len);
	if (ip_end != len || skb->gso_size || len + HOPTRACE_UDP_ID_LEN > MAX_LEN)
		return -1;
	seq = bpf_map_lookup_elem(&id_seq, &key);
	if (!seq)
		return -1;
	cpu = bpf_get_smp_processor_id();
	share = bpf_htonl((cpu + 1) << HOPTRACE_ID_SEQ_BITS | (++*seq & HOPTRACE_ID_SEQ_MASK));
	if (bpf_skb_change_tail(skb, len + HOPTRACE_UDP_ID_LEN, 0) ||
		bpf_skb_store_bytes(skb, ip_end, &share, sizeof(share), 0))
		return -1;
	rec = bpf_ringbuf_reserve(&records, sizeof(*rec), 0);
	if (rec) {
		rec->ts_ns = bpf_ktime_get_ns();
		rec->packet_id = bpf_ntohl(share);
		rec->flow_hash = 0;
		rec->ifindex = skb->ifindex;
		rec->wire_len = len + HOPTRACE_UDP_ID_LEN;
		rec->hop_index = 0;
		rec->trace_slot = TRACE_SLOT;
		rec->cpu = cpu;
		rec->flags = 0;
		bpf_ringbuf_submit(rec, BPF_RB_NO_WAKEUP);
	}
	/* CHECKSUM_PARTIAL: the seed loses the ID's share, its bytes swapped at an odd offset */
	if (BPF_CORE_READ_BITFIELD((struct sk_buff *)bpf_cast_to_kern_ctx(skb), ip_summed) == 3) {
		if (udp_len & 1)
			share = ((share & 0x00ff00ff) << 8) | ((share & 0xff00ff00) >> 8);
		bpf_l4_csum_replace(skb, sizeof(f->eth) + sizeof(f->ip) + offsetof(struct udphdr, check),
			share, 0, BPF_F_PSEUDO_HDR | sizeof(share));
	}
	/* the helpers moved the packet: its IPv4 length and header checksum (RFC 1624, eqn. 3) */
	f = (void *)(long)skb->data;
	if ((void *)(f + 1) > (void *)(long)skb->data_end)
		return -1;
	new_len = bpf_htons(bpf_ntohs(old_len) + HOPTRACE_UDP_ID_LEN);
	sum = (__u16)~f->ip.check + (__u16)~old_len + (__u16)new_len;
	sum = (sum & 0xffff) + (sum >> 16);
	sum = (sum & 0xffff) + (sum >> 16);
	f->ip.check = (__sum16)~sum;
	f->ip.tot_len = new_len;
	return -1; /* TC_ACT_UNSPEC */
}

char LICENSE[] SEC("license") = "GPL";
"""

# Where iperf3's server listens on each path: c2 across the VXLAN path, or host-a's bridge address across
# c1's veth (one veth, a hop at each of its ends).
SERVER = {"vxlan": ("c2", None), "veth": ("host-a", "br0")}
# The tc hops of each path (hop -> role, device, direction), where `empty` runs its program.
PATH_TC_HOPS = {
    "vxlan": TC_HOPS,
    "veth": {"c1-eth0-out": ("c1", "eth0", "egress"), "a-veth-in": ("host-a", "veth-c1", "ingress")},
}
# Every hop of each path at tc (the VXLAN path's two tracepoint hops at their devices', as `COND_tc` puts
# them), where `floor_s100` runs its empty program: the floor of `tag_s100`, and of `tag_s100_tc` on VXLAN.
EVERY_HOP_AT_TC = {
    "vxlan": {
        **TC_HOPS,
        "a-veth-in": ("host-a", "veth-c1", "ingress"),
        "b-veth-out": ("host-b", "veth-c2", "egress"),
    },
    "veth": PATH_TC_HOPS["veth"],
}
# The hop that tags on each path (c1's eth0, egress), where `floor_tag` runs the least tagger.
TAGGING_HOP = {"vxlan": "a-c1-eth0-out", "veth": "c1-eth0-out"}


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


def split_variant(name: str) -> tuple[str, str]:
    """A condition's base and variant (`tag_all_local` -> `tag_all`, `local`; `hops` -> `hops`, "")."""
    base, _, variant = name.rpartition("_")
    return (base, variant) if base and variant in VARIANTS else (name, "")


@contextlib.contextmanager
def condition(
    name: str, topo: TwoHostTopology, workdir: Path, sink: RecordSink, path: str, ab: dict[str, Path]
) -> Iterator[set[int]]:
    """Tracing as condition `name` on `path` for the block; yields the pids of its agents (none without).
    `ab`: the `COND_ab` conditions' "agent" binary and/or hop "object"."""
    if name == "none":
        yield set()
        return
    if name == "empty":
        with empty_tc_programs(topo, workdir, PATH_TC_HOPS[path]):
            yield set()
        return
    if name == "floor_tagger":
        with floor_tagger(topo, workdir):
            yield set()
        return
    if name == "floor_all":
        with floor_tagger(topo, workdir), floor_recorders(topo, path, workdir):
            yield set()
        return
    if name == "floor_ring":
        hops_only = (1, False, (), None, True)  # every segment, no agent tagger, every hop at tc
        with (
            floor_tagger(topo, workdir),
            tracing_agents(topo, path, workdir, sink, "tcpo-floor-ring", *hops_only) as pids,
            ring_floor_recorders(topo, path, workdir, pids),
        ):
            yield pids
        return
    if name == "floor_tag":
        hops_only = (1, False, (), None, True)
        tagger = least_tagger_object(topo, path, workdir)
        with (
            tracing_agents(topo, path, workdir, sink, "tcpo-floor-tag", *hops_only) as pids,
            ring_floor_recorders(topo, path, workdir, pids, tagger),
        ):
            yield pids
        return
    if name == "floor_s100":
        with (
            floor_tagger(topo, workdir, SAMPLE[name]),
            empty_tc_programs(topo, workdir, EVERY_HOP_AT_TC[path]),
        ):
            yield set()
        return
    if name == "mss8":
        with smaller_advertised_mss(topo, path, 8):
            yield set()
        return
    base, variant = split_variant(name)
    stopped = variant == "stopped"
    sample, tagging = SAMPLE.get(base, 1), base != "hops"
    extra = ("--ringbuf-bytes", BIG_RING) if stopped else ()
    trace = f"tcpo-{name.replace('_', '-')}"
    build = {"local": build_local_object, "emptytp": build_empty_tracepoint_object}.get(variant)
    obj_path = build(workdir) if build else ab.get("object") if variant == "ab" else None
    binary = ab.get("agent", AGENT_BINARY) if variant == "ab" else AGENT_BINARY
    with tracing_agents(
        topo, path, workdir, sink, trace, sample, tagging, extra, obj_path, variant == "tc", binary
    ) as pids:
        if base in DETACHED:
            detach_tc_links(topo, PATH_TC_HOPS[path], pids)
        if stopped:
            for pid in pids:
                os.kill(pid, signal.SIGSTOP)
        try:
            yield pids
        finally:
            if stopped:
                for pid in pids:
                    os.kill(pid, signal.SIGCONT)


def build_empty_tracepoint_object(workdir: Path) -> Path:
    """The hop object with EMPTY_TRACEPOINT applied, built as `make bpf` does."""
    return build_patched_object(workdir, "emptytp", [EMPTY_TRACEPOINT])


@contextlib.contextmanager
def tracing_agents(
    topo: TwoHostTopology,
    path: str,
    workdir: Path,
    sink: RecordSink,
    trace: str,
    sample: int,
    tagging: bool,
    extra: tuple[str, ...],
    obj: Path | None,
    tc_only: bool = False,
    binary: Path = AGENT_BINARY,
) -> Iterator[set[int]]:
    """The path's agents (`binary`) running `trace` (one on the veth path, two on the VXLAN path, its
    tracepoint hops at tc with `tc_only`), with the hop object `obj` if given; yields their pids."""
    server, server_iface = SERVER[path]
    dst = topo.addr(server, iface=server_iface)
    if path == "veth":
        plan = veth_plan(topo, trace, dst, sample, tagging)
        if obj:
            plan["objectPath"] = str(obj)
        agent = PlanAgent(
            plan, "host-a", topo.host_a, sink.addr, workdir, "--clock-server", "off", *extra, binary=binary
        )
        agent.start()
        try:
            yield {agent.pid}
        finally:
            agent.stop()
        return
    plans = path_plans(
        topo, trace, {"dst": dst}, sample=sample, tag_udp=tagging, tcp_tagging=tagging, tc_only=tc_only
    )
    for plan in plans if obj else ():
        plan["objectPath"] = str(obj)
    with path_agents(topo, sink.addr, workdir, plans, *extra, binary=binary) as agents:
        yield {agent.pid for agent in agents}


@contextlib.contextmanager
def floor_tagger(topo: TwoHostTopology, workdir: Path, sample_every: int = 1) -> Iterator[None]:
    """FLOOR_TAGGER_SOURCE, the option on one skb in `sample_every`, on the root cgroup's sock_ops for the
    block (for c1's sockets only)."""
    mounts = Path("/proc/self/mounts").read_text().splitlines()
    cgroup2 = next(line.split()[1] for line in mounts if line.split()[2] == "cgroup2")
    read_cookie = (
        "import socket; s = socket.socket(); print(int.from_bytes(s.getsockopt(1, 71, 8), 'little'))"
    )
    # 1, 71: SOL_SOCKET, SO_NETNS_COOKIE
    cookie = topo.run("c1", sys.executable, "-c", read_cookie).stdout.strip()
    src = workdir / "floor_tagger.bpf.c"
    src.write_text(FLOOR_TAGGER_SOURCE)
    obj = build_bpf(
        src,
        REPO / "kernel-patch" / "include",
        workdir / f"floor_tagger_{sample_every}.bpf.o",
        f"-DNETNS_COOKIE={cookie}ULL",
        f"-DSAMPLE_EVERY={sample_every}",
    )
    pin = Path(f"/sys/fs/bpf/hoptrace-bench-floor-tagger-{os.getpid()}")
    subprocess.run(["bpftool", "prog", "load", str(obj), str(pin), "type", "sockops"], check=True)
    try:
        subprocess.run(
            ["bpftool", "cgroup", "attach", cgroup2, "sock_ops", "pinned", str(pin), "multi"],
            check=True,
        )
        try:
            yield
        finally:
            subprocess.run(
                ["bpftool", "cgroup", "detach", cgroup2, "sock_ops", "pinned", str(pin)], check=False
            )
    finally:
        pin.unlink()


@contextlib.contextmanager
def floor_recorders(topo: TwoHostTopology, path: str, workdir: Path) -> Iterator[None]:
    """`ring_cost`'s `floor_local` program at every hop of the path, at tc (clsact), for the block."""
    with tc_programs(topo, EVERY_HOP_AT_TC[path], build_floor_object(workdir, "floor_local"), "floor_tc"):
        yield


# The node whose agent traces each role's hops.
NODE_OF_ROLE = {"c1": "host-a", "host-a": "host-a", "c2": "host-b", "host-b": "host-b"}


def agent_node(pid: int) -> str:
    """The --node an agent runs as, from its command line."""
    argv = Path(f"/proc/{pid}/cmdline").read_text().split("\0")
    return argv[argv.index("--node") + 1]


def least_tagger_object(topo: TwoHostTopology, path: str, workdir: Path) -> Path:
    """LEAST_TAGGER_SOURCE built for the tagging hop's device (its MTU and Ethernet header: MAX_LEN)."""
    role, dev, _ = EVERY_HOP_AT_TC[path][TAGGING_HOP[path]]
    mtu = int(topo.run(role, "cat", f"/sys/class/net/{dev}/mtu").stdout)
    src = workdir / "least_tagger.bpf.c"
    src.write_text(LEAST_TAGGER_SOURCE)
    obj = workdir / "least_tagger.bpf.o"
    return build_bpf(src, REPO / "kernel-patch" / "include", obj, f"-DMAX_LEN={mtu + 14}")


@contextlib.contextmanager
def ring_floor_recorders(
    topo: TwoHostTopology, path: str, workdir: Path, pids: set[int], tagger: Path | None = None
) -> Iterator[None]:
    """`ring_cost`'s `floor` program at every hop of the path instead of the agents' `pids` hold there
    (their tc links detached), writing into the ring of the hop's node's agent, for the block; with
    `tagger`, that object (program `least_tagger`, the same ring) at the path's tagging hop instead."""
    hops = EVERY_HOP_AT_TC[path]
    detach_tc_links(topo, hops, pids)
    obj = build_floor_object(workdir, "floor")
    pin_dir = Path("/sys/fs/bpf") / f"hoptrace-bench-floor-ring-{os.getpid()}"  # tc attaches from bpffs only
    pin_dir.mkdir()
    devices = sorted({(role, dev) for role, dev, _ in hops.values()})
    try:
        nodes = {agent_node(pid): pid for pid in pids}
        pinned = {node: load_floor(obj, records_map_id(pid), pin_dir / node) for node, pid in nodes.items()}
        at_hop = {hop: pinned[NODE_OF_ROLE[role]] for hop, (role, _, _) in hops.items()}
        if tagger:
            node = NODE_OF_ROLE[hops[TAGGING_HOP[path]][0]]
            at_hop[TAGGING_HOP[path]] = load_floor(tagger, records_map_id(nodes[node]), pin_dir / "tagger")
        for role, dev in devices:
            subprocess.run(["tc", "-n", topo.netns(role), "qdisc", "add", "dev", dev, "clsact"], check=True)
        for hop, (role, dev, direction) in hops.items():
            # nsenter, not `tc -n`: that mounts a sysfs of its own, where /sys/fs/bpf is empty
            subprocess.run(
                ["nsenter", f"--net={topo.netns_path(role)}", "tc", "filter", "add", "dev", dev, direction,
                 "bpf", "da", "pinned", str(at_hop[hop])],
                check=True,
            )  # fmt: skip
        yield
    finally:
        for role, dev in devices:
            topo.run(role, "tc", "qdisc", "del", "dev", dev, "clsact", check=False)
        for pin in pin_dir.iterdir():
            pin.unlink()
        pin_dir.rmdir()


@contextlib.contextmanager
def smaller_advertised_mss(topo: TwoHostTopology, path: str, less: int) -> Iterator[None]:
    """The server's route to the client with an advertised MSS `less` bytes under its device's default."""
    server, _ = SERVER[path]
    client = topo.addr("c1")
    (route,) = json.loads(topo.run(server, "ip", "-j", "route", "get", client).stdout)
    mtu = int(topo.run(server, "cat", f"/sys/class/net/{route['dev']}/mtu").stdout)
    via = ["via", route["gateway"]] if "gateway" in route else []
    host_route = [f"{client}/32", *via, "dev", route["dev"], "src", route["prefsrc"]]
    topo.run(server, "ip", "route", "add", *host_route, "advmss", str(mtu - 40 - less))  # 40: IPv4 + TCP
    try:
        yield
    finally:
        topo.run(server, "ip", "route", "del", f"{client}/32", check=False)


def detach_tc_links(topo: TwoHostTopology, hops: dict[str, tuple[str, str, str]], pids: set[int]) -> None:
    """Detach the tcx links of the programs `pids` hold at `hops` (hop -> role, device, direction; their
    agents close the detached links at stop)."""
    held = progs_of(pids)
    at_hops = {p for role, dev, direction in hops.values() for p in tcx_prog_ids(topo, role, dev)[direction]}
    ours = held.keys() & at_hops
    links = [lk["id"] for lk in bpftool_json("link", "show") if lk.get("prog_id") in ours]
    if not links or len(links) != len(ours):
        raise RuntimeError(f"agents {sorted(pids)}: expected a link for each of {sorted(ours)}")
    for link in links:
        subprocess.run(["bpftool", "link", "detach", "id", str(link)], check=True)


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


def cpu_seconds(pids: set[int]) -> float:
    """User and system CPU time the processes `pids` have used (/proc/PID/stat), in seconds."""
    ticks = 0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        ticks += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15 of stat)
    return ticks / os.sysconf("SC_CLK_TCK")


def own_cpu_seconds() -> float:
    """User and system CPU time of this process, all its threads (the record sink's gRPC server)."""
    times = os.times()
    return times.user + times.system


def nstat(topo: TwoHostTopology, role: str) -> dict[str, int]:
    """The TCP counters of a role's namespace (`nstat -a -z -j`), flattened."""
    out = topo.run(role, "nstat", "-a", "-z", "-j", check=False).stdout
    flat: dict[str, int] = {}
    for table in json.loads(out or "{}").values():
        flat.update(table)
    return flat


def run(
    rounds: int,
    seconds: int,
    perf: str | None,
    conditions: list[str],
    path: str,
    udp: bool,
    bpf_stats: bool,
    cpus: tuple[int, int] | None = None,
    ab: dict[str, Path] | None = None,
    bracket: bool = False,
) -> dict[str, Any]:
    """Interleaved rounds of `conditions` (`none` first); throughput ratios to `none`."""
    sink = RecordSink()
    topo = TwoHostTopology(f"tco{os.getpid() % 1000}", overlay="vxlan")
    server, server_iface = SERVER[path]
    timeline: list[tuple[int, str, float]] = []  # (round, condition, Mbit/s) in the order run
    profiled = False

    def measure() -> float:
        return iperf3(topo, seconds, udp=udp, server=server, server_iface=server_iface, cpus=cpus)

    try:
        topo.create()
        # bpf_stats reads the clock twice per program run: a cost of the measurement, on only when asked.
        with bpf_stats_enabled(bpf_stats), tempfile.TemporaryDirectory(prefix="hoptrace-tcpo-") as tmp:
            for r, order in enumerate(schedule(conditions, rounds, bracket)):
                for name in order:
                    with condition(name, topo, Path(tmp), sink, path, ab or {}) as pids:
                        cpu = cpu_seconds(pids)
                        if name == perf and not profiled:
                            data = Path(tmp) / "perf.data"
                            with perf_record(data):
                                mbps = measure()
                            print(f"perf, condition {name}:\n{perf_top(data)}", flush=True)
                            profiled, grown = True, "profiled (no program or TCP counters)"
                        else:
                            before, counters = prog_stats(), nstat(topo, server)
                            own = own_cpu_seconds()
                            mbps = measure()
                            own = own_cpu_seconds() - own
                            programs = stats_growth(before, prog_stats())
                            after = nstat(topo, server)
                            receiver = f"{server} " + ", ".join(
                                f"{k} {after.get(k, 0) - counters.get(k, 0)}" for k in NSTAT_KEYS
                            )
                            # the record sink is this process: its CPU is the collector's, not the node's
                            agents = (
                                f"agents {cpu_seconds(pids) - cpu:.2f} s CPU, sink {own:.2f} s"
                                if pids
                                else ""
                            )
                            grown = "; ".join(filter(None, [agents, programs, receiver]))
                    log(f"round {r + 1} {name}: {mbps:.0f} Mbit/s; {grown}")
                    timeline.append((r, name, mbps))
    finally:
        topo.destroy()
        sink.close()
    ratios = {}
    for name, values in condition_ratios(timeline, bracket).items():
        mean, low, high = ratio_interval(values)
        ratios[name] = {
            "median": median(values),
            "min": min(values),
            "max": max(values),
            "mean": mean,
            "ci95": [low, high],
            "ratios": values,
        }
        mbps = median([v for _, n, v in timeline if n == name])
        print(
            f"{name:9s} {mbps:8.0f} Mbit/s  x{ratios[name]['median']:.3f} "
            f"({ratios[name]['min']:.3f}..{ratios[name]['max']:.3f}), "
            f"geometric mean x{mean:.3f} [{low:.3f}, {high:.3f}] 95 %, {len(values)} ratios"
        )
    # Each condition over each one named before it, round by round: each round has one run of each.
    others = conditions[1:]
    paired = {}
    for i, name in enumerate(others):
        for base in others[:i]:
            values = [a / b for a, b in zip(ratios[name]["ratios"], ratios[base]["ratios"], strict=True)]
            mean, low, high = ratio_interval(values)
            paired[f"{name}/{base}"] = {"median": median(values), "mean": mean, "ci95": [low, high]}
            print(f"{name} over {base}, paired: geometric mean x{mean:.3f} [{low:.3f}, {high:.3f}] 95 %")
    return {"timeline": timeline, "ratios": ratios, "paired": paired}


def schedule(conditions: list[str], rounds: int, bracket: bool) -> Iterator[list[str]]:
    """Each round's runs in order, rotated round by round (`conditions[0]` is `none`). With `bracket`,
    `none` runs between every two conditions and at both ends of the whole run."""
    for r in range(rounds):
        if not bracket:
            k = r % len(conditions)
            yield conditions[k:] + conditions[:k]
            continue
        others = conditions[1:]
        k = r % len(others)
        runs = ["none"] if r == 0 else []
        for name in others[k:] + others[:k]:
            runs += [name, "none"]
        yield runs


def condition_ratios(timeline: list[tuple[int, str, float]], bracket: bool) -> dict[str, list[float]]:
    """Each condition's ratios to `none`: to its round's `none`, or, with `bracket`, to the mean of the two
    `none` runs either side of it (a drift of the machine over a round then cancels to first order)."""
    ratios: dict[str, list[float]] = {}
    for i, (r, name, mbps) in enumerate(timeline):
        if name == "none":
            base = mbps
        elif bracket:
            base = (timeline[i - 1][2] + timeline[i + 1][2]) / 2
        else:
            base = next(v for rr, n, v in timeline if rr == r and n == "none")
        ratios.setdefault(name, []).append(mbps / base)
    return ratios


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
        "--bpf-stats",
        action="store_true",
        help="kernel.bpf_stats_enabled on: each program's ns per run (its clock reads lower the ratios)",
    )
    ap.add_argument("--ab-agent", type=Path, help="the agent binary of the COND_ab conditions")
    ap.add_argument("--ab-object", type=Path, help="the hop object of the COND_ab conditions")
    ap.add_argument(
        "--pin",
        action="store_true",
        help="iperf3's client on CPU 0 and its server on CPU 1 (-A 0,1): the same placement in every run",
    )
    ap.add_argument(
        "--bracket",
        action="store_true",
        help="`none` between every two conditions, each ratio to the `none` either side (the drift cancels)",
    )
    args = ap.parse_args()
    conditions = ["none"] + [c for c in args.conditions.split(",") if c and c != "none"]
    with_agents = [c for c in CONDITIONS if c not in ("none", "empty", "mss8") and not c.startswith("floor_")]
    unknown = [c for c in conditions if c not in CONDITIONS and split_variant(c)[0] not in with_agents]
    if unknown:
        ap.error(
            f"unknown conditions {unknown}: choose from {', '.join(CONDITIONS)}, or COND_VARIANT with COND "
            f"one of {', '.join(with_agents)} and VARIANT one of {', '.join(VARIANTS)}"
        )
    variants = {split_variant(c)[1] for c in conditions}
    if "ab" in variants and not (args.ab_agent or args.ab_object):
        ap.error("the COND_ab conditions need --ab-agent BINARY, --ab-object OBJECT or both")
    if "tc" in variants and args.path != "vxlan":
        ap.error("COND_tc: only the VXLAN path has tracepoint hops")
    if args.bracket and len(conditions) < 2:
        ap.error("--bracket compares conditions with `none`: name at least one")
    ab = {k: v for k, v in (("agent", args.ab_agent), ("object", args.ab_object)) if v}
    cpus = (0, 1) if args.pin else None
    run(
        args.rounds,
        args.seconds,
        args.perf,
        conditions,
        args.path,
        args.udp,
        args.bpf_stats,
        cpus,
        ab,
        args.bracket,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
