"""Hop actions in the collector: cumulative counts and histograms become exact deltas in InfluxDB, and the
report's per-hop "counts" / "histograms" sum them back to what the hops saw."""

from __future__ import annotations

import json
import time
import uuid

import grpc
import pytest
from collector_helpers import batch
from google.protobuf.timestamp_pb2 import Timestamp

from hoptrace.collector.actions import (
    HOP_COUNTS,
    HOP_HISTOGRAM,
    HOP_RECORDED,
    HopActionsStage,
    RecordedValuesStage,
    bucket_le,
)
from hoptrace.collector.catalog import TraceCatalog
from hoptrace.collector.influx import InfluxConfig
from hoptrace.collector.influx import line as line_protocol
from hoptrace.collector.receiver import ReceiverConfig
from hoptrace.collector.records import (
    RECORD_SIZE,
    VALUES_SIZE,
    VALUES_STRUCT,
    RecordDecodeError,
    RecordFlag,
    decode_batch,
    decode_values,
    hop_counters,
    pack_records,
)
from hoptrace.collector.service import CollectorConfig, start_collector
from hoptrace.lab.processes import InfluxServer
from hoptrace.results.report_view import count_text, hop_actions_lines, render_text, report_from_proto
from hoptrace.results.store import get_report, read_report
from hoptrace.results.store_actions import key_name
from hoptrace.v1 import api_pb2, counters_pb2, records_pb2, records_pb2_grpc

SEC = 1_000_000_000


def with_actions(
    hop_index: int,
    hop: str,
    at_s: int,
    counts: dict[int, int] | None = None,
    by: int = 0,
    buckets: list[int] | None = None,
    field: int = 0,
) -> records_pb2.HopCounters:
    c = hop_counters(hop_index, hop, matched=sum((counts or {}).values()))
    c.at.CopyFrom(Timestamp(seconds=at_s))
    if counts is not None:
        c.actions.count = True
        c.actions.count_by = by
        c.actions.counts.update(counts)
    if buckets is not None:
        c.actions.histogram = field
        c.actions.buckets.extend(buckets)
    return c


def as_lines(points: list) -> list[str]:
    """The points as the InfluxDB exporter writes them."""
    return [line_protocol(p) for p in points]


@pytest.mark.unit
def test_cumulative_values_become_deltas_and_a_restart_counts_in_full() -> None:
    stage = HopActionsStage()
    now = int(time.time())
    first = as_lines(
        stage.add_counters("t", "n1", [with_actions(1, "b-in", now, {0: 5, 1: 2}, by=counters_pb2.FIELD_CPU)])
    )
    assert first == [
        f"{HOP_COUNTS},by=cpu,hop=b-in,node=n1,trace=t,key=0 count=5i {now * SEC}",
        f"{HOP_COUNTS},by=cpu,hop=b-in,node=n1,trace=t,key=1 count=2i {now * SEC}",
    ]
    second = as_lines(
        stage.add_counters(
            "t", "n1", [with_actions(1, "b-in", now + 1, {0: 9, 1: 2, 3: 1}, by=counters_pb2.FIELD_CPU)]
        )
    )
    assert [line.split(" ")[1] for line in second] == ["count=4i", "count=1i"]  # key 1 did not grow
    # The hop was attached again: its values start over and count in full.
    third = as_lines(
        stage.add_counters("t", "n1", [with_actions(1, "b-in", now + 2, {0: 3}, by=counters_pb2.FIELD_CPU)])
    )
    assert [line.split(" ")[1] for line in third] == ["count=3i"] and stage.resets == 1
    hist = as_lines(
        stage.add_counters(
            "t",
            "n1",
            [with_actions(2, "b-rx", now, buckets=[0, 0, 4, 0, 1], field=counters_pb2.FIELD_LATENCY)],
        )
    )
    assert hist == [
        f"{HOP_HISTOGRAM},field=latency,hop=b-rx,node=n1,trace=t,le=3 count=4i {now * SEC}",
        f"{HOP_HISTOGRAM},field=latency,hop=b-rx,node=n1,trace=t,le=15 count=1i {now * SEC}",
    ]
    assert stage.add_counters("t", "n1", [hop_counters(0, "a-out", matched=3)]) == []  # no actions


def test_counts_and_histograms_through_influx_into_the_report(influxd: InfluxServer) -> None:
    influx = influxd
    trace = f"acts-{uuid.uuid4().hex[:8]}"
    catalog = TraceCatalog()
    catalog.set_trace(trace, ["a-out", "b-in"], ["node-a", "node-b"])
    config = CollectorConfig(
        receiver=ReceiverConfig(listen="127.0.0.1:0"),
        influx=InfluxConfig(url=influx.url, bucket=influx.bucket, org=influx.org, token=influx.token),
    )
    service = start_collector(config, catalog)
    now = int(time.time()) - 30
    cpu, latency = counters_pb2.FIELD_CPU, counters_pb2.FIELD_LATENCY
    # Three reports of cumulative values, one per second: the report must equal the last one.
    reports = [
        ({0: 10, 1: 5}, [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 3, 12]),
        ({0: 22, 1: 9}, [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 7, 20, 1]),
        ({0: 30, 1: 10}, [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 9, 30, 1]),
    ]
    try:
        with grpc.insecure_channel(f"127.0.0.1:{service.port}") as ch:
            stub = records_pb2_grpc.CollectorStub(ch)
            batches = []
            for seq, (counts, buckets) in enumerate(reports, start=1):
                b = batch("node-b", trace, [], seq=seq, clock_delta=0)
                b.counters.append(
                    with_actions(1, "b-in", now + seq, counts, by=cpu, buckets=buckets, field=latency)
                )
                batches.append(b)
            stub.StreamRecords(iter(batches))
        assert service.flush(30)
    finally:
        service.stop()

    kw = {"url": influx.url, "bucket": influx.bucket, "org": influx.org, "token": influx.token}
    report = report_from_proto(read_report(trace, since="1h", path=["a-out", "b-in"], **kw))
    hop = next(h for h in report["hops"] if h["hop"] == "b-in")
    assert hop["counts"] == [
        {"node": "node-b", "by": "cpu", "key": 0, "count": 30},
        {"node": "node-b", "by": "cpu", "key": 1, "count": 10},
    ]
    last = reports[-1][1]
    assert hop["histograms"] == [
        {
            "node": "node-b",
            "field": "latency",
            "total": sum(last),
            "buckets": [{"le": bucket_le(b), "count": n} for b, n in enumerate(last) if n],
        }
    ]
    # The API carries the same, and `hoptrace report --json` prints it.
    proto = get_report(api_pb2.GetReportRequest(trace=trace), path=["a-out", "b-in"], **kw)
    from_api = report_from_proto(proto)
    assert next(h for h in from_api["hops"] if h["hop"] == "b-in") == json.loads(json.dumps(hop))
    text = render_text(report)
    assert "b-in @node-b: count by cpu: 0=30 1=10" in text
    assert "b-in @node-b: histogram latency (n=40): <=1.0us 9, <=2.0us 30, <=4.1us 1" in text


def _traced(hop_index: int, ts: int, packet_id: int, values: bool) -> tuple[int, ...]:
    flags = int(RecordFlag.UDP) | (int(RecordFlag.VALUES) if values else 0)
    return (ts, packet_id, 7, 2, 110, hop_index, 1, 0, flags)


@pytest.mark.unit
def test_recorded_values_pair_with_their_records_and_aggregate_per_hop_and_field() -> None:
    # Hop 1 records len and ttl of every packet; hop 0 records nothing (its records carry no values).
    sizes = [110, 90, 1500, 64]
    records, values = [], b""
    for i, size in enumerate(sizes):
        records.append(_traced(0, 1000 + i, 0x01000001 + i, False))
        records.append(_traced(1, 2000 + i, 0x01000001 + i, True))
        values += VALUES_STRUCT.pack(
            counters_pb2.FIELD_LEN, counters_pb2.FIELD_TTL, 0, 0, 2, size, 37 + i, 0, 0
        )
    msg = records_pb2.RecordBatch(
        node="n1",
        trace="t",
        records=pack_records(records),
        record_size=RECORD_SIZE,
        values=values,
        value_size=VALUES_SIZE,
    )
    decoded = decode_batch(msg)
    assert [(rec[1], fields) for rec, fields in decoded.values] == [
        (0x01000001 + i, {counters_pb2.FIELD_LEN: size, counters_pb2.FIELD_TTL: 37 + i})
        for i, size in enumerate(sizes)
    ]

    class Shift:
        def to_master(self, ts_ns: int) -> int:
            return ts_ns + 5

    lines = as_lines(
        RecordedValuesStage().add_values("t", "n1", decoded.values, Shift(), lambda i: f"hop-{i}")
    )
    assert lines == [
        f"{HOP_RECORDED},field=len,hop=hop-1,node=n1,trace=t count=4i,sum={float(sum(sizes))},min=64i,"
        f"max=1500i,last=64i {2003 + 5}",
        f"{HOP_RECORDED},field=ttl,hop=hop-1,node=n1,trace=t count=4i,sum={float(37 + 38 + 39 + 40)},min=37i,"
        f"max=40i,last=40i {2003 + 5}",
    ]


@pytest.mark.unit
def test_values_that_do_not_match_their_records_are_refused() -> None:
    records = [_traced(1, 1, 0x01000001, True), _traced(1, 2, 0x01000002, True)]
    one = VALUES_STRUCT.pack(counters_pb2.FIELD_LEN, 0, 0, 0, 1, 60, 0, 0, 0)
    with pytest.raises(RecordDecodeError, match="40 bytes of values for 2 records"):
        decode_values(records, one)
    assert decode_values([_traced(1, 1, 0x01000001, False)], b"") == []


@pytest.mark.unit
def test_the_text_report_shows_each_recorded_field() -> None:
    hops = [
        {
            "hop": "b-c2-in",
            "counts": [],
            "histograms": [],
            "recorded": [
                {
                    "node": "host-b",
                    "field": "len",
                    "count": 200,
                    "min": 110,
                    "max": 110,
                    "mean": 110.0,
                    "last": 110,
                }
            ],
        }
    ]
    assert hop_actions_lines(hops) == [
        "b-c2-in @host-b: recorded len (n=200): min 110 mean 110.0 max 110 last 110"
    ]


def test_a_comm_key_reads_as_the_task_name() -> None:
    """comm's value is the name's first 8 bytes, little-endian: the report and its text show the name."""
    key = int.from_bytes(b"sockperf", "little")
    assert key_name("comm", key) == "sockperf"
    assert key_name("comm", int.from_bytes(b"nc\0\0\0\0\0\0", "little")) == "nc"
    assert key_name("cpu", 3) == ""  # a number stays a number
    counts = [
        {"node": "b", "by": "comm", "key": key, "count": 7, "key_name": "sockperf"},
        {"node": "b", "by": "cpu", "key": 1, "count": 5},
    ]
    assert count_text(counts) == "count by comm: sockperf=7; count by cpu: 1=5"
