"""End to end: real UDP and TCP traffic between two containers over VXLAN, traced by two agents at every hop.

What a user checks after tracing a flow: every sampled packet shows up once at every hop of both hosts, in
path order, under one ID; the number of IDs is what the tagger says it tagged; and the traced application
gets its bytes unchanged.
"""

from __future__ import annotations

import json
import os
import random
import re
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from e2e_helpers import (
    ALL_HOPS,
    F_ENCAP_VXLAN,
    F_IPV6,
    F_TAGGED_HERE,
    F_TCP,
    F_UDP,
    HOST_A_HOPS,
    HOST_B_HOPS,
    WIRE_HOPS,
    assert_complete_path,
    capture,
    final_counters,
    ids_by_hop,
    parse_tcp,
    path_plans,
    program_counters,
    start_attached,
)

from hoptrace.lab.processes import AgentProcess, udp_transfer
from hoptrace.lab.topology import TwoHostTopology

SOCKPERF_PORT = 11111
IPERF_PORT = 5201
ECHO_PORT = 7007


def wait_listening(topo: TwoHostTopology, role: str, proto: str, port: int, timeout_s: float = 5.0) -> None:
    """Wait until a socket in ``role`` listens on ``port`` (``ss -l`` shows it)."""
    flag = "-ltnH" if proto == "tcp" else "-lunH"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        out = topo.run(role, "ss", flag, check=False).stdout
        if re.search(rf"[:\]]{port}\s", out):
            return
        time.sleep(0.05)
    raise AssertionError(f"nothing listens on {proto} port {port} in {role} after {timeout_s} s")


def run_traced(
    topo: TwoHostTopology,
    agent_factory: Callable[..., AgentProcess],
    plans: tuple[dict[str, Any], dict[str, Any]],
    traffic: Callable[[], Any],
) -> tuple[Any, AgentProcess, AgentProcess]:
    """Attach host-a's and host-b's agents, run ``traffic()``, stop both agents cleanly (SIGINT: every record
    flushed, final counters printed) and return what traffic() returned with the two agents."""
    agent_a = start_attached(agent_factory, plans[0], "host-a", topo.host_a)
    agent_b = start_attached(agent_factory, plans[1], "host-b", topo.host_b)
    result = traffic()
    agent_a.stop()
    agent_b.stop()
    return result, agent_a, agent_b


def assert_flags(records: list[dict[str, Any]], l4_flag: int, family: int) -> None:
    """Record flags: the L4 protocol and family of the traced packet at every hop, VXLAN only on the wire
    hops, "tagged here" only at the UDP tagger (hop 0)."""
    for rec in records:
        flags, hop = rec["flags"], rec["hop_index"]
        assert flags & l4_flag, f"hop {hop}: L4 flag {l4_flag:#x} missing: {rec}"
        assert bool(flags & F_IPV6) == (family == 6), f"hop {hop}: IPv6 flag wrong: {rec}"
        assert bool(flags & F_ENCAP_VXLAN) == (hop in WIRE_HOPS), f"hop {hop}: VXLAN flag wrong: {rec}"
        if l4_flag == F_UDP:
            assert bool(flags & F_TAGGED_HERE) == (hop == 0), f"hop {hop}: tagged-here flag wrong: {rec}"


# ---- 1. UDP ----------------------------------------------------------------------------------------------


def sockperf_ping_pong(topo: TwoHostTopology, addr: str) -> int:
    """sockperf ping-pong c1 -> c2 (2 s, 500 messages/s); returns how many messages the client sent."""
    server = topo.popen(
        "c2", "sockperf", "server", "-i", addr, "-p", str(SOCKPERF_PORT),
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        wait_listening(topo, "c2", "udp", SOCKPERF_PORT)
        client = topo.run(
            "c1", "sockperf", "ping-pong", "-i", addr, "-p", str(SOCKPERF_PORT), "-t", "2", "--mps", "500",
            check=False, timeout=20,
        )  # fmt: skip
    finally:
        server.terminate()
        server.wait(5)
    out = client.stdout + client.stderr
    assert client.returncode == 0, f"sockperf ping-pong failed ({client.returncode}): {out[-2000:]}"
    total = re.search(r"\[Total Run\].*SentMessages=(\d+); ReceivedMessages=(\d+)", out)
    assert total, f"no [Total Run] line in sockperf's output: {out[-2000:]}"
    sent, received = int(total.group(1)), int(total.group(2))
    # The last ping may still be in flight when sockperf's timer ends: it counts as sent, not received.
    assert sent >= 500 and sent - 1 <= received <= sent, (
        f"sockperf sent {sent}, got {received} back: {out[-2000:]}"
    )
    return sent


def iperf3_udp(topo: TwoHostTopology, addr: str) -> int:
    """iperf3 -u c1 -> c2 (2 s, 1 Mbit/s of 200-byte datagrams); returns how many datagrams it sent.

    For IPv6, because sockperf 3.7 (Debian 12) accepts only IPv4 addresses ("'-i' Invalid address").
    """
    server = topo.popen(
        "c2", "iperf3", "-s", "-1", "-B", addr, "-p", str(IPERF_PORT),
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        wait_listening(topo, "c2", "tcp", IPERF_PORT)
        client = topo.run(
            "c1", "iperf3", "-u", "-c", addr, "-p", str(IPERF_PORT), "-t", "2", "-b", "1M", "-l", "200", "-J",
            check=False, timeout=20,
        )  # fmt: skip
        assert server.wait(10) == 0, "iperf3 server did not finish its one test"
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
    assert client.returncode == 0, f"iperf3 -u failed: {client.stdout[-2000:]} {client.stderr[-1000:]}"
    result = json.loads(client.stdout)
    sent = int(result["end"]["sum"]["packets"])
    lost = int(result["end"]["sum"]["lost_packets"])
    assert sent >= 1000 and lost == 0, f"iperf3 sent {sent} datagrams, {lost} lost"
    return sent


@pytest.mark.parametrize("family", [4, 6], ids=["ipv4-sockperf", "ipv6-iperf3"])
def test_udp_flow_every_sampled_packet_seen_at_every_hop(
    topology: TwoHostTopology,
    agent_factory: Callable[..., AgentProcess],
    bpf_object: Path,
    require_tool: Callable[[str], str],
    family: int,
) -> None:
    """A UDP latency test c1 -> c2: each datagram gets one ID, seen once at each of the 8 hops on both hosts
    in path order; the IDs are as many as the tagger's ``tagged`` counter and the client's datagrams."""
    tool = require_tool("sockperf" if family == 4 else "iperf3")
    src, dst = topology.addr("c1", family), topology.addr("c2", family)
    port = SOCKPERF_PORT if family == 4 else IPERF_PORT
    plans = path_plans(
        topology, f"udp-v{family}", {"protocol": "udp", "src": src, "dst": dst, "dstPort": port}
    )

    def traffic() -> int:
        return sockperf_ping_pong(topology, dst) if family == 4 else iperf3_udp(topology, dst)

    sent, agent_a, agent_b = run_traced(topology, agent_factory, plans, traffic)

    counters_a, counters_b = final_counters(agent_a), final_counters(agent_b)
    tagged = counters_a[0]["tagged"]
    # Every client datagram is tagged; iperf3 sends one more than it counts: its UDP "connect" datagram.
    extra = 0 if family == 4 else 1
    assert tagged == sent + extra, f"{tool} sent {sent} datagrams (+{extra}), the tagger tagged {tagged}"
    assert counters_a[0]["too_big"] == counters_a[0]["tag_failed"] == counters_a[0]["gso_skipped"] == 0
    records = agent_a.records + agent_b.records
    by_id = assert_complete_path(records)
    assert len(by_id) == tagged, f"{len(by_id)} IDs recorded, {tagged} tagged"
    for hop in HOST_A_HOPS:
        assert counters_a[hop]["recorded"] == tagged, f"hop {hop}: {counters_a[hop]}"
    for hop in HOST_B_HOPS:
        assert counters_b[hop]["recorded"] == tagged, f"hop {hop}: {counters_b[hop]}"
    assert_flags(records, F_UDP, family)
    # The replies (c2 -> c1) are not the traced flow: nothing of theirs was recorded.
    assert len(records) == tagged * len(ALL_HOPS)


@pytest.mark.parametrize("family", [4, 6], ids=["ipv4", "ipv6"])
def test_udp_payloads_arrive_byte_identical_while_tagged(
    topology: TwoHostTopology, agent_factory: Callable[..., AgentProcess], bpf_object: Path, family: int
) -> None:
    """Random datagrams, 0 bytes up to the largest that can still carry the ID, arrive unchanged (the
    receiver's UDP stack drops the 4 ID bytes after the UDP length) while every one of them is tagged."""
    largest = topology.mtu - (20 if family == 4 else 40) - 8 - 4
    rng = random.Random(family)
    sizes = [0, 1, 2, 3, 4, 5, largest - 1, largest, *(rng.randrange(6, largest) for _ in range(72))]
    payloads = [rng.randbytes(n) for n in sizes]
    dst = topology.addr("c2", family)
    plans = path_plans(topology, f"bytes-v{family}", {"protocol": "udp", "dst": dst, "dstPort": 5555})

    received, agent_a, agent_b = run_traced(
        topology,
        agent_factory,
        plans,
        lambda: udp_transfer(topology, "c1", "c2", payloads, family, 5555, 0.002),
    )

    assert len(received) == len(payloads), f"sent {len(payloads)} datagrams, received {len(received)}"
    changed = [i for i, (got, sent) in enumerate(zip(received, payloads, strict=True)) if got != sent]
    assert not changed, f"datagrams changed on the way (index: sent size): {[(i, sizes[i]) for i in changed]}"
    counters_a = final_counters(agent_a)
    assert counters_a[0]["tagged"] == len(payloads), f"tagger: {counters_a[0]}"
    by_id = assert_complete_path(agent_a.records + agent_b.records)
    assert len(by_id) == len(payloads)
    # The tagger's wire length is the frame with the ID: Ethernet + IP + UDP + payload + 4.
    l3 = 20 if family == 4 else 40
    tagged_lens = sorted(r["wire_len"] for r in agent_a.records if r["hop_index"] == 0)
    assert tagged_lens == sorted(14 + l3 + 8 + n + 4 for n in sizes)


# ---- 2. TCP ----------------------------------------------------------------------------------------------


def iperf3_tcp(topo: TwoHostTopology, addr: str) -> dict[str, Any]:
    """iperf3 TCP c1 -> c2 for 2 s (paced to 200 Mbit/s so a packet capture keeps up); its JSON result."""
    server = topo.popen(
        "c2", "iperf3", "-s", "-1", "-B", addr, "-p", str(IPERF_PORT),
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        wait_listening(topo, "c2", "tcp", IPERF_PORT)
        client = topo.run(
            "c1", "iperf3", "-c", addr, "-p", str(IPERF_PORT), "-t", "2", "-b", "200M", "-J",
            check=False, timeout=20,
        )  # fmt: skip
        assert server.wait(10) == 0, "iperf3 server did not finish its one test"
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
    assert client.returncode == 0, f"iperf3 failed: {client.stdout[-2000:]} {client.stderr[-1000:]}"
    return json.loads(client.stdout)


def traced_iperf3_tcp(
    topo: TwoHostTopology, agent_factory: Callable[..., AgentProcess], family: int, sample: int
) -> tuple[dict[str, Any], list[tuple[int, bytes]], dict[str, int], list[dict[str, Any]]]:
    """iperf3 TCP c1 -> c2 with c1's sockets tagged (1 segment in `sample`) over the whole VXLAN path,
    captured on c2's eth0: iperf3's result, the frames, the tagger's counters and both agents' records."""
    dst = topo.addr("c2", family)
    plans = path_plans(
        topo,
        f"tcp-s{sample}-v{family}",
        {"protocol": "tcp", "dst": dst, "dstPort": IPERF_PORT},
        sample=sample,
        tag_udp=False,
        tcp_tagging=True,
    )
    agent_a = start_attached(agent_factory, plans[0], "host-a", topo.host_a)
    agent_b = start_attached(agent_factory, plans[1], "host-b", topo.host_b)
    cap = capture(topo, "c2", "eth0")
    try:
        result = iperf3_tcp(topo, dst)
    finally:
        frames = cap.stop()
    assert agent_a.proc is not None
    tagger = program_counters(agent_a.proc.pid, "tag_tcp")
    agent_a.stop()
    agent_b.stop()
    return result, frames, tagger, agent_a.records + agent_b.records


@pytest.mark.parametrize("family", [4, 6], ids=["ipv4", "ipv6"])
def test_tcp_transfer_segments_carry_the_option_and_are_seen_at_every_hop(
    topology: TwoHostTopology,
    agent_factory: Callable[..., AgentProcess],
    bpf_object: Path,
    require_tool: Callable[[str], str],
    family: int,
) -> None:
    """An iperf3 transfer c1 -> c2 with TCP tagging for c1's sockets completes; on the wire into c2 every
    c1 -> c2 segment, SYNs included, carries option 253 with ExID 0x4854 (RFC 6994) and an ID that every hop
    recorded; c2's segments (another namespace) carry none."""
    require_tool("iperf3")
    src, dst = topology.addr("c1", family), topology.addr("c2", family)
    result, frames, tagger, records = traced_iperf3_tcp(topology, agent_factory, family, sample=1)

    sent_bytes = int(result["end"]["sum_sent"]["bytes"])
    assert sent_bytes > 1_000_000, f"iperf3 moved only {sent_bytes} bytes"
    assert result["end"]["sum_received"]["bytes"] == sent_bytes

    by_id = assert_complete_path(records)
    assert len(by_id) >= 100, f"only {len(by_id)} segments recorded"
    assert tagger["tagged"] == len(by_id) and tagger["tag_failed"] == 0, f"{len(by_id)} IDs, tagger {tagger}"
    assert_flags(records, F_TCP, family)

    segments = [seg for _, frame in frames if (seg := parse_tcp(frame)) is not None]
    forward = [s for s in segments if s.src == src and s.dst == dst and s.dport == IPERF_PORT]
    backward = [s for s in segments if s.src == dst and s.dst == src and s.sport == IPERF_PORT]
    assert forward and backward, f"capture saw {len(forward)} c1 -> c2 and {len(backward)} c2 -> c1 segments"
    syns = [s for s in forward if s.syn]
    assert len(syns) >= 2, f"expected the SYNs of iperf3's control and data connections, saw {len(syns)}"
    # A RST for a socket that is gone comes from the namespace's control socket (tcp_v4_send_reset,
    # tcp_v6_send_response), which runs no sock_ops: only the segments of the traced sockets carry the ID.
    # So does the ACK a connection's TIME_WAIT socket sends when the peer's FIN comes again
    # (tcp_v4_timewait_ack, tcp_v6_timewait_ack): a connection's segments after its own FIN are not asked.
    closed: set[int] = set()
    without = []
    for at, s in enumerate(forward):
        if s.hoptrace_id() is None and not s.rst and s.sport not in closed:
            without.append((at, s))
        if s.fin:
            closed.add(s.sport)
    assert not without, (
        f"{len(without)} of {len(forward)} c1 -> c2 segments lack the option (position among them, segment): "
        f"{without[:3]}"
    )
    captured_ids = {s.hoptrace_id() for s in forward}
    recorded_c2 = set(ids_by_hop(records)[7])
    assert captured_ids <= recorded_c2, (
        f"IDs on the wire but never recorded: {sorted(captured_ids - recorded_c2)[:10]}"
    )
    assert {s.hoptrace_id() for s in syns} <= set(by_id)
    tagged_back = [s for s in backward if s.hoptrace_id() is not None]
    assert not tagged_back, f"c2's segments carry hoptrace IDs: {tagged_back[:3]}"


@pytest.mark.parametrize("family", [4, 6], ids=["ipv4", "ipv6"])
def test_tcp_sampled_out_segments_carry_no_option_bytes(
    topology: TwoHostTopology,
    agent_factory: Callable[..., AgentProcess],
    bpf_object: Path,
    require_tool: Callable[[str], str],
    family: int,
) -> None:
    """At ``sample: 10`` only the sampled segments carry the option: the others' headers are as long as
    untraced ones (c2's, which carry only timestamps), so receivers keep header prediction and coalescing.
    Exactly one segment in 10 is tagged, each sampled ID is recorded at every hop, and the transfer's bytes
    all arrive."""
    require_tool("iperf3")
    sample = 10
    src, dst = topology.addr("c1", family), topology.addr("c2", family)
    result, frames, tagger, records = traced_iperf3_tcp(topology, agent_factory, family, sample)

    sent_bytes = int(result["end"]["sum_sent"]["bytes"])
    assert sent_bytes > 1_000_000 and result["end"]["sum_received"]["bytes"] == sent_bytes
    assert tagger["tag_failed"] == 0 and tagger["matched"] == tagger["tagged"] + tagger["untagged"], tagger
    assert tagger["tagged"] == -(-tagger["matched"] // sample) >= 10, f"sample {sample}: tagger {tagger}"
    by_id = assert_complete_path(records)
    assert len(by_id) == tagger["tagged"], f"{len(by_id)} IDs recorded, tagger {tagger}"

    segments = [seg for _, frame in frames if (seg := parse_tcp(frame)) is not None]
    forward = [s for s in segments if s.src == src and s.dst == dst and s.dport == IPERF_PORT and not s.syn]
    backward = [s for s in segments if s.src == dst and s.dst == src and s.sport == IPERF_PORT and not s.syn]
    untraced_lengths = {s.option_bytes_without_sack() for s in backward}
    assert untraced_lengths == {12}, f"c2's segments: option lengths {untraced_lengths} (timestamps: 12)"
    tagged = [s for s in forward if s.hoptrace_id() is not None]
    sampled_out = [s for s in forward if s.hoptrace_id() is None and not s.rst]
    assert tagged and sampled_out, f"{len(tagged)} tagged and {len(sampled_out)} sampled-out segments seen"
    padded = [s for s in sampled_out if s.option_bytes_without_sack() != 12]
    assert not padded, f"{len(padded)} sampled-out segments carry more than timestamps: {padded[:3]}"
    tagged_lengths = {s.option_bytes_without_sack() for s in tagged}
    assert tagged_lengths == {20}, f"a tagged segment: timestamps and the 8-byte option, not {tagged_lengths}"
    assert {s.hoptrace_id() for s in tagged} <= set(by_id), "IDs on the wire but never recorded"


@pytest.mark.parametrize("family", [4, 6], ids=["ipv4", "ipv6"])
def test_tcp_echo_bytes_identical_while_tagged(
    topology: TwoHostTopology, agent_factory: Callable[..., AgentProcess], bpf_object: Path, family: int
) -> None:
    """256 KiB of random bytes sent c1 -> c2 over a tagged connection come back from an echo server in c2
    byte for byte; the connection's segments were recorded at every hop."""
    af = socket.AF_INET if family == 4 else socket.AF_INET6
    dst = topology.addr("c2", family)
    data = os.urandom(256 * 1024)
    plans = path_plans(
        topology,
        f"echo-v{family}",
        {"protocol": "tcp", "dst": dst, "dstPort": ECHO_PORT},
        tag_udp=False,
        tcp_tagging=True,
    )
    listener = topology.socket("c2", af, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((dst, ECHO_PORT))
    listener.listen(1)
    listener.settimeout(10)

    def echo_server() -> None:
        conn, _ = listener.accept()
        with conn:
            conn.settimeout(10)
            while chunk := conn.recv(65536):
                conn.sendall(chunk)

    def traffic() -> bytes:
        server = threading.Thread(target=echo_server, name="echo", daemon=True)
        server.start()
        echoed = bytearray()
        with topology.socket("c1", af, socket.SOCK_STREAM) as client:
            client.settimeout(10)
            client.connect((dst, ECHO_PORT))
            sender = threading.Thread(target=lambda: (client.sendall(data), client.shutdown(socket.SHUT_WR)))
            sender.start()
            while chunk := client.recv(65536):
                echoed += chunk
            sender.join(10)
        server.join(10)
        return bytes(echoed)

    try:
        echoed, agent_a, agent_b = run_traced(topology, agent_factory, plans, traffic)
    finally:
        listener.close()

    assert len(echoed) == len(data) and echoed == data, (
        f"echoed {len(echoed)} bytes of {len(data)}, or changed"
    )
    by_id = assert_complete_path(agent_a.records + agent_b.records)
    # At least the handshake, the data and the FIN: a connection of many segments, each one ID.
    assert len(by_id) >= 5, f"only {len(by_id)} segments recorded"
