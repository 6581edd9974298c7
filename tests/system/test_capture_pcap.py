"""Packets in Wireshark: a spec's `capture: N` on four hops of the VXLAN path (tc in c1's namespace, the
netif_receive_skb tracepoint at host-a's veth, tc at host-a's wire, tc in c2's namespace), N known UDP
datagrams with distinct payloads, `hoptrace packets --pcap` writing pcap-ng, and tshark reading it back:
every packet ID once per hop, in time order along the path, on interfaces named after the hops, with the
payload each datagram carried (a prefix of it where the VXLAN headers leave less than the whole).
"""

from __future__ import annotations

import json
import socket
import subprocess

import pytest
from system_helpers import running_cluster, wait_report

from hoptrace.lab.reference import vxlan_path_spec
from hoptrace.lab.topology import TwoHostTopology
from hoptrace.lab.waiting import wait_until
from hoptrace.v1 import trace_pb2

pytestmark = pytest.mark.kernel

PORT = 11121
DATAGRAMS = 24
CAPTURE = 128
# The hops that capture, in path order, and what the first captured byte begins.
CAPTURING = ("a-c1-eth0-out", "a-veth-in", "a-wire-out", "b-c2-eth0-in")


def payload(i: int) -> bytes:
    """Datagram i's payload: 40 bytes that no other datagram carries."""
    return f"hoptrace capture {i:04d} ".encode().ljust(40, b"-")


def capture_spec(topo: TwoHostTopology) -> trace_pb2.TraceSpec:
    spec = vxlan_path_spec(topo, "capture-pcap", port=PORT)
    for hop in spec.hops:
        if hop.name in CAPTURING:
            hop.actions.extend(
                [trace_pb2.ActionSpec(kind="timestamp"), trace_pb2.ActionSpec(kind="capture", bytes=CAPTURE)]
            )
    return spec


def send(topo: TwoHostTopology) -> list[bytes]:
    """DATAGRAMS datagrams from c1 to a socket on c2; what c2 received (the ground truth)."""
    sent = [payload(i) for i in range(DATAGRAMS)]
    with (
        topo.socket("c2", socket.AF_INET, socket.SOCK_DGRAM) as server,
        topo.socket("c1", socket.AF_INET, socket.SOCK_DGRAM) as client,
    ):
        server.bind((topo.addr("c2"), PORT))
        server.settimeout(5)
        received = []
        for data in sent:
            client.sendto(data, (topo.addr("c2"), PORT))
            received.append(server.recv(2048))
    assert received == sent
    return sent


def tshark(path: str) -> list[dict]:
    """Each frame of the file as tshark reads it: interface, epoch time to the ns, comment, lengths, and the
    innermost UDP payload (inside the VXLAN packet at the wire)."""
    fields = ["frame.interface_name", "frame.time_epoch", "frame.comment", "frame.len", "frame.cap_len"]
    out = subprocess.run(
        [
            "tshark",
            "-r",
            path,
            "-T",
            "json",
            "-x",
            *[a for f in fields for a in ("-e", f)],
            "-e",
            "udp.payload",
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    frames = []
    for frame in json.loads(out):
        layers = frame["_source"]["layers"]
        frames.append(
            {
                "interface": layers["frame.interface_name"][0],
                "time": layers["frame.time_epoch"][0],
                "comment": layers["frame.comment"][0],
                "len": int(layers["frame.len"][0]),
                "cap_len": int(layers["frame.cap_len"][0]),
                "udp_payload": bytes.fromhex(layers.get("udp.payload", [""])[-1].replace(":", "")),
            }
        )
    return frames


@pytest.mark.timeout(240)
def test_captured_packets_read_back_in_tshark(topology: TwoHostTopology, influxd, tmp_path) -> None:
    path = str(tmp_path / "capture.pcapng")
    with running_cluster(topology, influxd.url) as cluster:
        cluster.apply(capture_spec(topology))
        sent = send(topology)
        wait_report(cluster, "capture-pcap", len(sent))

        def written() -> str | None:
            result = cluster.hoptrace(
                "packets", "capture-pcap", "--since", "30m", "--pcap", path, check=False
            )
            expected = f"{path}: {len(sent)} packets, {len(sent) * len(CAPTURING)} captures at 4 hops"
            return result.stdout if result.stdout.startswith(expected) else None

        summary = wait_until(written, f"a pcap-ng of {len(sent)} packets at {len(CAPTURING)} hops", 30, 0.5)
    assert summary.strip().endswith(f"({', '.join(CAPTURING)})"), summary

    frames = tshark(path)
    assert len(frames) == len(sent) * len(CAPTURING)
    by_packet: dict[str, list[dict]] = {}
    for frame in frames:
        packet_id, _, where = frame["comment"].removeprefix("hoptrace packet ").partition(" at ")
        hop = where.split(" on ")[0]
        assert frame["interface"] == hop, frame  # one interface per hop, named after it
        by_packet.setdefault(packet_id, []).append(frame)
    assert len(by_packet) == len(sent)
    times = [frame["time"] for frame in frames]
    assert times == sorted(times, key=lambda t: tuple(map(int, t.split(".")))), "frames out of time order"
    payloads = set()
    for packet_id, seen in by_packet.items():
        # Once per hop, in path order by time (ns timestamps, as tshark prints them).
        assert [f["interface"] for f in seen] == list(CAPTURING), (packet_id, seen)
        # The tagging hop's frame holds all of the payload, then the ID it wrote after it (RFC 9868's surplus
        # area, which tshark shows in the payload: the IP length covers it).
        first, tagged = seen[0]["udp_payload"], int(packet_id, 16).to_bytes(4, "big")
        assert first[-4:] == tagged and first[:-4] in sent, (packet_id, first)
        payloads.add(first[:-4])
        for frame in seen:
            # the bytes the hop kept of the packet it saw (the ID included in its length)
            assert frame["cap_len"] == min(frame["len"], CAPTURE), frame
            assert len(frame["udp_payload"]) >= 32 and first.startswith(frame["udp_payload"]), (
                packet_id,
                frame,
            )
        # at the wire, inside VXLAN: the outer Ethernet, IP, UDP and VXLAN headers in front, 50 bytes more
        assert seen[2]["len"] == seen[1]["len"] + 50, seen
    assert payloads == set(sent)  # every datagram sent, each once
