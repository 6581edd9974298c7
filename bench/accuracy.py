"""Accuracy against ground truth: delay box sweep, clock offset sweep, loss sweep. Method: docs/accuracy.md.

- delay: the VXLAN topology with the delay box splitting the wire (`tests/tools/delaybox.py`, a
user-space relay
  holding each frame a set time and logging its own hold per frame). The whole system traces the 8-hop
  path; per
  packet, hoptrace's `a-wire-out>b-wire-in` latency minus the box's logged hold is the excess (the box's
  own veth
  traversal and relay wake-up, which the box cannot see). Reported: median excess and its spread.
- clock: host-b's agent restarted with `--clock-offset X --clock-drift-ppm 50` (SIMULATION flags); the
error is the
  cross-host segment `a-wire-out>b-wire-in` p50 minus the p50 of a run with no skew at all.
- loss: an nftables rule on host-b's wire0 ingress (netdev family, after tc ingress where `b-wire-in` records)
  drops `numgen random mod 1000 < N` of the VXLAN packets that carry the flow (`drop_flow_on_wire`); the
  report's loss_count vs the rule's counter.
"""

from __future__ import annotations

import os
from typing import Any

from common import (
    BenchContext,
    TwoHostTopology,
    log,
    mad,
    median,
    metric_sum,
    pctl,
    scrape,
    start_cluster,
    start_cluster_agent,
    target,
    wait_report,
)
from hoptrace.lab.delaybox import read_log
from hoptrace.lab.influx import EVERY_PACKET, segment_latencies
from hoptrace.lab.localcluster import writable_bpf_cache
from hoptrace.lab.processes import udp_transfer
from hoptrace.lab.reference import vxlan_path_spec
from hoptrace.lab.waiting import wait_until
from hoptrace.v1 import api_pb2

BOX_SEGMENT = "a-wire-out>b-wire-in"
PORT = 11111


def send(topo: TwoHostTopology, count: int, gap_s: float) -> int:
    """`count` datagrams c1 -> c2; how many arrived."""
    payloads = [os.urandom(64) for _ in range(count)]
    return len(udp_transfer(topo, "c1", "c2", payloads, 4, PORT, gap_s, timeout_s=1.0))


def delay_sweep(ctx: BenchContext, delays_us: list[int], packets: int) -> list[dict[str, Any]]:
    """Per delay: the box segment's excess over the box's own hold times, per packet."""
    influx = ctx.influx()
    topo = TwoHostTopology(ctx.prefix(), overlay="vxlan", delay_box=True)
    cluster = None
    out = []
    try:
        topo.create()
        cluster = start_cluster(
            influx.url, topo, ctx.workdir / "acc-delay", "--join-window", "1", *EVERY_PACKET,
            bpf_cache_dir=writable_bpf_cache(),
        )  # fmt: skip
        for delay_us in delays_us:
            log_path = ctx.workdir / f"box-{delay_us}.jsonl"
            topo.start_delay_box(delay_us * 1000, log_path=log_path)
            trace = f"acc-delay-{delay_us}-{os.getpid()}"
            cluster.apply(vxlan_path_spec(topo, trace))
            arrived = send(topo, packets, gap_s=max(0.003, delay_us * 2e-6))
            wait_report(cluster, trace, arrived, timeout_s=60)
            topo.stop_delay_box()
            holds = {
                r["packet_id"]: r["hold_ns"]
                for r in read_log(log_path)
                if r["dir"] == "in0>out0" and r["packet_id"]
            }
            latencies = segment_latencies(influx.url, trace, BOX_SEGMENT)
            common = sorted(set(holds) & set(latencies))
            if len(common) < 0.9 * packets:
                raise RuntimeError(
                    f"delay {delay_us} us: only {len(common)} of {packets} packets in log and InfluxDB"
                )
            excess = [latencies[p] - holds[p] for p in common]
            m = median(excess) or 0.0
            out.append(
                {
                    "delay_us": delay_us,
                    "packets": len(common),
                    "hold_p50_ns": median([holds[p] for p in common]),
                    "segment_p50_ns": median([latencies[p] for p in common]),
                    "excess_p50_ns": m,
                    "excess_mad_ns": mad(excess),
                    "excess_p99_abs_dev_ns": pctl([abs(e - m) for e in excess], 0.99),
                    "excess_min_ns": min(excess),
                    "excess_max_ns": max(excess),
                }
            )
            cluster.api().DeleteTrace(api_pb2.DeleteTraceRequest(name=trace), timeout=30)
            log(
                f"accuracy delay {delay_us} us: excess p50 {m / 1e3:.1f} us, MAD {out[-1]['excess_mad_ns'] / 1e3:.1f} us"  # noqa: E501
            )
    finally:
        if cluster is not None:
            cluster.stop()
        topo.destroy()
    return out


def segment_p50(report: Any, segment: str) -> float | None:
    """p50 of `from>to` in a Report."""
    for s in report.segments:
        if f"{getattr(s, 'from')}>{s.to}" == segment:
            return float(s.p50_ns)
    return None


# Clock rounds (one a second from the agent's start) that fit an agent's drift.
DRIFT_ROUNDS = 3


def restart_agent_b(cluster: Any, topo: TwoHostTopology, *flags: str) -> None:
    """Restart host-b's agent with `flags`; wait until it is connected again and has DRIFT_ROUNDS clock
    rounds, so the drift is fitted."""
    cluster.components["agent-host-b"].stop()
    start_cluster_agent(cluster, "host-b", topo.host_b, *flags)
    cluster.wait_agents(["host-a", "host-b"])
    metrics = cluster.metrics_addr("agent-host-b")
    wait_until(
        lambda: clock_rounds(metrics) >= DRIFT_ROUNDS, f"{DRIFT_ROUNDS} clock rounds of host-b's agent", 30
    )


def clock_rounds(metrics: str) -> float:
    """The clock rounds with an estimate of the agent serving /metrics at `metrics` (0 while it does not
    answer yet)."""
    try:
        return metric_sum(scrape(metrics), "hoptrace_agent_clock_rounds_total")
    except OSError:
        return 0


def clock_and_loss(ctx: BenchContext, offsets: list[str], losses: list[int], packets: int) -> dict[str, Any]:
    """Clock offset sweep, then loss sweep, on one plain VXLAN topology and cluster."""
    topo = TwoHostTopology(ctx.prefix(), overlay="vxlan")
    cluster = None
    clock_rows: list[dict[str, Any]] = []
    loss_rows: list[dict[str, Any]] = []
    try:
        topo.create()
        cluster = start_cluster(
            ctx.influx().url, topo, ctx.workdir / "acc-clock", "--join-window", "1", *EVERY_PACKET,
            bpf_cache_dir=writable_bpf_cache(),
        )  # fmt: skip
        baseline = None
        for offset in ["unskewed", *offsets]:  # a last "unskewed" shows the run-to-run spread
            flags = [] if offset == "unskewed" else ["--clock-offset", offset, "--clock-drift-ppm", "50"]
            restart_agent_b(cluster, topo, *flags)
            trace = f"acc-clock-{offset.replace('.', '_')}-{len(clock_rows)}-{os.getpid()}"
            cluster.apply(vxlan_path_spec(topo, trace))
            arrived = send(topo, packets, gap_s=0.002)
            report = wait_report(cluster, trace, arrived, timeout_s=60)
            p50 = segment_p50(report, BOX_SEGMENT)
            if offset == "unskewed" and baseline is None:
                baseline = p50
            row = {
                "offset": offset,
                "drift_ppm": 0 if offset == "unskewed" else 50,
                "segment_p50_ns": p50,
                "error_ns": None if p50 is None or baseline is None else p50 - baseline,
                "below_clock_bound": any(s.below_clock_bound for s in report.segments),
            }
            clock_rows.append(row)
            cluster.api().DeleteTrace(api_pb2.DeleteTraceRequest(name=trace), timeout=30)
            log(f"accuracy clock {offset}: {BOX_SEGMENT} p50 {p50} ns, error {row['error_ns']} ns")
        restart_agent_b(cluster, topo)
        for per_mille in losses:
            trace = f"acc-loss-{per_mille}-{os.getpid()}"
            cluster.apply(vxlan_path_spec(topo, trace))
            topo.drop_flow_on_wire(per_mille, PORT)
            try:
                send(topo, packets * 3, gap_s=0.0005)
                dropped = topo.dropped_on_wire()
            finally:
                topo.stop_dropping()
            report = wait_report(cluster, trace, 0, timeout_s=60, stable_s=4)
            loss = sum(s.loss_count for s in report.segments)
            loss_rows.append(
                {
                    "rule_per_mille": per_mille,
                    "sent": packets * 3,
                    "nft_dropped": dropped,
                    "reported_loss": loss,
                    "by_segment": {
                        f"{getattr(s, 'from')}>{s.to}": s.loss_count for s in report.segments if s.loss_count
                    },
                    "tracer_lost": sum(s.tracer_lost for s in report.segments),
                }
            )
            cluster.api().DeleteTrace(api_pb2.DeleteTraceRequest(name=trace), timeout=30)
            log(f"accuracy loss {per_mille}/1000: nft dropped {dropped}, hoptrace reports {loss}")
    finally:
        if cluster is not None:
            cluster.stop()
        topo.destroy()  # the nft table goes with host-b's namespace
    return {"clock": clock_rows, "loss": loss_rows}


def run(ctx: BenchContext) -> dict[str, Any]:
    """All three sweeps."""
    delays = delay_sweep(ctx, ctx.size([200], [50, 200, 1000, 5000]), ctx.size(100, 400))
    rest = clock_and_loss(
        ctx,
        ctx.size(["10ms"], ["0s", "1ms", "10ms", "50ms", "unskewed"]),
        ctx.size([100], [1, 10, 100]),
        ctx.size(100, 1000),
    )
    worst_clock = max((abs(r["error_ns"]) for r in rest["clock"] if r["error_ns"] is not None), default=None)
    loss_err = max((abs(r["reported_loss"] - r["nft_dropped"]) for r in rest["loss"]), default=None)
    return {
        "delay": delays,
        **rest,
        "summary": {
            "delay_excess_p50_ns": {d["delay_us"]: d["excess_p50_ns"] for d in delays},
            "delay_excess_mad_ns": {d["delay_us"]: d["excess_mad_ns"] for d in delays},
            "clock_worst_p50_error_ns": worst_clock,
            "loss_worst_abs_error": loss_err,
        },
        "targets": [
            target(
                "per-packet spread of box-segment excess (MAD, worst delay)",
                max(d["excess_mad_ns"] for d in delays),
                10_000,
                "ns",
            ),
            target("cross-host p50 error under clock skew (worst offset)", worst_clock, 20_000, "ns"),
            target("reported loss - nft drops (worst rate)", loss_err, 0, "packets"),
        ],
        "table": {
            "columns": [
                "delay µs",
                "packets",
                "box hold p50 µs",
                "segment p50 µs",
                "excess p50 µs",
                "excess MAD µs",
                "p99 |dev| µs",
            ],
            "rows": [
                [
                    d["delay_us"],
                    d["packets"],
                    d["hold_p50_ns"] / 1e3,
                    d["segment_p50_ns"] / 1e3,
                    d["excess_p50_ns"] / 1e3,
                    d["excess_mad_ns"] / 1e3,
                    d["excess_p99_abs_dev_ns"] / 1e3,
                ]
                for d in delays
            ],
        },
        "tables": {
            "clock": {
                "columns": ["host-b offset", "drift ppm", "segment p50 µs", "error vs unskewed µs"],
                "rows": [
                    [
                        r["offset"],
                        r["drift_ppm"],
                        (r["segment_p50_ns"] or 0) / 1e3,
                        None if r["error_ns"] is None else r["error_ns"] / 1e3,
                    ]
                    for r in rest["clock"]
                ],
            },
            "loss": {
                "columns": [
                    "nft rule (per mille)",
                    "sent",
                    "nft dropped",
                    "hoptrace loss_count",
                    "tracer lost",
                ],
                "rows": [
                    [r["rule_per_mille"], r["sent"], r["nft_dropped"], r["reported_loss"], r["tracer_lost"]]
                    for r in rest["loss"]
                ],
            },
        },
    }
