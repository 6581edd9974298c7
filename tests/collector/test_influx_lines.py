"""influx.py: the line protocol of the three measurements and timestamp de-duplication."""

from __future__ import annotations

from hoptrace.collector.aggregate import HopCounterWindow, LatencySample, SegmentWindow
from hoptrace.collector.influx import (
    InfluxConfig,
    TimestampDeduper,
    counters_line,
    latency_line,
    segment_line,
)


def sample(ts: int, pid: int = 5, latency: int = 1_234, flag: bool = False) -> LatencySample:
    return LatencySample("my trace", "a>b", "a", "b", "n1", "n,2", ts, latency, pid, flag)


def test_hop_latency_line() -> None:
    assert latency_line(sample(99)) == (
        r"hop_latency,from_hop=a,from_node=n1,segment=a>b,to_hop=b,to_node=n\,2,trace=my\ trace "
        "latency_ns=1234i,packet_id=5i 99"
    )
    assert latency_line(sample(99, latency=-3, flag=True)).endswith(
        "latency_ns=-3i,packet_id=5i,below_clock_bound=true 99"
    )


def test_segment_stats_and_counters_lines() -> None:
    w = SegmentWindow("t", "a>b", "a", "b", 7, 3, 12.5, 10, 11, 12, 13, 2)
    assert segment_line(w) == (
        "segment_stats,from_hop=a,segment=a>b,to_hop=b,trace=t "
        "count=3i,mean_ns=12.5,p50_ns=10i,p90_ns=11i,p99_ns=12i,max_ns=13i,incomplete=2i 7"
    )
    w.packets, w.complete = 5, 4
    assert segment_line(w).endswith("incomplete=2i,packets=5i,complete=4i 7")
    c = HopCounterWindow("t", "a", "", 8, 1, 2, 3, 4, 5, 6)  # empty node tag is left out
    assert counters_line(c) == (
        "hop_counters,hop=a,trace=t matched=1i,tagged=2i,untagged=3i,parse_errors=4i,lost_events=5i,bytes=6i"
        " 8"
    )


def test_distinct_packets_never_share_a_timestamp_in_a_series() -> None:
    d = TimestampDeduper(horizon_ns=1_000)
    assert [d.unique(sample(100, pid)) for pid in range(4)] == [100, 101, 102, 103]
    assert d.unique(sample(101)) == 104
    assert d.unique(sample(100)._replace(segment="b>c")) == 100  # another series
    assert d.moved == 1 + 2 + 3 + 3


def test_config_validate() -> None:
    InfluxConfig().validate()
    for bad in (InfluxConfig(url="localhost:8086"), InfluxConfig(bucket=""), InfluxConfig(batch_size=0)):
        try:
            bad.validate()
        except ValueError:
            continue
        raise AssertionError(f"{bad} validated")
