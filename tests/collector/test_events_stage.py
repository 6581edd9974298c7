"""Event probes in the collector: cumulative `EventValues` become exact deltas in InfluxDB
(`event_counts`, `event_histogram`), and the report's "events" sum them back to what the probes saw, the
same through the API (`report_from_proto`) and in the text report."""

from __future__ import annotations

import json
import time
import uuid

import grpc
import pytest
from collector_helpers import batch
from google.protobuf.timestamp_pb2 import Timestamp

from hoptrace.collector.catalog import TraceCatalog
from hoptrace.collector.events import EVENT_COUNTS, EVENT_HISTOGRAM, EventsStage
from hoptrace.collector.influx import InfluxConfig
from hoptrace.collector.influx import line as line_protocol
from hoptrace.collector.receiver import ReceiverConfig
from hoptrace.collector.service import CollectorConfig, start_collector
from hoptrace.lab.processes import InfluxServer
from hoptrace.results.report_view import render_text, report_from_proto
from hoptrace.results.store import get_report, read_report
from hoptrace.v1 import api_pb2, records_pb2, records_pb2_grpc

SEC = 1_000_000_000


def event_values(
    index: int,
    name: str,
    at_s: int,
    counts: dict[int, int] | None = None,
    by: str = "",
    buckets: list[int] | None = None,
    arg: str = "",
    recorded: list[records_pb2.EventRecorded] | None = None,
    missed: int = 0,
) -> records_pb2.EventValues:
    e = records_pb2.EventValues(
        event_index=index, event=name, count_by=by, histogram=arg, recorded=recorded, latency_missed=missed
    )
    e.at.CopyFrom(Timestamp(seconds=at_s))
    if counts is not None:
        e.count = True
        e.counts.update(counts)
    e.buckets.extend(buckets or [])
    return e


def as_lines(points: list) -> list[str]:
    """The points as the InfluxDB exporter writes them."""
    return [line_protocol(p) for p in points]


@pytest.mark.unit
def test_a_stream_resumed_after_a_commit_takes_its_first_values_as_the_baseline() -> None:
    """Kafka: the partition's previous owner wrote the growth up to its commit; the new owner's first
    values per (trace, node) are cumulative over that, so they only set the baseline, and the growth
    after them comes out as the previous owner would have written it (identical lines: one point)."""
    now = int(time.time())
    values = [
        event_values(0, "rx", now + i, {0: 5 + 4 * i, 1: 2}, by="cpu", buckets=[0, 3 + i], arg="len")
        for i in range(3)
    ]
    continuous = EventsStage()
    written = [as_lines(continuous.add_events("t", "n1", [v])) for v in values]
    resumed = EventsStage()
    resumed.resume_after_commit()
    assert as_lines(resumed.add_events("t", "n1", [values[1]])) == [] and resumed.baselines == 4
    assert as_lines(resumed.add_events("t", "n1", [values[2]])) == written[2] != []
    # a key first seen after the first message grew from 0 since: counted in full
    later = event_values(0, "rx", now + 3, {0: 17, 1: 2, 5: 6}, by="cpu", buckets=[0, 6], arg="len")
    assert [line.split(" ")[1] for line in as_lines(resumed.add_events("t", "n1", [later]))] == [
        "count=4i",
        "count=6i",
        "count=1i",
    ]
    # another node's first message after the resume is a baseline too; without a commit it counts
    assert as_lines(resumed.add_events("t", "n2", [values[0]])) == []
    fresh = as_lines(EventsStage().add_events("t", "n2", [values[0]]))
    assert fresh == [line.replace("node=n1", "node=n2") for line in written[0]] != []


@pytest.mark.unit
def test_cumulative_event_values_become_deltas_and_a_restart_counts_in_full() -> None:
    stage = EventsStage()
    now = int(time.time())
    first = as_lines(stage.add_events("t", "n1", [event_values(0, "rx", now, {0: 5, 1: 2}, by="cpu")]))
    assert first == [
        f"{EVENT_COUNTS},by=cpu,event=rx,node=n1,trace=t,key=0 count=5i {now * SEC}",
        f"{EVENT_COUNTS},by=cpu,event=rx,node=n1,trace=t,key=1 count=2i {now * SEC}",
    ]
    second = as_lines(
        stage.add_events("t", "n1", [event_values(0, "rx", now + 1, {0: 9, 1: 2, 3: 1}, by="cpu")])
    )
    assert [line.split(" ")[1] for line in second] == ["count=4i", "count=1i"]  # key 1 did not grow
    third = as_lines(stage.add_events("t", "n1", [event_values(0, "rx", now + 2, {0: 3}, by="cpu")]))
    assert [line.split(" ")[1] for line in third] == ["count=3i"] and stage.resets == 1
    plain = as_lines(stage.add_events("t", "n1", [event_values(1, "all", now, {0: 7})]))
    assert plain == [f"{EVENT_COUNTS},by=total,event=all,node=n1,trace=t,key=0 count=7i {now * SEC}"]
    hist = as_lines(
        stage.add_events("t", "n1", [event_values(2, "sizes", now, buckets=[0, 0, 4, 0, 1], arg="len")])
    )
    assert hist == [
        f"{EVENT_HISTOGRAM},arg=len,event=sizes,node=n1,trace=t,le=3 count=4i {now * SEC}",
        f"{EVENT_HISTOGRAM},arg=len,event=sizes,node=n1,trace=t,le=15 count=1i {now * SEC}",
    ]


def test_event_values_through_influx_into_the_report(influxd: InfluxServer) -> None:
    influx = influxd
    trace = f"evs-{uuid.uuid4().hex[:8]}"
    catalog = TraceCatalog()
    catalog.set_trace(trace, ["a-out", "b-in"], ["node-a", "node-b"])
    config = CollectorConfig(
        receiver=ReceiverConfig(listen="127.0.0.1:0"),
        influx=InfluxConfig(url=influx.url, bucket=influx.bucket, org=influx.org, token=influx.token),
    )
    service = start_collector(config, catalog)
    now = int(time.time()) - 30
    # Three reports of cumulative values, one per second: the report must equal the last one.
    reports = [
        ({0: 10, 1: 5}, [0] * 10 + [3, 12]),
        ({0: 22, 1: 9}, [0] * 10 + [7, 20, 1]),
        ({0: 30, 1: 10}, [0] * 10 + [9, 30, 1]),
    ]
    # A record action's cumulative statistics: a signed argument whose values went negative (its sum falls)
    # and an unsigned one above 2^63 (stored as two's complement bits), and a latency's misses.
    big = (1 << 64) - 5
    bits = big - (1 << 64)
    recorded = [
        [records_pb2.EventRecorded(arg="delta", count=4, sum=10.0, min=-3, max=9, last=2, signed=True),
         records_pb2.EventRecorded(arg="addr", count=4, sum=0.0, min=7, max=bits, last=7)],
        [records_pb2.EventRecorded(arg="delta", count=6, sum=-5.0, min=-20, max=9, last=-20, signed=True),
         records_pb2.EventRecorded(arg="addr", count=5, sum=0.0, min=7, max=bits, last=bits)],
        [records_pb2.EventRecorded(arg="delta", count=6, sum=-5.0, min=-20, max=9, last=-20, signed=True),
         records_pb2.EventRecorded(arg="addr", count=5, sum=0.0, min=7, max=bits, last=bits)],
    ]  # fmt: skip
    try:
        with grpc.insecure_channel(f"127.0.0.1:{service.port}") as ch:
            stub = records_pb2_grpc.CollectorStub(ch)
            batches = []
            for seq, (counts, buckets) in enumerate(reports, start=1):
                b = batch("node-a", trace, [], seq=seq, clock_delta=0)
                b.events.append(
                    event_values(0, "rx", now + seq, counts, by="cpu", buckets=buckets, arg="len")
                )
                b.events.append(
                    event_values(1, "all", now + seq, {0: seq * 100}, recorded=recorded[seq - 1], missed=seq)
                )
                batches.append(b)
            stub.StreamRecords(iter(batches))
        assert service.flush(30)
    finally:
        service.stop()

    kw = {"url": influx.url, "bucket": influx.bucket, "org": influx.org, "token": influx.token}
    report = report_from_proto(read_report(trace, since="1h", path=["a-out", "b-in"], **kw))
    last = reports[-1][1]
    assert report["events"] == [
        {"name": "all", "node": "node-a", "count": 300, "count_by": "", "by": {}, "histogram_arg": "",
         "histogram": [], "latency_missed": 3,
         "recorded": [
             {"arg": "addr", "count": 5, "sum": 0.0, "mean": 0.0, "min": 7, "max": big, "last": big,
              "signed": False},
             {"arg": "delta", "count": 6, "sum": -5.0, "mean": -5 / 6, "min": -20, "max": 9, "last": -20,
              "signed": True},
         ]},
        {
            "name": "rx",
            "node": "node-a",
            "count": 40,
            "count_by": "cpu",
            "by": {"0": 30, "1": 10},
            "histogram_arg": "len",
            "histogram": [{"le": (1 << b) - 1, "count": n} for b, n in enumerate(last) if n],
            "latency_missed": 0,
            "recorded": [],
        },
    ]  # fmt: skip
    proto = get_report(api_pb2.GetReportRequest(trace=trace), path=["a-out", "b-in"], **kw)
    assert report_from_proto(proto)["events"] == json.loads(json.dumps(report["events"]))
    text = render_text(report)
    assert "events:\n  all on node-a: count 300\n" in text, text
    assert "\n  rx on node-a: count 40; by cpu: 0=30 1=10\n" in text, text
    assert "  len (n=40): <=1023 9, <=2047 30, <=4095 1" in text, text
    assert "  delta: n=6 sum=-5 mean=-0.833333 min=-20 max=9 last=-20" in text, text
