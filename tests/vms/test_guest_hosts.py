"""Real hosts: Debian guests are the traced hosts, this machine is their hypervisor (lab/guests.py).

guest-a (Debian 12 backports' 6.12) and guest-b (Debian 12's 6.1) each run their own kernel, clock and agent;
this machine's agent is node `hypervisor` on the lab namespace holding the guests' taps and bridge. One spec
traces a flow from an application in guest-a through its virtio NIC, the hypervisor's tap and bridge, and
guest-b's NIC up to its receiving application's read (UDP; TCP up to the NIC). No agent sees another's
packets: each one's BPF runs in its own kernel. Ground truths: the packets guest-a's kernel sent (an nftables
counter there) and a real step of guest-b's wall clock (CLOCK_REALTIME set in the guest), which the
decomposition must not show.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Iterator
from typing import Any

import pytest
from system_helpers import recorded_segments

from hoptrace.common.timeouts import scaled
from hoptrace.lab import vm
from hoptrace.lab.guest_cluster import GuestCluster, fetched_kernel, guest_cluster, path_spec, wait_complete
from hoptrace.lab.localcluster import LocalCluster
from hoptrace.lab.prometheus import scrape
from hoptrace.lab.waiting import wait_until
from hoptrace.v1 import api_pb2, trace_pb2

NODES = ("hypervisor", "guest-a", "guest-b")
GUEST_KERNELS = {"guest-a": "6.12", "guest-b": "6.1"}
CLOCK_STEP_MS = 10
MIN_STEP_NS = 5_000_000  # the step the guest's clock must at least make: several milliseconds
# How much a segment's median may move between two runs under TCG beyond its clock bound.
NOISE_NS = 2_000_000
BULK_KIB = 1024  # one burst: TSO skbs of up to 64 KB, about 45 MSS-sized segments each
# The hops a TSO skb crosses whole: guest-a's NIC egress, and the hypervisor's taps (virtio's GSO).
WHOLE_SKB_HOPS = ("a-nic-out", "hv-tap-a-in", "hv-tap-b-out")


def kernel(version: str) -> vm.Kernel:
    """The fetched kernel of `version` (major.minor); fails telling how to fetch it."""
    try:
        return fetched_kernel(version)
    except RuntimeError as error:
        pytest.fail(str(error), pytrace=False)


@pytest.fixture(scope="module")
def guests(influxd: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GuestCluster]:
    """Two guests booted at once (the machine's two cores; no more), the control plane on the lab network's
    hypervisor address, the three agents connected."""
    kernels = {node: kernel(version) for node, version in GUEST_KERNELS.items()}
    workdir = tmp_path_factory.mktemp("guest-hosts")  # shared into the guests (certificates, agent logs)
    with guest_cluster(influxd.url, workdir, f"htvm{secrets.token_hex(2)}", kernels) as cluster:
        yield cluster


def node_clocks(cluster: LocalCluster) -> dict[str, api_pb2.NodeClockStatus]:
    """Each connected node's clock as the collector last measured it."""
    agents = cluster.api().ListAgents(api_pb2.ListAgentsRequest(), timeout=10).agents
    return {agent.registration.node: agent.clock for agent in agents if agent.connected}


def wait_clocks_measured(cluster: LocalCluster, timeout_s: float = 60.0) -> None:
    """Wait until the collector has a clock estimate of every node."""
    deadline = time.monotonic() + scaled(timeout_s)
    while time.monotonic() < deadline:
        clocks = node_clocks(cluster)
        if all(node in clocks and clocks[node].measured for node in NODES):
            return
        time.sleep(0.5)
    raise AssertionError(f"clocks not all measured after {timeout_s} s: {node_clocks(cluster)}")


def segment_names(spec: trace_pb2.TraceSpec) -> list[str]:
    """'from>to' of consecutive hops, in path order."""
    names = [hop.name for hop in spec.hops]
    return [f"{x}>{y}" for x, y in zip(names, names[1:], strict=False)]


def apply_path(guests: GuestCluster, name: str, protocol: str) -> trace_pb2.TraceSpec:
    """Apply the path's spec; returns once every node has a clock estimate (agents send their clock rounds
    on the record stream a trace opens, and packets are aligned with them)."""
    spec = path_spec(guests, name, protocol)
    guests.cluster.apply(spec, timeout_s=120)
    wait_clocks_measured(guests.cluster)
    return spec


def send_and_report(
    guests: GuestCluster, spec: trace_pb2.TraceSpec, writes: int
) -> tuple[int, dict[str, Any]]:
    """Send the flow from guest-a, wait for its report, delete the trace; the packets sent and the report."""
    sent = guests.a.send_flow(spec.filter.protocol, guests.b, writes)
    data = wait_complete(guests.cluster, spec.name, sent)
    guests.cluster.api().DeleteTrace(api_pb2.DeleteTraceRequest(name=spec.name), timeout=scaled(60))
    assert [f"{s['from']}>{s['to']}" for s in data["segments"]] == segment_names(spec)
    return sent, data


def trace_flow(guests: GuestCluster, name: str, protocol: str, writes: int) -> tuple[int, dict[str, Any]]:
    """Apply the path's spec, send the flow from guest-a, return the packets guest-a sent and the report."""
    return send_and_report(guests, apply_path(guests, name, protocol), writes)


def assert_complete_decomposition(data: dict[str, Any], sent: int) -> None:
    """Every packet guest-a's kernel sent was traced at every hop, and every segment took time."""
    assert data["packets"] == sent and data["complete"] == sent, (sent, data)
    for segment in data["segments"]:
        assert segment["count"] == sent and segment["incomplete"] == 0, segment
        assert 0 < segment["p50_ns"] <= segment["p99_ns"] <= segment["max_ns"], segment
    assert data["end_to_end"]["count"] == sent


def test_udp_flow_across_the_virtio_boundary(guests: GuestCluster) -> None:
    sent, data = trace_flow(guests, "vm-udp", "udp", 200)
    assert sent == 200  # one datagram per write, nothing else to guest-b's port
    assert_complete_decomposition(data, sent)


def test_tcp_flow_across_the_virtio_boundary(guests: GuestCluster) -> None:
    sent, data = trace_flow(guests, "vm-tcp", "tcp", 100)
    # At least the handshake's SYN and ACK, the FIN and one segment per write (no Nagle: writes are 10 ms
    # apart, far beyond the round trip); plus the pure ACKs of the flow's answers.
    assert sent >= 100 + 3, sent
    assert_complete_decomposition(data, sent)


def collector_segments(cluster: LocalCluster) -> tuple[float, float]:
    """The wire segments of the packets the collector joined so far, and those missing at some hop."""
    metrics = scrape(cluster.metrics_addr("collector"))
    return (
        metrics.get("hoptrace_collector_segments_total", 0.0),
        metrics.get("hoptrace_collector_segments_missing_total", 0.0),
    )


def test_tso_skbs_across_the_virtio_boundary_count_every_segment(guests: GuestCluster) -> None:
    """guest-a's TCP hands its virtio NIC TSO skbs of many segments, which reach the hypervisor's tap whole
    (virtio's GSO: a DODGY skb whose segments a hop counts from its length and gso_size) and leave it through
    guest-b's tap. The join's segments are every one guest-a's socket sent (tcpi_segs_out), none missing,
    and the hops before guest-b each recorded the same skbs of several segments."""
    spec = apply_path(guests, "vm-tso", "tcp")
    joined, missing = collector_segments(guests.cluster)
    sent = guests.a.send_tcp_bulk(guests.b, BULK_KIB)
    assert sent > BULK_KIB * 1024 // 1500, sent  # a segment per MSS at least
    wait_until(
        lambda: collector_segments(guests.cluster)[0] - joined >= sent,
        f"the join's {sent} segments of the bulk flow",
        90,
    )
    time.sleep(scaled(3))  # a packet joined twice would show by now
    now_joined, now_missing = collector_segments(guests.cluster)
    result = guests.cluster.hoptrace("report", spec.name, "--since", "30m", "--json")
    guests.cluster.api().DeleteTrace(api_pb2.DeleteTraceRequest(name=spec.name), timeout=scaled(60))
    assert (now_joined - joined, now_missing - missing) == (sent, 0)
    data = json.loads(result.stdout)
    whole = {hop: recorded_segments(data, hop) for hop in WHOLE_SKB_HOPS}
    print(f"{sent} segments sent; skbs of several segments (records, segments) by hop: {whole}")
    assert len(set(whole.values())) == 1 and whole["hv-tap-a-in"][0] > 0, whole


def fresh_clock(
    cluster: LocalCluster, node: str, after_ns: int, timeout_s: float = 60.0
) -> api_pb2.NodeClockStatus:
    """`node`'s first clock estimate measured after `after_ns` (this machine's wall clock: the master's) with
    a drift fitted (after a step the agent fits its drift anew, which takes two rounds)."""
    deadline = time.monotonic() + scaled(timeout_s)
    while True:
        clock = node_clocks(cluster).get(node)
        if clock and clock.measured and clock.measured_at.ToNanoseconds() > after_ns and clock.drift_ppm:
            return clock
        assert time.monotonic() < deadline, f"no new clock estimate of {node} in {timeout_s} s: {clock}"
        time.sleep(0.5)


def test_stepped_guest_clock_leaves_the_decomposition(guests: GuestCluster) -> None:
    """guest-b's wall clock steps 10 ms ahead (the step its clock made is measured in the guest): once its
    agent has run clock rounds since, no segment's median moves by more than its clock bound plus this
    machine's run-to-run noise, nor by half the step."""
    _, before = trace_flow(guests, "vm-clock-before", "udp", 200)
    # The next trace is applied first: its record stream carries guest-b's clock rounds to the collector.
    spec = apply_path(guests, "vm-clock-after", "udp")
    stepped_at = time.time_ns()
    step_ns = guests.b.shift_clock_ms(CLOCK_STEP_MS)
    print(f"guest-b's clock stepped {step_ns} ns ahead")
    assert step_ns >= MIN_STEP_NS, f"guest-b's clock stepped only {step_ns} ns"
    # Two clock estimates of guest-b measured after the step (rounds every 2 s): the agent saw the step.
    fresh_clock(
        guests.cluster,
        "guest-b",
        fresh_clock(guests.cluster, "guest-b", stepped_at).measured_at.ToNanoseconds(),
    )
    sent, after = send_and_report(guests, spec, 200)
    assert_complete_decomposition(after, sent)
    medians = {f"{s['from']}>{s['to']}": s for s in before["segments"]}
    for segment in after["segments"]:
        name = f"{segment['from']}>{segment['to']}"
        shift = abs(segment["p50_ns"] - medians[name]["p50_ns"])
        bound = max(segment["clock_bound_ns"], medians[name]["clock_bound_ns"])
        print(f"{name}: p50 {medians[name]['p50_ns']} -> {segment['p50_ns']} ns, clock bound {bound} ns")
        assert shift <= bound + NOISE_NS, f"{name} moved {shift} ns with a clock bound of {bound} ns"
        assert shift < step_ns / 2, f"{name} moved {shift} ns: guest-b's {step_ns} ns step shows"
