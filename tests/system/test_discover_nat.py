"""Path discovery through address translation, on test_nat_following's topology: host-a rewrites c1's
packets to the Service address to c2's address and port (a DNAT at prerouting, as kube-proxy's) and
masquerades them out of vxlan0. Discovery of c1 -> the Service follows them by their IDs after the
translation: the ten crossings to c2's eth0, the step where the addresses changed marked `translated`.

Two discoveries on one cluster:
- UDP over IPv4 while a trace of the same flow is applied, whose tagger runs first at c1's eth0 and writes
  its own IDs (a tagger never overwrites one): the discovery follows the IDs it saw on packets of the flow
  before the translation, and the trace keeps every packet nftables counted (discovery changes nothing of
  a trace's packets);
- TCP over IPv6, with no trace beside (sock_ops tags the connections opened while it looks): the discovery
  follows its own ID origin through the translation.
Ground truth: the devices c1 -> c2 cross (test_discover's EXPECTED_NAMES, the same as a discovery of
c1 -> c2 itself finds), the translating step where the kernel runs the DNAT rule (TRANSLATED), nftables'
count of the packets c1 sent to the Service.
"""

from __future__ import annotations

import json
import os
import socket
import threading

import pytest
from system_helpers import running_cluster, wait_report
from test_discover import EXPECTED_NAMES, TcpConnector
from test_nat_following import (
    SERVICE,
    TCP_BACKEND_PORT,
    TCP_SERVICE_PORT,
    UDP_SERVICE_PORT,
    Flow,
    counted_packets,
    service_spec,
    service_topology,  # noqa: F401 - test_nat_following's fixture, here by its name
)

from hoptrace.lab.topology import TwoHostTopology

# The step in which host-a's DNAT changes the addresses: br_netfilter (bridge-nf-call-iptables, 1 in a new
# namespace) runs the IP prerouting hooks, nftables' dnat among them, on the frame veth-c1 received, before
# br0 takes it up (br_nf_pre_routing); the masquerade later, at postrouting, changes nothing the filter
# still matched.
TRANSLATED = [("a-veth-c1-in", "a-br0-in")]


def discover(cluster, protocol: str, family: int, topology: TwoHostTopology, port: int) -> dict:
    """`hoptrace discover --json` of c1 -> the Service address and port, until 40 packets were seen."""
    result = cluster.hoptrace(
        "discover", "--protocol", protocol, "--src", topology.addr("c1", family), "--dst", SERVICE[family],
        "--dst-port", str(port), "--duration", "3s", "--packets", "40", "--json",
    )  # fmt: skip
    return json.loads(result.stdout)


def assert_whole_path(data: dict) -> None:
    """One path, every packet on it, the ten crossings to c2's eth0, one translated step."""
    assert data["packets"] >= 40, data
    [path] = data["paths"]
    assert path["share"] == 1.0
    assert [h["name"] for h in path["hops"]] == EXPECTED_NAMES
    assert [(s["from"], s["to"]) for s in data["segments"] if s["translated"]] == TRANSLATED


@pytest.mark.timeout(180)
def test_discovery_follows_udp_beside_a_trace_and_tcp_over_ipv6_through_dnat_and_masquerade(
    service_topology: TwoHostTopology,  # noqa: F811 - the imported fixture
    influxd,
) -> None:
    topology = service_topology
    udp = Flow("udp", 4)
    stop = threading.Event()

    def send_udp() -> None:
        with topology.socket("c1", socket.AF_INET, socket.SOCK_DGRAM) as client:
            while not stop.wait(0.005):
                client.sendto(os.urandom(64), (SERVICE[4], UDP_SERVICE_PORT))

    with running_cluster(topology, influxd.url) as cluster:
        # Its tagger at c1's eth0 runs before discovery's. A name of its own: the session's InfluxDB keeps
        # this trace's windows, which test_nat_following's report of svc-udp-v4 would count.
        spec = service_spec(topology, udp)
        spec.name = f"discover-{udp.trace}"
        cluster.apply(spec)
        sender = threading.Thread(target=send_udp, name="service-client", daemon=True)
        sender.start()
        try:
            data = discover(cluster, "udp", 4, topology, UDP_SERVICE_PORT)
        finally:
            stop.set()
            sender.join(5)
        assert_whole_path(data)
        assert data["spec"]["filter"]["dst"] == SERVICE[4]  # the flow as the client sends it
        sent = counted_packets(topology, udp)
        report = wait_report(cluster, spec.name, sent)
        assert report["packets"] == report["complete"] == sent, (sent, report)

        service = (SERVICE[6], TCP_SERVICE_PORT)
        with TcpConnector(topology, TCP_BACKEND_PORT, family=6, connect_to=service) as tcp:
            data = discover(cluster, "tcp", 6, topology, TCP_SERVICE_PORT)
        assert tcp.connections > 0
        assert_whole_path(data)
