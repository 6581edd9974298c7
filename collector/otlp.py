"""Export stage beside InfluxDB: exemplar packets as OpenTelemetry traces and segment latency as exponential
histograms, over OTLP/gRPC to any OpenTelemetry backend (Jaeger, Tempo, an OpenTelemetry Collector).

`OtlpExporter` takes the same points as the InfluxDB exporter (`pipeline.Exporter`; `beside` makes the
pair the pipeline exports to):

* `hop_latency` points, the exemplars, become traces: one trace per packet, a root span for its whole
  passage (the end-to-end sample: start = the packet's time at the path's first hop, duration = its
  end-to-end latency) and a child span per segment (start = its time at the segment's first hop, duration =
  the segment's latency), all with the packet's own aligned times. A latency below zero (a cross-node
  segment within its clocks' bound) ends its span at its start; the signed value is in
  `hoptrace.latency_ns`. Which exemplars (`OtlpConfig.sample`): `slowest`, the aggregation's slowest per
  trace and window (`--exemplar-slowest`); `1/N`, those whose ID sequence is a multiple of N (sampled by ID
  with `--exemplar-every`, so N must be a multiple of it); `all`, every exemplar. Each is a packet
  `hoptrace packets --id` shows too.
* Beside the points, the pipeline hands it the tuples of the packets that describe their addresses
  (`note_addresses`) and the lost packets whose drop was recorded (`note_drops`): a segment whose two hops
  saw different tuples gets a `nat` event (the packet's own tuples, else the trace's last packet's at that
  segment); a dropped packet gets a span for the segment it was lost in, ERROR, with a `drop` event (reason,
  function, node). It goes out when it is an exemplar the sample picks, or at once with `drops`
  (`--otlp-drops`). docs/otel.md lists the attributes.
* `segment_stats` points, the closed windows, become one exponential-histogram point per trace, segment
  and window (delta temporality: start = the window's start, time = its end). Count, sum, min and max are
  the window's own; the buckets come from its DDSketch buckets (`sketch.py`, 0.5 % relative accuracy), each
  counted in the exponential bucket of its representative value, at scale 6 or coarser (at most 160
  buckets, as the SDK's own aggregation): a latency within 0.5 % of a bucket boundary may be counted in the
  next bucket. Built from the windows, the histogram costs nothing per packet (the SDK's `record()` costs
  about 8 us per value).

Trace ID (`trace_id`): 8 bytes of SHA-256 of the trace's name, the packet's time at its first hop in unix
seconds (4 bytes), the packet ID (4 bytes), so `hoptrace packets` names what finds it (IDs wrap; the second
keeps two passages of one ID apart). Span IDs are derived from the trace ID and the segment, so a packet
exported twice (a replay) is the same spans again.

Delivery never blocks the pipeline: `export` only filters and queues (`max_packets` packets and
`max_windows` windows waiting; beyond, dropped and counted, reason `queue_full`). A worker thread builds
the spans and hands them to the SDK's `BatchSpanProcessor`, whose own queue drops its oldest span when full
(logged, counted nowhere we can read): the worker keeps that queue below its bound instead, waiting for
room, so every drop happens at the hand-off and is counted. The OTLP exporters retry with backoff for
`timeout_s`; a batch that still fails is dropped and counted (`export_failed`). Counters: `dropped`,
`exported` (packets for traces, histogram points for metrics), served as
`hoptrace_collector_otlp_dropped_total` and `hoptrace_collector_otlp_exported_total` (`metrics.py`).
"""

from __future__ import annotations

import hashlib
import logging
import math
import queue
import threading
import time
from collections import Counter, OrderedDict, deque
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from opentelemetry import trace as trace_api
from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    Buckets,
    ExponentialHistogram,
    ExponentialHistogramDataPoint,
    Metric,
    MetricExportResult,
    MetricsData,
    ResourceMetrics,
    ScopeMetrics,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.id_generator import IdGenerator
from opentelemetry.sdk.trace.sampling import ALWAYS_ON
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Status, StatusCode

from hoptrace.collector.addresses import translation
from hoptrace.collector.aggregate import AggregateConfig, LatencySample
from hoptrace.collector.catalog import MAX_HOPS, TraceCatalog
from hoptrace.collector.join import JoinedPacket
from hoptrace.collector.points import Point, latency_point
from hoptrace.collector.records import HOP_INDEX, ID_SEQ_MASK, PACKET_ID, DescribedRecord, FiveTuple
from hoptrace.collector.schema import END_TO_END, HOP_LATENCY, SEGMENT_STATS
from hoptrace.collector.sketch import MAPPING, LatencySketch, sketch_from_fields

log = logging.getLogger(__name__)

SCOPE = InstrumentationScope("hoptrace.collector")
LATENCY_METRIC = "hoptrace.segment.latency"
# The exponential histogram: the finest scale (64 buckets per doubling: 1.09 % wide, about the sketch's
# 1 % buckets) and the most buckets per sign, the SDK's default for its own aggregation.
MAX_SCALE = 6
MAX_BUCKETS = 160
OTLP_DROP_REASONS = ("closed", "export_failed", "queue_full")
# Packets whose described addresses, and dropped packets, are kept for their exemplars (oldest forgotten).
MAX_DESCRIBED = 4096
MAX_DROPPED = 16384


@dataclass
class OtlpConfig:
    """Where the OpenTelemetry export goes and which packets it sends. Off while `endpoint` is empty."""

    endpoint: str = ""  # HOST:PORT of an OTLP/gRPC receiver
    insecure: bool = False  # plaintext; otherwise TLS, checked against `ca` (default: the system's roots)
    ca: str | None = None
    cert: str | None = None  # a client certificate, when the backend asks for one
    key: str | None = None
    sample: str = "slowest"  # slowest | 1/N | all (of the exemplars; see the module's docstring)
    drops: bool = False  # every packet whose drop was recorded, beside the exemplars
    max_packets: int = 10_000  # packets waiting for the worker
    max_windows: int = 100_000  # windows waiting for the worker
    max_spans: int = 8192  # the BatchSpanProcessor's queue
    schedule_delay_ms: int = 1000  # the BatchSpanProcessor's export interval
    timeout_s: float = 10.0  # each OTLP export, retries included

    @property
    def enabled(self) -> bool:
        """Whether the export is on."""
        return bool(self.endpoint)

    def every(self) -> int:
        """N of a `1/N` sample; 0 for the others."""
        return int(self.sample[2:]) if self.sample.startswith("1/") else 0

    def validate(self, exemplar_every: int = 1000, exemplar_slowest: int = 3) -> None:
        """Raise ValueError on an unusable setting; the sample must pick exemplars the aggregation makes
        (`AggregateConfig.exemplar_every` / `exemplar_slowest`)."""
        if not self.enabled:
            return
        if ":" not in self.endpoint.removeprefix("http://").removeprefix("https://"):
            raise ValueError(f"--otlp-endpoint must be HOST:PORT, got {self.endpoint!r}")
        if self.insecure and (self.ca or self.cert or self.key):
            raise ValueError("--otlp-insecure and --otlp-ca/--otlp-cert/--otlp-key exclude each other")
        if bool(self.cert) != bool(self.key):
            raise ValueError("--otlp-cert and --otlp-key go together")
        for path in (self.ca, self.cert, self.key):
            if path and not Path(path).is_file():
                raise ValueError(f"OTLP TLS: {path} is not a file")
        if self.sample not in ("slowest", "all"):
            every = self.sample[2:] if self.sample.startswith("1/") else ""
            if not every.isdigit() or int(every) < 1:
                raise ValueError(f"--otlp-sample is slowest, all or 1/N (N >= 1), got {self.sample!r}")
            if exemplar_every < 1 or int(every) % exemplar_every:
                raise ValueError(
                    f"--otlp-sample {self.sample} exports exemplars sampled by ID: N must be a multiple of "
                    f"--exemplar-every (now {exemplar_every})"
                )
        if self.sample == "slowest" and exemplar_slowest < 1:
            raise ValueError("--otlp-sample slowest needs --exemplar-slowest of at least 1")
        if min(self.max_packets, self.max_windows) < 1 or self.timeout_s <= 0:
            raise ValueError("OTLP queue bounds and timeout must be positive")
        if self.max_spans <= MAX_HOPS:  # one packet's spans (a root and a segment per hop) must fit
            raise ValueError(f"the OTLP span queue must hold more than {MAX_HOPS} spans")

    def credentials(self) -> grpc.ChannelCredentials | None:
        """TLS credentials of the channel; None when insecure."""
        if self.insecure:
            return None

        def read(path: str | None) -> bytes | None:
            return Path(path).read_bytes() if path else None

        return grpc.ssl_channel_credentials(read(self.ca), read(self.key), read(self.cert))


def trace_id(trace: str, packet_id: int, at_ns: int) -> int:
    """The OpenTelemetry trace ID of packet `packet_id` of `trace` whose time at its first hop is `at_ns`
    (unix ns): SHA-256(trace)[:8] | unix seconds (4 bytes) | packet ID (4 bytes), as an int."""
    head = hashlib.sha256(trace.encode()).digest()[:8]
    seconds = (at_ns // 1_000_000_000) & 0xFFFFFFFF
    return int.from_bytes(head + seconds.to_bytes(4, "big") + (packet_id & 0xFFFFFFFF).to_bytes(4, "big"))


def span_id(trace_id_: int, name: str) -> int:
    """A span ID derived from its trace ID and its name (never 0, the invalid ID)."""
    digest = hashlib.blake2b(trace_id_.to_bytes(16, "big") + name.encode(), digest_size=8).digest()
    return int.from_bytes(digest) or 1


class _GivenIds(IdGenerator):
    """Hands out the IDs the worker set for the next span: the SDK takes IDs from its generator only."""

    def __init__(self) -> None:
        self.trace_id = 0
        self.span_id = 0

    def generate_trace_id(self) -> int:
        return self.trace_id

    def generate_span_id(self) -> int:
        return self.span_id


class _CountingSpanExporter(SpanExporter):
    """The OTLP span exporter, counting what leaves the BatchSpanProcessor's queue (`taken`) and the packets
    (root spans) of the batches that were exported or failed."""

    def __init__(self, inner: SpanExporter, owner: OtlpExporter) -> None:
        self.inner = inner
        self.owner = owner

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.owner._spans_taken(len(spans))
        try:
            result = self.inner.export(spans)
        except Exception:  # noqa: BLE001 - counted as failed; the processor would only log it
            log.exception("OTLP span export failed")
            result = SpanExportResult.FAILURE
        roots = sum(1 for s in spans if s.parent is None)
        self.owner._count(
            "traces", "exported" if result is SpanExportResult.SUCCESS else "export_failed", roots
        )
        return result

    def shutdown(self) -> None:
        self.inner.shutdown()

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return self.inner.force_flush(timeout_millis)


@dataclass(frozen=True, slots=True)
class _Packet:
    trace: str
    packet_id: int
    samples: tuple[Point, ...]  # its hop_latency points, end to end among them when it went end to end
    dropped: JoinedPacket | None = None  # the packet as joined, when the kernel dropped it

    @property
    def spans(self) -> int:
        """How many spans it becomes (at most): a root, one per segment (end to end is the root's), and
        the segment it was dropped in."""
        if self.dropped is not None and not self.samples:  # its segments come from its times
            return 2 + sum(1 for t in self.dropped.times if t is not None)
        return 1 + sum(1 for p in self.samples if p.tag("segment") != END_TO_END) + (self.dropped is not None)


def exponential_buckets(sketch: LatencySketch) -> tuple[int, Buckets, Buckets]:
    """(scale, positive, negative) buckets of an exponential histogram holding `sketch`'s values: each
    sketch bucket counted where its representative value falls, at the finest scale up to MAX_SCALE that
    fits MAX_BUCKETS per sign. Exponential bucket i at scale s holds (2^(i/2^s), 2^((i+1)/2^s)]."""

    def indexes(counts: Counter[int]) -> dict[int, int]:
        out: dict[int, int] = {}
        for key, n in counts.items():
            if n:
                index = math.ceil(math.log2(MAPPING.value(key)) * (1 << MAX_SCALE)) - 1
                out[index] = out.get(index, 0) + n
        return out

    signs = [indexes(sketch.positive), indexes(sketch.negative)]
    scale = MAX_SCALE
    while scale > -10 and any(s and max(s) - min(s) >= MAX_BUCKETS for s in signs):
        scale -= 1
        signs = [_downscale(s) for s in signs]
    return scale, _buckets(signs[0]), _buckets(signs[1])


def _downscale(counts: dict[int, int]) -> dict[int, int]:
    out: dict[int, int] = {}
    for index, n in counts.items():
        out[index >> 1] = out.get(index >> 1, 0) + n
    return out


def _buckets(counts: dict[int, int]) -> Buckets:
    if not counts:
        return Buckets(0, [])
    lo = min(counts)
    return Buckets(lo, [counts.get(i, 0) for i in range(lo, max(counts) + 1)])


class OtlpExporter:
    """The OpenTelemetry export stage (`pipeline.Exporter`): queues exemplars and windows, a worker sends
    them through the SDK. Thread-safe; `close` flushes what it can and stops."""

    def __init__(
        self,
        config: OtlpConfig,
        catalog: TraceCatalog | None = None,
        *,
        instance: str = "",
        interval_ns: int = 1_000_000_000,
        exemplar_every: int = 1000,
        span_exporter: SpanExporter | None = None,
        metric_exporter: Any = None,
    ) -> None:
        self.config = config
        self.catalog = catalog
        self.interval_ns = interval_ns
        self.exemplar_every = exemplar_every
        self._every = config.every()
        self.counts: Counter[tuple[str, str]] = Counter()  # (signal, exported | reason) -> packets/points
        self._lock = threading.Condition()
        self._packets: deque[_Packet] = deque()
        self._windows: deque[Point] = deque()
        self._in_processor = 0  # spans handed to the BatchSpanProcessor, not yet taken from its queue
        self._busy = False  # the worker holds items taken from the queues
        self._closed = False
        self._giving_up = False  # closing: a worker waiting for the processor's room stops waiting
        self._hop_cache: dict[tuple[str, str, str, str, int], dict[str, Any]] = {}
        # (trace, packet ID) -> hop index -> the tuple it saw, of the packets that describe their addresses
        self._described: OrderedDict[tuple[str, int], dict[int, FiveTuple]] = OrderedDict()
        # (trace, hop index a) -> (packet ID, tuple at a, tuple at a + 1): the last packet seen at both
        self._last_pair: dict[tuple[str, int], tuple[int, FiveTuple, FiveTuple]] = {}
        # (trace, packet ID) -> the packet as joined and whether it was queued already (`drops`)
        self._dropped: OrderedDict[tuple[str, int], tuple[JoinedPacket, bool]] = OrderedDict()
        attributes = {"service.name": "hoptrace"}
        if instance:
            attributes["service.instance.id"] = instance
        self.resource = Resource.create(attributes)
        credentials = config.credentials()
        endpoint = config.endpoint
        if span_exporter is None:
            span_exporter = OTLPSpanExporter(
                endpoint=endpoint, insecure=config.insecure, credentials=credentials, timeout=config.timeout_s
            )
        if metric_exporter is None:
            metric_exporter = OTLPMetricExporter(
                endpoint=endpoint,
                insecure=config.insecure,
                credentials=credentials,
                timeout=config.timeout_s,
            )
        self.metric_exporter = metric_exporter
        self._ids = _GivenIds()
        self.provider = TracerProvider(
            sampler=ALWAYS_ON, resource=self.resource, id_generator=self._ids, shutdown_on_exit=False
        )
        self.provider.add_span_processor(
            BatchSpanProcessor(
                _CountingSpanExporter(span_exporter, self),
                max_queue_size=config.max_spans,
                schedule_delay_millis=config.schedule_delay_ms,
                max_export_batch_size=min(512, config.max_spans),
            )
        )
        self.tracer = self.provider.get_tracer(SCOPE.name)
        self._metrics_out: queue.Queue[MetricsData | None] = queue.Queue(maxsize=16)
        self._worker = threading.Thread(target=self._work, name="otlp-export", daemon=True)
        self._metrics_thread = threading.Thread(target=self._send_metrics, name="otlp-metrics", daemon=True)
        self._worker.start()
        self._metrics_thread.start()

    # ---- counters ------------------------------------------------------------------------------------

    def _count(self, signal: str, what: str, n: int = 1) -> None:
        if n:
            with self._lock:
                self.counts[(signal, what)] += n

    @property
    def dropped(self) -> dict[tuple[str, str], int]:
        """(signal, reason) -> packets (traces) or histogram points (metrics) dropped."""
        with self._lock:
            return {k: v for k, v in self.counts.items() if k[1] != "exported"}

    def exported(self, signal: str) -> int:
        """Packets (traces) or histogram points (metrics) the backend took."""
        with self._lock:
            return self.counts[(signal, "exported")]

    def _spans_taken(self, n: int) -> None:
        with self._lock:
            self._in_processor -= n
            self._lock.notify_all()

    # ---- the pipeline's side: filter and queue, never wait ------------------------------------------

    def wants(self, packet_id: int) -> bool:
        """Whether an exemplar of packet `packet_id` goes out as a trace, by `OtlpConfig.sample`."""
        sampled_by_id = self.exemplar_every > 0 and (packet_id & ID_SEQ_MASK) % self.exemplar_every == 0
        if self.config.sample == "slowest":
            return not sampled_by_id  # sampled by ID means it never entered the slowest candidates
        if self._every:
            return (packet_id & ID_SEQ_MASK) % self._every == 0
        return True

    def export(self, points: list[Point]) -> None:
        """Queue the exemplars and windows among `points` (what the InfluxDB exporter gets too)."""
        packets: dict[tuple[str, int], list[Point]] = {}
        windows = []
        wanted: dict[int, bool] = {}
        for p in points:
            if p.measurement == HOP_LATENCY:
                packet_id = int(p.field("packet_id") or 0)
                want = wanted.get(packet_id)
                if want is None:
                    want = wanted[packet_id] = self.wants(packet_id)
                if want:
                    packets.setdefault((p.tag("trace"), packet_id), []).append(p)
            elif p.measurement == SEGMENT_STATS and p.field("count"):
                windows.append(p)
        if not packets and not windows:
            return
        with self._lock:
            if self._closed:
                self.counts[("traces", "closed")] += len(packets)
                self.counts[("metrics", "closed")] += len(windows)
                return
            for (trace, packet_id), samples in packets.items():
                dropped, queued = self._dropped.get((trace, packet_id), (None, False))
                for group in _passages(samples):
                    # the passage the kernel dropped: its exemplar's segments are among its times
                    drop = dropped if dropped is not None and group[0].time_ns in dropped.times else None
                    if drop is not None and queued:
                        continue  # sent already (`drops`)
                    if len(self._packets) >= self.config.max_packets:
                        self.counts[("traces", "queue_full")] += 1
                    else:
                        self._packets.append(_Packet(trace, packet_id, group, drop))
            room = self.config.max_windows - len(self._windows)
            self._windows.extend(windows[:room])
            if len(windows) > room > -1:
                self.counts[("metrics", "queue_full")] += len(windows) - max(room, 0)
            self._lock.notify_all()

    def note_addresses(self, trace: str, described: list[DescribedRecord]) -> None:
        """The described records of the trace's path hops, as they come (`pipeline`): the tuples each hop
        saw, kept for the packet's own exemplar and as the trace's last known tuples at each segment."""
        with self._lock:
            for rec, seen in described:
                key = (trace, rec[PACKET_ID])
                hops = self._described.get(key)
                if hops is None:
                    hops = self._described[key] = {}
                    if len(self._described) > MAX_DESCRIBED:
                        self._described.popitem(last=False)
                index = rec[HOP_INDEX]
                hops[index] = seen
                if index - 1 in hops:
                    self._last_pair[(trace, index - 1)] = (rec[PACKET_ID], hops[index - 1], seen)
                if index + 1 in hops:
                    self._last_pair[(trace, index)] = (rec[PACKET_ID], seen, hops[index + 1])

    def note_drops(self, packets: list[JoinedPacket]) -> None:
        """Joined packets the kernel dropped (`JoinedPacket.drop`), as the join emits them (`pipeline`):
        kept for their exemplars, which come when their window closes; with `drops`, queued at once."""
        with self._lock:
            for p in packets:
                queued = False
                if self.config.drops and not self._closed:
                    if len(self._packets) >= self.config.max_packets:
                        self.counts[("traces", "queue_full")] += 1
                    else:
                        self._packets.append(_Packet(p.trace, p.packet_id, (), p))
                        queued = True
                key = (p.trace, p.packet_id)
                self._dropped.pop(key, None)
                self._dropped[key] = (p, queued)
                if len(self._dropped) > MAX_DROPPED:
                    self._dropped.popitem(last=False)
            self._lock.notify_all()

    # ---- the worker ---------------------------------------------------------------------------------

    def _work(self) -> None:
        while True:
            with self._lock:
                while not self._packets and not self._windows and not self._closed:
                    self._lock.wait()
                if not self._packets and not self._windows:
                    return  # closed and drained
                # a few at a time: the queue's bound holds what waits, the worker's share included
                packets = [self._packets.popleft() for _ in range(min(len(self._packets), 16))]
                windows = list(self._windows)
                self._windows.clear()
                self._busy = True
            try:
                if windows:
                    self._queue_metrics(windows)
                for i, packet in enumerate(packets):
                    if not self._room_for(packet.spans):
                        self._count("traces", "closed", len(packets) - i)
                        break
                    spans = self._send_packet(packet)
                    if spans < packet.spans:  # reserved more than it made (a dropped packet's estimate)
                        self._spans_taken(packet.spans - spans)
            except Exception:  # keep the worker alive: a bug here must not stop the export for good
                log.exception("OTLP export worker")
            finally:
                with self._lock:
                    self._busy = False
                    self._lock.notify_all()

    def _room_for(self, spans: int) -> bool:
        """Wait until the BatchSpanProcessor's queue has room for `spans` more; False when the exporter is
        closing and gives up. While it is full, this thread has the processor send what it holds: the
        processor wakes at once only when its queue crosses a batch's size during an `end()`, otherwise
        once per schedule delay (a batch a second: a full queue would drain at 512 spans per second)."""
        while True:
            with self._lock:
                if self._in_processor + spans <= self.config.max_spans:
                    self._in_processor += spans
                    return True
                if self._giving_up:
                    return False
            self.provider.force_flush()  # outside the lock: the export counts under it

    def _send_packet(self, packet: _Packet) -> int:
        """The packet's spans: its root, then a child per segment, with the packet's own times; a packet
        the kernel dropped also the segment it was lost in. Returns how many spans it made."""
        points = packet.samples or self._dropped_samples(packet.dropped)
        samples = sorted(
            ((p.time_ns, dict(p.tags), dict(p.fields)) for p in points),
            key=lambda s: (s[0], s[1]["segment"] == END_TO_END),
        )
        e2e = next((s for s in samples if s[1]["segment"] == END_TO_END), None)
        segments = [s for s in samples if s[1]["segment"] != END_TO_END]
        lost = self._lost_segment(packet.dropped) if packet.dropped is not None else None
        if not segments and e2e is None and lost is None:
            return 0  # nothing to show: a dropped packet seen at no segment and after the path's last hop
        ends = [t + max(int(fields["latency_ns"]), 0) for t, _, fields in segments]
        if lost is not None:
            ends.append(max(lost[0], lost[1]))
        if e2e is not None:
            start = e2e[0]
            end = start + max(int(e2e[2]["latency_ns"]), 0)
        else:  # not end to end: from its first time seen to the end of its last segment
            start = min([t for t, _, _ in segments] + ([lost[0]] if lost is not None else []))
            end = max(ends)
        tid = trace_id(packet.trace, packet.packet_id, start)
        self._ids.trace_id, self._ids.span_id = tid, span_id(tid, "")
        root = self.tracer.start_span(
            packet.trace, start_time=start, attributes=self._packet_attributes(packet, e2e)
        )
        parent = trace_api.set_span_in_context(root)
        indexes = self._hop_indexes(packet.trace)
        for t, tags, fields in segments:
            self._ids.span_id = span_id(tid, tags["segment"])
            span = self.tracer.start_span(
                tags["segment"],
                context=parent,
                start_time=t,
                attributes=self._segment_attributes(tags, fields),
            )
            a = indexes.get(tags.get("from_hop", ""), -1)
            if a >= 0 and indexes.get(tags.get("to_hop", "")) == a + 1:
                nat = self._nat(packet.trace, packet.packet_id, a)
                if nat is not None:
                    span.add_event("nat", nat, timestamp=t)
            span.end(end_time=t + max(int(fields["latency_ns"]), 0))
        if lost is not None:
            at, drop_ns, tags, (node, reason, function) = lost
            self._ids.span_id = span_id(tid, tags["segment"])
            attributes = self._segment_attributes(tags, {"packet_id": packet.packet_id})
            span = self.tracer.start_span(
                tags["segment"], context=parent, start_time=at, attributes=attributes
            )
            span.add_event(
                "drop",
                {
                    "hoptrace.drop.reason": reason,
                    "hoptrace.drop.function": function,
                    "hoptrace.drop.node": node,
                },
                timestamp=max(drop_ns, at),
            )
            span.set_status(Status(StatusCode.ERROR, reason))
            span.end(end_time=max(drop_ns, at))
        root.end(end_time=end)
        return 1 + len(segments) + (lost is not None)

    def _hop_indexes(self, trace: str) -> dict[str, int]:
        path = self.catalog.get(trace) if self.catalog is not None else None
        if path is None or not path.known:
            return {}
        return {name: i for i, name in enumerate(path.hop_names)}

    def _dropped_samples(self, p: JoinedPacket | None) -> list[Point]:
        """The `hop_latency` points of a dropped packet's segments (those it was seen at both ends of), as
        the aggregation makes them for an exemplar."""
        if p is None:
            return []
        path = self.catalog.get(p.trace) if self.catalog is not None else None
        out = []
        for a in range(len(p.times) - 1):
            ta, tb = p.times[a], p.times[a + 1]
            if ta is None or tb is None:
                continue
            names = [path.hop_name(i) if path is not None else f"hop{i}" for i in (a, a + 1)]
            nodes = [p.nodes[i] or (path.hop_node(i) if path is not None else "") for i in (a, a + 1)]
            sample = LatencySample(
                p.trace, f"{names[0]}>{names[1]}", *names, *nodes, ta, tb - ta, p.packet_id, False
            )
            out.append(latency_point(sample))
        return out

    def _lost_segment(self, p: JoinedPacket) -> tuple[int, int, dict[str, str], tuple[str, str, str]] | None:
        """(start, drop time, tags, (node, reason, function)) of the segment a dropped packet was lost in:
        from the last hop of the path it reached to the next."""
        seen = [i for i, t in enumerate(p.times) if t is not None]
        if p.drop is None or not seen:
            return None
        path = self.catalog.get(p.trace) if self.catalog is not None else None
        a = seen[-1]
        if path is not None and path.known and a + 1 >= len(path.hop_names):
            return None  # seen at the path's last hop (a hop before it missed it): no segment after it
        at = p.times[a] or 0
        names = [path.hop_name(i) if path is not None else f"hop{i}" for i in (a, a + 1)]
        nodes = [p.nodes[a] or "", path.hop_node(a + 1) if path is not None else ""]
        if path is not None and not nodes[0]:
            nodes[0] = path.hop_node(a)
        tags = {
            "trace": p.trace,
            "segment": f"{names[0]}>{names[1]}",
            "from_hop": names[0],
            "to_hop": names[1],
            "from_node": nodes[0],
            "to_node": nodes[1],
        }
        node, reason, _, function, drop_ns = p.drop
        return at, drop_ns, tags, (node, reason, function)

    def _nat(self, trace: str, packet_id: int, a: int) -> dict[str, Any] | None:
        """The attributes of a `nat` event on segment a > a + 1 of a packet: where the tuples its two hops
        saw differ, the packet's own (it described its addresses) or else the trace's last packet seen at
        both; None without a translation there."""
        with self._lock:
            own = self._described.get((trace, packet_id))
            if own is not None and a in own and a + 1 in own:
                of, before, after = "packet", own[a], own[a + 1]
            elif (last := self._last_pair.get((trace, a))) is not None:
                of, (packet_id, before, after) = "trace", last
            else:
                return None
        if before == after:
            return None
        kind = translation(before, after)[0].upper()
        attributes: dict[str, Any] = {
            "hoptrace.nat.kind": kind,
            "hoptrace.nat.addresses_of": of,
            "hoptrace.nat.packet_id": packet_id,
        }
        for suffix, seen in (("before", before), ("after", after)):
            attributes[f"network.transport.{suffix}"] = seen.protocol_name
            attributes[f"source.address.{suffix}"] = seen.source
            attributes[f"source.port.{suffix}"] = seen.source_port
            attributes[f"destination.address.{suffix}"] = seen.destination
            attributes[f"destination.port.{suffix}"] = seen.destination_port
        return attributes

    def _packet_attributes(self, packet: _Packet, e2e: tuple[int, dict, dict] | None) -> dict[str, Any]:
        attributes: dict[str, Any] = {
            "hoptrace.trace": packet.trace,
            "hoptrace.packet_id": packet.packet_id,
            "hoptrace.complete": e2e is not None,
        }
        if e2e is not None:
            attributes.update(self._segment_attributes(e2e[1], e2e[2]))
        spec = self.catalog.spec(packet.trace) if self.catalog is not None else None
        path = self.catalog.get(packet.trace) if self.catalog is not None else None
        if path is not None and path.known:
            attributes["hoptrace.hops"] = list(path.hop_names)
            attributes["hoptrace.nodes"] = list(path.hop_nodes)
        if spec is not None:
            f = spec.filter
            if f.protocol:
                attributes["network.transport"] = f.protocol
            for side, addr, port in (("source", f.src, f.src_port), ("destination", f.dst, f.dst_port)):
                if addr and "/" not in addr:  # an address, not a range: one end of the 5-tuple
                    attributes[f"{side}.address"] = addr
                if port:
                    attributes[f"{side}.port"] = port
        return attributes

    def _segment_attributes(self, tags: dict[str, str], fields: dict[str, Any]) -> dict[str, Any]:
        """A segment span's attributes, from its `hop_latency` point's tags and fields."""
        trace = tags["trace"]
        attributes: dict[str, Any] = {
            "hoptrace.trace": trace,
            "hoptrace.packet_id": int(fields["packet_id"]),
            "hoptrace.segment": tags["segment"],
        }
        if "latency_ns" in fields:  # not in the segment a packet was dropped in
            attributes["hoptrace.latency_ns"] = int(fields["latency_ns"])
        if fields.get("below_clock_bound"):
            attributes["hoptrace.below_clock_bound"] = True
        for end in ("from", "to"):
            hop, node = tags.get(f"{end}_hop", ""), tags.get(f"{end}_node", "")
            attributes.update(self._hop_attributes(trace, hop, node, end))
        return attributes

    def _hop_attributes(self, trace: str, hop: str, node: str, end: str) -> dict[str, Any]:
        """`hoptrace.<end>.*` of one end of a segment: its hop and node, and what the trace's spec and
        the dispatcher's resolution of its workload say of it (attach point, device, netns, container,
        pod). Kept per trace path version (the worker's only: no lock)."""
        path = self.catalog.get(trace) if self.catalog is not None else None
        key = (trace, hop, node, end, path.version if path is not None else -1)
        found = self._hop_cache.get(key)
        if found is None:
            if len(self._hop_cache) > 4096:
                self._hop_cache.clear()
            found = self._hop_cache[key] = self._describe_hop(trace, hop, node, end)
        return found

    def _describe_hop(self, trace: str, hop: str, node: str, end: str) -> dict[str, Any]:
        prefix = f"hoptrace.{end}"
        out: dict[str, Any] = {f"{prefix}.hop": hop}
        if node:
            out[f"{prefix}.node"] = node
        if self.catalog is None:
            return out
        spec = self.catalog.spec(trace)
        path = self.catalog.get(trace)
        index = path.hop_names.index(hop) if path is not None and hop in path.hop_names else -1
        if spec is not None and 0 <= index < len(spec.hops):
            h = spec.hops[index]
            for key, value in (("kind", h.at), ("device", h.dev), ("netns", h.netns)):
                if value:
                    out[f"{prefix}.{key}"] = value
        if path is not None and index >= 0:
            container, pod = path.hop_workload(index)
            if container:
                out[f"{prefix}.container"] = container
            if pod:
                out[f"{prefix}.pod"] = pod
        return out

    # ---- metrics ------------------------------------------------------------------------------------

    def histogram_points(self, windows: list[Point]) -> list[ExponentialHistogramDataPoint]:
        """One exponential-histogram point per window (`segment_stats` points with a count)."""
        out = []
        for w in windows:
            sketch = sketch_from_fields({k: int(v) for k, v in w.fields})
            scale, positive, negative = exponential_buckets(sketch)
            out.append(
                ExponentialHistogramDataPoint(
                    attributes={"hoptrace.trace": w.tag("trace"), "hoptrace.segment": w.tag("segment")},
                    start_time_unix_nano=w.time_ns,
                    time_unix_nano=w.time_ns + self.interval_ns,
                    count=int(w.field("count") or 0),
                    sum=int(w.field("sum_ns") or 0),
                    scale=scale,
                    zero_count=sketch.zeros,
                    positive=positive,
                    negative=negative,
                    flags=0,
                    min=float(w.field("min_ns") or 0),
                    max=float(w.field("max_ns") or 0),
                )
            )
        return out

    def _queue_metrics(self, windows: list[Point]) -> None:
        points = self.histogram_points(windows)
        metric = Metric(
            name=LATENCY_METRIC,
            description="Latency of the packets of a hoptrace trace in a segment (end_to_end: the path)",
            unit="ns",
            data=ExponentialHistogram(
                data_points=points, aggregation_temporality=AggregationTemporality.DELTA
            ),
        )
        data = MetricsData([ResourceMetrics(self.resource, [ScopeMetrics(SCOPE, [metric], "")], "")])
        try:
            self._metrics_out.put_nowait(data)
        except queue.Full:
            self._count("metrics", "queue_full", len(points))

    def _send_metrics(self) -> None:
        while (data := self._metrics_out.get()) is not None:
            n = sum(
                len(m.data.data_points)
                for rm in data.resource_metrics
                for sm in rm.scope_metrics
                for m in sm.metrics
            )
            try:
                ok = self.metric_exporter.export(data) is MetricExportResult.SUCCESS
            except Exception:  # noqa: BLE001 - counted; the next windows try again
                log.exception("OTLP metric export failed")
                ok = False
            self._count("metrics", "exported" if ok else "export_failed", n)
            self._metrics_out.task_done()
        self._metrics_out.task_done()

    # ---- flush and close ----------------------------------------------------------------------------

    def flush(self, timeout_s: float = 30.0) -> bool:
        """Send everything queued so far; False when it did not all leave within `timeout_s`."""
        with self._lock:
            if not self._lock.wait_for(
                lambda: not self._packets and not self._windows and not self._busy, timeout_s
            ):
                return False
        self._metrics_out.join()
        return self.provider.force_flush(int(timeout_s * 1000))

    def close(self, timeout_s: float = 10.0) -> None:
        """Send what is queued (for up to about `timeout_s`), then stop; what is left is counted `closed`."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._lock.notify_all()
        deadline = time.monotonic() + timeout_s
        while self._worker.is_alive() and time.monotonic() < deadline:
            self.provider.force_flush()  # what the processor holds leaves now, making room for the worker
            self._worker.join(0.1)
        with self._lock:
            self._giving_up = True
            self._lock.notify_all()
        self._worker.join(1.0)
        self.provider.shutdown()  # exports what the processor holds (the exporter's timeout bounds it)
        self._metrics_out.put(None)
        self._metrics_thread.join(timeout_s)
        self.metric_exporter.shutdown(timeout_millis=timeout_s * 1000)


def _passages(samples: list[Point]) -> list[tuple[Point, ...]]:
    """The samples of one trace and packet ID split by passage: a segment seen twice is a second packet of
    the same ID (IDs wrap), told apart by time."""
    if len({s.tag("segment") for s in samples}) == len(samples):
        return [tuple(samples)]
    groups: list[list[Point]] = []
    for s in sorted(samples, key=lambda p: p.time_ns):
        for group in groups:
            if all(g.tag("segment") != s.tag("segment") for g in group):
                group.append(s)
                break
        else:
            groups.append([s])
    return [tuple(g) for g in groups]


def beside(exporter: Any, otlp: OtlpExporter | None) -> Any:
    """The exporter the pipeline exports to: `exporter` alone, or it and `otlp`, each given every point."""
    return exporter if otlp is None else _Both(exporter, otlp)


class _Both:
    """Two exporters as one (`pipeline.Exporter`): each takes every point; neither waits on the other."""

    def __init__(self, first: Any, second: OtlpExporter) -> None:
        self.first = first
        self.second = second

    def export(self, points: list[Point]) -> None:
        self.first.export(points)
        self.second.export(points)

    def note_addresses(self, trace: str, described: list[DescribedRecord]) -> None:
        """`OtlpExporter.note_addresses`."""
        self.second.note_addresses(trace, described)

    def note_drops(self, packets: list[JoinedPacket]) -> None:
        """`OtlpExporter.note_drops`."""
        self.second.note_drops(packets)


def start_otlp_exporter(
    config: OtlpConfig, catalog: TraceCatalog | None, aggregate: AggregateConfig
) -> OtlpExporter | None:
    """The OpenTelemetry exporter `config` asks for, for the exemplars and windows of `aggregate`; None
    when it is off."""
    if not config.enabled:
        return None
    config.validate(aggregate.exemplar_every, aggregate.exemplar_slowest)
    log.info("exporting OpenTelemetry traces (%s) and metrics to %s", config.sample, config.endpoint)
    return OtlpExporter(
        config,
        catalog,
        instance=aggregate.instance,
        interval_ns=aggregate.interval_ns,
        exemplar_every=aggregate.exemplar_every,
    )
