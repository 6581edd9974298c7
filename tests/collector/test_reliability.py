"""Nothing lost when a part fails: InfluxDB down during ingestion, bounded queues and spool, /metrics."""

from __future__ import annotations

import re
import socket
import time
import urllib.request
from pathlib import Path

import grpc
from collector_helpers import batch, pid, rec
from influxdb_client import InfluxDBClient

from hoptrace.collector.aggregate import AggregateConfig
from hoptrace.collector.catalog import TraceCatalog
from hoptrace.collector.influx import InfluxConfig, InfluxExporter, Spool
from hoptrace.collector.join import JoinConfig
from hoptrace.collector.points import Point
from hoptrace.collector.receiver import ReceiverConfig
from hoptrace.collector.records import RECORD_SIZE
from hoptrace.collector.service import CollectorConfig, CollectorService, WrittenBeforeMark, start_collector
from hoptrace.lab.processes import InfluxServer
from hoptrace.v1 import records_pb2_grpc

SEC = 1_000_000_000
HOPS = ["a-out", "a-br", "b-in"]
NODES = ["node-a", "node-a", "node-b"]
SECONDS = 30  # seconds of master time the synthetic trace spans
PER_SECOND = 100
_SAMPLE = re.compile(r'^([a-z_]+)(\{(?:[a-z_]+="(?:[^"\\]|\\.)*",?)*\})? (-?[0-9.e+-]+|NaN|[+-]Inf)$')


def scrape(port: int) -> dict[str, float]:
    """GET /metrics and parse the text format: {"name{labels}": value}; every line must be well formed."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        assert resp.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        text = resp.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("#"):
            assert re.match(r"^# (HELP|TYPE) hoptrace_(collector|segment)_[a-z_]+ ", line), line
            continue
        m = _SAMPLE.match(line)
        assert m, f"malformed sample line: {line!r}"
        out[m.group(1) + (m.group(2) or "")] = float(m.group(3))
    return out


def flux_count(url: str, query: str) -> dict:
    with InfluxDBClient(url=url, token="", org="-") as client:
        tables = client.query_api().query(query, org="-")
        return {
            tuple(r.values.get(k) for k in ("segment", "hop")): r.get_value()
            for t in tables
            for r in t.records
        }


def second_batches(trace: str, base: int, second: int) -> tuple:
    """The records of one second of master time: node-a (hops 0, 1) and node-b (hop 2); clocks are 0."""
    a, b = [], []
    for k in range(PER_SECOND):
        i = second * PER_SECOND + k
        t0 = base + second * SEC + k * (SEC // PER_SECOND)
        a += [rec(t0, pid(i + 1), 0, flow=i % 5), rec(t0 + 2_000 + k, pid(i + 1), 1, flow=i % 5)]
        b.append(rec(t0 + 60_000 + 3 * k, pid(i + 1), 2, flow=i % 5))
    return (
        batch("node-a", trace, a, seq=second + 1, clock_delta=0),
        batch("node-b", trace, b, seq=second + 1, clock_delta=0),
    )


def test_influxd_outage_loses_and_duplicates_nothing(
    restartable_influxd: InfluxServer, tmp_path: Path
) -> None:
    influx = restartable_influxd
    trace = "outage"
    catalog = TraceCatalog()
    catalog.set_trace(trace, HOPS, NODES)
    config = CollectorConfig(
        receiver=ReceiverConfig(listen="127.0.0.1:0"),
        join=JoinConfig(window_ns=2 * SEC),
        # every packet an exemplar: one hop_latency point per packet and segment, so that "each point
        # exactly once" is checked packet by packet, beside the windows' counts
        aggregate=AggregateConfig(exemplar_every=1),
        influx=InfluxConfig(
            url=influx.url,
            bucket=influx.bucket,
            flush_interval_s=0.2,
            timeout_ms=2_000,
            spool_dir=str(tmp_path / "spool"),
            retry_min_s=0.2,
            retry_max_s=1.0,
        ),
        clock_listen="127.0.0.1:0",
        metrics_listen="127.0.0.1:0",
        # The synthetic trace is not paced in real time: no idle ticks, or the collector's clock would move
        # the watermark past the windows of the records still to come (they would be late).
        tick_s=3600,
    )
    service = start_collector(config, catalog)
    assert service.metrics_server is not None
    mport = service.metrics_server.port
    base = (time.time_ns() // SEC - 120) * SEC  # two minutes ago, on a second boundary
    slowest = 0.0
    try:
        with grpc.insecure_channel(f"127.0.0.1:{service.port}") as ch:
            stub = records_pb2_grpc.CollectorStub(ch)

            def send(second: int) -> None:
                nonlocal slowest
                a, b = second_batches(trace, base, second)
                t = time.monotonic()
                assert stub.StreamRecords(iter([a])).records == 2 * PER_SECOND
                assert stub.StreamRecords(iter([b])).records == PER_SECOND
                slowest = max(slowest, time.monotonic() - t)

            for s in range(10):
                send(s)
            assert service.exporter.flush(30)
            written_before = service.exporter.written
            assert written_before > 0

            restartable_influxd.stop_process()
            outage = time.monotonic()
            for s in range(10, 20):  # ~4 s of ingestion while InfluxDB is down
                send(s)
                time.sleep(0.4)
            service.exporter.flush(3)  # pushes the partial batch out: to the spool
            during = scrape(mport)
            restartable_influxd.restart()
            outage = time.monotonic() - outage
            for s in range(20, SECONDS):
                send(s)
        assert service.flush(60), "the spool was not replayed"
        after = scrape(mport)
        stats = service.pipeline.stats()
        assert (stats["packets"], stats["complete"]) == (SECONDS * PER_SECOND, SECONDS * PER_SECOND)
        assert stats["late"] == 0
    finally:
        service.stop()
    spooled = {
        k.removeprefix("hoptrace_collector_"): v for k, v in during.items() if "spool" in k or "up" in k
    }
    print(
        f"outage {outage:.1f} s (restart included), slowest StreamRecords {slowest * 1e3:.1f} ms, {spooled}"
    )

    # the receive path never waited on InfluxDB
    assert slowest < 1.0
    # the outage was seen, spooled and replayed
    assert during["hoptrace_collector_influx_up"] == 0
    assert during["hoptrace_collector_spool_bytes"] > 0 and during["hoptrace_collector_spool_points"] > 0
    assert after["hoptrace_collector_spool_points"] == 0 and after["hoptrace_collector_influx_up"] == 1
    assert after["hoptrace_collector_influx_errors_total"] > 0
    assert after["hoptrace_collector_influx_reconnects_total"] >= 1
    assert after['hoptrace_collector_dropped_total{reason="spool_overflow"}'] == 0
    assert after['hoptrace_collector_dropped_total{reason="queue_full"}'] == 0
    assert after['hoptrace_collector_records_received_total{node="node-a"}'] == 2 * SECONDS * PER_SECOND
    assert after['hoptrace_collector_reconnects_total{node="node-a"}'] == SECONDS - 1  # a stream per second
    assert after["hoptrace_collector_packets_emitted_total"] == SECONDS * PER_SECOND
    assert after["hoptrace_collector_records_joined_total"] == 3 * SECONDS * PER_SECOND
    assert (
        after["hoptrace_collector_points_written_total"] >= after["hoptrace_collector_points_written_total"]
    )
    assert 'hoptrace_collector_node_clock_offset_ns{node="node-b"}' in after

    # every point exactly once: one hop_latency point per packet and segment (every packet an exemplar
    # here), one window per second, and the windows' counts add up to the packets
    rng = f'from(bucket: "{influx.bucket}") |> range(start: -1h) |> filter(fn: (r) => r.trace == "{trace}"'
    n = SECONDS * PER_SECOND
    assert flux_count(
        influx.url,
        f'{rng} and r._measurement == "hop_latency" and r._field == "latency_ns")'
        ' |> group(columns: ["segment"]) |> count()',
    ) == {("a-out>a-br", None): n, ("a-br>b-in", None): n, ("end_to_end", None): n}
    assert flux_count(
        influx.url,
        f'{rng} and r._measurement == "segment_stats" and r._field == "count")'
        ' |> group(columns: ["segment"]) |> count()',
    ) == {("a-out>a-br", None): SECONDS, ("a-br>b-in", None): SECONDS, ("end_to_end", None): SECONDS}
    assert flux_count(
        influx.url,
        f'{rng} and r._measurement == "segment_stats" and r._field == "count")'
        ' |> group(columns: ["segment"]) |> sum()',
    ) == {("a-out>a-br", None): n, ("a-br>b-in", None): n, ("end_to_end", None): n}
    assert flux_count(
        influx.url,
        f'{rng} and r._measurement == "hop_counters" and r._field == "packets")'
        ' |> group(columns: ["hop"]) |> sum()',
    ) == {(None, h): n for h in HOPS}


def test_a_restarted_collector_writes_no_window_twice(influxd: InfluxServer, tmp_path: Path) -> None:
    """Agents resend the batches a collector had in flight when it went away; the next collector on the same
    spool must not write the windows of those seconds again from part of their packets (it would overwrite
    whole windows, or add to them). It resumes after the mark the first one left (`WrittenBeforeMark`)."""
    trace = "restart"
    catalog = TraceCatalog()
    catalog.set_trace(trace, HOPS, NODES)
    spool = tmp_path / "spool"
    config = CollectorConfig(
        receiver=ReceiverConfig(listen="127.0.0.1:0"),
        join=JoinConfig(window_ns=2 * SEC),
        influx=InfluxConfig(
            url=influxd.url, bucket=influxd.bucket, flush_interval_s=0.2, spool_dir=str(spool)
        ),
        clock_listen=None,
        metrics_listen=None,
        tick_s=3600,  # not paced in real time (see the outage test)
    )
    base = (time.time_ns() // SEC - 120) * SEC
    seconds = 30

    def send(service: CollectorService, batches: list) -> None:
        with grpc.insecure_channel(f"127.0.0.1:{service.port}") as ch:
            stub = records_pb2_grpc.CollectorStub(ch)
            for b in batches:
                assert stub.StreamRecords(iter([b])).records == len(b.records) // RECORD_SIZE

    first = start_collector(config, catalog)
    try:
        send(first, [b for s in range(20) for b in second_batches(trace, base, s)])
    finally:
        first.stop()  # flushes every window and leaves the mark
    mark = WrittenBeforeMark(str(spool)).read()
    assert mark == base + 20 * SEC, (mark - base) / SEC

    second = start_collector(config, catalog)
    try:
        # node-b's stream had seconds 15-19 in flight: resent; then both nodes go on
        resent = [second_batches(trace, base, s)[1] for s in range(15, 20)]
        send(second, resent + [b for s in range(20, seconds) for b in second_batches(trace, base, s)])
        assert second.flush(30)
        stats = second.pipeline.stats()
    finally:
        second.stop()
    # the resent records are left out: before the mark, their windows were written whole
    assert stats["late_records"] == len(resent) * PER_SECOND and stats["late"] > 0, stats

    n = seconds * PER_SECOND
    rng = f'from(bucket: "{influxd.bucket}") |> range(start: -1h) |> filter(fn: (r) => r.trace == "{trace}"'
    assert flux_count(
        influxd.url,
        f'{rng} and r._measurement == "segment_stats" and r._field == "count")'
        ' |> group(columns: ["segment"]) |> sum()',
    ) == {("a-out>a-br", None): n, ("a-br>b-in", None): n, ("end_to_end", None): n}
    assert flux_count(
        influxd.url,
        f'{rng} and r._measurement == "hop_counters" and r._field == "packets")'
        ' |> group(columns: ["hop"]) |> sum()',
    ) == {(None, h): n for h in HOPS}


def _dead_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"  # closed again: connection refused


def test_spool_is_bounded_drop_oldest(tmp_path: Path) -> None:
    spool = Spool(tmp_path, max_bytes=100)
    assert spool.append(["x" * 40]) == 0 and spool.append(["y" * 40]) == 0
    assert spool.append(["z" * 30, "w" * 9]) == 1  # 40 + 40 + 40 > 100: the oldest batch goes
    assert (len(spool), spool.points, spool.bytes, spool.dropped) == (2, 3, 80, 1)
    assert spool.oldest()[1] == ["y" * 40]  # type: ignore[index]
    # a new Spool on the same directory takes the files over, in order
    again = Spool(tmp_path, max_bytes=100)
    assert (again.points, again.oldest()[1]) == (3, ["y" * 40])  # type: ignore[index]


def test_exporter_bounds_and_counts_every_drop(tmp_path: Path) -> None:
    exp = InfluxExporter(
        InfluxConfig(
            url=_dead_url(),
            batch_size=2,
            max_pending=4,
            flush_interval_s=0.05,
            spool_dir=str(tmp_path),
            spool_bytes=200,
            retry_min_s=5,
            retry_max_s=5,
        )
    )
    try:
        t = time.monotonic()
        point = Point("m", (), (("v", 1),), 1)  # "m v=1i 1"
        exp.export([point] * 5)  # more than max_pending at once: dropped, never blocks
        assert exp.drops["queue_full"] == 5
        for k in range(40):
            exp.export([Point("m", (), (("v", k),), k), Point("m", (), (("v", k),), k + 100)])
            time.sleep(0.005)
        assert time.monotonic() - t < 2.0  # InfluxDB unreachable: submit never waits
        assert not exp.flush(1.0, give_up_when_down=True)
        assert exp.failing and exp.influx_errors >= 1
        assert exp.spool.bytes <= 200 and exp.spool_points > 0
        assert exp.drops["spool_overflow"] > 0
        # every point is written, spooled or counted as dropped
        assert exp.spool_points + exp.dropped + exp.pending == 80 + 5
    finally:
        exp.close(1.0)
    assert list(tmp_path.glob("*.lp"))  # a fixed spool dir keeps what InfluxDB did not take
