"""report.py: pieces that need no InfluxDB (the full report is checked in test_integration.py)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from google.protobuf.timestamp_pb2 import Timestamp

from hoptrace.collector.report import _order, flux_time, format_ns, render_text, report_to_proto

pytestmark = pytest.mark.unit  # pure code: make test-unit runs it without root


def stats(a: str, b: str, count: int = 3) -> dict:
    return {
        "from": a,
        "to": b,
        "count": count,
        "mean_ns": 1500.0,
        "p50_ns": 1200,
        "p90_ns": 2000,
        "p99_ns": 2500,
        "max_ns": 3_000_000,
        "incomplete": 1,
    }


def test_segment_order_from_path_or_chain() -> None:
    pairs = {"b>c": ("b", "c"), "a>b": ("a", "b"), "c>d": ("c", "d")}
    assert _order(pairs, None) == ["a>b", "b>c", "c>d"]
    assert _order(pairs, ["a", "b", "c", "d"]) == ["a>b", "b>c", "c>d"]
    assert _order({"b>c": ("b", "c")}, ["a", "b", "c"]) == ["a>b", "b>c"]


def test_flux_time() -> None:
    assert flux_time("10m", "-1h") == "-10m"
    assert flux_time("-1h30m", "-1h") == "-1h30m"
    assert flux_time(None, "now()") == "now()"
    assert flux_time(Timestamp(seconds=0), "now()") == "now()"
    assert flux_time(Timestamp(seconds=1_700_000_000, nanos=5), "") == "2023-11-14T22:13:20.000000005Z"
    assert flux_time(datetime(2024, 1, 2, 3, 4, 5, 6, tzinfo=UTC), "") == "2024-01-02T03:04:05.000006000Z"
    with pytest.raises(ValueError):
        flux_time("10 minutes); drop()", "-1h")


def test_text_table_and_proto() -> None:
    report = {
        "trace": "demo",
        "packets": 4,
        "complete": 3,
        "segments": [stats("a", "b"), stats("b", "c")],
        "end_to_end": stats("a", "c"),
    }
    report["segments"][0].update(loss_count=2, loss_rate=0.02, jitter_ns=350.0, same_node=True)
    report["segments"][1].update(below_clock_bound=True, tracer_lost=7)
    report["hops"] = [{"hop": "a", "packets_per_s": 100.0, "bytes_per_s": 12_800.0}]
    lines = render_text(report).splitlines()
    assert lines[0] == "trace demo: 4 packets, 3 complete"
    head = ["segment", "count", "mean", "p50", "p90", "p99", "max", "incomplete", "loss", "loss%", "jitter"]
    assert lines[1].split() == head
    assert lines[2].split() == [
        *["a", ">", "b", "[node]", "3", "1.5us", "1.2us", "2.0us", "2.5us", "3.00ms", "1"],
        *["2", "2.00", "350ns"],
    ]
    assert lines[3].split()[:4] == ["b", ">", "c", "[<clock]"]
    assert lines[4].startswith("end to end (a > c)")
    assert len({len(line) for line in lines[1:5]}) == 1  # aligned columns
    assert lines[6].split() == ["hop", "packets/s", "bytes/s"] and lines[7].split() == [
        "a",
        "100.0",
        "12800.0",
    ]
    assert "note: b > c: latency below the clocks' alignment bound" in lines
    assert "note: b > c: 7 records lost by the tracer (not counted)" in lines
    assert format_ns(850) == "850ns" and format_ns(2.5e9) == "2.50s"
    proto = report_to_proto(report)
    assert [getattr(s, "from") + ">" + s.to for s in proto.segments] == ["a>b", "b>c"]
    assert (proto.end_to_end.p99_ns, proto.packets, proto.complete) == (2500, 4, 3)
    assert (proto.segments[0].loss_count, proto.segments[0].loss_rate, proto.segments[0].jitter_ns) == (
        2,
        0.02,
        350,
    )
    assert proto.segments[0].same_node and proto.segments[1].below_clock_bound
    assert proto.segments[1].tracer_lost == 7
    assert [(h.hop, h.packets_per_s, h.bytes_per_s) for h in proto.hops] == [("a", 100.0, 12_800.0)]
