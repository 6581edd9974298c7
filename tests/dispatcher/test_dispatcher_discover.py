"""Path discovery's merge (dispatcher/discover.py) on crafted crossings: per-node order, the cross-node merge
by aligned time, one path per distinct crossing sequence with its share (ECMP), the listening window, hop
names, and the request checks."""

from __future__ import annotations

import dataclasses
import random

import pytest

from hoptrace.dispatcher.discover import (
    Crossing,
    HopNamer,
    build_graph,
    build_paths,
    build_result,
    name_workloads,
    order_packet,
    overlapping_origins,
    validate_request,
)
from hoptrace.v1 import agent_pb2, api_pb2, trace_pb2

pytestmark = pytest.mark.unit  # pure code: make test-unit runs it without root

# Two hosts, a container each; packet 1 takes the path through "wire0", the ECMP twin through "wire1".
PATH = [
    ("host-a", "t-c1", "eth0", "egress"),
    ("host-a", "", "veth-c1", "ingress"),
    ("host-a", "", "vxlan0", "egress"),
    ("host-a", "", "wire0", "egress"),
    ("host-b", "", "wire0", "ingress"),
    ("host-b", "", "vxlan0", "ingress"),
    ("host-b", "t-c2", "eth0", "ingress"),
]
TWIN = [place if place[2] != "wire0" else (*place[:2], "wire1", place[3]) for place in PATH]


def crossings(packet: int, path, start_ns: int, skew: dict[str, int] | None = None) -> list[Crossing]:
    """One packet's crossings 1 us apart; each node's mono clock is offset from the master by `skew`."""
    skew = skew or {}
    out = []
    for i, (node, netns, dev, way) in enumerate(path):
        master = start_ns + 1000 * i
        out.append(Crossing(node, packet, master + skew.get(node, 0), master, netns, dev, way))
    return out


def places(path: api_pb2.DiscoveredPath) -> list[tuple[str, str, str, str]]:
    return [(h.node, h.netns, h.dev, "ingress" if h.at == "tc-ingress" else "egress") for h in path.hops]


def test_paths_in_order_from_shuffled_crossings_with_shares() -> None:
    """90 packets on one path, 30 on its ECMP twin, crossings shuffled, node clocks far apart (mono): two
    paths, exact sequences, 75 % / 25 %."""
    all_crossings = []
    for packet in range(120):
        path = TWIN if packet % 4 == 3 else PATH
        all_crossings += crossings(packet, path, 10_000_000 * packet, {"host-a": 5_000_000_000, "host-b": -7})
    random.Random(4).shuffle(all_crossings)
    paths = build_paths(all_crossings)
    assert [(p.packets, p.share) for p in paths] == [(90, 0.75), (30, 0.25)]
    assert places(paths[0]) == PATH and places(paths[1]) == TWIN
    assert list(paths[0].since_first_ns) == [1000 * i for i in range(len(PATH))]
    assert [h.name for h in paths[0].hops] == [
        "a-c1-eth0-out", "a-veth-c1-in", "a-vxlan0-out", "a-wire0-out", "b-wire0-in", "b-vxlan0-in",
        "b-c2-eth0-in",
    ]  # fmt: skip
    assert [h.at for h in paths[0].hops][:2] == ["tc-egress", "tc-ingress"]


def test_since_first_never_goes_back_where_aligned_clocks_put_a_node_early() -> None:
    """Crossings 1 us apart, but host-b's aligned clock 1.5 us early (within a clock bound, more than the
    wire's 1 us): the path keeps its order, its times since the first never decrease (the wire's step
    counts 0), and the steps within host-b keep their own clock's 1 us."""
    all_crossings = []
    for packet in range(21):
        for crossing in crossings(packet, PATH, 10_000_000 * packet):
            if crossing.node == "host-b":
                crossing = dataclasses.replace(crossing, master_ns=crossing.master_ns - 1500)
            all_crossings.append(crossing)
    (path,) = build_paths(all_crossings)
    assert places(path) == PATH
    assert list(path.since_first_ns) == [0, 1000, 2000, 3000, 3000, 4000, 5000]


def test_segments_carry_each_steps_median_and_p99_over_every_path_that_makes_it() -> None:
    """100 packets, 1 in 4 over the twin wire; packet k spends (k + 1) us between wire egress and ingress
    (across nodes: aligned time) and its steps within a node are told by the node's own clock even where
    aligned time is off. Each edge: its packets, share, nearest-rank median and p99 of exactly those
    packets' step times; an edge both paths take counts both."""
    all_crossings = []
    for packet in range(100):
        path = TWIN if packet % 4 == 3 else PATH
        cs = []
        master = 1_000_000_000 * (packet + 1)
        for i, (node, netns, dev, way) in enumerate(path):
            master += (packet + 1) * 1000 if i == 4 else 500 * (i + 1)
            # host-a's aligned clock wobbles by 40 us per crossing; its mono clock (skewed 5 s) is exact.
            mono = master + (5_000_000_000 if node == "host-a" else 0)
            aligned = master + (40_000 * (i % 2) if node == "host-a" else 0)
            cs.append(Crossing(node, (packet, 7), mono, aligned, netns, dev, way))
        all_crossings += cs
    paths, segments = build_graph(all_crossings)
    by_step = {(s.from_hop.name, s.to_hop.name): s for s in segments}
    assert list(by_step)[:6] == [
        ("a-c1-eth0-out", "a-veth-c1-in"), ("a-veth-c1-in", "a-vxlan0-out"), ("a-vxlan0-out", "a-wire0-out"),
        ("a-wire0-out", "b-wire0-in"), ("b-wire0-in", "b-vxlan0-in"), ("b-vxlan0-in", "b-c2-eth0-in"),
    ]  # fmt: skip
    shared = by_step[("a-c1-eth0-out", "a-veth-c1-in")]
    assert (shared.packets, shared.share, shared.median_ns, shared.p99_ns) == (100, 1.0, 1000, 1000)
    # The wire: packets 0,1,2,4,5,6,... over wire0 (75), k spending (k + 1) us; aligned times on host-a
    # at even positions (wire0-out is the 4th crossing, i=3: +40 us) shift the step by -40 us.
    wire0 = sorted((k + 1) * 1000 - 40_000 for k in range(100) if k % 4 != 3)
    step = by_step[("a-wire0-out", "b-wire0-in")]
    assert (step.packets, step.share) == (75, 0.75)
    assert step.median_ns == wire0[37] and step.p99_ns == wire0[74]  # nearest rank: ceil(q * 75) - 1
    twin = by_step[("a-wire1-out", "b-wire1-in")]
    assert (twin.packets, twin.share) == (25, 0.25)
    assert sum(p.packets for p in paths) == 100


def test_the_step_into_the_first_followed_crossing_is_the_translated_segment() -> None:
    """Packets whose addresses host-a translates after veth-c1 (a DNAT): their crossings from vxlan0 on are
    followed by ID. Exactly the one step veth-c1-in > vxlan0-out is translated, in the graph and the view."""
    from hoptrace.results.path_view import paths_text, segment_data

    followed_from = PATH.index(("host-a", "", "vxlan0", "egress"))
    all_crossings = [
        dataclasses.replace(c, followed=i >= followed_from)
        for packet in range(10)
        for i, c in enumerate(crossings(packet, PATH, 10_000_000 * packet))
    ]
    paths, segments = build_graph(all_crossings)
    assert [(p.packets, places(p)) for p in paths] == [(10, PATH)]
    assert [(s.from_hop.name, s.to_hop.name) for s in segments if s.translated] == [
        ("a-veth-c1-in", "a-vxlan0-out")
    ]
    assert sum(segment_data(s)["translated"] for s in segments) == 1
    result = api_pb2.DiscoverResult(paths=paths, segments=segments)
    (line,) = [line for line in paths_text(result).splitlines() if "translated" in line]
    assert line.split()[:3] == ["a-veth-c1-in", "->", "a-vxlan0-out"], line


def test_a_packet_followed_everywhere_is_another_flow_and_left_out() -> None:
    """Packets of a followed trace's origin that no crossing saw matching the filter (another flow of that
    trace, taken by its ID alone) are not the flow's: only the packets that matched somewhere make paths."""
    flow = [c for packet in range(5) for c in crossings(packet, PATH, 10_000_000 * packet)]
    other = [
        dataclasses.replace(c, followed=True)
        for packet in range(100, 120)
        for c in crossings(packet, TWIN, 10_000_000 * packet + 5_000_000)
    ]
    paths = build_paths(flow + other)
    assert [(p.packets, p.share, places(p)) for p in paths] == [(5, 1.0, PATH)]


def test_a_discovery_follows_the_origins_of_traces_that_may_tag_its_flow() -> None:
    """overlapping_origins: a trace whose filter may take a packet of the flow (the Service address the
    client sends to, a wider prefix, no protocol) has its origin followed; another protocol, port, family or
    disjoint prefix has not."""
    flow = trace_pb2.Filter(protocol="udp", src="198.18.1.2", dst="198.19.143.228", dst_port=8080)
    traces = [
        (trace_pb2.Filter(protocol="udp", dst="198.19.143.228", dst_port=8080), 3),
        (trace_pb2.Filter(src="198.18.0.0/16"), 4),
        (trace_pb2.Filter(protocol="tcp", dst="198.19.143.228", dst_port=8080), 5),
        (trace_pb2.Filter(protocol="udp", dst="198.19.143.228", dst_port=8081), 6),
        (trace_pb2.Filter(protocol="udp", dst="198.18.2.0/24"), 7),
        (trace_pb2.Filter(src="fd00::/8"), 8),
        (trace_pb2.Filter(), 9),
    ]
    assert overlapping_origins(flow, traces) == [3, 4, 9]


def test_within_a_node_its_own_clock_decides_across_nodes_its_run_stays_together() -> None:
    """Aligned times that disagree with a node's own order do not reorder that node's crossings; a receiver
    whose aligned clock puts its first ingress before the sender's last egress (a wire faster than the clock
    bound) still comes after it."""
    us = 1000
    r1 = Crossing("r", (1, 1), 100, 0, "", "ra1", "ingress")
    r2 = Crossing("r", (1, 1), 200, 5 * us, "", "rb0", "egress")
    b1 = Crossing("b", (1, 1), 50, 3 * us, "", "wb0", "ingress")  # 2 us early: clock error
    b2 = Crossing("b", (1, 1), 80, 9 * us, "", "br0", "egress")
    assert order_packet([b2, r2, b1, r1]) == [r1, r2, b1, b2]
    a1 = Crossing("a", (1, 1), 100, 1 * us, "", "x", "egress")
    a2 = Crossing("a", (1, 1), 200, 0, "", "y", "egress")  # aligned time says earlier: mono wins
    a3 = Crossing("a", (1, 1), 900, 300 * us, "", "x", "ingress")  # back on a after b
    c1 = Crossing("b", (1, 1), 10, 100 * us, "", "z", "ingress")
    c2 = Crossing("b", (1, 1), 20, 200 * us, "", "z", "egress")
    assert order_packet([c2, a3, a1, c1, a2]) == [a1, a2, c1, c2, a3]


def test_packets_outside_the_common_listening_window_do_not_count() -> None:
    """A packet seen before the last node started listening would look cut short: it is left out."""
    early = crossings(1, PATH[:4], 100)  # host-b was not listening yet
    inside = crossings(2, PATH, 10_000)
    paths = build_paths(early + inside, window=(5_000, 1_000_000))
    assert [(p.packets, places(p)) for p in paths] == [(1, PATH)]
    assert len(build_paths(early + inside)) == 2


def test_hop_names_are_readable_and_unique() -> None:
    namer = HopNamer(["host-a", "host-b"], ["", "lab-c1", "lab-c2"])
    assert namer.name("host-a", "lab-c1", "eth0", "egress") == "a-c1-eth0-out"
    assert namer.name("host-a", "", "veth-c1", "ingress") == "a-veth-c1-in"
    assert namer.name("host-a", "", "veth-c1", "ingress") == "a-veth-c1-in-2"
    single = HopNamer(["node1"], ["/proc/42/ns/net"])
    assert single.name("node1", "/proc/42/ns/net", "eth0", "ingress") == "node1-net-eth0-in"


def test_result_spec_is_the_main_path_and_nothing_seen_says_so() -> None:
    request = api_pb2.DiscoverRequest(filter=trace_pb2.Filter(protocol="udp", src="198.18.1.2"), name="x")

    def summary(node: str) -> dict:
        cs = [c for c in crossings(7, PATH, 1000) if c.node == node]
        return {
            "crossings": [
                {"packet_id": 7, "flow_hash": 99, "mono_ns": c.mono_ns, "master_ns": c.master_ns,
                 "netns": c.netns, "dev": c.dev, "direction": c.direction}
                for c in cs
            ],
            "listen_from_ns": 0,
            "listen_until_ns": 10**12,
        }  # fmt: skip

    result = build_result(request, {"host-a": summary("host-a"), "host-b": summary("host-b")}, 5000)
    assert result.spec.name == "x" and result.spec.filter.src == "198.18.1.2"
    assert [(h.node, h.netns, h.dev) for h in result.spec.hops] == [p[:3] for p in PATH]
    assert result.packets == 1 and list(result.nodes) == ["host-a", "host-b"] and not result.message
    # Namespaces a node reported a pod (or a container) in are named by it, hop names too.
    registrations = {
        "host-a": agent_pb2.Register(
            namespaces=[
                agent_pb2.Namespace(
                    name="t-c1",
                    workloads=[
                        trace_pb2.Workload(container_name="k8s_app", pod_namespace="shop", pod_name="client"),
                        trace_pb2.Workload(
                            container_name="k8s_pause", pod_namespace="shop", pod_name="client"
                        ),
                    ],
                )
            ]
        ),
        "host-b": agent_pb2.Register(
            namespaces=[
                agent_pb2.Namespace(
                    name="t-c2", inode=22, workloads=[trace_pb2.Workload(container_name="web")]
                ),
                # the node's own namespace, holding a host-network pod: the node's, never the pod's
                agent_pb2.Namespace(name="", inode=7),
                agent_pb2.Namespace(
                    name="node-b",
                    inode=7,
                    workloads=[trace_pb2.Workload(pod_namespace="ops", pod_name="agent")],
                ),
            ]
        ),
    }
    named = build_result(
        request, {"host-a": summary("host-a"), "host-b": summary("host-b")}, 5000, registrations
    )
    ends = [(h.name, h.netns) for h in (named.spec.hops[0], named.spec.hops[-1])]
    assert ends == [("a-client-eth0-out", "pod:shop/client"), ("b-web-eth0-in", "container:web")]
    assert [h.netns for h in named.spec.hops[1:-1]] == [""] * (len(PATH) - 2)
    own = crossings(8, [("host-b", "node-b", "eth0", "ingress")], 0)
    assert name_workloads(own, registrations)[0].netns == "node-b"
    empty = build_result(request, {"host-a": {"crossings": []}}, 5000)
    assert not empty.paths and not empty.spec.hops
    assert empty.message.startswith("no packet of the flow was seen in 5s on host-a")


def test_request_problems_name_their_fields() -> None:
    bad = api_pb2.DiscoverRequest(
        filter=trace_pb2.Filter(protocol="icmp", dst="198.18.0.0/15"), nodes=["nope"], name="Bad Name"
    )
    fields = {e.field for e in validate_request(bad, ["host-a"])}
    assert fields == {"filter.protocol", "filter.src", "nodes[0]", "name"}
    good = api_pb2.DiscoverRequest(
        filter=trace_pb2.Filter(protocol="tcp", src="198.18.1.2"), nodes=["host-a"]
    )
    assert validate_request(good, ["host-a"]) == []
