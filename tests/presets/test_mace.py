"""MACE on a real kernel: per-packet container overhead, the corrected RTT against native, and coverage.

The bound is MACE's: the container's ping RTT, minus the egress and ingress overhead MACE measured for the
same echo, has a mean within 20 µs of the host namespace's own ping to the same target. The two ping in turn,
each after the same pause, so both see the same machine. Means are taken over the central 98 % of echoes:
this VM shares its 2 CPUs with other work, and a single preempted echo (milliseconds) would otherwise decide
a 20 µs comparison.

The bound holds only if tracing perturbs the container's echoes no more than the host's: the agent must not
be woken per record (it was, and the wakeup preempted the pinger after every container echo and never after a
host echo: +19 to +37 µs; docs/mace.md).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hoptrace.cli import mace
from hoptrace.lab import flood as flood_script
from hoptrace.lab.topology import TwoHostTopology, add_container

FLOOD = Path(flood_script.__file__)  # run in a container namespace
BOUND_NS = 20_000


def trimmed_mean(values: list[float], trim: float = 0.01) -> float:
    """Mean of the values without the lowest and highest ``trim`` fraction."""
    ordered = sorted(values)
    cut = int(len(ordered) * trim)
    kept = ordered[cut : len(ordered) - cut] if cut else ordered
    return sum(kept) / len(kept)


def mace_args(topo: TwoHostTopology, *extra: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    mace.add_parser(parser.add_subparsers())
    return parser.parse_args(["mace", "--container", topo.c1, "--host-netns", topo.host_a, *extra])


def corrected_vs_host(topo: TwoHostTopology, count: int = 600) -> dict[str, Any]:
    """Ping host-b from c1 and from host-a in turn under MACE inner-dev; the report and both trimmed means."""
    target = topo.addr("host-b")
    args = mace_args(topo, "--ping", target, "--count", str(count), "--interval", "0.002", "--compare-host")
    report = mace.run(args)
    ping = report["ping"]
    assert ping["container_rtt"]["count"] >= count * 0.98, ping["container_rtt"]
    echoes = ping["echoes"]
    assert len(echoes) >= count * 0.98, f"only {len(echoes)} of {count} echoes corrected"
    corrected = trimmed_mean([e["corrected_ns"] for e in echoes])
    raw = trimmed_mean([e["rtt_ns"] for e in echoes])
    host = report["ping"]["host_rtt"]
    assert host["count"] >= count * 0.98
    host_rtts = [float(h) for h in _host_rtts(report)]
    native = trimmed_mean(host_rtts)
    print(f"container {raw / 1e3:.1f} µs, corrected {corrected / 1e3:.1f} µs, host {native / 1e3:.1f} µs")
    return {"report": report, "corrected": corrected, "raw": raw, "native": native}


def _host_rtts(report: dict[str, Any]) -> list[int]:
    return report["ping"]["host_rtts"]


def test_corrected_rtt_matches_native_idle(routed_topology: TwoHostTopology, mace_object: Path) -> None:
    """Idle system: corrected container RTT within 20 µs of native, and the correction is not nothing."""
    result = corrected_vs_host(routed_topology)
    summary = result["report"]["summary"]
    assert summary["egress"]["coverage"] >= 0.99 and summary["ingress"]["coverage"] >= 0.99, summary
    assert summary["egress"]["mean_ns"] > 0 and summary["ingress"]["mean_ns"] > 0
    assert result["raw"] - result["corrected"] > 1_000, "MACE removed less than 1 µs"
    # MACE's own claim is the bound. Nearer native than the raw RTT holds only where the container's
    # overhead stands out of the noise: on a 2-vCPU firecracker VM the raw RTT was 4-10 µs over native and
    # the corrected one 3-6 µs under it, so the raw one was nearer in 2 of 9 runs.
    if result["raw"] - result["native"] > BOUND_NS / 2:
        assert abs(result["corrected"] - result["native"]) < abs(result["raw"] - result["native"]), result
    assert abs(result["corrected"] - result["native"]) < BOUND_NS, result


def test_corrected_rtt_matches_native_with_flooding_neighbour(
    routed_topology: TwoHostTopology, mace_object: Path, extra_netns: Callable[[str], None]
) -> None:
    """A co-located container floods the same bridge and wire: the bound still holds."""
    topo = routed_topology
    ns = f"{topo.prefix}-c3"
    extra_netns(ns)
    add_container(topo, "c3", "198.18.1.3", "02:00:c6:12:01:03")
    flood = subprocess.Popen(
        [
            "ip",
            "netns",
            "exec",
            ns,
            sys.executable,
            str(FLOOD),
            topo.addr("host-b"),
            "9",
            "20000",
            "1000",
            "60",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        result = corrected_vs_host(topo)
    finally:
        flood.kill()
        flood.wait()
        flood.stdout.close()  # type: ignore[union-attr]
    summary = result["report"]["summary"]
    # The flood crossed the outer device; none of it may count as the container's.
    assert summary["counters"]["outer_egress"] > 10 * summary["egress"]["reported"], summary["counters"]
    assert summary["egress"]["coverage"] >= 0.99 and summary["ingress"]["coverage"] >= 0.99, summary
    assert abs(result["corrected"] - result["native"]) < BOUND_NS, result


def test_udp_coverage_at_1k_packets_per_second(routed_topology: TwoHostTopology, mace_object: Path) -> None:
    """UDP both ways at 1 k packets/s, keyed by header hash (no ICMP ids): ≥ 99 % of packets reported."""
    topo = routed_topology
    with mace.mace_agent(
        ["--container", topo.c1, "--host-netns", topo.host_a, "--peer", topo.addr("c2")]
    ) as agent:
        senders = [
            topo.popen(
                src,
                sys.executable,
                str(FLOOD),
                topo.addr(dst),
                "9",
                "1000",
                "200",
                "3",
                stdout=subprocess.PIPE,
                text=True,
            )
            for src, dst in (("c1", "c2"), ("c2", "c1"))
        ]
        sent = [int(s.communicate(timeout=30)[0].strip()) for s in senders]
        summary = agent.stop()
    assert min(sent) >= 2900, sent
    for direction, n in (("egress", sent[0]), ("ingress", sent[1])):
        d = summary[direction]
        assert d["reported"] >= 0.99 * n, (direction, n, d)
        assert d["coverage"] >= 0.99, (direction, d)
        assert d["collision_rate"] < 0.001, (direction, d)


def test_every_path_reports_each_echo(routed_topology: TwoHostTopology, mace_object: Path) -> None:
    """inner-dev, max-dev and syscalls all pair every echo; the syscalls path includes the container's own
    stack, so its correction is the largest."""
    topo = routed_topology
    corrections = {}
    for path in mace.PATHS:
        args = mace_args(topo, "--path", path, "--ping", topo.addr("host-b"), "--count", "200")
        report = mace.run(args)
        echoes = report["ping"]["echoes"]
        assert len(echoes) >= 196, (path, len(echoes))
        summary = report["summary"]
        assert summary["egress"]["coverage"] >= 0.99 and summary["ingress"]["coverage"] >= 0.99, (
            path,
            summary,
        )
        corrections[path] = trimmed_mean([e["correction_ns"] for e in echoes])
    assert corrections["syscalls"] > corrections["inner-dev"], corrections
