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

import ctypes
import errno
import ipaddress
import json
import os
import socket
import struct
import subprocess
import threading
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from google.protobuf import json_format
from helpers import REPO_ROOT, AgentProcess
from topology import TwoHostTopology

from hoptrace import kernel_abi
from hoptrace.dispatcher.compile import TCP_TAGGER_PROGRAM, standalone_plans
from hoptrace.dispatcher.spec import check_spec, spec_from_data
from hoptrace.v1 import trace_pb2

BPF_OBJECT = REPO_ROOT / "kernel-patch" / "build" / "hoptrace.bpf.o"

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


def node_salt(node: str) -> int:
    """The top 8 bits of the IDs a node writes: FNV-1a of its name mapped to 1..255 (docs/design.md)."""
    h = 0x811C9DC5
    for byte in node.encode():
        h = ((h ^ byte) * 0x01000193) & 0xFFFFFFFF
    return h % 255 + 1


def spec_plans(spec: dict[str, Any] | trace_pb2.TraceSpec) -> dict[str, dict[str, Any]]:
    """Each node's standalone plan (protojson) of a spec, validated and compiled as the dispatcher does,
    with the generic object."""
    if isinstance(spec, dict):
        spec = spec_from_data(spec)
    check_spec(spec)
    return standalone_plans(spec, BPF_OBJECT)


def path_spec(
    topo: TwoHostTopology, trace: str, filter_: dict[str, Any], sample: int = 1
) -> trace_pb2.TraceSpec:
    """The TraceSpec of the whole c1 -> c2 VXLAN path (`filter_` in protojson form)."""
    spec = trace_pb2.TraceSpec(name=trace, sample=sample)
    json_format.ParseDict(filter_, spec.filter)
    hops = [
        ("c1-eth0-out", "host-a", "tc-egress", "eth0", topo.c1),
        ("a-veth-in", "host-a", "tracepoint:net:netif_receive_skb", "veth-c1", ""),
        ("a-vxlan-out", "host-a", "tc-egress", "vxlan0", ""),
        ("a-wire-out", "host-a", "tc-egress", "wire0", ""),
        ("b-wire-in", "host-b", "tc-ingress", "wire0", ""),
        ("b-vxlan-in", "host-b", "tc-ingress", "vxlan0", ""),
        ("b-veth-out", "host-b", "tracepoint:net:net_dev_xmit", "veth-c2", ""),
        ("c2-eth0-in", "host-b", "tc-ingress", "eth0", topo.c2),
    ]
    for name, node, at, dev, netns in hops:
        spec.hops.add(name=name, node=node, at=at, dev=dev, netns=netns)
    return spec


def path_plans(
    topo: TwoHostTopology,
    trace: str,
    filter_: dict[str, Any],
    sample: int = 1,
    tag_udp: bool = True,
    tcp_tagging: bool = False,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The TracePlans (protojson) of host-a's and host-b's agents for the whole c1 -> c2 VXLAN path, as the
    dispatcher compiles them, with UDP and TCP tagging set as asked."""
    plans = spec_plans(path_spec(topo, trace, filter_, sample))
    plan_a, plan_b = plans["host-a"], plans["host-b"]
    plan_a["hops"][0]["tagUdp"] = tag_udp
    if tcp_tagging:
        plan_a["tcpTagging"] = {"netns": topo.c1, "program": TCP_TAGGER_PROGRAM}
    else:
        plan_a.pop("tcpTagging", None)
    return plan_a, plan_b


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
    same flow hash everywhere and the origin node's salt; returns the records by ID."""
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
    salt = node_salt(origin)
    by_id = records_by_id(records)
    for pid, recs in by_id.items():
        assert pid >> 24 == salt, f"ID {pid:#x} does not carry {origin}'s salt {salt:#x}"
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


def inet_checksum(data: bytes) -> int:
    """RFC 1071."""
    if len(data) % 2:
        data += b"\0"
    total = sum(struct.unpack(f"!{len(data) // 2}H", data))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return ~total & 0xFFFF


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


def bpftool_json(*args: str, netns: str | None = None) -> Any:
    """``bpftool -j ARGS`` (inside ``netns`` when given), parsed."""
    cmd = ["bpftool", "-j", *args]
    if netns:
        cmd = ["ip", "netns", "exec", netns, *cmd]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=30, check=False)
    except FileNotFoundError as exc:
        raise AssertionError("bpftool not found: install it (apt-get install bpftool)") from exc
    assert proc.returncode == 0, f"{' '.join(cmd)}: exit {proc.returncode}: {proc.stderr}"
    return json.loads(proc.stdout or "null")


def hoptrace_links() -> list[dict[str, Any]]:
    """Every BPF link in the system whose program is one of hoptrace's (by program name)."""
    names = {p["id"]: p.get("name", "") for p in bpftool_json("prog", "show") or []}
    links = bpftool_json("link", "show") or []
    return [
        dict(link, prog_name=names.get(link.get("prog_id")))
        for link in links
        if names.get(link.get("prog_id")) in HOPTRACE_PROGS
    ]


def bpf_fds(pid: int) -> dict[str, set[int]]:
    """The BPF link and program IDs a process holds, from /proc/PID/fdinfo: {"link": ..., "prog": ...}."""
    out: dict[str, set[int]] = {"link": set(), "prog": set()}
    for fd in os.listdir(f"/proc/{pid}/fdinfo"):
        try:
            text = Path(f"/proc/{pid}/fdinfo/{fd}").read_text()
        except OSError:
            continue
        info = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
        info = {k.strip(): v.strip() for k, v in info.items()}
        if "link_id" in info:
            out["link"].add(int(info["link_id"]))
        elif "prog_id" in info:
            out["prog"].add(int(info["prog_id"]))
    return out


def held_link_ids() -> set[int]:
    """IDs of the BPF links some live process holds an fd of."""
    held: set[int] = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                held |= bpf_fds(int(entry))["link"]
            except OSError:
                continue
    return held


_SYS_BPF = 321  # x86_64
_BPF_PROG_QUERY = 16
BPF_TCX_INGRESS, BPF_TCX_EGRESS = 46, 47
_libc = ctypes.CDLL(None, use_errno=True)


class _QueryAttr(ctypes.Structure):
    """The BPF_PROG_QUERY member of union bpf_attr (include/uapi/linux/bpf.h)."""

    _fields_ = [
        ("target_ifindex", ctypes.c_uint32),
        ("attach_type", ctypes.c_uint32),
        ("query_flags", ctypes.c_uint32),
        ("attach_flags", ctypes.c_uint32),
        ("prog_ids", ctypes.c_uint64),
        ("count", ctypes.c_uint32),
        ("_pad", ctypes.c_uint32),
        ("prog_attach_flags", ctypes.c_uint64),
        ("link_ids", ctypes.c_uint64),
        ("link_attach_flags", ctypes.c_uint64),
        ("revision", ctypes.c_uint64),
        ("_tail", ctypes.c_uint8 * 64),  # the union is larger: zero the rest
    ]


def tcx_programs(netns_path: str, ifindex: int) -> dict[str, list[int]]:
    """Program IDs attached with tcx to a device: {"ingress": [...], "egress": [...]}.

    bpftool 7.1's ``net show`` predates tcx (Linux 6.6) and lists nothing for it, so this asks the kernel
    directly: BPF_PROG_QUERY on the device, from a thread that entered the device's namespace.
    """
    result: dict[str, Any] = {}

    def query() -> None:
        try:
            with open(netns_path, "rb") as nsfile:
                if _libc.setns(nsfile.fileno(), 0x40000000) != 0:
                    raise OSError(ctypes.get_errno(), f"setns {netns_path}")
            for name, attach_type in (("ingress", BPF_TCX_INGRESS), ("egress", BPF_TCX_EGRESS)):
                ids = (ctypes.c_uint32 * 64)()
                attr = _QueryAttr(target_ifindex=ifindex, attach_type=attach_type, count=64)
                attr.prog_ids = ctypes.addressof(ids)
                rc = _libc.syscall(_SYS_BPF, _BPF_PROG_QUERY, ctypes.byref(attr), ctypes.sizeof(attr))
                if rc != 0:
                    err = ctypes.get_errno()
                    raise OSError(err, f"BPF_PROG_QUERY ifindex {ifindex} {name}: {errno.errorcode.get(err)}")
                result[name] = list(ids[: attr.count])
        except BaseException as exc:  # handed to the caller's thread
            result["error"] = exc

    thread = threading.Thread(target=query, name="tcx-query")
    thread.start()
    thread.join()
    if "error" in result:
        raise result["error"]
    return result


def tcx_attachments(topo: TwoHostTopology) -> dict[str, list[int]]:
    """Every tcx program on every device of the topology: {"role/dev/direction": [prog ids]}, if any."""
    found: dict[str, list[int]] = {}
    for role in topo.roles:
        out = topo.run(role, "ip", "-j", "link", "show").stdout
        for link in json.loads(out):
            progs = tcx_programs(topo.netns_path(role), int(link["ifindex"]))
            for direction, ids in progs.items():
                if ids:
                    found[f"{role}/{link['ifname']}/{direction}"] = ids
    return found


def program_counters(pid: int, prog_name: str) -> dict[str, int]:
    """The ``counters`` map of the program ``prog_name`` that process ``pid`` holds, summed over CPUs.

    For the TCP tagger (``tag_tcp``), whose counters the agent does not print: it is not a hop of the plan.
    """
    for prog_id in bpf_fds(pid)["prog"]:
        info = bpftool_json("prog", "show", "id", str(prog_id))
        if info.get("name") != prog_name:
            continue
        for map_id in info.get("map_ids", []):
            if bpftool_json("map", "show", "id", str(map_id)).get("name") != "counters":
                continue
            entries = bpftool_json("map", "dump", "id", str(map_id))
            sums = {e["formatted"]["key"]: sum(v["value"] for v in e["formatted"]["values"]) for e in entries}
            return {name: sums.get(i, 0) for i, name in enumerate(kernel_abi.COUNTERS)}
    raise AssertionError(f"process {pid} holds no program {prog_name} with a counters map")
