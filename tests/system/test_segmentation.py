"""A TCP packet's ID through segmentation: the kernel writes the ID into the one TCP header of a large (GSO)
skb, and where that skb is cut into wire segments each carries a copy of the header, so a hop after the cut
sees several records of one ID. They are one packet there: its time at that hop is its first segment's.

On the two-host VXLAN topology, host-a's wire0 has no segmentation offloads (tso, gso and the UDP tunnel's
off): the overlay's large packets leave host-a as MSS-sized frames, and host-b's wire0 (a veth, no GRO)
receives each of them. Ground truth: the bytes c2 received, and the records of the first hop (one per skb
the sender's TCP built, each with its own ID).
"""

from __future__ import annotations

import os
import socket
import threading

from system_helpers import running_cluster, wait_report

from hoptrace.lab.prometheus import scrape
from hoptrace.lab.reference import vxlan_path_spec
from hoptrace.lab.topology import TwoHostTopology

PORT = 11131
WRITES = 40
WRITE_BYTES = 48 * 1024  # each write one GSO skb of about 33 MSS-sized segments on the wire


def send_large_writes(topo: TwoHostTopology) -> bytes:
    """WRITES writes of WRITE_BYTES c1 -> c2 on one connection; returns what c2 received."""
    payload = os.urandom(WRITES * WRITE_BYTES)
    received = bytearray()
    with topo.socket("c2", socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((topo.addr("c2"), PORT))
        listener.listen(1)
        listener.settimeout(10)

        def receive() -> None:
            conn, _ = listener.accept()
            with conn:
                conn.settimeout(10)
                while chunk := conn.recv(1 << 20):
                    received.extend(chunk)

        receiver = threading.Thread(target=receive, name="receiver", daemon=True)
        receiver.start()
        with topo.socket("c1", socket.AF_INET, socket.SOCK_STREAM) as client:
            client.settimeout(10)
            client.connect((topo.addr("c2"), PORT))
            for offset in range(0, len(payload), WRITE_BYTES):
                client.sendall(payload[offset : offset + WRITE_BYTES])
            client.shutdown(socket.SHUT_WR)
            client.recv(1)
        receiver.join(10)
    assert bytes(received) == payload, f"c2 received {len(received)} of {len(payload)} bytes, or changed"
    return payload


def test_segments_of_one_tcp_packet_are_one_packet_at_the_hops_after_the_cut(
    topology: TwoHostTopology, influxd
) -> None:
    topology.run(
        "host-a", "ethtool", "-K", "wire0", "tso", "off", "gso", "off", "tx-udp_tnl-segmentation", "off"
    )
    spec = vxlan_path_spec(topology, "tcp-segmented", protocol="tcp", port=PORT)
    with running_cluster(topology, influxd.url) as cluster:
        cluster.apply(spec)
        send_large_writes(topology)
        report = wait_report(cluster, spec.name, 1)
        report = wait_report(cluster, spec.name, report["packets"])
        metrics = scrape(cluster.metrics_addr("collector"))
    # Every packet the sender's TCP built is whole at every hop: none taken for lost or for a collision.
    assert report["packets"] == report["complete"] > 0, report
    for segment in report["segments"]:
        assert segment["count"] == report["packets"], segment
        assert segment["incomplete"] == segment["loss_count"] == 0, segment
    # The cut happened: hops after it recorded each packet's segments.
    assert metrics["hoptrace_collector_repeats_total"] > report["packets"], metrics
