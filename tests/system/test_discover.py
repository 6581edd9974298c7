"""Path discovery end to end: ``hoptrace discover`` through the dispatcher on the two-host VXLAN
topology, with real UDP and TCP flows from c1 to c2.

Ground truth: the device sequence of the reference path (lab/reference.py, the demo's and the system tests'
hops) plus the two bridge crossings the reference does not trace (br0 receiving the frame c1 sends to its
gateway on host-a; br0 sending toward c2 on host-b). Every discovered packet must have crossed exactly those
devices in exactly this order; the discovered spec, applied, decomposes every packet sent; afterwards the
kernel holds no hoptrace program, link or tcx attachment (bpftool and BPF_PROG_QUERY, not the agent's word).
"""

from __future__ import annotations

import json
import socket
import threading
import time

import pytest
from system_helpers import UdpSender, running_cluster, wait_report

from hoptrace.common.timeouts import scaled
from hoptrace.lab.bpfstate import bpf_fds, bpftool_json, tcx_attachments
from hoptrace.lab.reference import vxlan_path_spec
from hoptrace.spec import load_spec
from hoptrace.v1 import api_pb2, trace_pb2

# (node, netns role or "" for the host's own, dev, direction) in path order: c1 -> c2 over VXLAN.
EXPECTED = [
    ("host-a", "c1", "eth0", "egress"),
    ("host-a", "", "veth-c1", "ingress"),
    ("host-a", "", "br0", "ingress"),
    ("host-a", "", "vxlan0", "egress"),
    ("host-a", "", "wire0", "egress"),
    ("host-b", "", "wire0", "ingress"),
    ("host-b", "", "vxlan0", "ingress"),
    ("host-b", "", "br0", "egress"),
    ("host-b", "", "veth-c2", "egress"),
    ("host-b", "c2", "eth0", "ingress"),
]
EXPECTED_NAMES = [
    "a-c1-eth0-out", "a-veth-c1-in", "a-br0-in", "a-vxlan0-out", "a-wire0-out",
    "b-wire0-in", "b-vxlan0-in", "b-br0-out", "b-veth-c2-out", "b-c2-eth0-in",
]  # fmt: skip


def expected_hops(topo) -> list[tuple[str, str, str, str]]:
    """EXPECTED with the topology's namespace names and each crossing's attach point."""
    return [
        (node, topo.netns(role) if role else "", dev, "tc-ingress" if way == "ingress" else "tc-egress")
        for node, role, dev, way in EXPECTED
    ]


def hop_tuples(hops) -> list[tuple[str, str, str, str]]:
    """(node, netns, dev, at) of each hop (JSON dicts or HopSpec messages)."""
    get = (lambda h, k: h[k]) if hops and isinstance(hops[0], dict) else getattr
    return [(get(h, "node"), get(h, "netns"), get(h, "dev"), get(h, "at")) for h in hops]


def assert_reference_in_order(topo, hops) -> None:
    """The reference path's devices (lab/reference.py) appear in the discovered hops, in the same order."""
    reference = vxlan_path_spec(topo, "ref")
    found = [(h[0], h[1], h[2]) for h in hop_tuples(hops)]
    positions = [found.index((r.node, r.netns, r.dev)) for r in reference.hops]
    assert positions == sorted(positions), (positions, found)


def discovery_programs() -> list[str]:
    """Names of the discovery programs the kernel still lists."""
    names = [p.get("name", "") for p in bpftool_json("prog", "show") or []]
    return [n for n in names if n.startswith("discover_")]


def assert_nothing_attached_anywhere(cluster=None) -> None:
    """No discovery program loaded anywhere (bpftool), no BPF link held by a running agent of `cluster`."""
    # An agent closes its discovery programs after it reports its summary, and the kernel may drop a
    # closed link's program a little later (deferred link release): they must be gone, in bounded time.
    deadline = time.monotonic() + scaled(10)
    while discovery_programs() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert discovery_programs() == []
    for name, component in cluster.components.items() if cluster else []:
        if name.startswith("agent-") and component.process.poll() is None:
            assert bpf_fds(component.process.pid)["link"] == set(), name


def assert_nothing_attached(topo, cluster=None) -> None:
    """No tcx program on any device of the topology, and nothing else attached (above)."""
    assert tcx_attachments(topo) == {}
    assert_nothing_attached_anywhere(cluster)


class TcpConnector:
    """Opens a new TCP connection c1 -> c2:PORT every 50 ms and sends a few segments on it (sock_ops tags
    connections that start while discovery runs), until stopped. With `family` 6, over IPv6; with
    `connect_to`, the client connects there (a Service address translated to c2:PORT)."""

    def __init__(self, topo, port: int, family: int = 4, connect_to: tuple[str, int] | None = None) -> None:
        self.topo, self.port, self.family = topo, port, family
        af = socket.AF_INET if family == 4 else socket.AF_INET6
        self.connect_to = connect_to or (topo.addr("c2", family), port)
        self.stop_event = threading.Event()
        self.server = topo.socket("c2", af, socket.SOCK_STREAM)
        self.server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.server.bind((topo.addr("c2", family), port))
        self.server.listen(64)
        self.server.settimeout(0.2)
        self.connections = 0
        self.threads = [
            threading.Thread(target=self._accept, daemon=True),
            threading.Thread(target=self._connect, daemon=True),
        ]

    def _accept(self) -> None:
        while not self.stop_event.is_set():
            try:
                conn, _ = self.server.accept()
            except TimeoutError:
                continue
            with conn:
                conn.settimeout(1)
                try:
                    while conn.recv(4096):
                        pass
                except OSError:
                    pass

    def _connect(self) -> None:
        while not self.stop_event.is_set():
            af = socket.AF_INET if self.family == 4 else socket.AF_INET6
            with self.topo.socket("c1", af, socket.SOCK_STREAM) as client:
                client.settimeout(1)
                client.connect(self.connect_to)
                for _ in range(3):
                    client.sendall(b"x" * 100)
                self.connections += 1
            self.stop_event.wait(0.05)

    def __enter__(self) -> TcpConnector:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop_event.set()
        for thread in self.threads:
            thread.join(5)
        self.server.close()


@pytest.fixture
def cluster(topology, influxd):
    """The VXLAN topology's cluster; each agent owns its host's and its container's netns."""
    with running_cluster(topology, influxd.url) as running:
        yield running
    # Agents stopped: discovery attached nothing that outlives them either.
    assert_nothing_attached(topology)


def test_discover_udp_flow_gives_every_crossing_in_order_and_a_spec_that_decomposes(topology, cluster):
    """UDP c1 -> c2: every packet crossed the ten devices in order; the printed spec applies and its report
    counts every packet sent afterwards; nothing stays attached after discovery."""
    port = 12131
    sender = UdpSender(topology, "c1", "c2", port, rate_pps=200).start()
    try:
        result = cluster.hoptrace(
            "discover", "--protocol", "udp", "--src", topology.addr("c1"), "--dst", topology.addr("c2"),
            "--dst-port", str(port), "--duration", "3s", "--packets", "50", "--json",
        )  # fmt: skip
    finally:
        sender.stop()
    data = json.loads(result.stdout)
    assert "discover: host-a:" in result.stderr and "discover: host-b:" in result.stderr
    assert data["packets"] >= 50
    assert len(data["paths"]) == 1, data["paths"]  # one route: every packet took it
    path = data["paths"][0]
    assert path["share"] == 1.0 and path["packets"] == data["packets"]
    assert hop_tuples(path["hops"]) == expected_hops(topology)
    assert [h["name"] for h in path["hops"]] == EXPECTED_NAMES
    since = [h["since_first_ns"] for h in path["hops"]]
    assert since[0] == 0 and since == sorted(since) and since[-1] > 0
    assert_reference_in_order(topology, path["hops"])
    # Discovery left nothing behind while the agents still run.
    assert_nothing_attached(topology, cluster)

    # The printed spec applies as it is, and decomposes every packet sent from then on.
    spec = load_spec(json.dumps(data["spec"]))
    spec.name = "discovered-udp"
    cluster.apply(spec)
    assert [h.name for h in cluster.api().GetTrace(api_pb2.GetTraceRequest(name=spec.name)).spec.hops] == (
        EXPECTED_NAMES
    )
    time.sleep(0.5)  # tcx links are in place once ApplyTrace returned; let the collector see the first batch
    sender = UdpSender(topology, "c1", "c2", port, rate_pps=200).start()
    time.sleep(2)
    sent = sender.stop()
    report = wait_report(cluster, spec.name, sent)
    assert report["complete"] == sent, report
    segments = [(s["from"], s["to"]) for s in report["segments"]][: len(EXPECTED_NAMES) - 1]
    assert segments == list(zip(EXPECTED_NAMES, EXPECTED_NAMES[1:], strict=False)), report["segments"]
    for segment in report["segments"][: len(EXPECTED_NAMES) - 1]:
        assert segment["count"] == sent, segment
    cluster.api().DeleteTrace(api_pb2.DeleteTraceRequest(name=spec.name))


def test_discover_tcp_flow_and_apply(topology, cluster):
    """TCP c1 -> c2 (sock_ops tags the connections that start while it looks): the same ten crossings in
    order, and --apply applies the spec at once."""
    port = 12132
    with TcpConnector(topology, port) as tcp:
        result = cluster.hoptrace(
            "discover", "--protocol", "tcp", "--src", topology.addr("c1"), "--dst", topology.addr("c2"),
            "--dst-port", str(port), "--duration", "3s", "--packets", "40", "--apply", "discovered-tcp",
        )  # fmt: skip
    assert tcp.connections > 0
    spec = load_spec(result.stdout)
    assert spec.name == "discovered-tcp" and spec.filter.protocol == "tcp"
    assert hop_tuples(spec.hops) == expected_hops(topology)
    assert [h.name for h in spec.hops] == EXPECTED_NAMES
    assert "path 1 of 1:" in result.stderr and "applied discovered-tcp" in result.stderr
    trace = cluster.api().GetTrace(api_pb2.GetTraceRequest(name="discovered-tcp"))
    assert [h.name for h in trace.spec.hops] == EXPECTED_NAMES
    cluster.api().DeleteTrace(api_pb2.DeleteTraceRequest(name="discovered-tcp"))
    assert_nothing_attached(topology, cluster)


def test_discover_names_what_is_wrong_and_says_when_nothing_was_seen(topology, cluster):
    """No --src is INVALID_ARGUMENT naming filter.src; an unknown node names it; a flow nobody sends gives
    the clear message after the duration, and a non-zero exit without a traceback."""
    missing = cluster.hoptrace("discover", "--protocol", "udp", "--dst", topology.addr("c2"), check=False)
    assert missing.returncode == 1 and "filter.src" in missing.stderr and "Traceback" not in missing.stderr
    unknown = cluster.hoptrace(
        "discover", "--protocol", "udp", "--src", topology.addr("c1"), "--node", "nope", check=False
    )
    assert unknown.returncode == 1 and "nodes[0]" in unknown.stderr and "nope" in unknown.stderr
    silent = cluster.hoptrace(
        "discover", "--protocol", "udp", "--src", topology.addr("c1"), "--dst-port", "9", "--duration", "1s",
        check=False,
    )  # fmt: skip
    assert silent.returncode == 1, silent.stdout
    assert "no packet of the flow was seen in 1s on host-a, host-b" in silent.stderr
    assert "Traceback" not in silent.stderr
    request = api_pb2.DiscoverRequest(
        filter=trace_pb2.Filter(protocol="udp", src="198.18.1.2"), duration_ms=500
    )
    events = list(cluster.api().Discover(request, timeout=60))
    assert events[-1].HasField("result") and not events[-1].result.paths
    assert_nothing_attached(topology, cluster)
