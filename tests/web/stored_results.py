"""Stored results the web tests read (test_web_at_a_glance, test_web_time_range): one trace's segments,
packets and a node's clock as the collector writes them to a real InfluxDB, a real dispatcher reading them,
two agents registered over AgentSession (one never measured), and a logged-in test client."""

from __future__ import annotations

import re
import secrets
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from web_helpers import PASSWORD, USERNAME

from hoptrace.collector.addresses import HopAddressesStage
from hoptrace.collector.aggregate import END_TO_END, LatencySample, SegmentWindow
from hoptrace.collector.clock import NodeClockPoint
from hoptrace.collector.influx import InfluxConfig, InfluxExporter
from hoptrace.collector.points import window_points
from hoptrace.collector.records import FiveTuple
from hoptrace.collector.sketch import LatencySketch
from hoptrace.dispatcher.reports import (
    influx_clock_provider,
    influx_packets_provider,
    influx_report_provider,
    influx_window_provider,
)
from hoptrace.dispatcher.server import DispatcherServer
from hoptrace.lab.processes import InfluxServer
from hoptrace.v1 import agent_pb2, agent_pb2_grpc, api_pb2, api_pb2_grpc

SEC = 1_000_000_000
PACKETS = 100
BOUND_NS = 170  # host-a's clock bound 85 ns + host-b's 85 ns
# Per packet i: a-c1-out > a-wire-out (host-a) 3000 + 10 i ns; a-wire-out > b-wire-in (cross-host)
# -150 + 4 i ns, i.e. -150..246 ns: its mean (48 ns) and p50 (46 ns) lie within ±170 ns, its p90
# (206 ns; 205 from the sketch) not.
HOST_LATENCY = [3000 + 10 * i for i in range(PACKETS)]
WIRE_LATENCY = [-150 + 4 * i for i in range(PACKETS)]


def pid(i: int) -> int:
    """Packet i's ID: origin salt 7 in the top byte (IDs are never 0), sequence i + 1."""
    return (7 << 24) | (i + 1)


# What the packets that describe their addresses (IDs 1 and 65) saw: a DNAT between host-a's two hops.
CLIENT_TUPLE = FiveTuple(17, "198.18.1.2", 40000, "198.18.99.9", 8080)
BACKEND_TUPLE = FiveTuple(17, "198.18.1.2", 40000, "198.18.2.2", 11111)
TRANSLATION = "a-c1-out > a-wire-out: DNAT 198.18.99.9:8080 -> 198.18.2.2:11111 (2 packets)"
HOPS = ["a-c1-out", "a-wire-out", "b-wire-in"]


def address_points(trace: str) -> list:
    """The hop_addresses and address_translations points the collector's stage makes of those packets."""
    stage = HopAddressesStage(settle_ns=0)
    for i in (0, 64):
        described = [
            ((0, pid(i), 0, 0, 0, hop, 0, 0, 0), CLIENT_TUPLE if hop == 0 else BACKEND_TUPLE)
            for hop in range(3)
        ]
        stage.add(trace, described, now_ns=0)
    return stage.take_points(now_ns=1, master_ns=time.time_ns() - 2 * SEC, path_hops=lambda name: HOPS)


# From the merged sketches (within 0.5 % of the exact 3490/3536, 3980/4222): 3481/3551, 3964/4209.
WHERE_MOST_TIME = "most time: a-c1-out > a-wire-out (98 % of p50, 94 % of p99)"


@dataclass
class Glance:
    """The test's world: node names, trace name, the dispatcher."""

    trace: str
    measured: str  # has a clock estimate
    unmeasured: str  # registered, never measured
    dispatcher: DispatcherServer


def write_trace_and_clocks(influxd: InfluxServer, trace: str, measured: str, peer: str) -> None:
    """What the collector writes for the trace and the measured node's clock, through its exporter."""
    now = time.time_ns()
    start = now - now % SEC - 3 * SEC
    samples, e2e = [], []
    for i in range(PACKETS):
        ts = start + i * (SEC // PACKETS)
        host, wire = HOST_LATENCY[i], WIRE_LATENCY[i]
        samples.append(
            LatencySample(
                trace,
                "a-c1-out>a-wire-out",
                "a-c1-out",
                "a-wire-out",
                measured,
                measured,
                ts,
                host,
                pid(i),
                False,
            )
        )
        samples.append(
            LatencySample(
                trace,
                "a-wire-out>b-wire-in",
                "a-wire-out",
                "b-wire-in",
                measured,
                peer,
                ts + host,
                wire,
                pid(i),
                wire < BOUND_NS,
            )
        )
        e2e.append(
            LatencySample(
                trace, END_TO_END, "a-c1-out", "b-wire-in", measured, peer, ts, host + wire, pid(i), False
            )
        )
    windows = [
        SegmentWindow(
            trace,
            "a-c1-out>a-wire-out",
            "a-c1-out",
            "a-wire-out",
            start,
            PACKETS,
            0.0,
            0,
            0,
            0,
            0,
            0,
            from_count=PACKETS,
            same_node=True,
        ),
        SegmentWindow(
            trace,
            "a-wire-out>b-wire-in",
            "a-wire-out",
            "b-wire-in",
            start,
            PACKETS,
            0.0,
            0,
            0,
            0,
            0,
            0,
            from_count=PACKETS,
            below_clock_bound=True,
            below_bound_count=PACKETS,
            clock_bound_ns=BOUND_NS,
        ),
        SegmentWindow(
            trace,
            END_TO_END,
            "a-c1-out",
            "b-wire-in",
            start,
            PACKETS,
            0.0,
            0,
            0,
            0,
            0,
            0,
            packets=PACKETS,
            complete=PACKETS,
            from_count=PACKETS,
            clock_bound_ns=BOUND_NS,
        ),
    ]
    # The windows carry what the report merges: sums, extremes and the sketch of their packets' latencies.
    latencies = [HOST_LATENCY, WIRE_LATENCY, [h + w for h, w in zip(HOST_LATENCY, WIRE_LATENCY, strict=True)]]
    for window, values in zip(windows, latencies, strict=True):
        window.sum_ns, window.min_ns, window.max_ns = sum(values), min(values), max(values)
        window.sketch = LatencySketch.of(values)
    exporter = InfluxExporter(
        InfluxConfig(url=influxd.url, bucket=influxd.bucket, org=influxd.org, token=influxd.token)
    )
    try:
        exporter.export(
            window_points(
                samples=samples + e2e,
                segments=windows,
                clocks=[NodeClockPoint(measured, now, -231, 150, 85, 1.5)],
            )
            + address_points(trace)
        )
        assert exporter.flush(timeout_s=30), "points not written"
    finally:
        exporter.close()


@contextmanager
def glance_world(tmp_path: Path, influxd: InfluxServer) -> Iterator[Glance]:
    """Data in InfluxDB, a dispatcher reading it, two registered agents (one never measured): the `glance`
    fixture (conftest.py)."""
    tag = secrets.token_hex(3)
    world = Glance(f"glance-{tag}", f"glance-{tag}-a", f"glance-{tag}-b", None)  # type: ignore[arg-type]
    write_trace_and_clocks(influxd, world.trace, world.measured, world.unmeasured)
    store = (influxd.url, influxd.bucket, influxd.org, influxd.token)
    world.dispatcher = DispatcherServer(
        "127.0.0.1:0",
        tmp_path / "state",
        report_provider=influx_report_provider(*store),
        clock_provider=influx_clock_provider(*store),
        packets_provider=influx_packets_provider(*store),
        window_provider=influx_window_provider(*store),
    ).start()
    channel = grpc.insecure_channel(world.dispatcher.address)
    done = threading.Event()

    def session(node: str) -> Iterator[agent_pb2.AgentMessage]:
        registration = agent_pb2.Register(node=node, kernel_release="6.18.0", agent_version="0.1.0")
        yield agent_pb2.AgentMessage(register=registration)
        done.wait()

    streams = [
        agent_pb2_grpc.AgentSessionStub(channel).Connect(session(node))
        for node in (world.measured, world.unmeasured)
    ]
    try:
        api = api_pb2_grpc.HoptraceStub(channel)
        deadline = time.monotonic() + 10
        while (
            len([a for a in api.ListAgents(api_pb2.ListAgentsRequest(), timeout=5).agents if a.connected]) < 2
        ):
            assert time.monotonic() < deadline, "agents did not register"
            time.sleep(0.05)
        yield world
    finally:
        done.set()
        for stream in streams:
            stream.cancel()
        channel.close()
        world.dispatcher.stop(grace=0)


def logged_in(app: Any) -> Any:
    """A test client of `app`, logged in through the form."""
    client = app.test_client()
    page = client.get("/login").text
    token = re.search(r'name="csrf_token" value="([^"]+)"', page).group(1)
    response = client.post("/login", data={"username": USERNAME, "password": PASSWORD, "csrf_token": token})
    assert response.status_code == 302
    return client


# A cross-host segment's per-second windows whose p50 is below zero within its clock bound, and a gap.
SERIES_SECONDS = [*range(0, 5), *range(20, 25)]
SERIES_WIRE_P50_NS = -100


def write_series(influxd: InfluxServer, trace: str, node: str) -> list[int]:
    """Per-second windows of `trace` (SERIES_SECONDS after a minute ago, nothing in between): a-c1-out >
    a-wire-out on one node (p50 3 us), a-wire-out > b-wire-in across nodes with p50 SERIES_WIRE_P50_NS within
    its clock bound BOUND_NS, and end to end; returns the windows' start times (ns)."""
    now = time.time_ns()
    base = now - now % SEC - 60 * SEC
    starts = [base + second * SEC for second in SERIES_SECONDS]
    windows = []
    for start in starts:
        windows += [
            SegmentWindow(
                trace, "a-c1-out>a-wire-out", "a-c1-out", "a-wire-out", start, 10, 3000.0, 3000, 3400, 3900,
                4000, 0, from_count=10, same_node=True,
            ),
            SegmentWindow(
                trace, "a-wire-out>b-wire-in", "a-wire-out", "b-wire-in", start, 10, -80.0,
                SERIES_WIRE_P50_NS, 150, 240, 246, 0, from_count=10, below_clock_bound=True,
                below_bound_count=10, clock_bound_ns=BOUND_NS,
            ),
            SegmentWindow(
                trace, END_TO_END, "a-c1-out", "b-wire-in", start, 10, 2920.0, 2900, 3500, 4100, 4200, 0,
                packets=10, complete=10, from_count=10, clock_bound_ns=BOUND_NS,
            ),
        ]  # fmt: skip
    exporter = InfluxExporter(
        InfluxConfig(url=influxd.url, bucket=influxd.bucket, org=influxd.org, token=influxd.token)
    )
    try:
        exporter.export(
            window_points(samples=[], segments=windows, clocks=[NodeClockPoint(node, now, 40, 150, 85, 1.0)])
        )
        assert exporter.flush(timeout_s=30), "points not written"
    finally:
        exporter.close()
    return starts
