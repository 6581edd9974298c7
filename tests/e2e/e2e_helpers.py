"""What the end-to-end datapath tests share: trace plans for the two-host path, agent runs, record checks,
raw frames and kernel queries (tcx attachments, BPF links).

The path every test traces is the VXLAN one of ``tests/topology.py``::

    c1 eth0 (tc-egress, tags UDP) -> host-a veth-c1 (tracepoint netif_receive_skb)
    -> host-a vxlan0 (tc-egress) -> host-a wire0 (tc-egress)
    -> host-b wire0 (tc-ingress) -> host-b vxlan0 (tc-ingress)
    -> host-b veth-c2 (tracepoint net_dev_xmit) -> c2 eth0 (tc-ingress)

Hops 0-3 belong to host-a's agent, hops 4-7 to host-b's.
"""

from __future__ import annotations

import ipaddress
import socket
import struct
import threading
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from hoptrace import kernel_abi
from hoptrace.common.netns import inet_checksum
from hoptrace.lab.bpfstate import *  # noqa: F403 (the e2e tests take the BPF introspection from here)
from hoptrace.lab.processes import AgentProcess
from hoptrace.lab.reference import BPF_OBJECT, path_plans, spec_plans  # noqa: F401 (re-exported)
from hoptrace.lab.topology import TwoHostTopology

_F = kernel_abi.RECORD_FLAGS
F_IPV6, F_TCP, F_UDP = _F["IPV6"], _F["TCP"], _F["UDP"]
F_ENCAP_VXLAN, F_TAGGED_HERE = _F["ENCAP_VXLAN"], _F["TAGGED_HERE"]
TCPOPT_KIND, TCPOPT_EXID = kernel_abi.TCPOPT_KIND, kernel_abi.TCPOPT_EXID  # RFC 6994 option + hoptrace's ExID

# Program names of the objects (what `bpftool prog show` calls them; the kernel cuts names at 15
# characters, none of ours is longer).
HOPTRACE_PROGS = frozenset(kernel_abi.PROGRAMS)

HOST_A_HOPS = (0, 1, 2, 3)
HOST_B_HOPS = (4, 5, 6, 7)
ALL_HOPS = HOST_A_HOPS + HOST_B_HOPS
WIRE_HOPS = (3, 4)  # the only hops that see the VXLAN packet rather than the container's


def node_origin(node: str) -> int:
    """The top 8 bits of the IDs a node writes for a standalone plan (no origin of the dispatcher's): FNV-1a
    of its name mapped above the traces' origins, TRACE_ORIGINS+1..255 (docs/design.md)."""
    h = 0x811C9DC5
    for byte in node.encode():
        h = ((h ^ byte) * 0x01000193) & 0xFFFFFFFF
    return h % (255 - kernel_abi.TRACE_ORIGINS) + kernel_abi.TRACE_ORIGINS + 1


def start_attached(
    agent_factory: Callable[..., AgentProcess], plan: dict[str, Any], node: str, netns: str
) -> AgentProcess:
    """Start an agent and assert that the plan is active with every hop attached."""
    agent = agent_factory(plan, node, netns)
    status = agent.wait_status()
    assert status.get("active") and not status.get("error"), f"{node}: plan not active: {status}"
    failed = [h for h in status.get("hops", []) if not h.get("attached")]
    assert not failed, f"{node}: hops not attached: {failed}"
    assert len(status["hops"]) == len(plan["hops"]), f"{node}: status lists {status['hops']}"
    return agent


def final_counters(agent: AgentProcess) -> dict[int, dict[str, Any]]:
    """The last counters line of every hop (after ``stop()``: the counters at exit), by hop index."""
    last: dict[int, dict[str, Any]] = {}
    for line in agent.counters:
        last[int(line["hop_index"])] = line
    return last


def ids_by_hop(records: Iterable[dict[str, Any]]) -> dict[int, list[int]]:
    """Packet IDs recorded at each hop, in arrival order (duplicates kept)."""
    out: dict[int, list[int]] = defaultdict(list)
    for rec in records:
        out[int(rec["hop_index"])].append(int(rec["packet_id"]))
    return out


def records_by_id(records: Iterable[dict[str, Any]]) -> dict[int, list[dict[str, Any]]]:
    """Records of each packet ID, sorted by hop index."""
    out: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for rec in records:
        out[int(rec["packet_id"])].append(rec)
    for recs in out.values():
        recs.sort(key=lambda r: r["hop_index"])
    return dict(out)


def assert_complete_path(
    records: list[dict[str, Any]],
    hops: Iterable[int] = ALL_HOPS,
    nodes: Iterable[Iterable[int]] = (HOST_A_HOPS, HOST_B_HOPS),
    origin: str = "host-a",
) -> dict[int, list[dict[str, Any]]]:
    """Every recorded ID is seen exactly once at every hop of ``hops``, in path order on each node, with the
    same flow hash everywhere and the origin node's ID origin; returns the records by ID."""
    hops = tuple(hops)
    per_hop = ids_by_hop(records)
    first = per_hop.get(hops[0], [])
    assert first, f"no record at hop {hops[0]}; records at hops {sorted(per_hop)}"
    for hop in hops:
        ids = per_hop.get(hop, [])
        dupes = sorted({i for i in ids if ids.count(i) > 1})
        assert not dupes, f"hop {hop}: IDs recorded more than once: {[hex(i) for i in dupes[:10]]}"
        missing, extra = set(first) - set(ids), set(ids) - set(first)
        assert not missing and not extra, (
            f"hop {hop} recorded {len(ids)} IDs, hop {hops[0]} {len(first)}: missing {sorted(missing)[:10]}, "
            f"extra {sorted(extra)[:10]}"
        )
    assert set(per_hop) == set(hops), f"records at unexpected hops: {sorted(set(per_hop) - set(hops))}"
    salt = node_origin(origin)
    by_id = records_by_id(records)
    for pid, recs in by_id.items():
        assert pid >> 24 == salt, f"ID {pid:#x} does not carry {origin}'s origin {salt:#x}"
        assert len({r["flow_hash"] for r in recs}) == 1, (
            f"ID {pid:#x}: flow hash differs between hops: {recs}"
        )
        ts = {r["hop_index"]: r["ts_ns"] for r in recs}
        for node_hops in nodes:
            seq = [ts[h] for h in node_hops if h in ts]
            assert seq == sorted(seq), f"ID {pid:#x}: timestamps go back along the path: {recs}"
    return by_id


# ---- traffic ---------------------------------------------------------------------------------------------


def family_of(addr: str) -> int:
    """4 or 6."""
    return ipaddress.ip_address(addr).version


def send_udp(
    topo: TwoHostTopology,
    role: str,
    src: str,
    sport: int,
    dst: str,
    dport: int,
    payloads: Iterable[bytes],
) -> None:
    """Send each payload as one datagram from (src, sport) in ``role`` to (dst, dport)."""
    af = socket.AF_INET if family_of(dst) == 4 else socket.AF_INET6
    with topo.socket(role, af, socket.SOCK_DGRAM) as sock:
        sock.bind((src, sport))
        for payload in payloads:
            sock.sendto(payload, (dst, dport))


@contextmanager
def udp_receiver(topo: TwoHostTopology, role: str, addr: str, port: int) -> Iterator[Callable[..., list]]:
    """A bound UDP socket in ``role``; yields ``drain(timeout_s=1.0)`` returning [(payload, (src, sport))]."""
    af = socket.AF_INET if family_of(addr) == 4 else socket.AF_INET6
    sock = topo.socket(role, af, socket.SOCK_DGRAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
    sock.bind((addr, port))

    def drain(timeout_s: float = 1.0) -> list[tuple[bytes, tuple[str, int]]]:
        got = []
        sock.settimeout(timeout_s)
        try:
            while True:
                data, peer = sock.recvfrom(65535)
                got.append((data, (peer[0], peer[1])))
        except TimeoutError:
            pass
        return got

    try:
        yield drain
    finally:
        sock.close()


def expected_flow_hash(proto: int, src: str, dst: str, sport: int, dport: int) -> int:
    """The flow hash hop.bpf.h's flow_hash() gives this 5-tuple (murmur3 rounds over the addresses as the
    BPF program loads them: network-order bytes read as little-endian u32 words)."""

    def mix32(h: int, v: int) -> int:
        v = (v * 0xCC9E2D51) & 0xFFFFFFFF
        v = ((v << 15) | (v >> 17)) & 0xFFFFFFFF
        v = (v * 0x1B873593) & 0xFFFFFFFF
        h ^= v
        h = ((h << 13) | (h >> 19)) & 0xFFFFFFFF
        return (h * 5 + 0xE6546B64) & 0xFFFFFFFF

    s, d = ipaddress.ip_address(src).packed, ipaddress.ip_address(dst).packed
    sw = struct.unpack(f"<{len(s) // 4}I", s)
    dw = struct.unpack(f"<{len(d) // 4}I", d)
    h = mix32(proto, sw[0])
    h = mix32(h, dw[0])
    if len(s) == 16:
        for w in (*sw[1:], *dw[1:]):
            h = mix32(h, w)
    h = mix32(h, (sport << 16) | dport)
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & 0xFFFFFFFF
    h ^= h >> 13
    return h


# ---- raw frames ------------------------------------------------------------------------------------------


def mac_bytes(mac: str) -> bytes:
    """b'\\x02\\x00...' from '02:00:...'."""
    return bytes(int(x, 16) for x in mac.split(":"))


def ipv4_header(src: str, dst: str, proto: int, tot_len: int, ihl: int = 5) -> bytes:
    """A 20-byte IPv4 header with the given (possibly lying) total length and IHL, checksummed."""
    hdr = struct.pack(
        "!BBHHHBBH4s4s",
        (4 << 4) | ihl,
        0,
        tot_len,
        0x1234,
        0x4000,
        64,
        proto,
        0,
        socket.inet_aton(src),
        socket.inet_aton(dst),
    )
    return hdr[:10] + struct.pack("!H", inet_checksum(hdr)) + hdr[12:]


def ipv6_header(src: str, dst: str, next_header: int, payload_len: int) -> bytes:
    """A 40-byte IPv6 header."""
    return struct.pack(
        "!IHBB16s16s",
        6 << 28,
        payload_len,
        next_header,
        64,
        socket.inet_pton(socket.AF_INET6, src),
        socket.inet_pton(socket.AF_INET6, dst),
    )


def send_frames(topo: TwoHostTopology, role: str, dev: str, frames: Iterable[bytes]) -> int:
    """Send raw Ethernet frames as they are on ``dev`` of ``role`` (AF_PACKET); returns how many."""
    n = 0
    with topo.socket(role, socket.AF_PACKET, socket.SOCK_RAW, 0) as sock:
        sock.bind((dev, 0))
        for frame in frames:
            assert sock.send(frame) == len(frame)
            n += 1
    return n


@dataclass
class Capture:
    """An AF_PACKET capture of every frame on one device, read by a thread until ``stop()``."""

    sock: socket.socket
    frames: list[tuple[int, bytes]] = field(default_factory=list)  # (pkttype, first bytes)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> Capture:
        """Start reading."""
        self.sock.settimeout(0.2)
        self._thread = threading.Thread(target=self._run, name="capture", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                data, addr = self.sock.recvfrom(512)  # headers are all we need: longer frames are cut
            except TimeoutError:
                continue
            except OSError:
                return
            self.frames.append((addr[2], data))

    def stop(self) -> list[tuple[int, bytes]]:
        """Stop reading, close the socket and return the frames."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        self.sock.close()
        return self.frames


def capture(topo: TwoHostTopology, role: str, dev: str) -> Capture:
    """Start capturing every frame (both directions) on ``dev`` of ``role``."""
    eth_p_all = 0x0003
    sock = topo.socket(role, socket.AF_PACKET, socket.SOCK_RAW, socket.htons(eth_p_all))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 32 << 20)
    sock.bind((dev, eth_p_all))
    return Capture(sock).start()


@dataclass(frozen=True)
class TcpSegment:
    """The fields of a captured TCP segment the tests look at."""

    src: str
    dst: str
    sport: int
    dport: int
    flags: int
    options: bytes

    @property
    def rst(self) -> bool:
        """RST set."""
        return bool(self.flags & 0x04)

    @property
    def syn(self) -> bool:
        """SYN set."""
        return bool(self.flags & 0x02)

    @property
    def fin(self) -> bool:
        """FIN set."""
        return bool(self.flags & 0x01)

    def option_bytes_without_sack(self) -> int:
        """The option bytes but SACK blocks and the NOPs that align them (RFC 2018): a receiver that saw loss
        or reordering (a loaded machine) acknowledges with SACK, whatever the tracer does."""
        opts, i, length = self.options, 0, len(self.options)
        while i < len(opts):
            kind = opts[i]
            if kind == 0 or (kind != 1 and (i + 1 >= len(opts) or opts[i + 1] < 2)):
                break
            size = 1 if kind == 1 else opts[i + 1]
            if kind == 5:
                nops = 0
                while nops < 2 and i - nops - 1 >= 0 and opts[i - nops - 1] == 1:
                    nops += 1
                length -= size + nops
            i += size
        return length

    def hoptrace_id(self) -> int | None:
        """The ID in option 253 with hoptrace's ExID (RFC 6994); None if absent or the options are broken."""
        opts, i = self.options, 0
        while i < len(opts):
            kind = opts[i]
            if kind == 0:
                return None
            if kind == 1:
                i += 1
                continue
            if i + 1 >= len(opts) or opts[i + 1] < 2 or i + opts[i + 1] > len(opts):
                return None
            length = opts[i + 1]
            if (
                kind == TCPOPT_KIND
                and length == 8
                and struct.unpack("!H", opts[i + 2 : i + 4])[0] == TCPOPT_EXID
            ):
                return struct.unpack("!I", opts[i + 4 : i + 8])[0]
            i += length
        return None


def parse_tcp(frame: bytes) -> TcpSegment | None:
    """The TCP segment in an Ethernet frame (IPv4 or IPv6 without extension headers), else None."""
    if len(frame) < 14:
        return None
    ethertype = struct.unpack("!H", frame[12:14])[0]
    if ethertype == 0x0800 and len(frame) >= 34:
        ihl = (frame[14] & 0x0F) * 4
        if frame[23] != 6:
            return None
        src, dst = socket.inet_ntoa(frame[26:30]), socket.inet_ntoa(frame[30:34])
        l4 = 14 + ihl
    elif ethertype == 0x86DD and len(frame) >= 54:
        if frame[20] != 6:
            return None
        src = socket.inet_ntop(socket.AF_INET6, frame[22:38])
        dst = socket.inet_ntop(socket.AF_INET6, frame[38:54])
        l4 = 54
    else:
        return None
    if len(frame) < l4 + 20:
        return None
    sport, dport = struct.unpack("!HH", frame[l4 : l4 + 4])
    doff = (frame[l4 + 12] >> 4) * 4
    return TcpSegment(src, dst, sport, dport, frame[l4 + 13], frame[l4 + 20 : l4 + doff])


# ---- kernel queries: BPF links and tcx attachments -------------------------------------------------------
