"""Integration: RecordBatches through a real gRPC server into a real InfluxDB, then the report from it."""

from __future__ import annotations

import json
import math
import os
import signal
import socket
import subprocess
import sys
import time
import uuid

import grpc
import pytest
from collector_helpers import ROOT, batch, pid, rec
from google.protobuf.timestamp_pb2 import Timestamp
from influxdb_client import InfluxDBClient

from hoptrace.collector.catalog import TraceCatalog
from hoptrace.collector.influx import InfluxConfig
from hoptrace.collector.join import JoinConfig
from hoptrace.collector.receiver import ReceiverConfig
from hoptrace.collector.records import hop_counters
from hoptrace.collector.service import CollectorConfig, start_collector
from hoptrace.common.grpcutil import INFLUX_TOKEN_ENV
from hoptrace.lab.processes import InfluxServer
from hoptrace.results.report_view import render_text, report_from_proto
from hoptrace.results.store import get_report, read_report
from hoptrace.v1 import api_pb2, records_pb2, records_pb2_grpc

SEC = 1_000_000_000
HOPS = ["a-egress", "a-bridge", "b-ingress"]
NODES = ["node-a", "node-a", "node-b"]
N = 200


def nearest_rank(values: list[int], q: float) -> int:
    v = sorted(values)
    return v[max(0, math.ceil(q * len(v)) - 1)]


def expected_stats(
    values: list[int],
    starts: list[int],
    incomplete: int,
    a: str,
    b: str,
    lost: int = 0,
    sent: int = 0,
    same_node: bool = False,
) -> dict:
    """Values in packet order, `starts` their times at the first hop: percentiles are over all of them,
    jitter over consecutive packets of each 1 s window (the windows are what the store merges)."""
    diffs = [
        abs(values[i + 1] - values[i])
        for i in range(len(values) - 1)
        if starts[i] // SEC == starts[i + 1] // SEC
    ]
    return {
        "from": a,
        "to": b,
        "count": len(values),
        "mean_ns": sum(values) / len(values),
        "p50_ns": nearest_rank(values, 0.5),
        "p90_ns": nearest_rank(values, 0.9),
        "p99_ns": nearest_rank(values, 0.99),
        "max_ns": max(values),
        "incomplete": incomplete,
        "loss_count": lost,
        "loss_rate": lost / sent if sent else 0.0,
        "tracer_lost": 0,
        "before_attach": 0,
        "jitter_ns": sum(diffs) / len(diffs),
        "jitter_p99_ns": nearest_rank(diffs, 0.99),
        "same_node": same_node,
        "below_clock_bound": False,
        "clock_bound_ns": 0,  # the batches carry no clock bound
        "drops": [],  # the trace has no drops: true
    }


# Read from the merged sketches: within 1 % of the exact nearest-rank value (RELATIVE_ACCURACY is 0.5 %).
SKETCHED = ("p50_ns", "p90_ns", "p99_ns", "jitter_p99_ns")


def assert_report_matches(got: dict, expected: dict) -> None:
    """Every number exact, except the sketched percentiles: within 1 % of the exact ones."""
    for key in SKETCHED:
        assert abs(got[key] - expected[key]) <= 0.01 * abs(expected[key]), (key, got, expected)
    assert got["drops"] == expected["drops"]
    assert {k: v for k, v in got.items() if k not in (*SKETCHED, "drops")} == pytest.approx(
        {k: v for k, v in expected.items() if k not in (*SKETCHED, "drops")}
    )


def expected_hop(hop: str, times: list[int]) -> dict:
    """Mean packets/s and bytes/s (100-byte records, no ID flags) over the seconds with traffic."""
    per_second: dict[int, int] = {}
    for t in times:
        per_second[t // SEC] = per_second.get(t // SEC, 0) + 1
    mean = sum(per_second.values()) / len(per_second)
    return {
        "hop": hop,
        "packets_per_s": mean,
        "bytes_per_s": 100 * mean,
        "counts": [],
        "histograms": [],
        "recorded": [],
    }


def counters(hop_index: int, hop: str, matched: int) -> records_pb2.HopCounters:
    c = hop_counters(hop_index, hop, matched=matched, tagged=matched, bytes=100 * matched)
    c.at.CopyFrom(Timestamp(seconds=int(time.time()) - 20))
    return c


def flux(influx: InfluxServer, query: str) -> list:
    with InfluxDBClient(url=influx.url, token=influx.token, org=influx.org) as client:
        return [r for t in client.query_api().query(query, org=influx.org) for r in t.records]


def flux_totals(
    influx: InfluxServer, measurement: str, trace: str, field: str, by: list[str], agg: str
) -> dict:
    """`agg` (count or sum) of one field of a trace over the last hour, keyed by the `by` tags."""
    rows = flux(
        influx,
        f'from(bucket: "{influx.bucket}") |> range(start: -1h)'
        f' |> filter(fn: (r) => r._measurement == "{measurement}" and r.trace == "{trace}"'
        f' and r._field == "{field}")'
        f" |> group(columns: {json.dumps(by)}) |> {agg}()",
    )
    return {tuple(r.values[k] for k in by) if len(by) > 1 else r.values[by[0]]: r.get_value() for r in rows}


def test_batches_to_influx_to_report(influxd: InfluxServer) -> None:
    influx = influxd
    trace = f"itest-{uuid.uuid4().hex[:8]}"
    catalog = TraceCatalog()
    catalog.set_trace(trace, HOPS, NODES)
    config = CollectorConfig(
        receiver=ReceiverConfig(listen="127.0.0.1:0"),
        join=JoinConfig(window_ns=2 * SEC),
        influx=InfluxConfig(url=influx.url, bucket=influx.bucket, org=influx.org, token=influx.token),
    )
    service = start_collector(config, catalog)

    base = time.time_ns() - 30 * SEC  # master time of the first packet
    delta_a, delta_b = base - SEC, base - 7 * SEC  # each node's monotonic -> master mapping
    ab, bc, e2e = [], [], []
    bc_starts, e2e_starts = [], []
    recs_a, recs_b = [], []
    times: list[list[int]] = [[], [], []]
    for i in range(N):
        t0 = base + i * 1_000_000
        t1 = t0 + 1_000 + (i % 10) * 100
        t2 = t1 + 50_000 + i * 10
        recs_a += [rec(t0 - delta_a, pid(i + 1), 0, flow=i % 3), rec(t1 - delta_a, pid(i + 1), 1, flow=i % 3)]
        ab.append(t1 - t0)
        times[0].append(t0)
        times[1].append(t1)
        if i % 20 == 19:
            continue  # lost between the nodes: 10 packets never reach b-ingress
        recs_b.append(rec(t2 - delta_b, pid(i + 1), 2, flow=i % 3))
        times[2].append(t2)
        bc.append(t2 - t1)
        e2e.append(t2 - t0)
        bc_starts.append(t1)
        e2e_starts.append(t0)
    try:
        with grpc.insecure_channel(f"127.0.0.1:{service.port}") as ch:
            stub = records_pb2_grpc.CollectorStub(ch)
            a_batches = [
                batch("node-a", trace, recs_a[k : k + 64], seq=k // 64 + 1, clock_delta=delta_a)
                for k in range(0, len(recs_a), 64)
            ]
            a_batches[-1].counters.extend([counters(0, HOPS[0], N), counters(1, HOPS[1], N)])
            b_batches = [
                batch("node-b", trace, recs_b[k : k + 50], seq=k // 50 + 1, clock_delta=delta_b)
                for k in range(0, len(recs_b), 50)
            ]
            b_batches[-1].counters.append(counters(2, HOPS[2], N - 10))
            # node-b first: its records wait in the join window for node-a's
            assert stub.StreamRecords(iter(b_batches)).records == len(recs_b)
            assert stub.StreamRecords(iter(a_batches[:3])).records == 192
            # node-a reconnects for the rest
            assert stub.StreamRecords(iter(a_batches[3:])).records == len(recs_a) - 192
        assert service.flush(30)
        stats = service.pipeline.stats()
        assert (stats["packets"], stats["complete"], stats["incomplete"]) == (N, N - 10, 10)
        assert stats["missing_hops"] == {f"{trace}/b-ingress": 10}
        assert service.exporter.dropped == 0
    finally:
        service.stop()

    # segment_stats: every packet counted once, over the windows of the one collector
    assert flux_totals(influx, "segment_stats", trace, "count", ["segment"], "sum") == {
        "a-egress>a-bridge": N,
        "a-bridge>b-ingress": N - 10,
        "end_to_end": N - 10,
    }
    # hop_latency: exemplars only (the 3 slowest of each window and IDs that are multiples of 1000)
    exemplars = flux_totals(influx, "hop_latency", trace, "latency_ns", ["segment"], "count")
    windows = len({t // SEC for t in times[0]})
    assert 3 <= exemplars["end_to_end"] <= 3 * windows, exemplars
    assert flux_totals(influx, "hop_counters", trace, "matched", ["hop", "node"], "sum") == {
        ("a-egress", "node-a"): N,
        ("a-bridge", "node-a"): N,
        ("b-ingress", "node-b"): N - 10,
    }

    expected = {
        "trace": trace,
        "packets": N,
        "complete": N - 10,
        "segments": [
            expected_stats(ab, times[0], 0, "a-egress", "a-bridge", sent=N, same_node=True),
            expected_stats(bc, bc_starts, 10, "a-bridge", "b-ingress", lost=10, sent=N),
        ],
        "end_to_end": expected_stats(e2e, e2e_starts, 10, "a-egress", "b-ingress", lost=10, sent=N),
        "hops": [expected_hop(h, t) for h, t in zip(HOPS, times, strict=True)],
        "events": [],
        "addresses": [],  # the batches carry no addresses
        "translations": [],
        "clock_jumps": [],  # the batches' clocks never jump
    }
    kw = {"url": influx.url, "bucket": influx.bucket, "org": influx.org, "token": influx.token}
    report = json.loads(json.dumps(report_from_proto(read_report(trace, since="1h", path=HOPS, **kw))))
    got_segments, got_e2e = report.pop("segments"), report.pop("end_to_end")
    assert report == {k: v for k, v in expected.items() if k not in ("segments", "end_to_end")}
    assert len(got_segments) == 2
    for got, want in zip(got_segments, expected["segments"], strict=True):
        assert_report_matches(got, want)
    assert_report_matches(got_e2e, expected["end_to_end"])
    report = report_from_proto(read_report(trace, since="1h", path=HOPS, **kw))
    without_path = report_from_proto(read_report(trace, since="1h", **kw))
    assert without_path == report  # path order recovered without the catalog

    proto = get_report(api_pb2.GetReportRequest(trace=trace), **kw)
    assert (proto.packets, proto.complete) == (N, N - 10)
    assert [(getattr(s, "from"), s.to, s.count, s.p99_ns) for s in proto.segments] == [
        (s["from"], s["to"], s["count"], s["p99_ns"]) for s in report["segments"]
    ]
    assert proto.end_to_end.max_ns == max(e2e)
    assert [(s.loss_count, s.same_node) for s in proto.segments] == [(0, True), (10, False)]
    assert [h.hop for h in proto.hops] == HOPS
    assert not proto.series, "series only when asked"

    # The web's charts: each segment's per-second p99 maxed over windows keeps the range's maximum.
    with_series = get_report(api_pb2.GetReportRequest(trace=trace, with_series=True), **kw)
    p99_max = flux_totals(influx, "segment_stats", trace, "p99_ns", ["segment"], "max")
    assert {s.segment: max(p.ns for p in s.p99) for s in with_series.series} == {
        segment: value for segment, value in p99_max.items() if segment != "end_to_end"
    }
    assert all(s.p50 and len(s.p50) == len(s.p99) for s in with_series.series)

    text = render_text(report)
    assert text.splitlines()[0] == f"trace {trace}: {N} packets, {N - 10} complete"
    assert "a-bridge > b-ingress" in text and "end to end (a-egress > b-ingress)" in text


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_sigterm_flushes_pending_packets(influxd: InfluxServer) -> None:
    influx = influxd
    trace = f"sigterm-{uuid.uuid4().hex[:8]}"
    port = _free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "hoptrace.collector.main",
            "--insecure",  # plaintext on loopback; TLS is tests/security's
            "--listen",
            f"127.0.0.1:{port}",
            "--influx-url",
            influx.url,
            "--influx-bucket",
            influx.bucket,
            "--influx-org",
            influx.org,
            "--join-window",
            "60",
        ],
        cwd=ROOT,
        # A secret is never a flag's value (--influx-token is refused): the environment carries it.
        env={**os.environ, "PYTHONUNBUFFERED": "1", INFLUX_TOKEN_ENV: influx.token},
    )
    try:
        base = time.time_ns() - 10 * SEC
        with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
            grpc.channel_ready_future(ch).result(timeout=20)
            stub = records_pb2_grpc.CollectorStub(ch)
            # the path is only learned from counters, so these wait for the (60 s) window to expire
            msg = batch(
                "n1",
                trace,
                [rec(base + i * 1000, pid(i + 1), h) for i in range(20) for h in (0, 1)],
                clock_delta=0,
            )
            msg.counters.extend([counters(0, "x", 20), counters(1, "y", 20)])
            assert stub.StreamRecords(iter([msg])).records == 40
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert flux_totals(influx, "segment_stats", trace, "count", ["segment"], "sum") == {
        "x>y": 20,
        "end_to_end": 20,
    }
