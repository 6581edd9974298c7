"""aggregate.py: segment latencies, per-second statistics and hop counter deltas."""

from __future__ import annotations

import pytest
from google.protobuf.timestamp_pb2 import Timestamp

from hoptrace.collector.aggregate import (
    END_TO_END,
    AggregateConfig,
    HopCounterAggregator,
    SegmentAggregator,
    quantile,
    summarize,
)
from hoptrace.collector.catalog import TraceCatalog
from hoptrace.collector.clock import ClockAligner
from hoptrace.collector.join import JoinedPacket
from hoptrace.collector.records import hop_counters
from hoptrace.v1 import records_pb2

pytestmark = pytest.mark.unit  # pure code: make test-unit runs it without root

SEC = 1_000_000_000
HOPS = ["a", "b", "c"]
NODES = ["n1", "n1", "n2"]


def catalog() -> TraceCatalog:
    c = TraceCatalog()
    c.set_trace("t", HOPS, NODES)
    return c


def packet(pid: int, times: list[int | None], nodes: list[str | None] | None = None) -> JoinedPacket:
    nodes = nodes or [n if t is not None else None for n, t in zip(NODES, times, strict=True)]
    return JoinedPacket("t", 7, 1, pid, times, nodes, all(t is not None for t in times))


def test_quantiles_by_hand() -> None:
    values = list(range(10, 0, -1))  # 10..1
    # nearest rank: index ceil(q*n)-1 of the sorted values 1..10
    assert summarize(values) == (10, 5.5, 5, 9, 10, 10)
    assert quantile([7], 0.99) == 7
    assert summarize([]) == (0, 0.0, 0, 0, 0, 0)
    v = list(range(1, 201))  # 1..200: p50 -> 100th value, p90 -> 180th, p99 -> 198th
    assert summarize(v)[2:] == (100, 180, 198, 200)


def test_segments_in_path_order_and_incomplete() -> None:
    agg = SegmentAggregator(catalog())
    samples = agg.add_packets(
        [
            packet(1, [SEC, SEC + 100, SEC + 1_100]),
            packet(2, [SEC + 10, None, SEC + 2_010]),  # missed hop b: both its segments incomplete
            packet(3, [SEC + 20, SEC + 320, None]),  # never reached c
        ]
    )
    got = [(s.packet_id, s.segment, s.latency_ns, s.ts_ns, s.from_node, s.to_node) for s in samples]
    assert got == [
        (1, "a>b", 100, SEC, "n1", "n1"),
        (1, "b>c", 1_000, SEC + 100, "n1", "n2"),
        (1, END_TO_END, 1_100, SEC, "n1", "n2"),
        (2, END_TO_END, 2_000, SEC + 10, "n1", "n2"),
        (3, "a>b", 300, SEC + 20, "n1", "n1"),
    ]
    windows = {w.segment: w for w in agg.close_windows(2 * SEC)}
    assert list(windows) == ["a>b", "b>c", END_TO_END]
    ab, bc, e2e = windows["a>b"], windows["b>c"], windows[END_TO_END]
    assert (ab.count, ab.mean_ns, ab.p50_ns, ab.max_ns, ab.incomplete) == (2, 200.0, 100, 300, 1)
    assert (ab.from_hop, ab.to_hop, ab.start_ns) == ("a", "b", SEC)
    assert (bc.count, bc.incomplete) == (1, 2)
    assert (e2e.count, e2e.incomplete, e2e.packets, e2e.complete, e2e.p99_ns) == (2, 1, 3, 1, 2_000)
    assert (e2e.from_hop, e2e.to_hop) == ("a", "c")


def test_segment_order_follows_the_path_not_the_hop_arrival() -> None:
    c = TraceCatalog()
    c.set_trace("t", ["z-first", "a-second", "m-third"], ["n", "n", "n"])
    agg = SegmentAggregator(c)
    agg.add_packets([JoinedPacket("t", 7, 1, 1, [SEC, SEC + 5, SEC + 9], ["n"] * 3, True)])
    assert [w.segment for w in agg.flush()] == ["z-first>a-second", "a-second>m-third", END_TO_END]


def test_one_second_windows_and_late_packets() -> None:
    agg = SegmentAggregator(catalog(), config=AggregateConfig(interval_ns=SEC))
    agg.add_packets(
        [packet(1, [SEC + 5, SEC + 10, SEC + 20]), packet(2, [2 * SEC + 5, 2 * SEC + 7, 2 * SEC + 9])]
    )
    first = agg.close_windows(2 * SEC)  # the [1 s, 2 s) windows have ended
    assert {(w.segment, w.start_ns, w.count) for w in first} == {
        ("a>b", SEC, 1),
        ("b>c", SEC, 1),
        (END_TO_END, SEC, 1),
    }
    samples = agg.add_packets([packet(3, [SEC + 50, SEC + 60, SEC + 70])])  # its window is closed
    assert len(samples) == 3 and agg.stats.late == 3
    rest = agg.flush()
    assert {(w.segment, w.start_ns, w.count) for w in rest} == {
        ("a>b", 2 * SEC, 1),
        ("b>c", 2 * SEC, 1),
        (END_TO_END, 2 * SEC, 1),
    }


def test_negative_cross_node_latency_is_kept_but_flagged() -> None:
    clock = ClockAligner()
    agg = SegmentAggregator(catalog(), clock)
    samples = agg.add_packets([packet(1, [SEC, SEC + 100, SEC + 40])])  # c before b: clocks disagree
    bc = next(s for s in samples if s.segment == "b>c")
    assert bc.latency_ns == -60 and bc.below_clock_bound
    assert not next(s for s in samples if s.segment == "a>b").below_clock_bound
    # with a known bound, a positive latency below it is flagged too
    clock.update("n1", records_pb2.NodeClock(bound_ns=500))
    samples = agg.add_packets([packet(2, [SEC, SEC + 100, SEC + 400])])
    assert next(s for s in samples if s.segment == "b>c").below_clock_bound
    assert agg.stats.below_clock_bound >= 2
    clock.update("n2", records_pb2.NodeClock(bound_ns=70))
    agg.add_packets([packet(3, [SEC, SEC + 100, SEC + 700])])
    # each cross-node window carries the two nodes' bounds summed, the largest seen; one node carries none
    bounds = {w.segment: w.clock_bound_ns for w in agg.flush()}
    assert bounds == {"a>b": 0, "b>c": 570, END_TO_END: 570}


def _counters(hop_index: int, hop: str, at_s: int, **values: int) -> records_pb2.HopCounters:
    c = hop_counters(hop_index, hop, **values)
    c.at.CopyFrom(Timestamp(seconds=at_s))
    return c


def test_hop_counter_deltas_per_second() -> None:
    agg = HopCounterAggregator()
    agg.add_counters("t", "n1", [_counters(0, "a", 10, matched=100, tagged=90, untagged=10, bytes=10_000)])
    agg.add_counters(
        "t",
        "n1",
        [
            _counters(
                0,
                "a",
                11,
                matched=250,
                tagged=230,
                untagged=20,
                bytes=25_000,
                parse_truncated=1,
                parse_non_ip=2,
            )
        ],
    )
    agg.add_counters(
        "t",
        "n1",
        [
            _counters(
                0,
                "a",
                11,
                matched=260,
                tagged=240,
                untagged=20,
                bytes=26_000,
                ringbuf_full=4,
                parse_truncated=1,
                parse_non_ip=2,
            )
        ],
    )
    ws = agg.close_windows(12 * SEC)
    assert [
        (w.start_ns, w.matched, w.tagged, w.untagged, w.bytes, w.parse_errors, w.lost_events) for w in ws
    ] == [
        (10 * SEC, 100, 90, 10, 10_000, 0, 0),
        (11 * SEC, 160, 150, 10, 16_000, 3, 4),
    ]
    assert (ws[0].trace, ws[0].hop, ws[0].node) == ("t", "a", "n1")
    # the agent re-attached: counters restart from 0
    agg.add_counters("t", "n1", [_counters(0, "a", 13, matched=5)])
    assert agg.stats.counter_resets == 1
    assert [w.matched for w in agg.flush()] == [5]
