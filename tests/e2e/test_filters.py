"""End to end: the flow filter, sampling, and which host's agent records what.

A user narrows a trace to one flow, samples it, and runs one agent per host; these tests check that exactly
the chosen packets get IDs, that every hop records the same sampled packets, and that an agent whose hop
means "any device" still records only its own host's devices.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from e2e_helpers import (
    ALL_HOPS,
    assert_complete_path,
    expected_flow_hash,
    final_counters,
    ids_by_hop,
    path_plans,
    send_udp,
    spec_plans,
    start_attached,
    udp_receiver,
)

from hoptrace.lab.processes import AgentProcess
from hoptrace.lab.topology import TwoHostTopology

UDP = 17


def matched_everywhere(counters: dict[int, dict[str, Any]], hops: tuple[int, ...], n: int) -> None:
    """Each hop's ``matched`` counter is exactly n (the filtered flow's packets) and ``recorded`` too."""
    for hop in hops:
        c = counters[hop]
        assert c["matched"] == n and c["recorded"] == n, f"hop {hop}: want {n} matched and recorded: {c}"


def test_filter_on_one_of_two_concurrent_flows(
    topology: TwoHostTopology, agent_factory: Callable[..., AgentProcess], bpf_object: Path
) -> None:
    """Two interleaved UDP flows c1 -> c2 on ports 6001 and 6002, filter on 6001: only 6001's packets get IDs
    and records (with its flow hash); 6002's are delivered, and counted not matched at every hop."""
    src, dst = topology.addr("c1"), topology.addr("c2")
    n = 50
    plans = path_plans(topology, "two-flows", {"protocol": "udp", "dstPort": 6001})
    agent_a = start_attached(agent_factory, plans[0], "host-a", topology.host_a)
    agent_b = start_attached(agent_factory, plans[1], "host-b", topology.host_b)
    with udp_receiver(topology, "c2", dst, 6001) as drain1, udp_receiver(topology, "c2", dst, 6002) as drain2:
        for i in range(n):
            send_udp(topology, "c1", src, 40001, dst, 6001, [b"one-%03d" % i])
            send_udp(topology, "c1", src, 40002, dst, 6002, [b"two-%03d" % i])
        got1, got2 = drain1(), drain2()
    agent_a.stop()
    agent_b.stop()

    assert [p for p, _ in got1] == [b"one-%03d" % i for i in range(n)]
    assert [p for p, _ in got2] == [b"two-%03d" % i for i in range(n)]
    counters = {**final_counters(agent_a), **final_counters(agent_b)}
    assert counters[0]["tagged"] == n, f"tagger: {counters[0]}"
    records = agent_a.records + agent_b.records
    by_id = assert_complete_path(records)
    assert len(by_id) == n
    flow1 = expected_flow_hash(UDP, src, dst, 40001, 6001)
    flow2 = expected_flow_hash(UDP, src, dst, 40002, 6002)
    assert flow1 != flow2
    hashes = Counter(r["flow_hash"] for r in records)
    assert hashes == {flow1: n * len(ALL_HOPS)}, f"flow hashes {hashes}, want only {flow1:#x} (port 6001)"
    matched_everywhere(counters, ALL_HOPS, n)
    for hop in ALL_HOPS:
        assert counters[hop]["not_matched"] >= n, (
            f"hop {hop}: port 6002's packets not counted: {counters[hop]}"
        )


@pytest.mark.parametrize("sample,packets", [(10, 1000), (7, 100)])
def test_sampling_tags_exactly_one_in_n_and_every_hop_records_those(
    topology: TwoHostTopology,
    agent_factory: Callable[..., AgentProcess],
    bpf_object: Path,
    sample: int,
    packets: int,
) -> None:
    """``sample: N`` with a known number of packets: exactly every N-th packet is tagged (the tagger's
    counter, its records and the packets' sizes agree) and every hop records exactly those IDs."""
    src, dst = topology.addr("c1"), topology.addr("c2")
    plans = path_plans(topology, "sampled", {"protocol": "udp", "dstPort": 6100}, sample=sample)
    agent_a = start_attached(agent_factory, plans[0], "host-a", topology.host_a)
    agent_b = start_attached(agent_factory, plans[1], "host-b", topology.host_b)
    # Packet i has i + 100 payload bytes, so a record's wire length says which packet it was.
    payloads = [bytes([i % 251]) * (100 + i % 1000) for i in range(packets)]
    with udp_receiver(topology, "c2", dst, 6100) as drain:
        for start in range(0, packets, 50):
            send_udp(topology, "c1", src, 40100, dst, 6100, payloads[start : start + 50])
        got = drain()
    agent_a.stop()
    agent_b.stop()

    assert [p for p, _ in got] == payloads, f"sent {packets} datagrams, received {len(got)} (or changed)"
    expected = -(-packets // sample)  # ceil: the sequence starts at a sampled packet
    counters = {**final_counters(agent_a), **final_counters(agent_b)}
    tagger = counters[0]
    assert tagger["tagged"] == expected, f"{packets} packets, sample {sample}: tagger {tagger}"
    assert tagger["matched"] == packets and tagger["untagged"] == packets - expected, f"tagger {tagger}"
    by_id = assert_complete_path(agent_a.records + agent_b.records)
    assert len(by_id) == expected
    for hop in ALL_HOPS:
        c = counters[hop]
        assert c["recorded"] == expected and c["matched"] == packets, f"hop {hop}: {c}"
    index = sorted(r["wire_len"] - (14 + 20 + 8 + 4) - 100 for r in agent_a.records if r["hop_index"] == 0)
    assert index == list(range(index[0], packets, sample)), f"tagged packets (by index): {index}"


# (filter, address that matches, address that must not match); the second source is added to c1's eth0.
CIDR_CASES = [
    pytest.param("198.18.1.0/24", "198.18.1.2", "198.18.3.2", id="ipv4-cidr-24"),
    pytest.param("198.18.1.0/25", "198.18.1.2", "198.18.1.200", id="ipv4-cidr-25"),
    pytest.param("fd00:1::2", "fd00:1::2", "fd00:1::3", id="ipv6-address"),
    pytest.param("fd00:1::/126", "fd00:1::2", "fd00:1::5", id="ipv6-cidr-126"),
]


@pytest.mark.parametrize("src_filter,inside,outside", CIDR_CASES)
def test_source_address_filter(
    topology: TwoHostTopology,
    agent_factory: Callable[..., AgentProcess],
    bpf_object: Path,
    src_filter: str,
    inside: str,
    outside: str,
) -> None:
    """A source address or CIDR filter: packets from inside it are traced at every hop, packets from
    outside it (same ports, same destination, delivered just the same) are not."""
    v6 = ":" in inside
    dst = topology.addr("c2", 6 if v6 else 4)
    prefix = "/128" if v6 else ("/24" if outside.startswith("198.18.1.") else "/32")
    topology.run("c1", "ip", "addr", "add", outside + prefix, "dev", "eth0", *(["nodad"] if v6 else []))
    n = 20
    plans = path_plans(topology, "cidr", {"protocol": "udp", "src": src_filter, "dstPort": 6200})
    agent_a = start_attached(agent_factory, plans[0], "host-a", topology.host_a)
    agent_b = start_attached(agent_factory, plans[1], "host-b", topology.host_b)
    with udp_receiver(topology, "c2", dst, 6200) as drain:
        for i in range(n):
            send_udp(topology, "c1", inside, 40200, dst, 6200, [b"in-%02d" % i])
            send_udp(topology, "c1", outside, 40200, dst, 6200, [b"out-%02d" % i])
        got = drain()
    agent_a.stop()
    agent_b.stop()

    senders = Counter(peer[0] for _, peer in got)
    assert senders == {inside: n, outside: n}, f"c2 received {dict(senders)}, want {n} from each"
    counters = {**final_counters(agent_a), **final_counters(agent_b)}
    assert counters[0]["tagged"] == n, f"tagger: {counters[0]}"
    records = agent_a.records + agent_b.records
    assert len(assert_complete_path(records)) == n
    want = expected_flow_hash(UDP, inside, dst, 40200, 6200)
    assert {r["flow_hash"] for r in records} == {want}, "records of another flow than the filtered source's"
    matched_everywhere(counters, ALL_HOPS, n)


def ifindex_names(topo: TwoHostTopology, role: str) -> dict[int, str]:
    """ifindex -> device name inside a role's namespace."""
    return {
        int(link["ifindex"]): link["ifname"] for link in json.loads(topo.run(role, "ip", "-j", "link").stdout)
    }


def test_each_agent_records_only_its_own_hosts_devices(
    topology: TwoHostTopology, agent_factory: Callable[..., AgentProcess], bpf_object: Path
) -> None:
    """Both agents hook the system-wide netif_receive_skb event without a device ("any device of my host"):
    host-a's records only host-a's receptions (veth-c1, br0), host-b's only host-b's (wire0, vxlan0), each
    once per packet, although both programs run for every packet of the machine."""
    src, dst, n = topology.addr("c1"), topology.addr("c2"), 30
    plans = spec_plans(
        {
            "name": "own-hops",
            "filter": {"protocol": "udp", "dst_port": 6300},
            "hops": [
                {"name": "c1-out", "node": "host-a", "at": "tc-egress", "dev": "eth0", "netns": topology.c1},
                {"name": "a-any-rx", "node": "host-a", "at": "tracepoint:net:netif_receive_skb"},
                {"name": "b-any-rx", "node": "host-b", "at": "tracepoint:net:netif_receive_skb"},
            ],
        }
    )
    plan_a, plan_b = plans["host-a"], plans["host-b"]
    agent_a = start_attached(agent_factory, plan_a, "host-a", topology.host_a)
    agent_b = start_attached(agent_factory, plan_b, "host-b", topology.host_b)
    with udp_receiver(topology, "c2", dst, 6300) as drain:
        send_udp(topology, "c1", src, 40300, dst, 6300, [b"x" * 64] * n)
        got = drain()
    agent_a.stop()
    agent_b.stop()

    assert len(got) == n
    ids = set(ids_by_hop(agent_a.records)[0])
    assert len(ids) == n, f"tagger recorded {len(ids)} IDs for {n} packets"
    for agent, hop, role, devices in (
        (agent_a, 1, "host-a", ("veth-c1", "br0")),
        (agent_b, 2, "host-b", ("wire0", "vxlan0")),
    ):
        names = ifindex_names(topology, role)
        recs = [r for r in agent.records if r["hop_index"] == hop]
        foreign = [r for r in recs if r["ifindex"] not in names]
        assert not foreign, f"{role}'s agent recorded devices that are not {role}'s: {foreign[:3]}"
        seen = Counter((names[r["ifindex"]], r["packet_id"]) for r in recs)
        want = Counter({(dev, pid): 1 for dev in devices for pid in ids})
        assert seen == want, (
            f"{role}: want every ID once on each of {devices}; got per device "
            f"{dict(Counter(names[r['ifindex']] for r in recs))}, IDs {len({r['packet_id'] for r in recs})}"
        )
        counters = final_counters(agent)[hop]
        # The program ran for the other host's receptions too, and turned them away.
        assert counters["not_matched"] >= n, f"{role} hop {hop}: {counters}"
