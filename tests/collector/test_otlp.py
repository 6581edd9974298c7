"""The OpenTelemetry export stage (collector/otlp.py) on the points of a real pipeline: which exemplars become
traces, their spans' times and attributes, the histograms against the SDK's own aggregation of the same
latencies, and drops counted instead of waits. The SDK's in-memory span exporter stands in for the backend
(tests/system/test_otlp_export.py sends to a real one)."""

from __future__ import annotations

import math
import random
import socket
import threading
from collections import defaultdict

import pytest
from collector_helpers import batch, pid, rec
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader, MetricExportResult, MetricsData
from opentelemetry.sdk.metrics.view import ExponentialBucketHistogramAggregation, View
from opentelemetry.sdk.trace.export import SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from hoptrace.collector.aggregate import AggregateConfig
from hoptrace.collector.catalog import TraceCatalog
from hoptrace.collector.otlp import MAX_SCALE, OtlpConfig, OtlpExporter, beside, trace_id
from hoptrace.collector.pipeline import CollectorPipeline
from hoptrace.collector.points import Point
from hoptrace.collector.records import decode_batch
from hoptrace.v1 import trace_pb2

pytestmark = pytest.mark.unit  # pure code: make test-unit runs it without root

SEC = 1_000_000_000
BASE = 1_700_000_000 * SEC
TRACE = "udp-a-to-b"
HOPS = [
    trace_pb2.HopSpec(name="a-c1-out", node="host-a", at="tc-ingress", dev="veth-c1", netns="htdemo-a"),
    trace_pb2.HopSpec(name="a-wire-out", node="host-a", at="tc-egress", dev="wire0"),
    trace_pb2.HopSpec(name="b-wire-in", node="host-b", at="tc-ingress", dev="wire0"),
    trace_pb2.HopSpec(name="b-c2-in", node="host-b", at="tc-egress", dev="veth-c2", netns="htdemo-b"),
]
HOPS[3].workload.container_name = "server"
HOPS[3].workload.pod_namespace, HOPS[3].workload.pod_name = "default", "server-0"
SEGMENTS = ["a-c1-out>a-wire-out", "a-wire-out>b-wire-in", "b-wire-in>b-c2-in"]


def spec() -> trace_pb2.TraceSpec:
    s = trace_pb2.TraceSpec(name=TRACE, hops=HOPS)
    s.filter.protocol, s.filter.src, s.filter.dst, s.filter.dst_port = (
        "udp",
        "198.18.1.2",
        "198.18.2.2",
        11111,
    )
    return s


class Points:
    """The pipeline's points in order (what every exporter gets)."""

    def __init__(self) -> None:
        self.points: list[Point] = []

    def export(self, points: list[Point]) -> None:
        self.points.extend(points)


class MetricSink:
    """A metric exporter that keeps what it is given."""

    def __init__(self) -> None:
        self.data: list[MetricsData] = []

    def export(self, data: MetricsData, **_: object) -> MetricExportResult:
        self.data.append(data)
        return MetricExportResult.SUCCESS

    def shutdown(self, **_: object) -> None:
        pass

    def points(self) -> list:
        return [
            p
            for d in self.data
            for rm in d.resource_metrics
            for sm in rm.scope_metrics
            for m in sm.metrics
            for p in m.data.data_points
        ]


def traced(
    n: int, aggregate: AggregateConfig, beside_points: OtlpExporter | None = None, seed: int = 1
) -> tuple[TraceCatalog, list[Point], dict]:
    """`n` packets, one every 7 ms over several 1 s windows, through a real pipeline (two nodes, clocks
    aligned) exporting to a list and `beside_points`; returns the catalog, the points and each packet's
    times at its hops."""
    rng = random.Random(seed)
    catalog = beside_points.catalog if beside_points is not None else TraceCatalog()
    catalog.set_spec(spec())
    out = Points()
    pipeline = CollectorPipeline(beside(out, beside_points), catalog, aggregate_config=aggregate)
    times: dict[int, list[int]] = {}
    recs: dict[str, list] = defaultdict(list)
    for seq in range(1, n + 1):
        t0 = BASE + seq * 7_000_000
        # 1-60 us in each node, and a cross-node wire within +-300 ns (negative and zero latencies too)
        t = [t0, t0 + rng.randint(1_000, 60_000)]
        t.append(t[1] + rng.choice([0, rng.randint(-300, 300)]))
        t.append(t[2] + rng.randint(1_000, 60_000))
        times[pid(seq)] = t
        for hop, ts in enumerate(t):
            recs["host-a" if hop < 2 else "host-b"].append(rec(ts, pid(seq), hop))
    for node, records in recs.items():
        pipeline.consume(decode_batch(batch(node, TRACE, records, clock_delta=0)))
    pipeline.flush()
    return catalog, out.points, times


def exporter(catalog: TraceCatalog | None, sample: str, aggregate: AggregateConfig, **kw: object):
    spans, metrics = InMemorySpanExporter(), MetricSink()
    config = OtlpConfig(endpoint="backend:4317", insecure=True, sample=sample, **kw)  # type: ignore[arg-type]
    config.validate(aggregate.exemplar_every, aggregate.exemplar_slowest)
    otlp = OtlpExporter(
        config,
        catalog or TraceCatalog(),
        instance="c1",
        exemplar_every=aggregate.exemplar_every,
        span_exporter=spans,
        metric_exporter=metrics,
    )
    return otlp, spans, metrics


def by_trace(spans) -> dict[int, list]:
    out: dict[int, list] = defaultdict(list)
    for s in spans:
        out[s.context.trace_id].append(s)
    return out


def test_slowest_packets_become_traces_with_their_own_times_and_what_the_spec_says() -> None:
    aggregate = AggregateConfig(exemplar_slowest=2, exemplar_every=0)
    catalog, points, times = traced(400, aggregate)
    otlp, spans, _ = exporter(catalog, "slowest", aggregate)
    otlp.export(points)
    assert otlp.flush()
    otlp.close()

    # the two slowest end to end of each 1 s window, by the times the records carried
    windows: dict[int, list[int]] = defaultdict(list)
    for packet, t in times.items():
        windows[t[0] // SEC].append(packet)
    want = {p for ids in windows.values() for p in sorted(ids, key=lambda p: times[p][0] - times[p][3])[:2]}
    assert len(want) == 2 * len(windows) == 6

    traces = by_trace(spans.get_finished_spans())
    assert {trace_id(TRACE, p, times[p][0]) for p in want} == set(traces)
    assert otlp.exported("traces") == 6 and not otlp.dropped
    for packet in want:
        t = times[packet]
        got = traces[trace_id(TRACE, packet, t[0])]
        root = next(s for s in got if s.parent is None)
        assert (root.name, root.start_time, root.end_time) == (TRACE, t[0], t[3])
        assert root.attributes["hoptrace.packet_id"] == packet
        assert root.attributes["hoptrace.hops"] == tuple(h.name for h in HOPS)
        assert root.attributes["network.transport"] == "udp"
        assert root.attributes["destination.address"] == "198.18.2.2"
        assert root.attributes["destination.port"] == 11111
        assert "source.port" not in root.attributes  # the spec does not say
        children = sorted((s for s in got if s.parent is not None), key=lambda s: SEGMENTS.index(s.name))
        assert [s.name for s in children] == SEGMENTS
        for i, s in enumerate(children):
            latency = t[i + 1] - t[i]
            assert s.parent.span_id == root.context.span_id
            assert s.start_time == t[i]
            assert s.end_time == t[i] + max(latency, 0)  # below zero: ends where it starts
            assert s.attributes["hoptrace.latency_ns"] == latency
            assert s.attributes["hoptrace.from.hop"] == HOPS[i].name
            assert s.attributes["hoptrace.to.node"] == HOPS[i + 1].node
            assert s.attributes["hoptrace.from.kind"] == HOPS[i].at
            assert s.attributes["hoptrace.from.device"] == HOPS[i].dev
        assert children[0].attributes["hoptrace.from.netns"] == "htdemo-a"
        assert children[2].attributes["hoptrace.to.container"] == "server"
        assert children[2].attributes["hoptrace.to.pod"] == "default/server-0"
        assert root.resource.attributes["service.name"] == "hoptrace"


def test_one_in_n_by_id_and_all() -> None:
    aggregate = AggregateConfig(exemplar_slowest=3, exemplar_every=10)
    catalog, points, times = traced(400, aggregate)
    otlp, spans, _ = exporter(catalog, "1/20", aggregate)
    otlp.export(points)
    assert otlp.flush()
    otlp.close()
    want = {trace_id(TRACE, p, t[0]) for p, t in times.items() if (p & 0xFFFFFF) % 20 == 0}
    assert set(by_trace(spans.get_finished_spans())) == want and len(want) == 20

    otlp, spans, _ = exporter(catalog, "all", aggregate)
    otlp.export(points)
    assert otlp.flush()
    otlp.close()
    # every exemplar: 1 in 10 by ID, and the 3 slowest of each window among the others
    assert len(by_trace(spans.get_finished_spans())) == 40 + 3 * 3

    with pytest.raises(ValueError, match="multiple of --exemplar-every"):
        OtlpConfig(endpoint="b:4317", sample="1/25").validate(exemplar_every=10)
    with pytest.raises(ValueError, match="slowest, all or 1/N"):
        OtlpConfig(endpoint="b:4317", sample="fastest").validate()


def test_histograms_match_the_sdks_own_aggregation_of_the_same_latencies() -> None:
    aggregate = AggregateConfig(exemplar_slowest=1, exemplar_every=0)
    catalog, points, times = traced(400, aggregate)
    otlp, _, metrics = exporter(catalog, "slowest", aggregate)
    otlp.export(points)
    assert otlp.flush()
    otlp.close()

    got = {(p.attributes["hoptrace.segment"], p.start_time_unix_nano): p for p in metrics.points()}
    assert otlp.exported("metrics") == len(got) == 4 * 3  # 3 segments and end to end, 3 windows
    assert got[("end_to_end", BASE)].time_unix_nano == BASE + SEC
    values: dict[tuple[str, int], list[int]] = defaultdict(list)
    for t in times.values():
        start = t[0] - t[0] % SEC
        for i, segment in enumerate(SEGMENTS):
            values[(segment, t[i] - t[i] % SEC)].append(t[i + 1] - t[i])
        values[("end_to_end", start)].append(t[3] - t[0])
    assert set(values) == set(got)
    for key, lats in values.items():
        ours = got[key]
        assert (ours.count, ours.sum, ours.min, ours.max) == (len(lats), sum(lats), min(lats), max(lats))
        assert ours.zero_count == lats.count(0)
        # each value counted in its bucket (i holds (2^(i/2^scale), 2^((i+1)/2^scale)]) or, when it lies
        # within the sketch's accuracy of a boundary, the one on the boundary's other side (values and
        # buckets paired by rank: both are in order)
        for sign, buckets in ((1, ours.positive), (-1, ours.negative)):
            mine = [buckets.offset + i for i, n in enumerate(buckets.bucket_counts) for _ in range(n)]
            magnitudes = sorted(sign * v for v in lats if sign * v > 0)
            exact = [math.ceil(math.log2(v) * 2**ours.scale) - 1 for v in magnitudes]
            assert len(mine) == len(magnitudes), key
            for mine_i, exact_i, v in zip(mine, exact, magnitudes, strict=True):
                boundary = 2 ** (max(mine_i, exact_i) / 2**ours.scale)
                assert mine_i == exact_i or (abs(mine_i - exact_i) == 1 and abs(v / boundary - 1) < 0.011), (
                    key
                )
        if min(lats) >= 0:  # the SDK's instruments take no negative values
            reader = InMemoryMetricReader()
            aggregation = ExponentialBucketHistogramAggregation(max_scale=MAX_SCALE)
            meter = MeterProvider([reader], views=[View(instrument_name="*", aggregation=aggregation)])
            histogram = meter.get_meter("t").create_histogram("h")
            for v in lats:
                histogram.record(v)
            data = reader.get_metrics_data().resource_metrics[0].scope_metrics[0].metrics[0].data
            (sdk,) = data.data_points
            assert (ours.scale, ours.count, ours.sum, ours.min, ours.max, ours.zero_count) == (
                sdk.scale,
                sdk.count,
                sdk.sum,
                sdk.min,
                sdk.max,
                sdk.zero_count,
            ), key
    assert any(p.negative.bucket_counts for p in got.values())  # the wire's negative latencies are there


class BlockedExporter(InMemorySpanExporter):
    """A backend that does not answer until released, then fails."""

    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()

    def export(self, spans):  # type: ignore[override]
        self.release.wait()
        return SpanExportResult.FAILURE


def test_a_stuck_backend_costs_drops_never_a_wait() -> None:
    aggregate = AggregateConfig(exemplar_slowest=3, exemplar_every=1)  # every packet an exemplar
    blocked = BlockedExporter()
    config = OtlpConfig(endpoint="b:4317", insecure=True, sample="all", max_packets=50, max_spans=64)
    otlp = OtlpExporter(
        config, TraceCatalog(), exemplar_every=1, span_exporter=blocked, metric_exporter=MetricSink()
    )
    traced(1000, aggregate, otlp)  # the pipeline's export calls return while the backend hangs
    assert not otlp.flush(timeout_s=0.5)
    blocked.release.set()
    otlp.close(timeout_s=5)
    dropped = otlp.dropped
    # 1000 packets: 50 wait in the queue at most, 64 spans (16 packets) in the processor at most
    assert dropped[("traces", "queue_full")] >= 1000 - 50 - 16 - 64
    assert dropped[("traces", "export_failed")] >= 1
    accounted = sum(n for (signal, _), n in dropped.items() if signal == "traces")
    assert accounted == 1000 and otlp.exported("traces") == 0


def test_a_backend_that_is_down_costs_counted_drops() -> None:
    """The SDK's own OTLP exporters toward a port nothing listens on: they retry until their timeout, then
    give up; every packet and histogram point is counted export_failed, none is lost uncounted."""
    aggregate = AggregateConfig(exemplar_slowest=1, exemplar_every=0)
    with socket.socket() as held:  # bound, never listening: connections are refused, and no one takes it
        held.bind(("127.0.0.1", 0))
        config = OtlpConfig(endpoint=f"127.0.0.1:{held.getsockname()[1]}", insecure=True, timeout_s=0.5)
        otlp = OtlpExporter(config, TraceCatalog(), exemplar_every=0)
        traced(300, aggregate, otlp)
        assert otlp.flush(timeout_s=30)
        otlp.close()
    assert otlp.dropped == {("traces", "export_failed"): 3, ("metrics", "export_failed"): 4 * 3}
    assert otlp.exported("traces") == otlp.exported("metrics") == 0


def test_a_small_span_queue_delays_the_worker_and_drops_nothing() -> None:
    """The worker waits for the processor's room (80 spans: 20 packets) and has it send what it holds, so
    400 packets all leave through a queue far smaller than them."""
    aggregate = AggregateConfig(exemplar_slowest=3, exemplar_every=1)
    otlp, spans, _ = exporter(None, "all", aggregate, max_spans=80, max_packets=1000)
    traced(400, aggregate, otlp)
    assert otlp.flush(timeout_s=60)
    otlp.close()
    assert not otlp.dropped and otlp.exported("traces") == 400
    assert len(by_trace(spans.get_finished_spans())) == 400
