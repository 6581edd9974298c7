"""influx.py: the line protocol of each measurement's points (points.py) and timestamp de-duplication."""

from __future__ import annotations

import pytest

from hoptrace.collector.aggregate import HopCounterWindow, LatencySample, SegmentWindow, TracerLossWindow
from hoptrace.collector.clock import NodeClockPoint
from hoptrace.collector.influx import InfluxConfig, TimestampDeduper, line
from hoptrace.collector.points import (
    counters_points,
    latency_point,
    node_clock_point,
    segment_point,
    tracer_loss_point,
)
from hoptrace.collector.sketch import MAPPING, LatencySketch

pytestmark = pytest.mark.unit  # pure code: make test-unit runs it without root


def sample(ts: int, pid: int = 5, latency: int = 1_234, flag: bool = False) -> LatencySample:
    return LatencySample("my trace", "a>b", "a", "b", "n1", "n,2", ts, latency, pid, flag)


def test_hop_latency_line() -> None:
    assert line(latency_point(sample(99))) == (
        r"hop_latency,from_hop=a,from_node=n1,segment=a>b,to_hop=b,to_node=n\,2,trace=my\ trace "
        "latency_ns=1234i,packet_id=5i 99"
    )
    assert line(latency_point(sample(99, latency=-3, flag=True))).endswith(
        "latency_ns=-3i,packet_id=5i,below_clock_bound=true 99"
    )


def test_segment_stats_and_counters_lines() -> None:
    w = SegmentWindow("t", "a>b", "a", "b", 7, 3, 12.5, 10, 11, 12, 13, 2)
    assert line(segment_point(w)) == (
        "segment_stats,from_hop=a,segment=a>b,to_hop=b,trace=t "
        "count=3i,mean_ns=12.5,p50_ns=10i,p90_ns=11i,p99_ns=12i,max_ns=13i,incomplete=2i,"
        "from_count=0i,loss_count=0i,loss_rate=0.0,tracer_lost=0i,jitter_ns=0.0,jitter_p99_ns=0i,"
        "same_node=false,below_clock_bound=false,below_bound_count=0i,clock_bound_ns=0i,"
        "sum_ns=0i,min_ns=0i,jitter_sum_ns=0i,jitter_count=0i 7"
    )
    w.packets, w.complete = 5, 4
    w.from_count, w.loss_count, w.loss_rate, w.tracer_lost = 100, 5, 0.05, 2
    w.jitter_ns, w.jitter_p99_ns, w.same_node, w.clock_bound_ns = 1.5, 3, True, 170
    assert line(segment_point(w)).endswith(
        "incomplete=2i,packets=5i,complete=4i,from_count=100i,loss_count=5i,loss_rate=0.05,tracer_lost=2i,"
        "jitter_ns=1.5,jitter_p99_ns=3i,same_node=true,below_clock_bound=false,below_bound_count=0i,"
        "clock_bound_ns=170i,sum_ns=0i,min_ns=0i,jitter_sum_ns=0i,jitter_count=0i 7"
    )
    # the collector's tag and the sketches: one field per non-empty bucket (sketch.py names them)
    w.instance, w.sum_ns, w.min_ns, w.jitter_sum_ns, w.jitter_count = "coll 1", 2_100, -100, 1_200, 2
    w.sketch, w.jitter_sketch = (
        LatencySketch.of([1_000, 1_000, 1_200, 0, -100]),
        LatencySketch.of([200, 1_000]),
    )
    written = line(segment_point(w))
    assert written.startswith(r"segment_stats,collector=coll\ 1,from_hop=a,segment=a>b,to_hop=b,trace=t ")
    k = MAPPING.key
    assert written.endswith(
        f"sum_ns=2100i,min_ns=-100i,jitter_sum_ns=1200i,jitter_count=2i,bp{k(1_000)}=2i,bp{k(1_200)}=1i,"
        f"bn{k(100)}=1i,bz=1i,jp{k(200)}=1i,jp{k(1_000)}=1i 7"
    )
    c = HopCounterWindow("t", "a", "", 8, 1, 2, 3, 4, 5, 6)  # empty node tag is left out
    assert "\n".join(line(p) for p in counters_points(c)) == (
        "hop_counters,hop=a,trace=t matched=1i,tagged=2i,untagged=3i,parse_errors=4i,lost_events=5i,bytes=6i"
        " 8"
    )
    # throughput from the records: a second line of the same point (InfluxDB merges the fields)
    c.packets, c.payload_bytes, c.has_records, c.interval_ns = 10, 1_000, True, 500_000_000
    assert (
        line(counters_points(c)[1])
        == "hop_counters,hop=a,trace=t packets=10i,packets_per_s=20.0,bytes_per_s=2000.0 8"
    )
    c.has_counters = False
    assert len(counters_points(c)) == 1


def test_node_clock_and_tracer_loss_lines() -> None:
    assert line(node_clock_point(NodeClockPoint("n 1", 5, -300, 20_000, 10_500, 1.5))) == (
        r"node_clock,node=n\ 1 offset_ns=-300i,delay_ns=20000i,bound_ns=10500i,drift_ppm=1.5 5"
    )
    assert line(tracer_loss_point(TracerLossWindow("t", "n2", "", "agent_dropped", 9, 4))) == (
        "tracer_loss,node=n2,reason=agent_dropped,trace=t records=4i 9"
    )


def test_distinct_packets_never_share_a_timestamp_in_a_series() -> None:
    d = TimestampDeduper(horizon_ns=1_000)
    assert [d.unique(latency_point(sample(100, pid))) for pid in range(4)] == [100, 101, 102, 103]
    assert d.unique(latency_point(sample(101))) == 104
    assert d.unique(latency_point(sample(100)._replace(segment="b>c"))) == 100  # another series
    assert d.moved == 1 + 2 + 3 + 3
    # the same packet again (an exemplar exported twice, a replay): its first timestamp, so it overwrites
    assert d.unique(latency_point(sample(100, 2))) == 102 and d.unique(latency_point(sample(101))) == 104
    assert d.moved == 1 + 2 + 3 + 3 + 2 + 3


def test_config_validate() -> None:
    InfluxConfig().validate()
    for bad in (InfluxConfig(url="localhost:8086"), InfluxConfig(bucket=""), InfluxConfig(batch_size=0)):
        try:
            bad.validate()
        except ValueError:
            continue
        raise AssertionError(f"{bad} validated")
