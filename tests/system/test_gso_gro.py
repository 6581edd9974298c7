"""A TCP packet through segmentation, loss and GRO, counted segment for segment against the wire.

A record is one skb at one hop; a skb that stands for several wire segments (a GSO skb before the cut, a GRO
skb after the merge) carries their number as its `gso_segs` value (docs/design.md, "Segmentation and GRO").
On the two-host VXLAN topology host-a's wire0 has no segmentation offloads, so the kernel cuts the overlay's
large skbs in software after the `a-wire-out` hop (tc egress runs before `validate_xmit_skb`). Host-b's wire0
first has GRO off, every segment reaching b-wire-in alone, and netfilter drops one data segment in 97 after
it (VXLAN's GRO cells merge what is left before b-vxlan-in); then GRO on, veth NAPI merging each ID's
segments again (they share their TCP options, so only the segments of one ID merge).

Ground truth: tcpdump on both wires (host-a's frames are the wire segments; host-b's tap runs after GRO and
before netfilter, and the drop rule's `numgen inc` says which of them it dropped, its counter how many), and
the bytes c1 wrote and c2 read. Exact: the report's packets are the IDs on the wire, lost only where a drop
took one of their segments; the join's segments are the wire's, and those missing are the dropped ones at
every hop after the drop; at a-wire-out and b-wire-in the recorded segment counts are what either tap saw.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import struct
import subprocess
import threading
from collections import Counter
from pathlib import Path
from typing import NamedTuple

from system_helpers import recorded_segments, report, running_cluster, wait_report

from hoptrace.lab.prometheus import scrape
from hoptrace.lab.reference import vxlan_path_spec
from hoptrace.lab.topology import TwoHostTopology
from hoptrace.lab.waiting import wait_until

PORT = 11133
WRITES = 24
WRITE_BYTES = 48 * 1024  # a write: GSO skbs of up to 64 KB, about 33 MSS-sized wire segments each
TCPOPT_HOPTRACE = (253, 8, 0x4854)  # kind, length, ExID ("HT"): hoptrace.h's HOPTRACE_TCPOPT_*
TCP_FIN = 0x01
DROP_TABLE = "hoptrace_gso_drop"
DROP_EVERY, DROP_AT = 97, 50
DATA_IP_LEN = 100  # an inner IPv4 packet longer than this carries data (c1's ACKs, SYN, FIN are 60 or less)
HOPS_AFTER_DROP = ("b-vxlan-in", "b-veth-out", "b-c2-eth0-in")


def transfer(topo: TwoHostTopology) -> int:
    """WRITES writes of WRITE_BYTES c1 -> c2 on one connection, checked byte for byte; returns the bytes."""
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
    return len(payload)


def drop_data_frames(topo: TwoHostTopology) -> None:
    """Drops, at host-b's wire0 ingress (netfilter's netdev hook, after tc ingress where b-wire-in records),
    the (DROP_AT + 1)th of every DROP_EVERY data frames of the flow: `numgen inc`, so which ones is known
    from the tap's order (`dropped_frames`). Offsets from the outer UDP header: UDP 8 + VXLAN 8 + Ethernet
    14, then the inner IPv4 header (20 bytes) and TCP."""
    table = ("netdev", DROP_TABLE)
    topo.run("host-b", "nft", "add", "table", *table)
    topo.run(
        "host-b", "nft", "add", "chain", *table, "wire",
        "{ type filter hook ingress device wire0 priority 0; }",
    )  # fmt: skip
    topo.run(
        "host-b", "nft", "add", "rule", *table, "wire",
        "udp", "dport", "4789",
        "@th,224,16", "0x0800",  # inner ethertype: IPv4
        "@th,240,8", "0x45",  # IPv4 with a 20-byte header
        "@th,312,8", "6",  # TCP
        "@th,416,16", str(PORT),  # to c2's port
        "@th,256,16", ">", str(DATA_IP_LEN),  # with data
        "numgen", "inc", "mod", str(DROP_EVERY), str(DROP_AT), "counter", "drop",
    )  # fmt: skip


def nft_dropped(topo: TwoHostTopology) -> int:
    """What the rule of `drop_data_frames` dropped, by its counter; removes it."""
    data = json.loads(topo.run("host-b", "nft", "-j", "list", "table", "netdev", DROP_TABLE).stdout)
    topo.run("host-b", "nft", "delete", "table", "netdev", DROP_TABLE)
    for item in data["nftables"]:
        for expr in item.get("rule", {}).get("expr", []):
            if "counter" in expr:
                return int(expr["counter"]["packets"])
    raise AssertionError(f"no counter in the drop rule: {data}")


def dropped_frames(arrived: list[Frame]) -> list[Frame]:
    """The frames `drop_data_frames` dropped, from the frames host-b's tap saw in its order (taps run before
    tc ingress and netfilter)."""
    data = [f for f in arrived if f.dport == PORT and f.ip_len > DATA_IP_LEN]
    return [f for k, f in enumerate(data) if k % DROP_EVERY == DROP_AT]


def covered(frames: list[Frame]) -> int:
    """Bytes of the stream the frames cover (a retransmitted range once)."""
    total, end = 0, None
    for f in sorted((f for f in frames if f.payload), key=lambda f: f.seq):
        start = f.seq if end is None else max(f.seq, end)
        stop = f.seq + f.payload
        if stop > start:
            total += stop - start
            end = stop
    return total


class Capture:
    """tcpdump on one host's wire0, VXLAN frames only, headers only."""

    def __init__(self, topo: TwoHostTopology, host: str, path: Path) -> None:
        self.path = path
        self.proc = topo.popen(
            host,
            *("tcpdump", "-i", "wire0", "-n", "-s", "256", "-U", "--immediate-mode", "-w", str(path)),
            *("udp", "port", "4789"),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        line = self.proc.stderr.readline()  # "listening on wire0 ...": the tap is in place
        assert "listening" in line, line

    def stop(self) -> list[Frame]:
        """Stops it once c1's last frame, its ACK of c2's FIN, is in its file; the frames of c1 -> c2 that
        carry an ID. c1 sends that ACK before its recv returns, but the frame reaches the wires from a
        backlog later, and the tap hands frames over in blocks: a stop before would lose it on one tap."""
        wait_until(
            lambda: last_ack(tagged_frames(self.path.read_bytes())),
            f"c1's ACK of c2's FIN in {self.path.name}",
            10,
        )
        self.proc.send_signal(signal.SIGINT)
        _, err = self.proc.communicate(timeout=10)
        assert re.search(r"^0 packets dropped by kernel", err, re.M), err
        return tagged_frames(self.path.read_bytes())


class Frame(NamedTuple):
    """One frame of c1 -> c2 that carries an ID, as a tap saw it."""

    pid: int
    seq: int
    payload: int  # TCP payload bytes (a GRO frame's: every segment's)
    flags: int  # TCP flags
    dport: int
    ip_len: int  # the inner IPv4 total length


def tagged_frames(pcap: bytes) -> list[Frame]:
    """Parses a pcap of Ethernet / IPv4 / UDP / VXLAN / Ethernet / IPv4 / TCP frames: each with hoptrace's
    option, in order (c1's segments: the trace tags nothing of c2's)."""
    magic = struct.unpack_from("<I", pcap)[0]
    assert magic == 0xA1B2C3D4, hex(magic)  # little-endian, microseconds, as tcpdump writes here
    out = []
    off = 24
    while off + 16 <= len(pcap):
        _, _, caplen, _ = struct.unpack_from("<IIII", pcap, off)
        if off + 16 + caplen > len(pcap):
            break  # being written
        frame = pcap[off + 16 : off + 16 + caplen]
        off += 16 + caplen
        inner = 14 + (frame[14] & 0xF) * 4 + 8 + 8 + 14  # outer Ethernet, IPv4, UDP, VXLAN; inner Ethernet
        ip = frame[inner:]
        if len(ip) < 40 or ip[9] != socket.IPPROTO_TCP:
            continue
        ihl = (ip[0] & 0xF) * 4
        total = struct.unpack_from("!H", ip, 2)[0]
        tcp = ip[ihl:]
        doff = (tcp[12] >> 4) * 4
        pid = option_id(tcp[20:doff])
        if pid is not None:
            dport, seq = struct.unpack_from("!HI", tcp, 2)
            out.append(Frame(pid, seq, total - ihl - doff, tcp[13], dport, total))
    return out


def last_ack(frames: list[Frame]) -> bool:
    """Whether c1's ACK of c2's FIN is among the frames: the one numbered after c1's FIN, which follows the
    FIN segment's data (the FIN rides the last data segment when it is still queued at the shutdown)."""
    ends = [f.seq + f.payload + 1 for f in frames if f.flags & TCP_FIN]
    return bool(ends) and any(f.seq == ends[0] and not f.flags & TCP_FIN for f in frames)


def option_id(options: bytes) -> int | None:
    """The packet ID in hoptrace's TCP option (RFC 6994: kind 253, ExID), or None."""
    i = 0
    while i < len(options):
        kind = options[i]
        if kind == 0:
            return None
        if kind == 1:
            i += 1
            continue
        length = options[i + 1] if i + 1 < len(options) else 0
        if length < 2:
            return None
        if (kind, length) == TCPOPT_HOPTRACE[:2] and struct.unpack_from("!H", options, i + 2)[0] == 0x4854:
            return struct.unpack_from("!I", options, i + 4)[0]
        i += length
    return None


def test_segments_of_a_cut_and_merged_tcp_packet_are_counted_exactly(
    topology: TwoHostTopology, influxd, tmp_path: Path
) -> None:
    topology.run(
        "host-a", "ethtool", "-K", "wire0", "tso", "off", "gso", "off", "tx-udp_tnl-segmentation", "off"
    )
    # a-veth-in and b-veth-out are tracepoints: kernel hops count from the struct sk_buff's shared info
    spec = vxlan_path_spec(topology, "tcp-gso-gro", protocol="tcp", port=PORT)
    with running_cluster(topology, influxd.url) as cluster:
        cluster.apply(spec)
        frames: dict[str, tuple[list[Frame], list[Frame]]] = {}
        nft = 0
        for gro in ("off", "on"):
            topology.run("host-b", "ethtool", "-K", "wire0", "gro", gro)
            if gro == "off":  # GRO would merge before netfilter: drop single wire segments only
                drop_data_frames(topology)
            sent, arrived = (
                Capture(topology, h, tmp_path / f"{h}-gro-{gro}.pcap") for h in ("host-a", "host-b")
            )
            written = transfer(topology)
            frames[gro] = (sent.stop(), arrived.stop())
            if gro == "off":
                nft = nft_dropped(topology)
            # what c1 wrote crossed the wire, each byte in a frame that arrived
            lost = set(dropped_frames(frames[gro][1])) if gro == "off" else set()
            assert covered([f for f in frames[gro][0] if f not in lost]) == written, gro
        assert sum(f.payload for f in frames["on"][0]) == written  # no loss, no retransmission

        wire = [f for gro in frames for f in frames[gro][0]]
        ids = Counter(f.pid for f in wire)
        drops = Counter(f.pid for f in dropped_frames(frames["off"][1]))
        # the packets the drops reached no longer reach b-vxlan-in whole: lost in b-wire-in > b-vxlan-in
        report_now = wait_report(cluster, spec.name, len(ids) - len(drops))
        report_now = wait_until(
            lambda: (r := report(cluster, spec.name))["packets"] >= len(ids)
            and recorded_segments(r, "b-wire-in")[0]
            and r,
            f"report of {spec.name} with {len(ids)} packets",
            30,
        )
        metrics = scrape(cluster.metrics_addr("collector"))

    # the cut happened on host-a's wire, the drops on host-b's, and GRO merged there only with it on
    cut = sum(1 for n in ids.values() if n > 1)
    assert cut > WRITES, ids
    assert sum(drops.values()) == nft > 0, (drops, nft)
    assert len(frames["off"][1]) == len(frames["off"][0]), (
        "host-b merged with GRO off",
        *map(len, frames["off"]),
    )
    assert len(frames["on"][1]) < len(frames["on"][0]), "GRO merged nothing"
    # Packets: the IDs on the wire; lost exactly where the drops were, whole everywhere else
    assert report_now["packets"] == len(ids) and report_now["complete"] == len(ids) - len(drops), report_now
    for segment in report_now["segments"]:
        lost = len(drops) if (segment["from"], segment["to"]) == ("b-wire-in", "b-vxlan-in") else 0
        assert segment["loss_count"] == lost and segment["tracer_lost"] == 0, segment
    # Segments: the wire's; missing, each dropped one at every hop after the drop that saw its packet in part
    assert metrics["hoptrace_collector_segments_total"] == len(wire), (metrics, len(wire))
    partial = sum(n for pid, n in drops.items() if ids[pid] > n)
    assert metrics["hoptrace_collector_segments_missing_total"] == len(HOPS_AFTER_DROP) * partial, metrics
    # Before the cut (a-wire-out, and the tracepoint at a-veth-in) each ID's skb said its segments: the
    # IDs cut into several
    before_cut = (cut, sum(n for n in ids.values() if n > 1))
    assert recorded_segments(report_now, "a-wire-out") == before_cut
    assert recorded_segments(report_now, "a-veth-in") == before_cut
    # The skbs VXLAN's GRO cells merged are forwarded whole: the tracepoint at b-veth-out sees them
    assert recorded_segments(report_now, "b-veth-out") == recorded_segments(report_now, "b-vxlan-in")
    assert recorded_segments(report_now, "b-vxlan-in")[0] > 0
    # After GRO (b-wire-in) each merged skb said how many it holds: host-b's tap saw those skbs
    after_gro = [f for gro in frames for f in frames[gro][1]]
    mss = max(f.payload for f in wire)
    merged = [f for f in after_gro if f.payload > mss]
    records, segments = recorded_segments(report_now, "b-wire-in")
    assert records == len(merged) > 0, (records, len(merged))
    assert segments + (len(after_gro) - records) == len(wire), (segments, len(after_gro), len(wire))
