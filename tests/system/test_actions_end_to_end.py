"""Hop actions end to end: a spec with count, count by cpu, histogram of len and of latency goes through the
dispatcher (validation, typed constants), both agents (in-kernel maps), the collector and InfluxDB into
`hoptrace report --json`, whose per-hop counts and histograms must equal the packets sent."""

from __future__ import annotations

import os
import time

from system_helpers import running_cluster, wait_report

from hoptrace import kernel_abi
from hoptrace.collector.sketch import RELATIVE_ACCURACY
from hoptrace.lab.processes import udp_transfer
from hoptrace.lab.reference import vxlan_path_spec
from hoptrace.v1 import trace_pb2

SENT = 200


def _actions(*items: tuple[str, str, str]) -> list[trace_pb2.ActionSpec]:
    return [trace_pb2.ActionSpec(kind=kind, by=by, field=field) for kind, by, field in items]


def _hop(data: dict, name: str) -> dict:
    return next(h for h in data["hops"] if h["hop"] == name)


def test_counts_and_histograms_reach_the_report(topology, influxd):
    spec = vxlan_path_spec(topology, "e2e-actions")
    hops = {hop.name: hop for hop in spec.hops}
    # host-a: time from the container's egress to the bridge's receive, and which CPUs receive there.
    hops["a-veth-in"].actions.extend(
        _actions(("timestamp", "", ""), ("count", "cpu", ""), ("histogram", "", "latency"))
    )
    # host-b: every packet that reached the wire, and their sizes there (VXLAN included).
    hops["b-wire-in"].actions.extend(
        _actions(("timestamp", "", ""), ("count", "", ""), ("histogram", "", "len"))
    )
    with running_cluster(topology, influxd.url) as cluster:
        cluster.apply(spec)
        payloads = [os.urandom(64) for _ in range(SENT)]
        assert udp_transfer(topology, "c1", "c2", payloads, 4, 11111, 0.002) == payloads
        data = wait_report(cluster, "e2e-actions", SENT)
        # Counts come with the agents' counters (every second): wait for all of them.
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            wire = _hop(data, "b-wire-in")
            veth = _hop(data, "a-veth-in")
            if (
                sum(c["count"] for c in wire["counts"]) >= SENT
                and sum(c["count"] for c in veth["counts"]) >= SENT
                and all(g["total"] >= SENT for g in wire["histograms"] + veth["histograms"])
                and wire["histograms"]
                and veth["histograms"]
            ):
                break
            time.sleep(1)
            data = wait_report(cluster, "e2e-actions", SENT)

    wire, veth = _hop(data, "b-wire-in"), _hop(data, "a-veth-in")
    assert wire["counts"] == [{"node": "host-b", "by": "", "key": 0, "count": SENT}], wire
    (sizes,) = wire["histograms"]
    assert (sizes["node"], sizes["field"], sizes["total"]) == ("host-b", "len", SENT), sizes
    # Every datagram has the same size: one bucket, whose bound covers a VXLAN frame of 64 bytes' payload.
    assert len(sizes["buckets"]) == 1 and 128 <= sizes["buckets"][0]["le"] <= 255, sizes

    assert {c["by"] for c in veth["counts"]} == {"cpu"}
    assert sum(c["count"] for c in veth["counts"]) == SENT, veth
    assert all(0 <= c["key"] < os.cpu_count() for c in veth["counts"]), veth
    (latency,) = veth["histograms"]
    assert (latency["node"], latency["field"], latency["total"]) == ("host-a", "latency", SENT), latency
    # The in-kernel histogram and the joined records use the same timestamps (one node): the max falls in
    # the top bucket, and the p50 (nearest rank) in the bucket where the cumulative count passes half.
    segment = next(s for s in data["segments"] if (s["from"], s["to"]) == ("a-c1-eth0-out", "a-veth-in"))
    assert segment["count"] == SENT
    le_of = lambda ns: (1 << int(ns).bit_length()) - 1  # noqa: E731 - hop.bpf.h's log2 bucket bound
    assert latency["buckets"][-1]["le"] == le_of(segment["max_ns"]), (segment, latency)
    running, median_le = 0, None
    for bucket in latency["buckets"]:
        running += bucket["count"]
        if median_le is None and running >= SENT // 2:
            median_le = bucket["le"]
    # The report's p50 comes from the merged sketches: within RELATIVE_ACCURACY of the exact one, which may
    # lie across a bucket bound from it (a p50 of 2049 reported for an exact 2040: buckets 4095 and 2047).
    exact_low = segment["p50_ns"] / (1 + RELATIVE_ACCURACY) - 1
    exact_high = segment["p50_ns"] / (1 - RELATIVE_ACCURACY) + 1
    assert le_of(exact_low) <= median_le <= le_of(exact_high), (segment, latency)
    # Hops without actions report none.
    assert _hop(data, "a-c1-eth0-out")["counts"] == [] and _hop(data, "a-c1-eth0-out")["histograms"] == []


SENT_TTL = 37  # c1's default TTL for this test: not the kernel's 64, so a match is not a default
PAYLOAD = 64


def test_recorded_values_and_count_by_ttl_reach_the_report(topology, influxd):
    """`record: [len]` at the receiver's eth0 holds every packet's size; `record: [ttl]` at the host's
    receive tracepoint and `count by ttl` at the sender's egress hold the TTL c1 sent with."""
    topology.run("c1", "sysctl", "-qw", f"net.ipv4.ip_default_ttl={SENT_TTL}")
    spec = vxlan_path_spec(topology, "e2e-record")
    hops = {hop.name: hop for hop in spec.hops}
    hops["a-c1-eth0-out"].actions.extend(_actions(("timestamp", "", ""), ("count", "ttl", "")))
    hops["a-veth-in"].actions.extend(_actions(("timestamp", "", "")))
    hops["a-veth-in"].actions.add(kind="record", fields=["ttl"])
    hops["b-c2-eth0-in"].actions.extend(_actions(("timestamp", "", "")))
    hops["b-c2-eth0-in"].actions.add(kind="record", fields=["len"])
    with running_cluster(topology, influxd.url) as cluster:
        cluster.apply(spec)
        payloads = [os.urandom(PAYLOAD) for _ in range(SENT)]
        assert udp_transfer(topology, "c1", "c2", payloads, 4, 11111, 0.002) == payloads
        data = wait_report(cluster, "e2e-record", SENT)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            sender, veth, receiver = (_hop(data, h) for h in ("a-c1-eth0-out", "a-veth-in", "b-c2-eth0-in"))
            if (
                sum(c["count"] for c in sender["counts"]) >= SENT
                and sum(r["count"] for r in veth.get("recorded", [])) >= SENT
                and sum(r["count"] for r in receiver.get("recorded", [])) >= SENT
            ):
                break
            time.sleep(1)
            data = wait_report(cluster, "e2e-record", SENT)

    sender, veth, receiver = (_hop(data, h) for h in ("a-c1-eth0-out", "a-veth-in", "b-c2-eth0-in"))
    assert sender["counts"] == [{"node": "host-a", "by": "ttl", "key": SENT_TTL, "count": SENT}], sender
    # The TTL at host-a's receive from the veth (a tracepoint: read from the kernel's sk_buff), every packet.
    assert veth["recorded"] == [
        {
            "node": "host-a",
            "field": "ttl",
            "count": SENT,
            "min": SENT_TTL,
            "max": SENT_TTL,
            "mean": float(SENT_TTL),
            "last": SENT_TTL,
        }
    ], veth
    # Every packet's size at c2's eth0: Ethernet 14 + IPv4 20 + UDP 8 + payload + the 4-byte ID the first hop
    # added after the UDP payload (trimmed by c2's UDP stack, after this hop).
    size = 14 + 20 + 8 + PAYLOAD + kernel_abi.UDP_ID_LEN
    assert receiver["recorded"] == [
        {
            "node": "host-b",
            "field": "len",
            "count": SENT,
            "min": size,
            "max": size,
            "mean": float(size),
            "last": size,
        }
    ], receiver
    # The joined packets agree: every packet was recorded at both hops.
    assert data["packets"] >= SENT
    assert _hop(data, "a-c1-eth0-out")["recorded"] == []
