"""The packets hops captured (`GetPackets` with `captured`) as one pcap-ng file, for Wireshark and tshark:
one interface per hop (its name is the hop's, its link type Ethernet or raw IP as the hop saw the packet),
every capture in master-time order with its nanosecond timestamp, its captured bytes and the packet's
length, and a comment naming the packet ID, hop and node. `hoptrace packets --pcap` and the web's
download write it (pcap-ng: https://www.ietf.org/archive/id/draft-ietf-opsawg-pcapng-02.html).
"""

from __future__ import annotations

import time
from typing import BinaryIO

from pcapng import FileWriter, blocks

from hoptrace import kernel_abi
from hoptrace.v1 import api_pb2

# if_tsresol 9: timestamps in ns (the option's value is the negative power of ten, RFC draft section 4.2).
NS_RESOLUTION = b"\x09"
LINK_NAMES = {kernel_abi.CAPTURE_LINK_ETHERNET: "Ethernet", kernel_abi.CAPTURE_LINK_RAW: "raw IP"}


def captured_request(
    trace: str,
    limit: int,
    *,
    since_s: float | None = None,
    start_ns: int | None = None,
    end_ns: int | None = None,
    packet_id: int = 0,
) -> api_pb2.GetPacketsRequest:
    """The GetPackets request of a trace's captured packets: the first `limit` of the `since_s` seconds ending
    now (or from `start_ns` to `end_ns`; unset, the dispatcher's default range), or the one `packet_id`."""
    request = api_pb2.GetPacketsRequest(trace=trace, packet_id=packet_id, captured=limit)
    if start_ns is not None:
        request.start.FromNanoseconds(start_ns)
    elif since_s is not None:
        request.start.FromNanoseconds(time.time_ns() - round(since_s * 1e9))
    if end_ns is not None:
        request.end.FromNanoseconds(end_ns)
    return request


def write_pcapng(packets: api_pb2.PacketList, out: BinaryIO) -> int:
    """Write every capture of `packets` to `out` as pcap-ng; returns how many packet blocks it wrote."""
    captures = sorted(
        ((c.at.ToNanoseconds(), p.packet_id, c) for p in packets.packets for c in p.captures),
        key=lambda k: (k[0], k[1]),
    )
    order = list(packets.capture_hops)
    order += [hop for hop in dict.fromkeys(c.hop for _, _, c in captures) if hop not in order]
    # One interface per hop and link type (a hop sees one kind of packet start: its own kind's).
    kinds = {(c.hop, c.link_type) for _, _, c in captures}
    shb = blocks.SectionHeader(options={"shb_userappl": "hoptrace packets --pcap"})
    interfaces: dict[tuple[str, int], int] = {}
    for hop in order:
        links = sorted(link for h, link in kinds if h == hop)
        for link in links:
            name = hop if len(links) == 1 else f"{hop} ({LINK_NAMES.get(link, link)})"
            interfaces[(hop, link)] = len(interfaces)
            shb.new_member(
                blocks.InterfaceDescription,
                link_type=link,
                snaplen=kernel_abi.CAPTURE_MAX,
                options={"if_name": name, "if_tsresol": NS_RESOLUTION},
            )
    writer = FileWriter(out, shb)
    for at, packet_id, capture in captures:
        block = shb.new_member(
            blocks.EnhancedPacket,
            interface_id=interfaces[(capture.hop, capture.link_type)],
            timestamp_high=at >> 32,
            timestamp_low=at & 0xFFFFFFFF,
            packet_data=capture.data,
            packet_len=max(capture.wire_len, len(capture.data)),
            options={"opt_comment": f"hoptrace packet 0x{packet_id:08x} at {capture.hop} on {capture.node}"},
        )
        writer.write_block(block)
    return len(captures)
