"""Packets followed through address translation: a spec names the Service address a client sends to, and
every hop after the node's DNAT (and masquerade) still takes the packet, by its ID (discovery through the
same translation: test_discover_nat).

On the two-host VXLAN topology host-a translates as kube-proxy does for a ClusterIP Service: nftables
rewrites c1's packets to the Service address 198.18.99.9 (fd00:99::9) to c2's address and port at
prerouting, then masquerades them out of vxlan0 to host-a's own address. Four traces run at once (UDP and
TCP, IPv4 and IPv6), each with the dispatcher's own ID origin, so a hop of one trace that follows IDs never
takes another's packets. Ground truth: what c2 received, and nftables' count of c1's packets to the Service
before translation.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from dataclasses import dataclass

import pytest
from system_helpers import running_cluster, wait_report

from hoptrace.lab.reference import vxlan_path_spec
from hoptrace.lab.topology import TwoHostTopology
from hoptrace.lab.waiting import WaitTimeout, wait_until
from hoptrace.v1 import trace_pb2

SERVICE = {4: "198.18.99.9", 6: "fd00:99::9"}
UDP_SERVICE_PORT, UDP_BACKEND_PORT = 8080, 11111
TCP_SERVICE_PORT, TCP_BACKEND_PORT = 8081, 11112
DATAGRAMS = 120
MESSAGES = 40


@dataclass(frozen=True)
class Flow:
    protocol: str
    family: int

    @property
    def trace(self) -> str:
        return f"svc-{self.protocol}-v{self.family}"

    @property
    def service_port(self) -> int:
        return UDP_SERVICE_PORT if self.protocol == "udp" else TCP_SERVICE_PORT

    @property
    def backend_port(self) -> int:
        return UDP_BACKEND_PORT if self.protocol == "udp" else TCP_BACKEND_PORT


FLOWS = [Flow(protocol, family) for protocol in ("udp", "tcp") for family in (4, 6)]


def service_rules(topo: TwoHostTopology) -> str:
    """kube-proxy's shape in nftables: a Service chain per address family, jumped to from nat prerouting,
    DNAT to the backend; masquerade out of the overlay; a counter per flow before any translation."""
    tables = []
    for family, table in ((4, "ip"), (6, "ip6")):
        addr, backend = (SERVICE[family], topo.addr("c2", family))
        backend_at = backend if family == 4 else f"[{backend}]"
        counters = "\n".join(
            f"    {table} saddr {topo.addr('c1', family)} {table} daddr {addr} {p} dport {port} counter"
            for p, port in (("udp", UDP_SERVICE_PORT), ("tcp", TCP_SERVICE_PORT))
        )
        tables.append(f"""
table {table} hoptrace-svc {{
  chain count {{
    type filter hook prerouting priority raw; policy accept;
{counters}
  }}
  chain services {{
    {table} daddr {addr} udp dport {UDP_SERVICE_PORT} dnat to {backend_at}:{UDP_BACKEND_PORT}
    {table} daddr {addr} tcp dport {TCP_SERVICE_PORT} dnat to {backend_at}:{TCP_BACKEND_PORT}
  }}
  chain prerouting {{
    type nat hook prerouting priority dstnat; policy accept;
    jump services
  }}
  chain postrouting {{
    type nat hook postrouting priority srcnat; policy accept;
    oifname "vxlan0" masquerade
  }}
}}""")
    return "\n".join(tables)


def counted_packets(topo: TwoHostTopology, flow: Flow) -> int:
    """nftables' count of c1's packets of `flow` to the Service address, before translation."""
    table = "ip" if flow.family == 4 else "ip6"
    listing = topo.run("host-a", "nft", "list", "chain", table, "hoptrace-svc", "count").stdout
    for line in listing.splitlines():
        if f"{flow.protocol} dport {flow.service_port}" in line:
            return int(line.split("packets")[1].split()[0])
    raise AssertionError(f"no counter for {flow} in:\n{listing}")


def service_spec(topo: TwoHostTopology, flow: Flow) -> trace_pb2.TraceSpec:
    """The VXLAN path's hops, with a filter naming the Service address and port the client sends to."""
    spec = vxlan_path_spec(topo, flow.trace, protocol=flow.protocol)
    spec.filter.CopyFrom(
        trace_pb2.Filter(
            protocol=flow.protocol,
            src=topo.addr("c1", flow.family),
            dst=SERVICE[flow.family],
            dst_port=flow.service_port,
        )
    )
    return spec


def endpoint(address: str, port: int) -> str:
    return f"[{address}]:{port}" if ":" in address else f"{address}:{port}"


def wait_addresses(cluster, trace: str, hops: list[str], described: int) -> dict:
    """Poll the report until every hop has described the addresses of `described` packets and their
    translations are in (the collector compares a packet's hops once no record of it came for 3 s)."""

    last: list[dict] = [{}]

    def settled() -> dict | None:
        report = last[0] = json.loads(cluster.hoptrace("report", trace, "--since", "30m", "--json").stdout)
        per_hop = {hop: sum(a["packets"] for a in report["addresses"] if a["hop"] == hop) for hop in hops}
        translated = sum(t["packets"] for t in report["translations"])
        return report if set(per_hop.values()) == {described} and translated == described else None

    try:
        return wait_until(settled, f"{trace}: {described} packets' addresses at all {len(hops)} hops", 30)
    except WaitTimeout as timeout:
        raise AssertionError(f"{timeout}: {last[0]['addresses']}, {last[0]['translations']}") from None


def send_datagrams(topo: TwoHostTopology, family: int) -> list[bytes]:
    """DATAGRAMS random datagrams c1 -> the Service; returns what the backend in c2 received."""
    af = socket.AF_INET if family == 4 else socket.AF_INET6
    payloads = [os.urandom(64) for _ in range(DATAGRAMS)]
    with (
        topo.socket("c2", af, socket.SOCK_DGRAM) as backend,
        topo.socket("c1", af, socket.SOCK_DGRAM) as client,
    ):
        backend.bind((topo.addr("c2", family), UDP_BACKEND_PORT))
        backend.settimeout(2)
        for payload in payloads:
            client.sendto(payload, (SERVICE[family], UDP_SERVICE_PORT))
            time.sleep(0.002)
        received = []
        try:
            while len(received) < len(payloads):
                received.append(backend.recv(2048))
        except TimeoutError:
            pass
    assert received == payloads, (
        f"the backend received {len(received)} of {len(payloads)} datagrams, or changed"
    )
    return received


def send_messages(topo: TwoHostTopology, family: int) -> None:
    """MESSAGES small messages over one TCP connection c1 -> the Service, each its own segment; the backend
    in c2 must receive every byte."""
    af = socket.AF_INET if family == 4 else socket.AF_INET6
    messages = [os.urandom(100) for _ in range(MESSAGES)]
    received = bytearray()
    with topo.socket("c2", af, socket.SOCK_STREAM) as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((topo.addr("c2", family), TCP_BACKEND_PORT))
        listener.listen(1)
        listener.settimeout(10)

        def backend() -> None:
            conn, _ = listener.accept()
            with conn:
                conn.settimeout(10)
                while chunk := conn.recv(65536):
                    received.extend(chunk)

        server = threading.Thread(target=backend, name="backend", daemon=True)
        server.start()
        with topo.socket("c1", af, socket.SOCK_STREAM) as client:
            client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            client.settimeout(10)
            client.connect((SERVICE[family], TCP_SERVICE_PORT))
            for message in messages:
                client.sendall(message)
                time.sleep(0.005)
            client.shutdown(socket.SHUT_WR)
            client.recv(1)  # the backend's FIN: the connection is over on both sides
        server.join(10)
    assert bytes(received) == b"".join(messages), f"the backend received {len(received)} bytes, or changed"


@pytest.fixture
def service_topology(topology: TwoHostTopology, tmp_path) -> TwoHostTopology:
    """The two hosts with host-a translating the Service addresses (service_rules)."""
    rules = tmp_path / "service.nft"
    rules.write_text(service_rules(topology))
    topology.run("host-a", "nft", "-f", str(rules))
    return topology


@pytest.mark.timeout(300)
def test_packets_to_a_service_address_are_traced_at_every_hop_through_dnat_and_masquerade(
    service_topology: TwoHostTopology, influxd
) -> None:
    topology = service_topology
    with running_cluster(topology, influxd.url) as cluster:
        for flow in FLOWS:
            cluster.apply(service_spec(topology, flow))
        for flow in FLOWS:
            if flow.protocol == "udp":
                send_datagrams(topology, flow.family)
            else:
                send_messages(topology, flow.family)

        hops = [hop.name for hop in vxlan_path_spec(topology, "hops").hops]
        for flow in FLOWS:
            sent = counted_packets(topology, flow)
            assert sent >= (DATAGRAMS if flow.protocol == "udp" else MESSAGES), (flow, sent)
            report = wait_report(cluster, flow.trace, sent)
            segments = {f"{s['from']}>{s['to']}": s for s in report["segments"]}
            assert list(segments) == [f"{a}>{b}" for a, b in zip(hops, hops[1:], strict=False)], report
            # Every packet c1 sent to the Service, at every hop: none lost, none of another trace taken.
            assert report["packets"] == report["complete"] == sent, (flow, sent, report)
            for name, segment in segments.items():
                assert segment["count"] == sent and segment["loss_count"] == segment["incomplete"] == 0, (
                    flow,
                    name,
                    segment,
                )
            # What each hop saw: the Service address up to host-a's veth, the backend (from host-a's own
            # address) from its overlay on; the translation named between those two hops.
            # IDs 1, 65, 129...: the packets whose sequence is 1 modulo 64 describe their addresses
            described = (sent + 63) // 64
            report = wait_addresses(cluster, flow.trace, hops, described)
            client, backend = topology.addr("c1", flow.family), topology.addr("c2", flow.family)
            service = endpoint(SERVICE[flow.family], flow.service_port)
            backend_at = endpoint(backend, flow.backend_port)
            seen = {a["hop"]: a for a in report["addresses"]}
            assert len(report["addresses"]) == len(hops), report["addresses"]  # one tuple at each hop
            for hop in hops[:2]:
                assert (seen[hop]["source"], seen[hop]["destination"]) == (client, service), seen[hop]
            for hop in hops[2:]:
                assert seen[hop]["source"] != client and seen[hop]["destination"] == backend_at, seen[hop]
            assert seen[hops[0]]["protocol"] == flow.protocol
            [translation] = report["translations"]
            assert (translation["from"], translation["to"], translation["kind"]) == (
                hops[1],
                hops[2],
                "dnat+snat",
            )
            assert translation["before"].startswith(endpoint(client, 0)[:-1]), translation
            assert translation["before"].endswith(f" > {service}"), translation
            assert translation["after"].endswith(f" > {backend_at}"), translation
            assert translation["packets"] == described
