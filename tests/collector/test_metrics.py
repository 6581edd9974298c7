"""vNetTracer's metric set and clock mapping, through the pipeline with an in-memory exporter."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace

import pytest
from collector_helpers import pid, rec
from google.protobuf.timestamp_pb2 import Timestamp

from hoptrace.collector.aggregate import END_TO_END, SegmentAggregator, jitter
from hoptrace.collector.catalog import TraceCatalog
from hoptrace.collector.clock import ClockAligner, mapping_of
from hoptrace.collector.join import HopJoiner, JoinedPacket
from hoptrace.collector.pipeline import CollectorPipeline
from hoptrace.collector.points import Point
from hoptrace.collector.records import RecordFlag, decode_batch, hop_counters, pack_records
from hoptrace.collector.schema import HOP_COUNTERS, HOP_LATENCY, SEGMENT_STATS, TRACER_LOSS
from hoptrace.v1 import records_pb2

pytestmark = pytest.mark.unit  # pure code: make test-unit runs it without root

SEC = 1_000_000_000
BASE = 1_700_000_000 * SEC  # master time of the first packet (a second boundary)


@dataclass
class ListExporter:
    """Keeps the pipeline's points as InfluxDB stores them: one per measurement, series and time (the fields
    of points of one series and time merged), each read back by its tags and fields."""

    stored: dict = field(default_factory=dict)

    def export(self, points: list[Point]) -> None:
        for p in points:
            self.stored.setdefault((p.measurement, p.tags, p.time_ns), {}).update(p.fields)

    def measurement(self, name: str) -> list[SimpleNamespace]:
        return [
            SimpleNamespace(**dict(tags), **fields, start_ns=time_ns)
            for (measurement, tags, time_ns), fields in self.stored.items()
            if measurement == name
        ]

    @property
    def samples(self) -> list[SimpleNamespace]:
        return self.measurement(HOP_LATENCY)

    @property
    def segments(self) -> list[SimpleNamespace]:
        return self.measurement(SEGMENT_STATS)

    @property
    def counters(self) -> list[SimpleNamespace]:
        return self.measurement(HOP_COUNTERS)

    @property
    def tracer_loss(self) -> list[SimpleNamespace]:
        return self.measurement(TRACER_LOSS)


def pipeline(hops: list[str], nodes: list[str]) -> tuple[CollectorPipeline, ListExporter]:
    catalog = TraceCatalog()
    catalog.set_trace("t", hops, nodes)
    out = ListExporter()
    return CollectorPipeline(out, catalog), out


def feed(p: CollectorPipeline, node: str, records: list, **batch: object) -> None:
    msg = records_pb2.RecordBatch(node=node, trace="t", records=pack_records(records), **batch)  # type: ignore[arg-type]
    p.consume(decode_batch(msg))


def by_segment(windows: list) -> dict:
    return {w.segment: w for w in windows}


# -- clock -------------------------------------------------------------------------------------------------


def test_drift_mapping_math() -> None:
    m2r = 1_000 * SEC  # node wall = monotonic + 1000 s
    sampled = m2r + 100 * SEC  # offset measured at node wall 1100 s (monotonic 100 s)
    clock = records_pb2.NodeClock(
        monotonic_to_realtime_ns=m2r, offset_ns=5_000, drift_ppm=10.0, sampled_at_ns=sampled, bound_ns=40
    )
    m = mapping_of(clock)
    # at the sample: the plain offset
    assert m.to_master(100 * SEC) == 100 * SEC + m2r - 5_000
    # 10 s later the offset grew by 10 ppm x 10 s = 100 us
    assert m.to_master(110 * SEC) == 110 * SEC + m2r - (5_000 + 100_000)
    # 20 s before: shrunk by 200 us (the drift applies both ways)
    assert m.to_master(80 * SEC) == 80 * SEC + m2r - (5_000 - 200_000)
    assert m.wall_to_master(sampled + 10 * SEC) == sampled + 10 * SEC - 105_000
    # without a sample time the drift cannot be placed: not applied
    clock.sampled_at_ns = 0
    assert mapping_of(clock).to_master(110 * SEC) == 110 * SEC + m2r - 5_000
    # the join applies the same mapping to every record
    joiner = HopJoiner()
    joiner.catalog.set_trace("t", ["a", "b"])
    recs = [rec(100 * SEC, pid(1), 0), rec(110 * SEC, pid(1), 1)]
    (p,) = joiner.join_hops("t", "n", recs, m.delta_ns, drift=m.drift, ref_mono_ns=m.ref_mono_ns)
    assert p.times == [m.to_master(100 * SEC), m.to_master(110 * SEC)]
    assert p.times[1] - p.times[0] == 10 * SEC - 100_000


def test_node_clock_points_at_most_once_a_second_and_only_when_new() -> None:
    c = ClockAligner()
    c.update("n1", records_pb2.NodeClock(offset_ns=10, bound_ns=5, delay_ns=9, drift_ppm=0.5))
    assert [(p.node, p.offset_ns, p.bound_ns, p.delay_ns, p.drift_ppm) for p in c.due_points(SEC)] == [
        ("n1", 10, 5, 9, 0.5)
    ]
    c.update("n1", records_pb2.NodeClock(offset_ns=10, bound_ns=5, delay_ns=9, drift_ppm=0.5))
    assert c.due_points(3 * SEC) == []  # the same estimate again: not news
    c.update("n1", records_pb2.NodeClock(offset_ns=12, bound_ns=5))
    assert c.due_points(3 * SEC + 1) != []
    c.update("n1", records_pb2.NodeClock(offset_ns=14, bound_ns=5))
    assert c.due_points(3 * SEC + 2) == []  # within 1 s of the last point
    assert [p.offset_ns for p in c.due_points(4 * SEC + 2)] == [14]


# -- loss --------------------------------------------------------------------------------------------------

N = 1_000


def _two_hop_records(missing_every: int = 20) -> tuple[list, list]:
    """N packets over 0.5 s; every `missing_every`-th never reaches hop 1 (5%)."""
    a, b = [], []
    for i in range(N):
        t = BASE + i * 500_000
        a.append(rec(t, pid(i + 1), 0))
        if i % missing_every != missing_every - 1:
            b.append(rec(t + 20_000, pid(i + 1), 1))
    return a, b


def test_loss_is_exact() -> None:
    p, out = pipeline(["h0", "h1"], ["n1", "n2"])
    a, b = _two_hop_records()
    feed(p, "n1", a)
    feed(p, "n2", b)
    p.flush()
    seg = by_segment(out.segments)["h0>h1"]
    assert (seg.from_count, seg.loss_count, seg.loss_rate, seg.tracer_lost) == (N, 50, 0.05, 0)
    assert (seg.count, seg.incomplete) == (N - 50, 50)
    e2e = by_segment(out.segments)[END_TO_END]
    assert (e2e.loss_count, e2e.loss_rate) == (50, 0.05)
    assert out.tracer_loss == []


def test_records_the_tracer_lost_are_not_network_loss() -> None:
    p, out = pipeline(["h0", "h1"], ["n1", "n2"])
    a, b = _two_hop_records()
    feed(p, "n1", a)
    # hop 1's ring buffer was full for 20 of the 50 missing records, and the agent of n2 dropped 5 more
    counters = hop_counters(1, "h1", matched=N, recorded=N - 50, ringbuf_full=20)
    counters.at.CopyFrom(Timestamp(seconds=BASE // SEC))
    feed(p, "n2", b, counters=[counters], agent_dropped=5)
    p.flush()
    seg = by_segment(out.segments)["h0>h1"]
    assert (seg.from_count, seg.loss_count, seg.tracer_lost) == (N, 25, 25)
    assert seg.loss_rate == 25 / N
    losses = {(w.node, w.hop, w.reason): w.records for w in out.tracer_loss}
    assert losses == {("n2", "h1", "ringbuf_full"): 20, ("n2", "", "agent_dropped"): 5}
    assert p.stats()["tracer_lost"] == 25


def test_packets_the_collector_cut_short_are_not_loss() -> None:
    c = TraceCatalog()
    c.set_trace("t", ["h0", "h1"], ["n1", "n2"])
    agg = SegmentAggregator(c)
    agg.add_packets(
        [
            JoinedPacket("t", 7, 1, [BASE, None], ["n1", None], False),  # lost in the network
            JoinedPacket("t", 7, 2, [BASE + 5, None], ["n1", None], False, cut=True),  # evicted
            JoinedPacket("t", 7, 3, [BASE + 9, BASE + 90], ["n1", "n2"], True),
        ]
    )
    seg = by_segment(agg.flush())["h0>h1"]
    assert (seg.from_count, seg.loss_count, seg.tracer_lost) == (3, 1, 1)
    # the join marks what it evicts at its bound
    joiner = HopJoiner(c)
    joiner.config.max_entries = 1
    joiner.join_hops("t", "n1", [rec(BASE, pid(1), 0)])
    out = joiner.join_hops("t", "n1", [rec(BASE + 1, pid(2), 0)])
    assert [(p.packet_id, p.cut) for p in out] == [(pid(1), True)]


def test_packets_that_passed_a_hop_before_it_was_attached_are_not_loss() -> None:
    """A trace applied to live traffic: n2's hop h2 is attached 0.3 s into a flow that n1's hops already
    trace. Its attach time comes in n2's counters on n2's clock (7 s behind the master's); the packets that
    passed h2 before are counted apart, every 20th after it is lost."""
    p, out = pipeline(["h0", "h1", "h2"], ["n1", "n1", "n2"])
    n1_clock = records_pb2.NodeClock(monotonic_to_realtime_ns=BASE)  # n1 monotonic 0 = master BASE
    n2_clock = records_pb2.NodeClock(monotonic_to_realtime_ns=BASE - 7 * SEC)  # n2 monotonic 7 s = BASE
    attached = {"h0": 0, "h1": 1_000, "h2": 7 * SEC + 300_000_000}  # each on its node's monotonic clock
    heartbeat = {node: [] for node in ("n1", "n2")}
    for index, (hop, at) in enumerate(attached.items()):
        counters = hop_counters(index, hop)
        counters.attached_ns = at
        heartbeat["n2" if hop == "h2" else "n1"].append(counters)
    feed(p, "n1", [], counters=heartbeat["n1"], clock=n1_clock, generation=3)
    feed(p, "n2", [], counters=heartbeat["n2"], clock=n2_clock, generation=3)
    n1, n2 = [], []
    lost = 0
    for i in range(N):  # 0.5 s of packets
        t = i * 500_000
        n1 += [rec(t + 2_000, pid(i + 1), 0), rec(t + 10_000, pid(i + 1), 1)]
        if t + 10_000 < 300_000_000:
            continue  # passed h2 before it was attached
        if i % 20 == 19:
            lost += 1
            continue
        n2.append(rec(7 * SEC + t + 30_000, pid(i + 1), 2))
    feed(p, "n1", n1, clock=n1_clock, generation=3)
    feed(p, "n2", n2, clock=n2_clock, generation=3)
    p.flush()
    in_flight = sum(1 for i in range(N) if i * 500_000 + 10_000 < 300_000_000)
    assert (in_flight, lost) == (600, 20)
    segments = by_segment(out.segments)
    first, second, e2e = segments["h0>h1"], segments["h1>h2"], segments[END_TO_END]
    assert (first.from_count, first.loss_count, getattr(first, "before_attach", 0)) == (N, 0, 0)
    assert (second.from_count, second.loss_count, second.before_attach) == (N, lost, in_flight)
    assert (e2e.loss_count, e2e.before_attach, e2e.tracer_lost) == (lost, in_flight, 0)
    assert second.loss_rate == lost / N
    assert p.stats()["before_attach"] == in_flight


# -- jitter, same node, throughput ---------------------------------------------------------------------------


def test_jitter_by_hand() -> None:
    # latencies in packet order (time at the first hop): 100, 130, 90, 200, 150; fed out of order
    times = [BASE + 40, BASE + 10, BASE + 30, BASE + 20, BASE + 50]
    lats = [200, 100, 90, 130, 150]
    # |130-100| + |90-130| + |200-90| + |150-200| = 30 + 40 + 110 + 50 -> mean 57.5; nearest-rank p99 = 110
    assert jitter(times, lats) == (57.5, 110)
    p, out = pipeline(["h0", "h1"], ["n1", "n1"])
    feed(
        p,
        "n1",
        [
            r
            for i, (t, d) in enumerate(zip(times, lats, strict=True))
            for r in (rec(t, pid(i + 1), 0), rec(t + d, pid(i + 1), 1))
        ],
    )
    p.flush()
    seg = by_segment(out.segments)["h0>h1"]
    assert (seg.jitter_ns, seg.jitter_p99_ns) == (57.5, 110)
    assert seg.same_node  # both hops on n1: this is n1's processing time
    assert jitter([BASE], [5]) == (0.0, 0)


def test_throughput_per_hop_without_the_id_bytes() -> None:
    p, out = pipeline(["h0", "h1"], ["n1", "n2"])
    recs = []
    for i in range(10):  # 10 UDP packets of 104 wire bytes (100 + the 4-byte ID) in [BASE, BASE + 1 s)
        recs.append(rec(BASE + i * 50_000_000, pid(i + 1), 0, wire_len=104, flags=RecordFlag.UDP))
    for i in range(10, 20):  # 10 TCP packets of 208 wire bytes (200 + the 8-byte option)
        recs.append(
            rec(BASE + i * 50_000_000, pid(i + 1), 0, wire_len=208, flags=RecordFlag.TCP | RecordFlag.IPV6)
        )
    recs.append(rec(BASE + SEC + 5, pid(99), 0, wire_len=64, flags=RecordFlag.UDP))  # next second
    feed(p, "n1", recs)
    p.flush()
    w = {(c.hop, c.start_ns): c for c in out.counters}
    first = w[("h0", BASE)]
    assert (first.packets, first.packets_per_s, first.bytes_per_s) == (20, 20.0, 10 * 100 + 10 * 200)
    assert (w[("h0", BASE + SEC)].packets_per_s, w[("h0", BASE + SEC)].bytes_per_s) == (1.0, 60.0)
    assert not hasattr(
        first, "matched"
    )  # no HopCounters in the batch: only the throughput fields are written


def test_records_for_another_nodes_hops_are_refused_and_counted() -> None:
    """With host-a's certificate, 50 records at host-b's hop turned a report from
    count 500, max 100 us into mean 454 ms. A node's records and counters count only at its own hops."""
    p, out = pipeline(["a-out", "b-in"], ["host-a", "host-b"])
    honest = [[rec(BASE + i * 1_000, pid(i + 1), 0)] for i in range(20)]
    for i, records in enumerate(honest):
        feed(p, "host-a", records)
        feed(p, "host-b", [rec(BASE + i * 1_000 + 100_000, pid(i + 1), 1)])
    forged = [rec(BASE + 5 * SEC, pid(i + 1), 1) for i in range(10)]  # 5 s "latency" at b-in
    feed(p, "host-a", forged, counters=[hop_counters(1, "b-in", matched=10**6)])
    p.flush()
    windows = [w for w in out.segments if w.segment == "a-out>b-in"]
    assert sum(w.count for w in windows) == 20 and max(w.max_ns for w in windows) == 100_000
    assert {s.latency_ns for s in out.samples if s.segment == "a-out>b-in"} == {100_000}  # the exemplars
    assert p.foreign_records == {"host-a": 11}
    assert all(getattr(c, "matched", 0) < 10**6 for c in out.counters)
