"""otlp.py: a translation between two hops as a `nat` event on its segment's span (the packet's own tuples
when it described them, else the trace's last), and a packet the kernel dropped as its spans up to its last
hop and the segment it was lost in (an ERROR span with a `drop` event), through a real pipeline."""

from __future__ import annotations

import pytest
from collector_helpers import batch, pid, rec
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode
from test_addresses import BACKEND, CLIENT, MASQUERADED, packed
from test_join_drops import BASE, DROP_B, REASONS_A, REASONS_B, drop_batch, path_batch
from test_otlp import MetricSink, Points

from hoptrace.collector.aggregate import AggregateConfig
from hoptrace.collector.catalog import DropSite, TraceCatalog
from hoptrace.collector.otlp import OtlpConfig, OtlpExporter, beside, trace_id
from hoptrace.collector.pipeline import CollectorPipeline
from hoptrace.collector.records import ADDRESSES_STRUCT, F_ADDRESSES, decode_batch

pytestmark = pytest.mark.unit  # pure code: make test-unit runs it without root

HOPS = ["a-out", "b-in", "b-read"]
SLOW = 100_000  # packet 9's time to b-in: the slowest of its window
NODES = ["host-a", "host-b", "host-b"]


def pipeline_to(
    config: OtlpConfig, aggregate: AggregateConfig
) -> tuple[CollectorPipeline, OtlpExporter, list]:
    catalog = TraceCatalog()
    catalog.set_trace(
        "t",
        HOPS,
        NODES,
        drop_hops=[
            DropSite(3, "host-a", "drops@host-a", REASONS_A),
            DropSite(DROP_B, "host-b", "drops@host-b", REASONS_B),
        ],
    )
    spans = InMemorySpanExporter()
    otlp = OtlpExporter(
        config,
        catalog,
        exemplar_every=aggregate.exemplar_every,
        span_exporter=spans,
        metric_exporter=MetricSink(),
    )
    pipeline = CollectorPipeline(beside(Points(), otlp), catalog, aggregate_config=aggregate)
    return pipeline, otlp, spans


def t(seq: int, hop: int) -> int:
    return BASE + seq * 5_000_000 + hop * 10_000 + seq


def by_trace(spans) -> dict[int, dict[str, object]]:
    out: dict[int, dict[str, object]] = {}
    for s in spans:
        out.setdefault(s.context.trace_id, {})[s.name] = s
    return out


def test_a_translation_is_a_nat_event_with_the_packets_own_tuples_or_the_traces_last() -> None:
    config = OtlpConfig(endpoint="backend:4317", insecure=True, sample="all")
    pipeline, otlp, spans = pipeline_to(config, AggregateConfig(exemplar_slowest=0, exemplar_every=1))
    # packets 1..4 at every hop; 1 describes its addresses: DNAT between a-out and b-in, and a masquerade
    # between b-in and b-read
    for node, hops in (("host-a", [0]), ("host-b", [1, 2])):
        records = [rec(t(seq, hop), pid(seq), hop) for seq in range(2, 5) for hop in hops]
        pipeline.consume(decode_batch(batch(node, "t", records, clock_delta=0, seq=1)))
        described = [rec(t(1, hop), pid(1), hop, flags=F_ADDRESSES) for hop in hops]
        msg = batch(node, "t", described, clock_delta=0, seq=2)
        tuples = {0: CLIENT, 1: BACKEND, 2: MASQUERADED}
        msg.addresses, msg.addresses_size = b"".join(packed(tuples[h]) for h in hops), ADDRESSES_STRUCT.size
        pipeline.consume(decode_batch(msg))
    pipeline.flush()
    assert otlp.flush(10)
    traces = by_trace(spans.get_finished_spans())
    assert len(traces) == 4
    for seq in range(1, 5):
        found = traces[trace_id("t", pid(seq), t(seq, 0))]
        assert set(found) == {"t", "a-out>b-in", "b-in>b-read"}
        dnat, snat = found["a-out>b-in"].events, found["b-in>b-read"].events
        assert [e.name for e in dnat] == [e.name for e in snat] == ["nat"]
        assert dnat[0].timestamp == t(seq, 0) and snat[0].timestamp == t(seq, 1)
        of = "packet" if seq == 1 else "trace"  # the others: the last packet seen at both hops, 1
        assert dict(dnat[0].attributes) == {
            "hoptrace.nat.kind": "DNAT",
            "hoptrace.nat.addresses_of": of,
            "hoptrace.nat.packet_id": pid(1),
            "network.transport.before": "udp",
            "source.address.before": "198.18.0.1",
            "source.port.before": 40000,
            "destination.address.before": "198.18.99.9",
            "destination.port.before": 8080,
            "network.transport.after": "udp",
            "source.address.after": "198.18.0.1",
            "source.port.after": 40000,
            "destination.address.after": "198.18.2.2",
            "destination.port.after": 11111,
        }
        attributes = dict(snat[0].attributes)
        assert attributes["hoptrace.nat.kind"] == "SNAT"
        assert (attributes["source.address.before"], attributes["source.address.after"]) == (
            "198.18.0.1",
            "198.18.2.1",
        )
    otlp.close()


def test_a_dropped_packet_ends_in_an_error_span_with_its_drop() -> None:
    def run(config: OtlpConfig, aggregate: AggregateConfig) -> tuple[dict, OtlpExporter]:
        pipeline, otlp, spans = pipeline_to(config, aggregate)
        a, b, drops = [], [], []
        for seq in range(1, 21):
            a.append(rec(t(seq, 0), pid(seq), 0))
            if seq not in (5, 6, 7):
                b.append(rec(t(seq, 1) + (SLOW if seq == 9 else 0), pid(seq), 1))
            if seq not in (5, 6, 7, 9):
                b.append(rec(t(seq, 2), pid(seq), 2))
        drops.append((t(5, 1) + 7, pid(5), 13, "nft_do_chain"))  # lost before b-in
        drops.append((t(6, 1) + 8, pid(6), 13, "nft_do_chain"))
        drops.append((t(9, 1) + SLOW + 9, pid(9), 3, "__udp4_lib_rcv"))  # lost after b-in
        pipeline.consume(decode_batch(path_batch("host-a", a)))
        pipeline.consume(decode_batch(path_batch("host-b", b)))
        pipeline.consume(decode_batch(drop_batch("host-b", drops)))  # 7: lost, no drop recorded
        pipeline.flush()
        assert otlp.flush(10)
        assert otlp._in_processor == 0  # every span reserved in the processor's queue made and taken
        return by_trace(spans.get_finished_spans()), otlp

    # --otlp-drops: every recorded drop, none of the others (no exemplar is sent: 1/1000 picks none)
    traces, otlp = run(
        OtlpConfig(endpoint="backend:4317", insecure=True, sample="1/1000", drops=True),
        AggregateConfig(exemplar_slowest=0, exemplar_every=1000),
    )
    assert set(traces) == {trace_id("t", pid(seq), t(seq, 0)) for seq in (5, 6, 9)}
    for seq, lost, reason, function, drop_ns in (
        (5, "a-out>b-in", "NETFILTER_DROP", "nft_do_chain", t(5, 1) + 7),
        (6, "a-out>b-in", "NETFILTER_DROP", "nft_do_chain", t(6, 1) + 8),
        (9, "b-in>b-read", "NO_SOCKET", "__udp4_lib_rcv", t(9, 1) + SLOW + 9),
    ):
        found = traces[trace_id("t", pid(seq), t(seq, 0))]
        assert set(found) == {"t", *(["a-out>b-in"] if seq == 9 else []), lost}
        span = found[lost]
        assert span.status.status_code is StatusCode.ERROR and span.status.description == reason
        assert span.start_time == (t(seq, 0) if seq != 9 else t(9, 1) + SLOW) and span.end_time == drop_ns
        [event] = span.events
        assert (event.name, event.timestamp) == ("drop", drop_ns)
        assert dict(event.attributes) == {
            "hoptrace.drop.reason": reason,
            "hoptrace.drop.function": function,
            "hoptrace.drop.node": "host-b",
        }
        assert span.attributes["hoptrace.from.hop"] == lost.split(">")[0]
        assert span.attributes["hoptrace.to.hop"] == lost.split(">")[1]
        root = found["t"]
        assert root.attributes["hoptrace.complete"] is False
        assert (root.start_time, root.end_time) == (t(seq, 0), drop_ns)
        if seq == 9:  # its segment up to its last hop
            seen = found["a-out>b-in"]
            assert (seen.start_time, seen.end_time) == (t(9, 0), t(9, 1) + SLOW)
            assert seen.status.status_code is StatusCode.UNSET
    assert otlp.exported("traces") == 3
    otlp.close()

    # without it: a dropped packet goes out when it is an exemplar (the slowest by its seen passage: 9),
    # with its drop, once
    traces, otlp = run(
        OtlpConfig(endpoint="backend:4317", insecure=True, sample="slowest"),
        AggregateConfig(exemplar_slowest=1, exemplar_every=0),
    )
    found = traces[trace_id("t", pid(9), t(9, 0))]
    assert set(found) == {"t", "a-out>b-in", "b-in>b-read"}
    assert found["b-in>b-read"].status.description == "NO_SOCKET"
    assert [e.name for e in found["b-in>b-read"].events] == ["drop"]
    otlp.close()
