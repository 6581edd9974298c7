"""Path discovery across three hosts with a routed hop and two equal-cost wires (lab/routed.py).

Ground truth: the kernel's own route choice for each flow (``ip route get ... sport P`` on host-a, the same
5-tuple hash the datapath uses) decides which wire a flow takes. Flows from many source ports give two paths
with their shares; one flow per wire gives exactly its own path; the discovered spec of one flow, applied,
decomposes every packet it sends across the routed hop.
"""

from __future__ import annotations

import json
import socket
import subprocess
import threading
import time

import pytest
from system_helpers import wait_report
from test_discover import assert_nothing_attached_anywhere

from hoptrace.lab.localcluster import LocalCluster
from hoptrace.lab.routed import RoutedTopology
from hoptrace.spec import load_spec
from hoptrace.v1 import api_pb2

PORT = 13131


def expected(topo: RoutedTopology, wire: int) -> list[tuple[str, str, str, str]]:
    """(node, netns, dev, at) of c1 -> c2 over wire `wire` (0 or 1)."""
    return [
        ("host-a", topo.c1, "eth0", "tc-egress"),
        ("host-a", "", "veth-c1", "tc-ingress"),
        ("host-a", "", "br0", "tc-ingress"),
        ("host-a", "", f"wa{wire}", "tc-egress"),
        ("host-r", "", f"ra{wire}", "tc-ingress"),
        ("host-r", "", "rb0", "tc-egress"),
        ("host-b", "", "wb0", "tc-ingress"),
        ("host-b", "", "br0", "tc-egress"),
        ("host-b", "", "veth-c2", "tc-egress"),
        ("host-b", topo.c2, "eth0", "tc-ingress"),
    ]


def wire_of(topo: RoutedTopology, sport: int) -> int:
    """The wire host-a's kernel routes the flow c1:sport -> c2:PORT over (its ECMP hash, asked directly)."""
    out = subprocess.run(
        ["ip", "-n", topo.netns("host-a"), "route", "get", topo.addr("c2"), "from", topo.addr("c1"),
         "iif", "br0", "ipproto", "udp", "sport", str(sport), "dport", str(PORT)],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    return 0 if " dev wa0 " in out else 1


def hop_tuples(hops) -> list[tuple[str, str, str, str]]:
    return [(h["node"], h["netns"], h["dev"], h["at"]) for h in hops]


class UdpFlows:
    """UDP datagrams c1:sport -> c2:PORT from each of `sports`, round-robin at `rate_pps` in all."""

    def __init__(self, topo: RoutedTopology, sports: list[int], rate_pps: float = 300.0) -> None:
        self.socks = []
        for sport in sports:
            sock = topo.socket("c1", socket.AF_INET, socket.SOCK_DGRAM)
            sock.bind((topo.addr("c1"), sport))
            self.socks.append(sock)
        self.target = (topo.addr("c2"), PORT)
        self.gap = 1.0 / rate_pps
        self.sent = 0
        self.stop_event = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self.stop_event.is_set():
            self.socks[self.sent % len(self.socks)].sendto(b"y" * 64, self.target)
            self.sent += 1
            self.stop_event.wait(self.gap)

    def __enter__(self) -> UdpFlows:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop_event.set()
        self.thread.join(5)
        for sock in self.socks:
            sock.close()


@pytest.fixture
def routed(three_host_topology: RoutedTopology) -> RoutedTopology:
    return three_host_topology


@pytest.fixture
def cluster3(routed, influxd):
    """Dispatcher, collector and three agents: host-a owns c1, host-b owns c2, host-r only its own netns."""
    cluster = LocalCluster(influx_url=influxd.url)
    try:
        cluster.start_dispatcher()
        cluster.start_collector("--join-window", "1")
        cluster.wait_listening()
        cluster.start_agent("host-a", routed.netns("host-a"), "--netns-owned", routed.c1)
        # Naming its own netns alone: the router owns no other namespace (the default would be all).
        cluster.start_agent("host-r", routed.netns("host-r"), "--netns-owned", routed.netns("host-r"))
        cluster.start_agent("host-b", routed.netns("host-b"), "--netns-owned", routed.c2)
        cluster.wait_agents(["host-a", "host-r", "host-b"])
        yield cluster
    finally:
        cluster.stop()
    assert_nothing_attached_anywhere()


def discover(cluster: LocalCluster, topo: RoutedTopology, *extra: str) -> dict:
    result = cluster.hoptrace(
        "discover", "--protocol", "udp", "--src", topo.addr("c1"), "--dst", topo.addr("c2"),
        "--dst-port", str(PORT), "--duration", "3s", "--json", *extra,
    )  # fmt: skip
    return json.loads(result.stdout)


def test_flows_over_equal_cost_wires_give_two_paths_each_exact(routed, cluster3):
    """32 flows (source ports) split over wa0 and wa1 by the kernel's hash: two paths, each the exact ten
    crossings over its wire, their shares what the kernel's route choice predicts."""
    sports = list(range(30000, 30032))
    on_wire1 = sum(wire_of(routed, sport) for sport in sports)
    assert 0 < on_wire1 < len(sports), "the hash put every flow on one wire: pick other ports"
    with UdpFlows(routed, sports):
        data = discover(cluster3, routed, "--packets", "320")
    paths = data["paths"]
    assert len(paths) == 2, [hop_tuples(p["hops"]) for p in paths]
    by_wire = {0 if any(h["dev"] == "wa0" for h in p["hops"]) else 1: p for p in paths}
    assert hop_tuples(by_wire[0]["hops"]) == expected(routed, 0)
    assert hop_tuples(by_wire[1]["hops"]) == expected(routed, 1)
    assert sum(p["packets"] for p in paths) == data["packets"]
    # Round-robin over the ports: each wire's share is its ports' share (within a packet or two per port).
    assert abs(by_wire[1]["share"] - on_wire1 / len(sports)) < 0.05, (by_wire[1]["share"], on_wire1)
    assert [h["name"] for h in by_wire[0]["hops"]][3:6] == ["a-wa0-out", "r-ra0-in", "r-rb0-out"]
    # The path graph's edges: 6 steps both wires share (every packet) and 3 of each wire's own.
    steps = {(s["from"], s["to"]): s for s in data["segments"]}
    assert len(steps) == 12
    assert steps[("a-c1-eth0-out", "a-veth-c1-in")]["packets"] == data["packets"]
    assert steps[("a-wa1-out", "r-ra1-in")]["packets"] == by_wire[1]["packets"]
    node_of = {h["name"]: h["node"] for p in paths for h in p["hops"]}
    within = [s for (a, b), s in steps.items() if node_of[a] == node_of[b]]
    assert len(within) == 9 and all(s["median_ns"] > 0 for s in within)  # one clock: never below zero


def test_a_flow_per_wire_gets_its_own_path_and_its_spec_decomposes(routed, cluster3):
    """One flow on each wire (chosen by the kernel's route lookup): each discovery gives exactly its own
    path; the first flow's spec, applied, counts every packet it sends afterwards in every segment."""
    sports = list(range(31000, 31064))
    first = {wire_of(routed, sport): sport for sport in reversed(sports)}
    assert set(first) == {0, 1}
    specs = {}
    for wire, sport in sorted(first.items()):
        with UdpFlows(routed, [sport], rate_pps=200):
            data = discover(cluster3, routed, "--src-port", str(sport), "--packets", "40")
        assert len(data["paths"]) == 1, data["paths"]
        assert hop_tuples(data["paths"][0]["hops"]) == expected(routed, wire)
        assert data["spec"]["filter"]["src_port"] == sport
        specs[wire] = data["spec"]

    spec = load_spec(json.dumps(specs[0]))
    spec.name = "routed-wa0"
    cluster3.apply(spec)
    time.sleep(0.5)  # the collector's first batch of the trace
    with UdpFlows(routed, [first[0]], rate_pps=200) as flow:
        time.sleep(2)
    sent = flow.sent
    report = wait_report(cluster3, spec.name, sent)
    assert report["complete"] == sent, report
    names = [h.name for h in spec.hops]
    segments = [(s["from"], s["to"]) for s in report["segments"]][: len(names) - 1]
    assert segments == list(zip(names, names[1:], strict=False))
    assert all(s["count"] == sent for s in report["segments"][: len(names) - 1]), report["segments"]
    cluster3.api().DeleteTrace(api_pb2.DeleteTraceRequest(name=spec.name))


def test_tcp_connections_over_equal_cost_wires_each_take_an_exact_path(routed, cluster3):
    """New TCP connections (ephemeral source ports) spread over both wires: every discovered path is one of
    the two exact sequences, and the two together hold every packet."""
    server = routed.socket("c2", socket.AF_INET, socket.SOCK_STREAM)
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind((routed.addr("c2"), PORT))
    server.listen(64)
    server.settimeout(0.2)
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            with conn:
                conn.settimeout(1)
                try:
                    while conn.recv(4096):
                        pass
                except OSError:
                    pass

    def connect() -> None:
        while not stop.is_set():
            with routed.socket("c1", socket.AF_INET, socket.SOCK_STREAM) as client:
                client.settimeout(1)
                client.connect((routed.addr("c2"), PORT))
                client.sendall(b"z" * 100)
            stop.wait(0.03)

    threads = [threading.Thread(target=accept, daemon=True), threading.Thread(target=connect, daemon=True)]
    for thread in threads:
        thread.start()
    try:
        result = cluster3.hoptrace(
            "discover", "--protocol", "tcp", "--src", routed.addr("c1"), "--dst", routed.addr("c2"),
            "--dst-port", str(PORT), "--duration", "3s", "--json",
        )  # fmt: skip
    finally:
        stop.set()
        for thread in threads:
            thread.join(5)
        server.close()
    data = json.loads(result.stdout)
    assert "discover: looking:" in result.stderr  # progress while the agents look
    sequences = [hop_tuples(p["hops"]) for p in data["paths"]]
    assert sequences and all(s in (expected(routed, 0), expected(routed, 1)) for s in sequences), sequences
    assert sum(p["packets"] for p in data["paths"]) == data["packets"] > 0
