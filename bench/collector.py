"""Collector: join throughput (bench/collector_join.py), InfluxDB write throughput, end-to-end freshness.

- join: `bench/collector_join.py` as it is (decode + join on one core), its output parsed;
- InfluxDB write: the collector's own exporter (`InfluxExporter`, batches of 5000, one writer thread) writing
  `hop_latency` points (`points.latency_point`) into a real influxd; points/s = points / time until flushed;
- freshness: the whole system (collector, dispatcher, two agents) on the VXLAN topology; one datagram at
a time
  c1 -> c2, then InfluxDB is polled (InfluxQL count, every 20 ms) until that packet's `hop_latency` points are
  there. Freshness = that moment minus the send (the last hop is a few tens of µs after the send).
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from typing import Any

from common import REPO, BenchContext, TwoHostTopology, log, median, pctl, start_cluster, udp_socket
from hoptrace.collector.aggregate import LatencySample
from hoptrace.collector.influx import InfluxConfig, InfluxExporter
from hoptrace.collector.points import latency_point
from hoptrace.lab.localcluster import writable_bpf_cache
from hoptrace.lab.reference import vxlan_path_spec


def join_throughput(packets: int) -> dict[str, Any]:
    """Run bench/collector_join.py and parse its two result lines."""
    out = subprocess.run(
        [sys.executable, str(REPO / "bench" / "collector_join.py"), "--packets", str(packets)],
        capture_output=True,
        text=True,
        check=True,
        timeout=600,
    ).stdout
    rate = re.search(r"(\d+) k records/s joined", out)
    per = re.search(r"(\d+) bytes each", out)
    if not rate or not per:
        raise RuntimeError(f"collector_join.py printed no results: {out}")
    return {
        "packets": packets,
        "records_per_s": int(rate.group(1)) * 1000,
        "bytes_per_pending": int(per.group(1)),
    }


def influx_write_throughput(url: str, points: int) -> dict[str, Any]:
    """points/s of the collector's exporter into a real influxd."""
    exporter = InfluxExporter(InfluxConfig(url=url, bucket="hoptrace/autogen"))
    base = time.time_ns()
    batch = [
        latency_point(
            LatencySample(
                "bench-write",
                f"h{i % 7}>h{i % 7 + 1}",
                f"h{i % 7}",
                f"h{i % 7 + 1}",
                "host-a",
                "host-b",
                base + i * 1000,
                10_000 + i % 5000,
                i,
                False,
            )
        )
        for i in range(points)
    ]
    try:
        t0 = time.monotonic()
        for start in range(0, points, 5000):
            exporter.export(batch[start : start + 5000])
        ok = exporter.flush(timeout_s=600)
        dt = time.monotonic() - t0
        if not ok or exporter.written < points:
            raise RuntimeError(
                f"influx exporter wrote {exporter.written} of {points} points (errors {exporter.influx_errors})"  # noqa: E501
            )
    finally:
        exporter.close()
    return {"points": points, "seconds": dt, "points_per_s": points / dt}


def influx_count(influx: Any, trace: str) -> int:
    """hop_latency points of `trace` in InfluxDB now."""
    data = influx.query_v1(f"SELECT count(latency_ns) FROM hop_latency WHERE \"trace\" = '{trace}'")
    series = data.get("results", [{}])[0].get("series")
    return int(series[0]["values"][0][1]) if series else 0


def freshness(ctx: BenchContext, packets: int) -> dict[str, Any]:
    """Seconds from a packet's send to its points queryable in InfluxDB, per packet."""
    influx = ctx.influx()
    topo = TwoHostTopology(ctx.prefix(), overlay="vxlan")
    cluster = None
    delays: list[float] = []
    try:
        topo.create()
        cluster = start_cluster(
            influx.url, topo, ctx.workdir / "fresh-cluster", bpf_cache_dir=writable_bpf_cache()
        )
        trace = "bench-fresh"
        cluster.apply(vxlan_path_spec(topo, trace))
        segments = 8  # 7 segments + end_to_end per packet
        sock = udp_socket(topo, "c1")
        receiver = udp_socket(topo, "c2")
        receiver.bind((topo.addr("c2"), 11111))
        with sock, receiver:
            for i in range(packets + 1):  # the first packet warms up the path and the agents' first batches
                before = influx_count(influx, trace)
                t0 = time.monotonic()
                sock.sendto(i.to_bytes(8, "big") + bytes(56), (topo.addr("c2"), 11111))
                while influx_count(influx, trace) < before + segments:
                    if time.monotonic() - t0 > 30:
                        raise RuntimeError(f"packet {i}: its points did not reach InfluxDB within 30 s")
                    time.sleep(0.02)
                if i:
                    delays.append(time.monotonic() - t0)
                receiver.recv(100)
    finally:
        if cluster is not None:
            cluster.stop()
        topo.destroy()
    return {
        "packets": packets,
        "p50_s": median(delays),
        "p90_s": pctl(delays, 0.9),
        "max_s": max(delays),
        "delays_s": delays,
        "note": "collector defaults: --join-window 2 s; exporter flush interval 1 s; a lone "
        "packet's points are its window's slowest exemplar, written when its 1 s window closes",
    }


def run(ctx: BenchContext) -> dict[str, Any]:
    """All three parts."""
    join = join_throughput(ctx.size(20_000, 500_000))
    log(
        f"collector join: {join['records_per_s'] / 1e3:.0f} k records/s, {join['bytes_per_pending']} B/pending"  # noqa: E501
    )
    write = influx_write_throughput(ctx.influx().url, ctx.size(20_000, 500_000))
    log(f"collector influx write: {write['points_per_s'] / 1e3:.0f} k points/s")
    fresh = freshness(ctx, ctx.size(2, 15))
    log(f"collector freshness: p50 {fresh['p50_s']:.2f} s, max {fresh['max_s']:.2f} s")
    return {
        "join": join,
        "influx_write": write,
        "freshness": fresh,
        "summary": {
            "join_records_per_s": join["records_per_s"],
            "influx_points_per_s": write["points_per_s"],
            "freshness_p50_s": fresh["p50_s"],
        },
        "targets": [],
        "table": {
            "columns": ["measure", "value"],
            "rows": [
                ["join, records/s (1 core)", join["records_per_s"]],
                ["join, bytes per pending packet", join["bytes_per_pending"]],
                ["InfluxDB write, points/s", write["points_per_s"]],
                ["freshness p50 (s)", fresh["p50_s"]],
                ["freshness p90 (s)", fresh["p90_s"]],
                ["freshness max (s)", fresh["max_s"]],
            ],
        },
    }
