"""Clock alignment, loss/jitter metrics and the data path's reliability, on the whole system.

Ground truths: a simulated clock skew on one agent (same machine, so the true offset is 0), an nftables rule
whose counter is the exact number of dropped packets, the delay box's own hold log, and the packets sent.
"""

from __future__ import annotations

import json
import signal
import statistics
import subprocess
import time

from system_helpers import (
    EVERY_PACKET,
    UdpSender,
    distinct_packets,
    p50,
    report,
    running_cluster,
    segment_counts,
    segment_latencies,
    wait_report,
)

from hoptrace.lab.reference import vxlan_path_spec
from hoptrace.v1 import api_pb2

CROSS_HOST = "a-wire-out>b-wire-in"
PORT = 11111


def send_count(topo, count: int, rate_pps: float, port: int = PORT) -> int:
    """Send exactly `count` datagrams c1 -> c2 at `rate_pps`; returns the count."""
    sender = UdpSender(topo, "c1", "c2", port, rate_pps=rate_pps).start()
    while sender.sent < count:
        time.sleep(0.05)
    sender.stop()
    return sender.sent


def cross_host_p50s(topo, influx_url: str, trace: str, agent_args=None) -> dict[str, float]:
    """p50 of every segment for 300 packets, with the given agent flags."""
    with running_cluster(topo, influx_url, agent_args) as cluster:
        cluster.apply(vxlan_path_spec(topo, trace))
        time.sleep(4)  # three clock rounds: offset and drift are known before the packets
        sent = send_count(topo, 300, 300)
        data = wait_report(cluster, trace, sent)
        return {f"{s['from']}>{s['to']}": s["p50_ns"] for s in data["segments"]}


def test_skewed_host_clock_is_aligned(topology, influxd):
    """host-b acts 3.7 ms ahead with 50 ppm drift: cross-host p50s stay within 20 us of an unskewed run."""
    plain = cross_host_p50s(topology, influxd.url, "clk-plain")
    skew = {"host-b": ["--clock-offset", "3.7ms", "--clock-drift-ppm", "50"]}
    skewed = cross_host_p50s(topology, influxd.url, "clk-skewed", skew)
    assert plain.keys() == skewed.keys()
    for segment, value in plain.items():
        assert abs(skewed[segment] - value) <= 20_000, f"{segment}: {value} plain, {skewed[segment]} skewed"
    assert abs(skewed[CROSS_HOST]) < 1_000_000  # the 3.7 ms really was taken out (the segment is ~3 us)


def test_loss_on_the_wire_matches_the_nftables_counter(topology, influxd):
    """5 % random drop on host-b's wire: that segment's loss equals the rule's counter, others show none."""
    topology.drop_flow_on_wire(50, PORT)
    with running_cluster(topology, influxd.url) as cluster:
        cluster.apply(vxlan_path_spec(topology, "loss"))
        sent = send_count(topology, 4000, 1000, PORT)
        time.sleep(3)  # every packet's join window closes
        dropped = topology.dropped_on_wire()
        data = wait_report(cluster, "loss", sent - dropped)
    segments = {f"{s['from']}>{s['to']}": s for s in data["segments"]}
    # tc ingress on host-b's wire0 (the hop) runs before netfilter's netdev ingress hook (the drop)
    lossy = segments["b-wire-in>b-vxlan-in"]
    assert dropped > 0
    assert lossy["loss_count"] == dropped, (lossy, dropped)
    assert abs(lossy["loss_rate"] - dropped / sent) < 0.001
    assert 0.04 <= lossy["loss_rate"] <= 0.06
    for name, segment in segments.items():
        if name != "b-wire-in>b-vxlan-in":
            assert segment["loss_count"] == 0, (name, segment)
        assert segment["tracer_lost"] == 0, (name, segment)


def test_jitter_across_the_delay_box_matches_its_log(topology_factory, influxd, tmp_path):
    """200 us +- 50 us random delay: the box segment's jitter is the box's own, within 10 %."""
    from hoptrace.lab.delaybox import read_log

    topo = topology_factory("vxlan", delay_box=True)
    jitter: dict[str, dict[str, float]] = {}
    with running_cluster(topo, influxd.url, collector_args=EVERY_PACKET) as cluster:
        for name, jitter_us in (("jit-fixed", 0), ("jit-random", 50)):
            log = tmp_path / f"{name}.jsonl"
            topo.start_delay_box(200_000, jitter_ns=jitter_us * 1000, log_path=log, seed=7)
            cluster.apply(vxlan_path_spec(topo, name))
            sent = send_count(topo, 600, 200)
            data = wait_report(cluster, name, sent)
            topo.stop_delay_box()
            cluster.api().DeleteTrace(api_pb2.DeleteTraceRequest(name=name))
            jitter[name] = {f"{s['from']}>{s['to']}": s["jitter_ns"] for s in data["segments"]}
            if jitter_us:
                # The box's jitter, computed like hoptrace's: mean |hold(i+1) - hold(i)| in packet order.
                latencies = segment_latencies(influxd.url, name, CROSS_HOST)
                rows = [r for r in read_log(log) if r["dir"] == "in0>out0" and r["packet_id"] in latencies]
                rows.sort(key=lambda r: r["t_rx_ns"])
                holds = [r["hold_ns"] for r in rows]
                truth = statistics.mean(abs(b - a) for a, b in zip(holds, holds[1:], strict=False))
    measured = jitter["jit-random"][CROSS_HOST]
    assert abs(measured - truth) <= 0.10 * truth, f"hoptrace {measured:.0f} ns, box {truth:.0f} ns"
    for segment, value in jitter["jit-fixed"].items():
        if segment != CROSS_HOST:
            assert abs(jitter["jit-random"][segment] - value) <= 0.10 * truth, segment


def test_collector_down_for_20s_loses_nothing(topology, influxd):
    """Agents hold records while the collector is gone (SIGKILL) and send them when it is back.

    An agent resends the batches its broken stream had in flight; the restarted collector leaves out their
    records before the mark of windows written (`WrittenBeforeMark`, beside its spool), so those windows are
    not written again (tests/collector/test_reliability.py checks that exactly). None is missing, which is
    what is checked here (packet IDs: every packet is an exemplar here).
    """
    with running_cluster(topology, influxd.url, collector_args=EVERY_PACKET) as cluster:
        spec = vxlan_path_spec(topology, "coll-down")
        cluster.apply(spec)
        sender = UdpSender(topology, "c1", "c2", 11111, rate_pps=200).start()
        time.sleep(3)  # traffic before the outage (pacing)
        cluster.components["collector"].stop(signal.SIGKILL)
        time.sleep(20)  # the outage (the thing tested)
        cluster.start_collector("--join-window", "1", *EVERY_PACKET)
        time.sleep(3)  # traffic after it (pacing)
        sent = sender.stop()
        data = wait_report(cluster, "coll-down", sent, timeout_s=90)
        assert all(s["incomplete"] == 0 for s in data["segments"]), data["segments"]
    counts = distinct_packets(influxd.url, "coll-down")
    names = [h.name for h in spec.hops]
    for a, b in zip(names, names[1:], strict=False):
        assert counts[f"{a}>{b}"] == sent


def test_influxdb_down_for_60s_loses_and_duplicates_nothing(topology, restartable_influxd):
    """The collector spools while InfluxDB is away and replays once, exactly, when it returns."""
    influxd = restartable_influxd
    with running_cluster(topology, influxd.url) as cluster:
        spec = vxlan_path_spec(topology, "influx-down")
        cluster.apply(spec)
        sender = UdpSender(topology, "c1", "c2", 11111, rate_pps=100).start()
        time.sleep(2)  # traffic before the outage (pacing)
        influxd.stop_process()
        time.sleep(60)  # the outage (the thing tested)
        influxd.restart()
        time.sleep(2)  # traffic after it (pacing)
        sent = sender.stop()
        wait_report(cluster, "influx-down", sent, timeout_s=90)
    counts = segment_counts(influxd.url, "influx-down")
    names = [h.name for h in spec.hops]
    assert {f"{a}>{b}": counts.get(f"{a}>{b}") for a, b in zip(names, names[1:], strict=False)} == {
        f"{a}>{b}": sent for a, b in zip(names, names[1:], strict=False)
    }


def test_agent_killed_and_restarted_leaves_nothing_and_resumes(topology, influxd):
    """SIGKILL an agent mid-trace: its links go with it; restarted, it gets its traces back by itself."""
    with running_cluster(topology, influxd.url) as cluster:
        spec = vxlan_path_spec(topology, "agent-kill")
        hops_b = sum(hop.node == "host-b" for hop in spec.hops)  # one link per hop
        cluster.apply(spec)
        agent = cluster.components["agent-host-b"]
        links = held_link_ids(agent.process.pid)
        assert len(links) == hops_b
        agent.stop(signal.SIGKILL)
        assert set(link_ids()) & links == set()
        assert "hop_" not in topology.run("host-b", "bpftool", "net", "show").stdout

        cluster.start_agent("host-b", topology.host_b)
        cluster.wait_agents(["host-a", "host-b"])
        restarted = cluster.components["agent-host-b"].process.pid
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and len(held_link_ids(restarted)) < hops_b:
            time.sleep(0.2)  # every hop attached again before traffic: none misses a packet
        sent = send_count(topology, 100, 200)
        data = wait_report(cluster, "agent-kill", sent)
        assert data["complete"] >= sent


def held_link_ids(pid: int) -> set[int]:
    """IDs of the BPF links process `pid` holds (from /proc/PID/fdinfo)."""
    import os

    ids = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}") != "anon_inode:bpf_link":
                continue
            with open(f"/proc/{pid}/fdinfo/{fd}") as info:
                for line in info:
                    if line.startswith("link_id:"):
                        ids.add(int(line.split()[1]))
        except OSError:
            continue
    return ids


def link_ids() -> list[int]:
    """Every BPF link the kernel has now."""
    out = subprocess.run(["bpftool", "-j", "link", "show"], capture_output=True, text=True, check=True).stdout
    return [link["id"] for link in json.loads(out or "[]")]


def test_report_json_has_the_metric_fields(topology, influxd):
    """`hoptrace report --json` carries loss, jitter and per-hop throughput."""
    with running_cluster(topology, influxd.url) as cluster:
        cluster.apply(vxlan_path_spec(topology, "fields"))
        sent = send_count(topology, 200, 200)
        data = wait_report(cluster, "fields", sent)
        for segment in data["segments"]:
            assert {"loss_count", "loss_rate", "jitter_ns"} <= segment.keys()
        hops = {h["hop"]: h for h in data["hops"]}
        assert len(hops) == 8 and all(h["packets_per_s"] > 0 and h["bytes_per_s"] > 0 for h in hops.values())
        assert report(cluster, "fields")["trace"] == "fields"
        assert p50([s["p50_ns"] for s in data["segments"]]) > 0
