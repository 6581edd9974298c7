"""captures.py: the capture action's bytes, decoded from the wire, written as hop_capture points within each
trace's budget per second, and their line protocol."""

from __future__ import annotations

import base64

import pytest
from collector_helpers import batch, pid, rec

from hoptrace import kernel_abi
from hoptrace.collector.captures import CaptureConfig, HopCapturesStage
from hoptrace.collector.catalog import TraceCatalog
from hoptrace.collector.influx import line
from hoptrace.collector.pipeline import CollectorConfig, CollectorPipeline
from hoptrace.collector.records import (
    CAPTURE_STRUCT,
    F_CAPTURE,
    F_VALUES,
    VALUES_STRUCT,
    Capture,
    RecordDecodeError,
    decode_batch,
    decode_captures,
)
from hoptrace.collector.schema import HOP_CAPTURE

pytestmark = pytest.mark.unit  # pure code: make test-unit runs it without root

ETHERNET, RAW = kernel_abi.CAPTURE_LINK_ETHERNET, kernel_abi.CAPTURE_LINK_RAW


def packed(wire_len: int, data: bytes, link_type: int = ETHERNET, stale: bytes = b"") -> bytes:
    """struct hoptrace_capture as the agent sends it (bytes past the captured ones zero, or `stale`)."""
    return CAPTURE_STRUCT.pack(
        wire_len, len(data), link_type, (data + stale).ljust(kernel_abi.CAPTURE_MAX, b"\0")
    )


class Offset:
    """A node clock `delta` ns ahead of master."""

    def __init__(self, delta: int) -> None:
        self.delta = delta

    def to_master(self, ts_ns: int) -> int:
        return ts_ns - self.delta


def test_decode_pairs_each_capturing_record_with_its_bytes_in_order():
    records = [
        rec(1, pid(1), 0, flags=F_CAPTURE),
        rec(2, pid(2), 0),
        rec(3, pid(3), 1, flags=F_CAPTURE | F_VALUES),
    ]
    data = packed(1514, b"\x01" * 96) + packed(60, b"\x45\x00", RAW, stale=b"\xee\xee")
    got = decode_captures(records, data)
    assert got == [
        (records[0], Capture(1514, ETHERNET, b"\x01" * 96)),
        (records[2], Capture(60, RAW, b"\x45\x00")),  # its captured bytes only
    ]
    with pytest.raises(RecordDecodeError, match="136 bytes of captures for 2 records"):
        decode_captures(records, data[: CAPTURE_STRUCT.size])
    too_long = bytearray(packed(60, b"x"))
    too_long[4] = kernel_abi.CAPTURE_MAX + 1
    with pytest.raises(RecordDecodeError, match="129 bytes, at most 128"):
        decode_captures(records[:1], bytes(too_long))
    assert decode_captures([records[1]], b"") == []


def test_decode_batch_carries_the_captures_beside_the_values():
    msg = batch("a", "t", [rec(1, pid(1), 0, flags=F_CAPTURE | F_VALUES)])
    msg.values, msg.value_size = VALUES_STRUCT.pack(2, 0, 0, 0, 1, 100, 0, 0, 0), VALUES_STRUCT.size
    msg.captures, msg.capture_size = packed(100, b"frame"), CAPTURE_STRUCT.size
    decoded = decode_batch(msg)
    assert decoded.captures == [(decoded.records[0], Capture(100, ETHERNET, b"frame"))]
    assert decoded.values[0][1] == {2: 100}


def test_points_at_master_time_within_each_traces_budget_per_second():
    stage = HopCapturesStage(CaptureConfig(per_trace_per_s=10))
    second = 1_000_000_000
    delta = 5_000  # the node's clock runs 5 us ahead: points are at master time

    def captures(trace_ts: list[int]) -> list:
        return [
            (rec(ts, pid(i + 1), 1), Capture(200, ETHERNET, bytes([i % 256]) * 64))
            for i, ts in enumerate(trace_ts)
        ]

    # 25 packets in the first second, 4 in the next, for each of two traces (the budget is per trace).
    times = [10 * second + delta + 1_000 * i for i in range(25)]
    times += [11 * second + delta + 1_000 * i for i in range(4)]
    points = {
        trace: stage.add(trace, "host-b", captures(times), Offset(delta), lambda i: f"hop{i}")
        for trace in "tu"
    }
    for trace in "tu":
        got = points[trace]
        assert len(got) == 14, trace
        assert [p.field("packet_id") for p in got] == [pid(i + 1) for i in [*range(10), *range(25, 29)]]
        first = got[0]
        assert first.measurement == HOP_CAPTURE
        assert first.tags == (("hop", "hop1"), ("node", "host-b"), ("trace", trace))
        assert first.time_ns == 10 * second  # the record's ts, aligned
        assert base64.b64decode(first.field("bytes")) == b"\x00" * 64
        assert (first.field("wire_len"), first.field("link_type")) == (200, ETHERNET)
    assert stage.written == {"t": 14, "u": 14} and stage.dropped == {"t": 15, "u": 15}
    # A later batch of the same second (another node's hop) finds the budget spent.
    assert stage.add("t", "host-a", captures([10 * second + 7]), Offset(0), str) == []
    assert stage.dropped["t"] == 16
    stage.forget_traces({"u"})
    assert len(stage.add("t", "host-a", captures([10 * second + 7]), Offset(0), str)) == 1  # a fresh trace


def test_the_bytes_are_a_quoted_string_field_in_line_protocol():
    point = HopCapturesStage().add(
        "t,1", "n", [(rec(42, pid(7), 0), Capture(60, RAW, b"\xfb\xff\xfe"))], Offset(0), lambda i: "a hop"
    )[0]
    assert line(point) == (
        "hop_capture,hop=a\\ hop,node=n,trace=t\\,1"
        f' packet_id={pid(7)}i,wire_len=60i,link_type=101i,bytes="+//+" 42'
    )


def test_the_pipeline_names_the_hops_of_the_batchs_captures():
    catalog = TraceCatalog()
    catalog.set_trace("t", ["a-out", "b-in"], ["a", "b"])
    points = []

    class Exporter:
        def export(self, batch_points) -> None:
            points.extend(batch_points)

    pipeline = CollectorPipeline(Exporter(), catalog)
    msg = batch("b", "t", [rec(100, pid(3), 1, flags=F_CAPTURE), rec(101, pid(4), 1)], clock_delta=0)
    msg.captures, msg.capture_size = packed(90, b"abc"), CAPTURE_STRUCT.size
    pipeline.consume(decode_batch(msg))
    captured = [p for p in points if p.measurement == HOP_CAPTURE]
    assert [(p.tag("hop"), p.tag("node"), p.field("packet_id")) for p in captured] == [("b-in", "b", pid(3))]
    assert pipeline.stats()["captures_written"] == {"t": 1}


class Discard:
    def export(self, points) -> None:
        pass


def test_the_collectors_budget_reaches_its_pipeline():
    with pytest.raises(ValueError, match="per_trace_per_s must be >= 0"):
        CollectorConfig(capture=CaptureConfig(per_trace_per_s=-1)).validate()
    assert CollectorPipeline(Discard()).captures.config.per_trace_per_s == CaptureConfig.per_trace_per_s
    pipeline = CollectorPipeline(Discard(), capture_config=CaptureConfig(per_trace_per_s=2))
    msg = batch("b", "t", [rec(100 + i, pid(i + 1), 0, flags=F_CAPTURE) for i in range(5)], clock_delta=0)
    msg.captures, msg.capture_size = packed(90, b"abc") * 5, CAPTURE_STRUCT.size
    pipeline.consume(decode_batch(msg))
    assert (pipeline.stats()["captures_written"], pipeline.stats()["captures_dropped"]) == (
        {"t": 2},
        {"t": 3},
    )
