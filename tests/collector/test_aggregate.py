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
    return JoinedPacket("t", 7, pid, times, nodes, all(t is not None for t in times))


def test_quantiles_by_hand() -> None:
    values = list(range(10, 0, -1))  # 10..1
    # nearest rank: index ceil(q*n)-1 of the sorted values 1..10
    assert summarize(values) == (10, 5.5, 5, 9, 10, 10)
    assert quantile([7], 0.99) == 7
    assert summarize([]) == (0, 0.0, 0, 0, 0, 0)
    v = list(range(1, 201))  # 1..200: p50 -> 100th value, p90 -> 180th, p99 -> 198th
    assert summarize(v)[2:] == (100, 180, 198, 200)


# Every packet an exemplar: its per-segment samples come back from add_packets at once.
EVERY_PACKET = AggregateConfig(exemplar_every=1)


def test_segments_in_path_order_and_incomplete() -> None:
    agg = SegmentAggregator(catalog(), config=EVERY_PACKET)
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
    agg.add_packets([JoinedPacket("t", 7, 1, [SEC, SEC + 5, SEC + 9], ["n"] * 3, True)])
    assert [w.segment for w in agg.flush()] == ["z-first>a-second", "a-second>m-third", END_TO_END]


def test_one_second_windows_and_late_packets() -> None:
    agg = SegmentAggregator(catalog(), config=AggregateConfig(interval_ns=SEC, exemplar_every=1))
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
    agg = SegmentAggregator(catalog(), clock, EVERY_PACKET)
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


def test_exemplars_are_the_slowest_of_each_window_and_one_in_n_by_id() -> None:
    """Per-packet points only for exemplars: the K slowest end to end per window, and IDs that are a
    multiple of N (the same packets on every collector and every replay). The windows still count all."""
    agg = SegmentAggregator(catalog(), config=AggregateConfig(exemplar_slowest=2, exemplar_every=10))
    # 25 packets in second 1, 5 in second 2; end-to-end latency 1000 + 7 * (pid % 13): slowest are known
    packets = [packet(i, [SEC + i, SEC + i + 100, SEC + i + 1_000 + 7 * (i % 13)]) for i in range(1, 26)]
    packets += [packet(i, [2 * SEC + i, 2 * SEC + i + 50, 2 * SEC + i + 500 + i]) for i in range(26, 31)]
    sampled = agg.add_packets(packets)
    # pid 10, 20, 30: every segment and end to end, at once
    assert sorted({s.packet_id for s in sampled}) == [10, 20, 30]
    assert len(sampled) == 3 * 3
    assert agg.take_exemplars() == []  # the slowest wait for their window to close
    windows = agg.close_windows(2 * SEC)
    assert sum(w.count for w in windows if w.segment == END_TO_END) == 25
    slowest = agg.take_exemplars()
    # second 1 without the sampled 10 and 20: slowest by 7 * (pid % 13) are 12 (84) and 25 (84) / 11 (77)
    e2e = {s.packet_id: s.latency_ns for s in slowest if s.segment == END_TO_END}
    assert e2e == {12: 1_084, 25: 1_084}
    assert {(s.packet_id, s.segment) for s in slowest} == {
        (pid, seg) for pid in (12, 25) for seg in ("a>b", "b>c", END_TO_END)
    }
    agg.flush()
    assert {s.packet_id for s in agg.take_exemplars() if s.segment == END_TO_END} == {28, 29}
    # 0/0 keeps none; the windows do not change
    none = SegmentAggregator(catalog(), config=AggregateConfig(exemplar_slowest=0, exemplar_every=0))
    assert none.add_packets(packets) == []
    assert sum(w.count for w in none.flush() if w.segment == END_TO_END) == 30
    assert none.take_exemplars() == []
    with pytest.raises(ValueError, match="exemplar"):
        AggregateConfig(exemplar_every=-1).validate()


def test_windows_carry_mergeable_sums_and_sketches() -> None:
    agg = SegmentAggregator(catalog(), config=AggregateConfig(instance="c1"))
    # a>b latencies 100, 130, 90, 200, 150 in packet order
    lat = [100, 130, 90, 200, 150]
    agg.add_packets([packet(i + 1, [SEC + i, SEC + i + v, SEC + i + v + 10]) for i, v in enumerate(lat)])
    ab = {w.segment: w for w in agg.flush()}["a>b"]
    assert (ab.instance, ab.count, ab.sum_ns, ab.min_ns, ab.max_ns) == ("c1", 5, 670, 90, 200)
    assert ab.sketch.count == 5 and ab.sketch.quantile(0.5) == pytest.approx(130, rel=0.01)
    diffs = [30, 40, 110, 50]
    assert (ab.jitter_count, ab.jitter_sum_ns, ab.jitter_sketch.count) == (4, sum(diffs), 4)
    assert ab.jitter_ns == sum(diffs) / 4


def test_the_batch_path_of_complete_packets_equals_the_one_by_one_path() -> None:
    """Complete packets of a known path take the batch path; it must give exactly what the per-packet path
    gives: windows (across second boundaries, negative and bound-flagged latencies), stats and exemplars."""
    import random

    rng = random.Random(5)
    packets = []
    for i in range(3_000):
        t0 = SEC + i * 1_000_000 + rng.randint(0, 999)  # 3 s of packets
        t1 = t0 + rng.randint(-200, 5_000)
        packets.append(packet(i + 1, [t0, t1, t1 + rng.randint(-500, 90_000)]))

    def run(batch: bool) -> tuple:
        clock = ClockAligner()
        clock.update("n2", records_pb2.NodeClock(bound_ns=300))
        agg = SegmentAggregator(catalog(), clock, AggregateConfig(exemplar_slowest=4, exemplar_every=97))
        sampled, closed = [], []
        for k in range(0, len(packets), 256):
            part = packets[k : k + 256]
            if batch:
                sampled += agg.add_packets(part)
            else:
                agg._add_each(part, {"t": agg.catalog.get("t")}, sampled)
            if k == 512:  # close the first second while packets of it are still coming: late ones
                closed += agg.close_windows(2 * SEC)
        windows = [
            (w.segment, w.start_ns, w.count, w.sum_ns, w.max_ns, w.p99_ns, w.below_bound_count, w.from_count)
            + (w.packets, w.complete, w.clock_bound_ns, w.same_node, w.jitter_sum_ns, w.sketch.fields())
            for w in closed + agg.flush()
        ]
        return windows, sorted(sampled), sorted(agg.take_exemplars()), agg.stats

    assert run(batch=True) == run(batch=False)
    windows, sampled, slowest, stats = run(batch=True)
    assert len(windows) == 3 * 3 and stats.below_clock_bound > 0 and stats.late > 0
    assert {s.packet_id for s in sampled} == {pid for pid in range(1, 3_001) if pid % 97 == 0}
    assert len({s.packet_id for s in slowest}) == 4 * 3


def test_default_instance_tells_collectors_on_one_host_apart() -> None:
    import socket

    from hoptrace.collector.main import default_instance

    host = socket.gethostname()
    assert default_instance("127.0.0.1:7071") == f"{host}:7071" != default_instance("127.0.0.1:7072")
    assert default_instance("[::1]:7071") == f"{host}:7071"
    assert default_instance("127.0.0.1:0") == host  # an ephemeral port says nothing stable


def test_hop_counters_carry_the_container_and_pod_of_a_workload_hop() -> None:
    """A spec whose hops were named by workloads (the dispatcher's resolved HopSpec.workload): their
    hop_counters windows, from counters and from records, carry the container and pod; other hops none."""
    from hoptrace.collector.influx import line
    from hoptrace.collector.points import counters_points
    from hoptrace.v1 import trace_pb2

    spec = trace_pb2.TraceSpec(name="t")
    spec.hops.add(name="a-out", node="n1", netns="container:web").workload.container_name = "web"
    spec.hops.add(name="wire", node="n1")
    pod_hop = spec.hops.add(name="b-in", node="n2", netns="pod:shop/web-0")
    pod_hop.workload.container_name, pod_hop.workload.pod_namespace = "k8s_app_web-0", "shop"
    pod_hop.workload.pod_name = "web-0"
    catalog = TraceCatalog()
    catalog.set_spec(spec)
    agg = HopCounterAggregator(catalog=catalog)
    agg.add_counters("t", "n1", [_counters(0, "a-out", 10, matched=5), _counters(1, "wire", 10, matched=5)])
    agg.add_counters("t", "n2", [_counters(2, "b-in", 10, matched=5)])
    tags = {w.hop: (w.container, w.pod) for w in agg.close_windows(12 * SEC)}
    assert tags == {"a-out": ("web", ""), "wire": ("", ""), "b-in": ("k8s_app_web-0", "shop/web-0")}
    agg.add_counters("t", "n2", [_counters(2, "b-in", 20, matched=9)])
    (window,) = agg.close_windows(22 * SEC)
    assert line(counters_points(window)[0]).startswith(
        "hop_counters,container=k8s_app_web-0,hop=b-in,node=n2,pod=shop/web-0,trace=t matched=4i,"
    )


def test_a_replay_resumed_after_the_written_windows_leaves_them_whole() -> None:
    """A partition replayed from its commit: the first pipeline wrote the 1 s window complete, the replay
    starts inside it. Resumed after what was written, the replay leaves that window alone and writes the
    next whole, so the last write of each window (InfluxDB keeps one point per series and time) counts
    every packet once; without it the replay overwrites the 1 s window with a part of its packets."""
    stream = [packet(i, [SEC + i * 10_000_000 + d for d in (0, 5, 9)]) for i in range(150)]  # 1 s .. 2.5 s
    config = AggregateConfig(interval_ns=SEC, exemplar_every=1)
    first = SegmentAggregator(catalog(), config=config)
    first.add_packets(stream[:120])
    written = {(w.segment, w.start_ns): w.count for w in first.close_windows(2 * SEC)}
    written_before = first.closed_before
    assert written_before == 2 * SEC and written[(END_TO_END, SEC)] == 100

    def replay(resume: bool) -> dict[tuple[str, int], int]:
        again = SegmentAggregator(catalog(), config=config)
        if resume:
            again.resume_after(written_before)
        again.add_packets(stream[90:])  # the commit was at packet 90: the rest of 1 s and all of 2 s
        # a tracer loss of the written second was counted there: not again in the oldest open window
        again.note_tracer_lost("t", "c", "n2", SEC + 5, 3, "ringbuf_full")
        out = dict(written)
        out.update({(w.segment, w.start_ns): w.count for w in again.flush()})
        assert (again.take_tracer_loss() == []) == resume
        return out

    whole = replay(resume=True)
    assert whole[(END_TO_END, SEC)] == 100 and whole[(END_TO_END, 2 * SEC)] == 50
    assert sum(n for (seg, _), n in whole.items() if seg == END_TO_END) == len(stream)
    assert replay(resume=False)[(END_TO_END, SEC)] == 10  # the loss this guards against


def test_replayed_hop_counters_before_the_written_windows_only_set_the_base() -> None:
    agg = HopCounterAggregator()
    agg.resume_after(11 * SEC)
    agg.add_counters("t", "n1", [_counters(0, "a", 10, matched=100)])  # in a window written before
    agg.add_counters("t", "n1", [_counters(0, "a", 11, matched=130)])
    assert [(w.start_ns, w.matched) for w in agg.flush()] == [(11 * SEC, 30)]
