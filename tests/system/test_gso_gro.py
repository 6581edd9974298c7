"""A TCP packet through segmentation and GRO, counted segment for segment against the wire.

A record is one skb at one hop; a skb that stands for several wire segments (a GSO skb before the cut, a GRO
skb after the merge) carries their number as its `gso_segs` value. On the two-host VXLAN topology host-a's
wire0 has no segmentation offloads, so the kernel cuts the overlay's large skbs in software after the
`a-wire-out` hop (tc egress runs before `validate_xmit_skb`); host-b's wire0 first has GRO off (every
segment reaches the hops after the cut alone), then on (veth NAPI merges the segments of one skb again,
which share their TCP options, so only the segments of one ID merge).

Ground truth: tcpdump on both wires (host-a's frames are the wire segments, host-b's what GRO made of them:
packet taps run after GRO) and the bytes c1 wrote and c2 read. Exact: the report's packets are the IDs on
the wire, each complete; the join's segments are the wire's; at a-wire-out and b-wire-in the recorded
segment counts are what tcpdump saw on either side.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import struct
import subprocess
import threading
from collections import Counter
from pathlib import Path

from system_helpers import running_cluster, wait_report

from hoptrace.lab.prometheus import scrape
from hoptrace.lab.reference import vxlan_path_spec
from hoptrace.lab.topology import TwoHostTopology
from hoptrace.lab.waiting import wait_until

PORT = 11133
WRITES = 24
WRITE_BYTES = 48 * 1024  # a write: GSO skbs of up to 64 KB, about 33 MSS-sized wire segments each
TCPOPT_HOPTRACE = (253, 8, 0x4854)  # kind, length, ExID ("HT"): hoptrace.h's HOPTRACE_TCPOPT_*
TCP_FIN = 0x01


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

    def stop(self) -> list[tuple[int, int]]:
        """Stops it once c1's FIN is in its file (the tap hands frames over in blocks: a stop before would
        lose the last); (packet ID, TCP payload bytes) of each frame of c1 -> c2 that carries an ID."""
        wait_until(
            lambda: any(flags & TCP_FIN for _, _, flags in tagged_frames(self.path.read_bytes())),
            f"c1's FIN in {self.path.name}",
            10,
        )
        self.proc.send_signal(signal.SIGINT)
        _, err = self.proc.communicate(timeout=10)
        assert re.search(r"^0 packets dropped by kernel", err, re.M), err
        return [(pid, payload) for pid, payload, _ in tagged_frames(self.path.read_bytes())]


def tagged_frames(pcap: bytes) -> list[tuple[int, int, int]]:
    """Parses a pcap of Ethernet / IPv4 / UDP / VXLAN / Ethernet / IPv4 / TCP frames: (ID, TCP payload bytes,
    TCP flags) of each with hoptrace's option (c1's segments: the trace tags nothing of c2's)."""
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
        options = tcp[20:doff]
        pid = option_id(options)
        if pid is not None:
            out.append((pid, total - ihl - doff, tcp[13]))
    return out


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


def recorded_segments(report: dict, hop: str) -> tuple[int, int]:
    """(records, segments) of the skbs of several segments at `hop`: its recorded gso_segs count and sum."""
    for h in report.get("hops", []):
        if h["hop"] == hop:
            for r in h.get("recorded", []):
                if r["field"] == "gso_segs":
                    return r["count"], round(r["mean"] * r["count"])
    return 0, 0


def test_segments_of_a_cut_and_merged_tcp_packet_are_counted_exactly(
    topology: TwoHostTopology, influxd, tmp_path: Path
) -> None:
    topology.run(
        "host-a", "ethtool", "-K", "wire0", "tso", "off", "gso", "off", "tx-udp_tnl-segmentation", "off"
    )
    spec = vxlan_path_spec(topology, "tcp-gso-gro", protocol="tcp", port=PORT)
    with running_cluster(topology, influxd.url) as cluster:
        cluster.apply(spec)
        frames = {}
        for gro in ("off", "on"):
            topology.run("host-b", "ethtool", "-K", "wire0", "gro", gro)
            sent, merged = (
                Capture(topology, h, tmp_path / f"{h}-gro-{gro}.pcap") for h in ("host-a", "host-b")
            )
            written = transfer(topology)
            frames[gro] = (sent.stop(), merged.stop())
            # what c1 wrote crossed the wire once, in segments of one ID each (no retransmission)
            assert sum(payload for _, payload in frames[gro][0]) == written, gro
        wire = [f for gro in frames for f in frames[gro][0]]
        after_gro = [f for gro in frames for f in frames[gro][1]]
        ids = Counter(pid for pid, _ in wire)
        report = wait_until(
            lambda: (r := wait_report(cluster, spec.name, len(ids)))
            and recorded_segments(r, "b-wire-in")[0]
            and r,
            "b-wire-in's recorded segments",
            30,
        )
        metrics = scrape(cluster.metrics_addr("collector"))

    # the cut happened on host-a's wire, and GRO merged on host-b's only with it on
    cut = sum(1 for n in ids.values() if n > 1)
    assert cut > WRITES, ids
    assert len(frames["off"][1]) == len(frames["off"][0]), "host-b merged with GRO off"
    assert len(frames["on"][1]) < len(frames["on"][0]), "GRO merged nothing"
    # Packets: the IDs on the wire, each whole at every hop: none lost, none split into packets
    assert report["packets"] == report["complete"] == len(ids), (report["packets"], len(ids))
    for segment in report["segments"]:
        assert segment["count"] == len(ids) and segment["incomplete"] == segment["loss_count"] == 0, segment
    # Segments: the wire's, none missing at any hop
    assert metrics["hoptrace_collector_segments_total"] == len(wire), (metrics, len(wire))
    assert metrics["hoptrace_collector_segments_missing_total"] == 0, metrics
    # Before the cut (a-wire-out) each ID's skb said its segments: the IDs cut into several
    assert recorded_segments(report, "a-wire-out") == (cut, sum(n for n in ids.values() if n > 1))
    # After GRO (b-wire-in) each merged skb said how many it holds: host-b's tap saw those skbs
    merged_frames = [f for f in after_gro if ids[f[0]] > 1 and f[1] > max(p for _, p in wire)]
    records, segments = recorded_segments(report, "b-wire-in")
    assert records == len(merged_frames) > 0, (records, len(merged_frames))
    assert segments + (len(after_gro) - records) == len(wire), (segments, len(after_gro), len(wire))
