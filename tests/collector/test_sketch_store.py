"""Sketches through a real InfluxDB: two collectors write the same trace, segments and seconds, one of them
twice (a replay after a crash); the report merges by content, and its percentiles are within 1 % of the
exact ones computed from the known latencies. The waterfall still finds the slowest packets (exemplars).
Also: how many points a traced packet costs at the default settings, through the whole pipeline."""

from __future__ import annotations

import math
import random
import time
import uuid

import pytest
from collector_helpers import pid, rec

from hoptrace.collector.aggregate import END_TO_END, AggregateConfig, SegmentAggregator, SegmentWindow
from hoptrace.collector.catalog import TraceCatalog
from hoptrace.collector.influx import InfluxConfig, InfluxExporter
from hoptrace.collector.join import JoinedPacket
from hoptrace.collector.pipeline import CollectorPipeline
from hoptrace.collector.points import Point, window_points
from hoptrace.collector.records import decode_batch, hop_counters, pack_records
from hoptrace.lab.processes import InfluxServer
from hoptrace.results.report_view import report_from_proto
from hoptrace.results.store import get_packets, read_report
from hoptrace.v1 import api_pb2, records_pb2

SEC = 1_000_000_000
HOPS = ["a", "b", "c"]
NODES = ["n1", "n1", "n2"]
SEGMENTS = {"a>b": (0, 1), "b>c": (1, 2), END_TO_END: (0, 2)}


def nearest_rank(values: list[int], q: float) -> int:
    v = sorted(values)
    return v[max(0, math.ceil(q * len(v)) - 1)]


def synthetic_packets(trace: str, start_ns: int, seconds: int, per_second: int) -> list[JoinedPacket]:
    """Packets with known latencies: a few us with a long tail on a>b, a bimodal b>c (a queue that fills)."""
    rng = random.Random(2024)
    packets = []
    for i in range(seconds * per_second):
        t0 = start_ns + i * SEC // per_second
        t1 = t0 + max(1, round(rng.lognormvariate(math.log(2_500), 0.5)))
        t2 = t1 + (rng.randint(40_000, 60_000) if rng.random() < 0.95 else rng.randint(300_000, 900_000))
        packets.append(JoinedPacket(trace, 7, pid(i + 1), [t0, t1, t2], list(NODES), True))
    return packets


def test_two_collectors_and_a_replay_merge_by_content(influxd: InfluxServer) -> None:
    trace = f"sketch-{uuid.uuid4().hex[:8]}"
    catalog = TraceCatalog()
    catalog.set_trace(trace, HOPS, NODES)
    start = (time.time_ns() - 60 * SEC) // SEC * SEC
    packets = synthetic_packets(trace, start, seconds=3, per_second=2_000)
    truth = {seg: [p.times[b] - p.times[a] for p in packets] for seg, (a, b) in SEGMENTS.items()}

    exporter = InfluxExporter(InfluxConfig(url=influxd.url, bucket=influxd.bucket, flush_interval_s=0.2))
    try:
        for instance, part in (("c1", 0), ("c2", 1)):  # packets split between them, as by partitions
            agg = SegmentAggregator(catalog, config=AggregateConfig(instance=instance))
            sampled = agg.add_packets([p for p in packets if p.packet_id % 2 == part])
            windows = agg.flush()
            exemplars = sampled + agg.take_exemplars()
            assert len({w.start_ns for w in windows}) == 3  # both write the same seconds
            exporter.export(window_points(exemplars, windows))
            if instance == "c1":  # c1 crashed after writing and replays the same windows
                exporter.export(window_points(exemplars, windows))
        # while the path was being learned, 5 packets went into an end-to-end window under placeholder names
        placeholder = SegmentWindow(trace, END_TO_END, "hop0", "hop2", start, 0, 0.0, 0, 0, 0, 0, 5, 5, 0)
        exporter.export(window_points(segments=[placeholder]))
        assert exporter.flush(30) and exporter.dropped == 0
    finally:
        exporter.close()

    kw = {"url": influxd.url, "bucket": influxd.bucket}
    report = report_from_proto(read_report(trace, since="1h", path=HOPS, **kw))
    # every window adds up by segment, whatever hop names it was written under; the names most packets had
    assert (report["packets"], report["complete"]) == (len(packets) + 5, len(packets))
    assert (report["end_to_end"]["from"], report["end_to_end"]["to"]) == ("a", "c")
    assert report["end_to_end"]["incomplete"] == 5
    by_segment = {f"{s['from']}>{s['to']}": s for s in report["segments"]}
    by_segment[END_TO_END] = report["end_to_end"]
    assert list(by_segment) == list(SEGMENTS)
    for segment, values in truth.items():
        got = by_segment[segment]
        # counts and sums add up over both collectors, once each: the replay overwrote itself
        assert got["count"] == len(values), segment
        assert got["mean_ns"] == pytest.approx(sum(values) / len(values), rel=1e-12), segment
        assert got["max_ns"] == max(values), segment
        for q, key in ((0.5, "p50_ns"), (0.9, "p90_ns"), (0.99, "p99_ns")):
            exact = nearest_rank(values, q)
            error = abs(got[key] - exact) / exact
            print(f"{segment} {key}: report {got[key]} exact {exact} error {100 * error:.3f} %")
            assert error <= 0.01, (segment, key, got[key], exact)

    # The waterfall's slowest packets, from the exemplars: each collector kept its 3 slowest per second,
    # so the 3 slowest of the range are there.
    slowest = get_packets(api_pb2.GetPacketsRequest(trace=trace, slowest=3), path=HOPS, **kw)
    expected = sorted(truth[END_TO_END], reverse=True)[:3]
    assert [p.end_to_end_ns for p in slowest.packets] == expected
    assert all(len(p.segments) == 2 for p in slowest.packets)


def count_points(exported: dict[str, int]):  # noqa: ANN201 - an Exporter that counts stored points
    """An exporter that counts the points InfluxDB would keep, by measurement: one per series and time (the
    counter deltas and the throughput of a hop's window are two points of one series and time, merged)."""
    stored: set[tuple] = set()

    class Counting:
        def export(self, points: list[Point]) -> None:
            for p in points:
                if (p.measurement, p.tags, p.time_ns) not in stored:
                    stored.add((p.measurement, p.tags, p.time_ns))
                    exported[p.measurement] += 1

    return Counting()


@pytest.mark.unit
def test_points_per_traced_packet_at_default_settings() -> None:
    """The demo's shape (an 8-hop path over two nodes, 1000 packets/s, 10 s, counters every second):
    at most 0.1 InfluxDB points per traced packet with the default exemplar settings."""
    hops = [f"h{i}" for i in range(8)]
    nodes = ["n1"] * 4 + ["n2"] * 4
    catalog = TraceCatalog()
    catalog.set_trace("demo", hops, nodes)
    exported = dict.fromkeys(("hop_latency", "segment_stats", "hop_counters", "node_clock", "tracer_loss"), 0)
    pipeline = CollectorPipeline(count_points(exported), catalog)
    base, rate, seconds = 1_700_000_000 * SEC, 1_000, 10
    rng = random.Random(8)
    for second in range(seconds):
        per_node: dict[str, list] = {"n1": [], "n2": []}
        for i in range(rate):
            seq = second * rate + i + 1
            t = base + second * SEC + i * (SEC // rate)
            for hop, node in enumerate(nodes):
                t += rng.randint(1_000, 20_000)
                per_node[node].append(rec(t, pid(seq), hop))
        for node, records in per_node.items():
            counters = [
                hop_counters(h, hops[h], matched=(second + 1) * rate) for h in range(8) if nodes[h] == node
            ]
            msg = records_pb2.RecordBatch(
                node=node, trace="demo", records=pack_records(records), counters=counters
            )
            pipeline.consume(decode_batch(msg))
    pipeline.flush()
    packets = seconds * rate
    assert pipeline.stats()["complete"] == packets
    points = sum(exported.values())
    print(f"points per traced packet: {points / packets:.4f} ({exported})")
    assert exported["segment_stats"] == 8 * seconds  # 7 segments and end to end, each second
    assert exported["hop_latency"] > 0  # exemplars remain
    assert points / packets <= 0.1
