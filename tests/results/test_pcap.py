"""results/pcap.py: the captured packets as pcap-ng, read back with python-pcapng's own reader (the system
test reads a real trace's file with tshark): interfaces named after the hops in path order, one per link
type, every capture in time order with its nanosecond time, bytes, length and comment."""

from __future__ import annotations

import io

import pytest
from pcapng import FileScanner, blocks

from hoptrace import kernel_abi
from hoptrace.results.packets_view import packets_from_proto
from hoptrace.results.pcap import write_pcapng
from hoptrace.v1 import api_pb2

pytestmark = pytest.mark.unit

ETHERNET, RAW = kernel_abi.CAPTURE_LINK_ETHERNET, kernel_abi.CAPTURE_LINK_RAW
T0 = 1_764_000_000_123_456_789  # ns: more than a float's precision


def captured() -> api_pb2.PacketList:
    """Two packets at three hops (the middle one a cgroup hop: raw IP), the second packet overtaking the first
    at the last hop."""
    out = api_pb2.PacketList(capture_hops=["a-out", "a-app", "b-in"])
    for n, offsets in ((1, (0, 500, 9_000)), (2, (100, 600, 8_000))):
        packet = out.packets.add(packet_id=0x07000000 | n)
        frame = bytes([n]) * 14 + bytes([0x45, n]) + bytes(80)
        for hop, node, link, offset in zip(
            ("a-out", "a-app", "b-in"),
            ("host-a", "host-a", "host-b"),
            (ETHERNET, RAW, ETHERNET),
            offsets,
            strict=True,
        ):
            data = frame[14:] if link == RAW else frame
            capture = packet.captures.add(
                hop=hop, node=node, link_type=link, wire_len=len(data) + 400, data=data
            )
            capture.at.FromNanoseconds(T0 + offset)
        packet.at.FromNanoseconds(T0 + offsets[0])
    return out


def read(data: bytes) -> tuple[list[blocks.InterfaceDescription], list[blocks.EnhancedPacket]]:
    found = list(FileScanner(io.BytesIO(data)))
    interfaces = [b for b in found if isinstance(b, blocks.InterfaceDescription)]
    packets = [b for b in found if isinstance(b, blocks.EnhancedPacket)]
    return interfaces, packets


def test_one_interface_per_hop_and_every_capture_in_time_order_to_the_ns():
    out = io.BytesIO()
    assert write_pcapng(captured(), out) == 6
    interfaces, packets = read(out.getvalue())
    assert [(i.options["if_name"], i.link_type) for i in interfaces] == [
        ("a-out", ETHERNET),
        ("a-app", RAW),
        ("b-in", ETHERNET),
    ]
    got = [
        (
            interfaces[p.interface_id].options["if_name"],
            (p.timestamp_high << 32) | p.timestamp_low,
            p.options["opt_comment"],
            p.packet_len,
            p.packet_data[:16],
        )
        for p in packets
    ]
    frame = {n: bytes([n]) * 14 + bytes([0x45, n]) for n in (1, 2)}
    assert got == [
        ("a-out", T0, "hoptrace packet 0x07000001 at a-out on host-a", 96 + 400, frame[1][:16]),
        ("a-out", T0 + 100, "hoptrace packet 0x07000002 at a-out on host-a", 96 + 400, frame[2][:16]),
        (
            "a-app",
            T0 + 500,
            "hoptrace packet 0x07000001 at a-app on host-a",
            82 + 400,
            frame[1][14:] + bytes(14),
        ),
        (
            "a-app",
            T0 + 600,
            "hoptrace packet 0x07000002 at a-app on host-a",
            82 + 400,
            frame[2][14:] + bytes(14),
        ),
        ("b-in", T0 + 8_000, "hoptrace packet 0x07000002 at b-in on host-b", 96 + 400, frame[2][:16]),
        ("b-in", T0 + 9_000, "hoptrace packet 0x07000001 at b-in on host-b", 96 + 400, frame[1][:16]),
    ]
    assert all(interfaces[0].timestamp_resolution == 1e-9 for _ in packets)


def test_a_hop_with_two_link_types_gets_an_interface_for_each():
    packets = captured()
    packets.packets[1].captures[2].link_type = RAW
    interfaces, blocks_written = read(_written(packets))
    assert [i.options["if_name"] for i in interfaces] == [
        "a-out",
        "a-app",
        "b-in (Ethernet)",
        "b-in (raw IP)",
    ]
    assert len(blocks_written) == 6


def test_the_json_view_carries_the_captures():
    [first, _] = packets_from_proto(captured())
    assert first["captures"][1] == {
        "hop": "a-app",
        "node": "host-a",
        "at_ns": T0 + 500,
        "wire_len": 82 + 400,
        "link_type": RAW,
        "data": (bytes([0x45, 1]) + bytes(80)).hex(),
    }


def _written(packets: api_pb2.PacketList) -> bytes:
    out = io.BytesIO()
    write_pcapng(packets, out)
    return out.getvalue()
