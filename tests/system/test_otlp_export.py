"""The collector's OpenTelemetry export against a real backend: Jaeger v2 (`make jaeger`, lab/otel.py) with
its in-memory storage, fed by the collector of a real cluster tracing a real flow on the two-host VXLAN
topology. A packet `hoptrace packets` shows is found in Jaeger by its trace ID, span for segment, each
span as long as the latency hoptrace reports; the segment histograms count what the report counts."""

from __future__ import annotations

import json
import os
import urllib.request
from collections.abc import Iterator
from datetime import datetime

import pytest
from system_helpers import running_cluster, wait_report

from hoptrace.collector.otlp import LATENCY_METRIC, trace_id
from hoptrace.lab.otel import Jaeger, start_jaeger
from hoptrace.lab.processes import udp_transfer
from hoptrace.lab.reference import vxlan_path_spec
from hoptrace.lab.waiting import wait_until

PACKETS = 200


@pytest.fixture
def jaeger() -> Iterator[Jaeger]:
    backend = start_jaeger()
    try:
        yield backend
    finally:
        backend.stop()


def collector_metrics(addr: str) -> dict[str, float]:
    """The collector's /metrics samples, by name with labels."""
    with urllib.request.urlopen(f"http://{addr}/metrics", timeout=10) as response:
        text = response.read().decode()
    return {
        line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line and not line.startswith("#")
    }


def check_trace(cluster, jaeger: Jaeger, spec, packet: dict) -> None:
    """Packet `packet` (as `hoptrace packets --json` shows it) is one trace in Jaeger: its root as long as
    its end-to-end latency, a child per segment starting at its offset, as long as its latency."""
    hops = {h.name: h for h in spec.hops}
    at_ns = int(datetime.fromisoformat(packet["at"]).timestamp()) * 1_000_000_000
    wanted = trace_id(spec.name, packet["packet_id"], at_ns)

    def whole_trace() -> list[dict] | None:
        cluster.check_running()
        spans = jaeger.trace_spans(wanted)
        return spans if len(spans) == len(spec.hops) else None

    spans = wait_until(whole_trace, f"trace {wanted:032x} of packet {packet['packet_id']} in jaeger", 30, 0.2)
    (root,) = [s for s in spans if not s.get("parentSpanId")]
    start, end = int(root["startTimeUnixNano"]), int(root["endTimeUnixNano"])
    assert root["name"] == spec.name
    assert end - start == packet["end_to_end_ns"]
    attributes = root["attributes"]
    assert attributes["hoptrace.trace"] == spec.name
    assert attributes["hoptrace.packet_id"] == packet["packet_id"]
    assert attributes["hoptrace.hops"] == list(hops)
    assert attributes["network.transport"] == "udp"
    assert attributes["source.address"] == spec.filter.src
    assert attributes["destination.address"] == spec.filter.dst
    assert attributes["destination.port"] == spec.filter.dst_port

    children = {s["name"]: s for s in spans if s.get("parentSpanId")}
    assert set(children) == {f"{s['from']}>{s['to']}" for s in packet["segments"]}
    assert len(children) == len(spec.hops) - 1
    for segment in packet["segments"]:
        span = children[f"{segment['from']}>{segment['to']}"]
        assert span["parentSpanId"] == root["spanId"]
        latency = segment["latency_ns"]
        # the packet's own times: its offset from the first hop, its latency (a negative one, within
        # the clocks' bound on the cross-node segment, ends where it starts and is kept as an attribute)
        assert int(span["startTimeUnixNano"]) - start == segment["offset_ns"], segment
        assert int(span["endTimeUnixNano"]) - int(span["startTimeUnixNano"]) == max(latency, 0), segment
        a = span["attributes"]
        assert a["hoptrace.latency_ns"] == latency
        assert a["hoptrace.packet_id"] == packet["packet_id"]
        for end_, hop in (("from", hops[segment["from"]]), ("to", hops[segment["to"]])):
            assert a[f"hoptrace.{end_}.hop"] == hop.name
            assert a[f"hoptrace.{end_}.node"] == hop.node == segment[f"{end_}_node"]
            assert a[f"hoptrace.{end_}.kind"] == hop.at
            assert a[f"hoptrace.{end_}.device"] == hop.dev
            assert a.get(f"hoptrace.{end_}.netns", "") == hop.netns


def test_packets_reach_jaeger_as_traces_of_their_segments(topology, influxd, jaeger) -> None:
    spec = vxlan_path_spec(topology, "otlp-e2e")
    # the slowest 3 per window, and no packet sampled by ID (--exemplar-every 0): the exemplars `hoptrace
    # packets` lists are then exactly the packets sent as traces
    args = ["--otlp-endpoint", jaeger.otlp_endpoint, "--otlp-insecure", "--otlp-sample", "slowest"]
    args += ["--exemplar-slowest", "3", "--exemplar-every", "0"]
    with running_cluster(topology, influxd.url, collector_args=args) as cluster:
        cluster.apply(spec)
        payloads = [os.urandom(64) for _ in range(PACKETS)]
        assert udp_transfer(topology, "c1", "c2", payloads, 4, spec.filter.dst_port, 0.002) == payloads
        report = wait_report(cluster, spec.name, PACKETS)
        packets = json.loads(cluster.hoptrace("packets", spec.name, "--slowest", "50", "--json").stdout)
        assert 3 <= len(packets) <= 9  # 3 per 1 s window: the flow's 0.4 s spans one to three
        for packet in packets:
            check_trace(cluster, jaeger, spec, packet)

        # the histograms: per segment, over its windows, the report's count, mean and max
        segments = {f"{s['from']}>{s['to']}": s for s in report["segments"]}
        segments["end_to_end"] = report["end_to_end"]

        def histograms() -> dict[str, list] | None:
            found: dict[str, list] = {}
            for attributes, point in jaeger.sink.exponential_histograms(LATENCY_METRIC):
                if attributes["hoptrace.trace"] == spec.name:
                    found.setdefault(attributes["hoptrace.segment"], []).append(point)
            counts = {name: sum(p.count for p in points) for name, points in found.items()}
            return found if counts == {name: s["count"] for name, s in segments.items()} else None

        found = wait_until(histograms, "every window's histogram relayed by jaeger", 30, 0.2)
        for name, points in found.items():
            count = sum(p.count for p in points)
            assert count == segments[name]["count"] == PACKETS
            assert max(p.max for p in points) == segments[name]["max_ns"], name
            assert abs(sum(p.sum for p in points) / count - segments[name]["mean_ns"]) < 1, name
            for p in points:  # the buckets hold every value of the window
                buckets = sum(p.positive.bucket_counts) + sum(p.negative.bucket_counts) + p.zero_count
                assert buckets == p.count, name

        sent = collector_metrics(cluster.metrics_addr("collector"))
        assert sent['hoptrace_collector_otlp_exported_total{signal="traces"}'] == len(packets)
        assert sent['hoptrace_collector_otlp_exported_total{signal="metrics"}'] >= len(segments)
        dropped = {k: v for k, v in sent.items() if k.startswith("hoptrace_collector_otlp_dropped_total")}
        assert dropped and not any(dropped.values()), dropped
