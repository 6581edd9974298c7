"""End to end: broken frames and full-size datagrams on a traced path.

Crafted frames are written onto c1's eth0 with an AF_PACKET socket, so they reach host-a exactly as built:
every hop must count each one under the right parse error and never read an ID out of it. Datagrams that
fill the MTU must go through untouched and untagged.
"""

from __future__ import annotations

import errno
import socket
import struct
from collections.abc import Callable
from pathlib import Path

import pytest
from e2e_helpers import (
    F_TAGGED_HERE,
    assert_complete_path,
    final_counters,
    ids_by_hop,
    ipv4_header,
    ipv6_header,
    mac_bytes,
    path_plans,
    send_frames,
    send_udp,
    spec_plans,
    start_attached,
    udp_receiver,
)

from hoptrace.lab.processes import AgentProcess, udp_transfer
from hoptrace.lab.topology import TwoHostTopology

FAKE_ID = b"\xde\xad\xbe\xef"
PORT = 6500


def broken_frames(topo: TwoHostTopology) -> dict[str, list[bytes]]:
    """Frames c1 -> c2 (to host-a's bridge MAC) that no parser may take an ID from, by the parse error each
    must be counted as. Each carries 0xdeadbeef where an ID would sit if the frame were read carelessly."""
    eth4 = mac_bytes(topo.mac("host-a", "br0")) + mac_bytes(topo.mac("c1")) + b"\x08\x00"
    eth6 = eth4[:12] + b"\x86\xdd"
    src4, dst4 = topo.addr("c1", 4), topo.addr("c2", 4)
    src6, dst6 = topo.addr("c1", 6), topo.addr("c2", 6)
    payload = b"0123456789"
    udp = struct.pack("!HHHH", 40500, PORT, 8 + len(payload), 0) + payload  # UDP length excludes the surplus
    tcp_opts = bytes([253, 8, 0x48, 0x54])  # option 253 claims 8 bytes, only 4 are inside the header
    tcp = struct.pack("!HHIIBBHHH", 40500, PORT, 1, 0, 6 << 4, 0x18, 1024, 0, 0) + tcp_opts
    return {
        "parse_truncated": [
            # IPv4 total length 64 bytes beyond the frame (the surplus would be 68 bytes, not an ID).
            eth4 + ipv4_header(src4, dst4, 17, 20 + len(udp) + 4 + 64) + udp + FAKE_ID,
            # The UDP header is cut after its ports (and the IP length agrees with the cut).
            eth4 + ipv4_header(src4, dst4, 17, 20 + 4) + udp[:4],
            # A 4-byte surplus, as a tagged packet has, but the frame ends 2 bytes into it.
            eth4 + ipv4_header(src4, dst4, 17, 20 + len(udp) + 4) + udp + FAKE_ID[:2],
            # IPv6: a hop-by-hop header of which only 4 of its 8 bytes exist (payload length agrees).
            eth6 + ipv6_header(src6, dst6, 0, 4) + bytes([17, 0, 1, 2]),
            # IPv6: hop-by-hop complete, the destination-options header after it cut in the middle.
            eth6 + ipv6_header(src6, dst6, 0, 12) + bytes([60, 0, 1, 4, 0, 0, 0, 0]) + bytes([17, 0, 1, 2]),
        ],
        "parse_malformed": [
            # IHL 4: a header shorter than the 20 bytes every IPv4 header has (RFC 791).
            eth4 + ipv4_header(src4, dst4, 17, 20 + len(udp) + 4, ihl=4) + udp + FAKE_ID,
            # A TCP option that runs past the header (data offset 6 = 4 option bytes).
            eth4 + ipv4_header(src4, dst4, 6, 20 + len(tcp) + 4) + tcp + FAKE_ID,
        ],
        "parse_non_ip": [
            # Local experimental ethertype 0x88B5 (IEEE 802): not IP, whatever its bytes look like.
            eth4[:12] + b"\x88\xb5" + ipv4_header(src4, dst4, 17, 20 + len(udp) + 4) + udp + FAKE_ID,
        ],
    }


def test_broken_frames_are_counted_and_never_yield_an_id(
    topology: TwoHostTopology, agent_factory: Callable[..., AgentProcess], bpf_object: Path
) -> None:
    """Truncated, malformed and non-IP frames raise the parse counters by exactly their number at a tc hop
    and a tracepoint hop (and at the tagger they pass); records carry only the IDs the tagger wrote for the
    legitimate datagrams sent alongside, never the planted 0xdeadbeef. The filter names no protocol: a hop
    reads the ID (and the TCP options) only of a packet its filter matches, so the TCP frame must match."""
    rounds, legit = 10, 10
    a = "host-a"
    plan = spec_plans(
        {
            "name": "broken",
            "filter": {"dst_port": PORT},
            "hops": [
                {"name": "c1-out", "node": a, "at": "tc-egress", "dev": "eth0", "netns": topology.c1},
                {"name": "a-veth-tc-in", "node": a, "at": "tc-ingress", "dev": "veth-c1"},
                {"name": "a-veth-rx", "node": a, "at": "tracepoint:net:netif_receive_skb", "dev": "veth-c1"},
            ],
        }
    )[a]
    agent = start_attached(agent_factory, plan, "host-a", topology.host_a)
    frames = broken_frames(topology)
    dst = topology.addr("c2")
    with udp_receiver(topology, "c2", dst, PORT) as drain:
        for i in range(rounds):
            send_udp(topology, "c1", topology.addr("c1"), 40501, dst, PORT, [b"legit-%02d" % i])
            send_frames(topology, "c1", "eth0", [f for group in frames.values() for f in group])
        got = drain(0.5)
    agent.stop()

    assert len(got) == legit, f"the legitimate datagrams did not all arrive: {got}"
    counters = final_counters(agent)
    for hop in (0, 1, 2):
        c = counters[hop]
        for name, group in frames.items():
            assert c[name] == rounds * len(group), f"hop {hop}: {name} want {rounds * len(group)}: {c}"
    assert counters[0]["tagged"] == legit, f"tagger: {counters[0]}"
    per_hop = ids_by_hop(agent.records)
    tagged_ids = {r["packet_id"] for r in agent.records if r["hop_index"] == 0 and r["flags"] & F_TAGGED_HERE}
    assert len(tagged_ids) == legit
    fake = int.from_bytes(FAKE_ID, "big")
    assert all(r["packet_id"] != fake for r in agent.records), "a record carries the planted ID 0xdeadbeef"
    for hop in (0, 1, 2):
        assert sorted(per_hop[hop]) == sorted(tagged_ids), (
            f"hop {hop} recorded {per_hop[hop]}, tagged {tagged_ids}"
        )


# linux/socket.h, linux/if_packet.h and linux/virtio_net.h: frames written with a virtio-net header in
# front, whose hdr_len says how many bytes the kernel puts in the skb's linear head (the rest in pages).
SOL_PACKET, PACKET_VNET_HDR = 263, 15
VIRTIO_NET_HDR_F_NEEDS_CSUM = 1
VIRTIO_NET_HDR_GSO_NONE, VIRTIO_NET_HDR_GSO_TCPV4 = 0, 1


def paged_frame(topo: TwoHostTopology, proto: int, packet_id: int) -> tuple[bytes, bytes]:
    """A 6 KB frame c1 -> c2 carrying packet_id, and the virtio-net header that leaves only its first
    headers in the skb's head: TCP as a GSO packet (the kernel pulls Ethernet, IPv4 and the 20-byte TCP
    header, not the option after them), UDP as one frame whose head is its Ethernet header alone (the
    ID after the payload, RFC 9868)."""
    eth = mac_bytes(topo.mac("host-a", "br0")) + mac_bytes(topo.mac("c1")) + b"\x08\x00"
    src, dst = topo.addr("c1"), topo.addr("c2")
    payload = bytes(range(256)) * 24
    if proto == 6:
        option = bytes([253, 8, 0x48, 0x54]) + packet_id.to_bytes(4, "big")
        l4 = struct.pack("!HHIIBBHHH", 40600, PORT, 1, 0, 7 << 4, 0x18, 1024, 0, 0) + option + payload
        # flags, gso_type, hdr_len, gso_size, csum_start, csum_offset
        vnet = struct.pack("<BBHHHH", VIRTIO_NET_HDR_F_NEEDS_CSUM, VIRTIO_NET_HDR_GSO_TCPV4, 54, 1400, 34, 16)
    else:
        l4 = struct.pack("!HHHH", 40600, PORT, 8 + len(payload), 0) + payload + packet_id.to_bytes(4, "big")
        vnet = struct.pack("<BBHHHH", 0, VIRTIO_NET_HDR_GSO_NONE, 14, 0, 0, 0)
    return vnet, eth + ipv4_header(src, dst, proto, 20 + len(l4)) + l4


@pytest.mark.parametrize("proto", [6, 17], ids=["tcp-gso", "udp-head-14"])
def test_headers_past_a_paged_skbs_head_are_read(
    topology: TwoHostTopology, agent_factory: Callable[..., AgentProcess], bpf_object: Path, proto: int
) -> None:
    """tc hops read a paged skb's linear head with plain loads and what lies past it with the helper: a
    6 KB frame whose ID sits past its head (TCP: the option after a 54-byte head; UDP: everything after a
    14-byte head) is recorded with its ID at c1's eth0 egress, once per frame, with no parse error. The
    UDP frame, too big for host-a's veth, is dropped there: only the TCP one reaches the second hop."""
    packet_id, frames = 0x0A0B0C0D, 5
    vnet, frame = paged_frame(topology, proto, packet_id)
    plan = spec_plans(
        {
            "name": "paged",
            "filter": {"protocol": "tcp" if proto == 6 else "udp", "dst_port": PORT},
            "hops": [
                {"name": "c1-out", "node": "host-a", "at": "tc-egress", "dev": "eth0", "netns": topology.c1},
                {"name": "a-veth-tc-in", "node": "host-a", "at": "tc-ingress", "dev": "veth-c1"},
            ],
        }
    )["host-a"]
    agent = start_attached(agent_factory, plan, "host-a", topology.host_a)
    # A frame that is not a GSO packet must fit the device's MTU to be sent at all.
    topology.run("c1", "ip", "link", "set", "eth0", "mtu", "9000")
    try:
        with topology.socket("c1", socket.AF_PACKET, socket.SOCK_RAW, 0) as sock:
            sock.setsockopt(SOL_PACKET, PACKET_VNET_HDR, 1)
            sock.bind(("eth0", 0))
            for _ in range(frames):
                try:
                    assert sock.send(vnet + frame) == len(vnet + frame)
                except OSError as e:  # UDP: host-a's veth drops it after c1's egress hop (its MTU)
                    if proto == 6 or e.errno != errno.ENOBUFS:
                        raise
    finally:
        topology.run("c1", "ip", "link", "set", "eth0", "mtu", str(topology.mtu))
    agent.stop()

    counters = final_counters(agent)
    hops = (0, 1) if proto == 6 else (0,)
    for hop in hops:
        c = counters[hop]
        assert c["matched"] == frames and c["recorded"] == frames and c["tagged"] == 0, f"hop {hop}: {c}"
        assert c["parse_truncated"] == c["parse_malformed"] == 0, f"hop {hop}: {c}"
    assert ids_by_hop(agent.records) == {hop: [packet_id] * frames for hop in hops}
    assert {r["wire_len"] for r in agent.records} == {len(frame)}


@pytest.mark.parametrize("family", [4, 6], ids=["ipv4", "ipv6"])
def test_datagram_filling_the_mtu_goes_untagged_and_unchanged(
    topology: TwoHostTopology, agent_factory: Callable[..., AgentProcess], bpf_object: Path, family: int
) -> None:
    """A datagram that fills c1's MTU (1450 over VXLAN) cannot take 4 more bytes: it is delivered unchanged,
    untagged, unrecorded, and counted ``too_big`` once; one 4 bytes shorter is tagged, recorded at every hop
    with a full-MTU IP packet, and delivered unchanged too."""
    l3 = 20 if family == 4 else 40
    full = topology.mtu - l3 - 8  # 1422 (IPv4) or 1402 (IPv6)
    payloads = [bytes(range(256)) * 6, bytes(range(255, -1, -1)) * 6]
    payloads = [payloads[0][:full], payloads[1][: full - 4]]
    dst = topology.addr("c2", family)
    plans = path_plans(topology, f"mtu-v{family}", {"protocol": "udp", "dst": dst, "dstPort": 6600})
    agent_a = start_attached(agent_factory, plans[0], "host-a", topology.host_a)
    agent_b = start_attached(agent_factory, plans[1], "host-b", topology.host_b)
    received = udp_transfer(topology, "c1", "c2", payloads, family, 6600, 0.05, timeout_s=1.0)
    agent_a.stop()
    agent_b.stop()

    assert received == payloads, f"sent sizes {[len(p) for p in payloads]}, got {[len(p) for p in received]}"
    tagger = final_counters(agent_a)[0]
    assert tagger["too_big"] == 1 and tagger["tagged"] == 1 and tagger["matched"] == 2, f"tagger: {tagger}"
    records = agent_a.records + agent_b.records
    by_id = assert_complete_path(records)
    assert len(by_id) == 1, f"want only the shorter datagram recorded, got {len(by_id)} IDs"
    (recs,) = by_id.values()
    assert recs[0]["wire_len"] == 14 + topology.mtu, f"tagged frame: {recs[0]}"


@pytest.mark.parametrize("family", [4, 6], ids=["ipv4", "ipv6"])
def test_fragmented_datagram_is_delivered_untagged_and_not_called_malformed(
    topology: TwoHostTopology, agent_factory: Callable[..., AgentProcess], bpf_object: Path, family: int
) -> None:
    """A 3000-byte datagram sent without DF leaves c1 as 3 fragments: none can take the ID (it would belong
    after the whole datagram), the datagram arrives unchanged, and no hop calls the legitimate fragments
    malformed."""
    dst = topology.addr("c2", family)
    plans = path_plans(topology, f"frag-v{family}", {"protocol": "udp", "dst": dst, "dstPort": 6800})
    agent_a = start_attached(agent_factory, plans[0], "host-a", topology.host_a)
    agent_b = start_attached(agent_factory, plans[1], "host-b", topology.host_b)
    data = bytes(range(256)) * 11 + bytes(184)
    with udp_receiver(topology, "c2", dst, 6800) as drain:
        send_udp(topology, "c1", topology.addr("c1", family), 40800, dst, 6800, [data])  # no DF: fragments
        got = drain(0.5)
    agent_a.stop()
    agent_b.stop()

    assert [payload for payload, _ in got] == [data]
    counters = {**final_counters(agent_a), **final_counters(agent_b)}
    assert counters[0]["tagged"] == 0 and not agent_a.records and not agent_b.records
    malformed = {hop: c["parse_malformed"] for hop, c in counters.items() if c["parse_malformed"]}
    assert not malformed, f"legitimate fragments counted parse_malformed at hops {malformed}"
