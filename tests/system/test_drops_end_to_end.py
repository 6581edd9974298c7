"""drops: true end to end: a trace's lost packets say where and why, with the kernel's own reason names and
the kernel function that freed them.

Two drops of known cause and exact count on the receiving host, in one trace c1 -> c2 over VXLAN whose path
ends at the application's socket read in c2: an nftables rule at host-b's wire0 ingress drops about 5 % of
the flow (its counter is the truth: NETFILTER_DROP, lost between b-wire-in and b-vxlan-in), and nothing
listens on the port in c2, so every other datagram is dropped for want of a socket (NO_SOCKET, lost between
b-c2-eth0-in and b-c2-read): their count is what was sent less the counter. The report's per-reason counts
must equal both exactly, through the agents' kfree_skb hops, the collector, InfluxDB and `hoptrace report`
(text and --json), and the collector's Prometheus counter; each names the function that freed the packets,
from host-b's /proc/kallsyms: on 6.18 nftables' verdict frees them in nft_do_chain (older kernels: in
nf_hook_slow), UDP's missing socket in __udp4_lib_rcv (bpftrace's ksym of skb:kfree_skb's location, for
such drops on this machine, names the same two).
"""

from __future__ import annotations

import json
import re
import urllib.request
from pathlib import Path

import pytest
from system_helpers import UdpSender, report, running_cluster

from hoptrace.lab.reference import vxlan_path_spec
from hoptrace.lab.waiting import wait_until
from hoptrace.v1 import trace_pb2

pytestmark = pytest.mark.kernel

PORT = 11119  # nothing listens on it in c2
# Where this kernel frees each drop (skb:kfree_skb's location, the caller of sk_skb_reason_drop).
NETFILTER_FUNCTION = "nft_do_chain"
NO_SOCKET_FUNCTION = "__udp4_lib_rcv"
SENT = 400
WIRE = "b-wire-in>b-vxlan-in"
READ = "b-c2-eth0-in>b-c2-read"


def kernel_reason_names() -> set[str]:
    """The reason names this kernel's skb:kfree_skb format prints (tracefs: another route than BTF)."""
    root = next(
        p for p in (Path("/sys/kernel/tracing"), Path("/sys/kernel/debug/tracing")) if (p / "events").is_dir()
    )
    return set(re.findall(r'\{ \d+, "([A-Z0-9_]+)" \}', (root / "events/skb/kfree_skb/format").read_text()))


def kernel_functions() -> set[str]:
    """The functions this kernel has (kallsyms, as root): the names the test expects are there."""
    return {
        line.split()[2]
        for line in Path("/proc/kallsyms").read_text().splitlines()
        if " t " in line or " T " in line
    }


def test_lost_packets_say_where_and_why(topology, influxd):
    spec = vxlan_path_spec(topology, "drops", port=PORT, tc_only=True)
    spec.hops.append(trace_pb2.HopSpec(name="b-c2-read", node="host-b", at="socket-read", netns=topology.c2))
    spec.drops = True
    topology.drop_flow_on_wire(50, PORT)
    try:
        with running_cluster(topology, influxd.url) as cluster:
            applied = cluster.apply(spec)
            assert [d.name for d in applied.spec.drop_hops] == [
                f"drops@host-a/{topology.c1}",
                "drops@host-a",
                "drops@host-b",
                f"drops@host-b/{topology.c2}",
            ]
            sender = UdpSender(topology, "c1", "c2", PORT, rate_pps=400).start()
            wait_until(lambda: sender.sent >= SENT, f"{SENT} datagrams sent", 10)
            sent = sender.stop()
            dropped = topology.dropped_on_wire()

            def accounted() -> dict | None:
                data = report(cluster, "drops")
                e2e = data["end_to_end"]
                return data if sum(d["count"] for d in e2e["drops"]) >= sent else None

            data = wait_until(accounted, f"drops of all {sent} datagrams in the report", 30, 0.5)
            text = cluster.hoptrace("report", "drops", "--since", "30m").stdout
            with urllib.request.urlopen(f"http://{cluster.metrics_addr('collector')}/metrics") as answer:
                metrics = answer.read().decode()
    finally:
        topology.stop_dropping()
    assert 0 < dropped < sent
    segments = {f"{s['from']}>{s['to']}": s for s in data["segments"]}
    assert {NETFILTER_FUNCTION, NO_SOCKET_FUNCTION} <= kernel_functions()
    netfilter = {
        "node": "host-b",
        "reason": "NETFILTER_DROP",
        "function": NETFILTER_FUNCTION,
        "count": dropped,
    }
    no_socket = {
        "node": "host-b",
        "reason": "NO_SOCKET",
        "function": NO_SOCKET_FUNCTION,
        "count": sent - dropped,
    }
    assert segments[WIRE]["loss_count"] == dropped and segments[WIRE]["drops"] == [netfilter], segments[WIRE]
    assert segments[READ]["loss_count"] == sent - dropped and segments[READ]["drops"] == [no_socket], segments
    for name, segment in segments.items():
        if name not in (WIRE, READ):
            assert segment["loss_count"] == 0 and segment["drops"] == [], (name, segment)
    e2e = data["end_to_end"]
    assert e2e["loss_count"] == sent
    assert sorted(e2e["drops"], key=json.dumps) == sorted([netfilter, no_socket], key=json.dumps)
    assert {"NETFILTER_DROP", "NO_SOCKET"} <= kernel_reason_names()  # the kernel's own names
    most, fewest = sorted([netfilter, no_socket], key=lambda d: -d["count"])
    line = (
        f"  end to end: lost {sent}: {most['count']} {most['reason']} on host-b ({most['function']}),"
        f" {fewest['count']} {fewest['reason']} on host-b ({fewest['function']})"
    )
    assert line in text.splitlines(), text
    series = (
        f'hoptrace_segment_dropped_packets_total{{function="{NO_SOCKET_FUNCTION}",node="host-b",reason="NO_SOCKET",'
        'segment="end_to_end",'
    )
    assert f'{series}trace="drops"}} {float(sent - dropped)}' in metrics, metrics
    series = (
        f'hoptrace_segment_dropped_packets_total{{function="{NETFILTER_FUNCTION}",node="host-b",'
        f'reason="NETFILTER_DROP",segment="{WIRE}",'
    )
    assert f'{series}trace="drops"}} {float(dropped)}' in metrics, metrics
