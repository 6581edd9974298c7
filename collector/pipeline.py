"""The collector's pipeline: clock alignment -> join -> aggregation and actions -> exporters, whatever the
records come by (gRPC: `service.py`; Kafka: `kafka.py`, one pipeline per owned partition).

`CollectorPipeline` is driven by its receiver (one call per batch) and by a ticker (idle expiry, window
closing). Every stage's output leaves as `points.Point`s through one interface, `Exporter.export`: hop
actions, event probes and recorded values as each batch brings them, exemplars, windows, clock estimates and
tracer losses as windows close. An exemplar leaves with its window, never before it (`_hold_exemplars`):
what `closed_before` says is written is then all of those windows' points, and a restarted collector that
joins an agent's resend again writes the exemplars of the windows after that mark only, once.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from operator import itemgetter
from typing import Protocol

from hoptrace.collector.actions import HopActionsStage, RecordedValuesStage
from hoptrace.collector.addresses import HopAddressesStage
from hoptrace.collector.aggregate import (
    AggregateConfig,
    HopCounterAggregator,
    LatencySample,
    SegmentAggregator,
)
from hoptrace.collector.captures import CaptureConfig, HopCapturesStage
from hoptrace.collector.catalog import TraceCatalog
from hoptrace.collector.clock import ClockAligner
from hoptrace.collector.clockauth import ClockKeys
from hoptrace.collector.events import EventsStage
from hoptrace.collector.influx import InfluxConfig, ensure_database
from hoptrace.collector.join import HopJoiner, JoinConfig, JoinedPacket
from hoptrace.collector.otlp import OtlpConfig
from hoptrace.collector.points import Point, window_points
from hoptrace.collector.receiver import ReceiverConfig
from hoptrace.collector.records import HOP_INDEX, DecodedBatch, DescribedRecord
from hoptrace.collector.segment_metrics import SegmentMetrics
from hoptrace.collector.timeservice import TimeServer, parse_addr

log = logging.getLogger(__name__)


class Exporter(Protocol):
    """Where the pipeline's points go: the InfluxDB exporter (`influx.InfluxExporter`), any peer beside it
    that takes the same points, or a list in tests. `export` must not block the pipeline: an exporter that
    falls behind queues, then drops and counts (the InfluxDB one: `max_pending`, `drops`)."""

    def export(self, points: list[Point]) -> None: ...


@dataclass
class CollectorConfig:
    """Configuration of every stage."""

    receiver: ReceiverConfig = field(default_factory=ReceiverConfig)
    join: JoinConfig = field(default_factory=JoinConfig)
    aggregate: AggregateConfig = field(default_factory=AggregateConfig)
    influx: InfluxConfig = field(default_factory=InfluxConfig)
    otlp: OtlpConfig = field(default_factory=OtlpConfig)  # OpenTelemetry export beside InfluxDB (otlp.py)
    capture: CaptureConfig = field(
        default_factory=CaptureConfig
    )  # the bound on stored captures (captures.py)
    catalog_file: str | None = None
    tick_s: float = 0.25
    create_database: bool = True
    clock_listen: str | None = "127.0.0.1:7123"  # NTP time service (UDP); None: off
    clock_key_file: str | None = None  # shared clock key (clockauth.py); None: a random one, rotated
    clock_key_rotate_s: float = 3600.0
    metrics_listen: str | None = "127.0.0.1:9171"  # Prometheus /metrics (HTTP); None: off

    def validate(self) -> None:
        """Validate every stage's config."""
        self.receiver.validate()
        self.join.validate()
        self.aggregate.validate()
        self.influx.validate()
        self.otlp.validate(self.aggregate.exemplar_every, self.aggregate.exemplar_slowest)
        self.capture.validate()
        if self.tick_s <= 0:
            raise ValueError("tick_s must be positive")
        if self.clock_key_rotate_s <= 0:
            raise ValueError("--clock-key-rotate must be positive")
        for addr in (self.clock_listen, self.metrics_listen):
            if addr is not None:
                parse_addr(addr)


class CollectorPipeline:
    """The processing stages between the receiver and the exporter. Thread-safe (one lock)."""

    def __init__(
        self,
        exporter: Exporter,
        catalog: TraceCatalog | None = None,
        join_config: JoinConfig | None = None,
        aggregate_config: AggregateConfig | None = None,
        capture_config: CaptureConfig | None = None,
    ) -> None:
        self.catalog = catalog if catalog is not None else TraceCatalog()
        self.exporter = exporter
        self.clock = ClockAligner()
        self.joiner = HopJoiner(self.catalog, join_config)
        self.segments = SegmentAggregator(self.catalog, self.clock, aggregate_config)
        self.counters = HopCounterAggregator(self.clock, aggregate_config, self.catalog)
        self.hop_actions = HopActionsStage(self.clock)
        self.events = EventsStage(self.clock)
        self.recorded = RecordedValuesStage()
        self.addresses = HopAddressesStage()
        self.captures = HopCapturesStage(capture_config)
        self._lock = threading.Lock()
        self._agent_dropped: dict[str, int] = {}  # node -> last cumulative agent_dropped
        self.agent_dropped: dict[str, int] = {}  # node -> records the agent dropped, summed over restarts
        # node -> records and counters it sent for hops of another node (refused, see own_hops_only)
        self.foreign_records: dict[str, int] = {}
        self.segment_metrics = SegmentMetrics()
        self._flushed_before = 0  # flush() closed every window before this (master time)
        # Exemplars sampled by ID, by the start of their segment's window: held until it closes.
        self._exemplars: dict[int, list[LatencySample]] = {}
        # Master time now, for what is stamped when it leaves (clock estimates, addresses, counters without
        # a time): the collector's clock; an import of recorded files (file_input.py) gives the time its
        # records have reached, so those points land among the records.
        self.now_ns: Callable[[], int] = time.time_ns
        # An exporter that follows packets beyond their points (otlp.OtlpExporter, through otlp.beside) is
        # also handed the described records of the path hops and the joined packets the kernel dropped.
        self._note_addresses = getattr(exporter, "note_addresses", None)
        self._note_drops = getattr(exporter, "note_drops", None)

    def closed_before(self) -> int:
        """Master time before which every window is closed and handed to the exporter: what the exporter
        has accepted once this returns includes their points (windows are exported under the same lock)."""
        with self._lock:
            return max(min(self.segments.closed_before, self.counters.closed_before), self._flushed_before)

    def resume_after(self, written_before_ns: int) -> None:
        """Replay a stream (a Kafka partition from its commit) whose windows before `written_before_ns`
        (master time; 0 when the commit does not say) an earlier pipeline wrote: they are not written
        again (see `SegmentAggregator.resume_after`), and the cumulative hop-action and event values
        seen first set the baseline (their growth so far was written by that pipeline)."""
        with self._lock:
            self.segments.resume_after(written_before_ns)
            self.counters.resume_after(written_before_ns)
            self.hop_actions.resume_after_commit()
            self.events.resume_after_commit()

    def own_hops_only(self, batch: DecodedBatch) -> DecodedBatch:
        """The batch without records and counters at hops its node does not run: an agent only ever
        records its own hops, so others are forged or corrupt (with mutual TLS, `batch.node` is the
        sender's certificate) and would move another node's segments."""
        path = self.catalog.get(batch.trace)
        if path is None or not path.known or not any(path.hop_nodes):
            return batch  # no path with nodes to check against yet (records wait in the join)
        own = {i for i, node in enumerate(path.hop_nodes) if node in ("", batch.node)}
        own.update(drop.hop_index for drop in path.drop_hops if drop.node == batch.node)
        if set(map(itemgetter(HOP_INDEX), batch.records)) <= own and all(
            c.hop_index in own for c in batch.counters
        ):
            return batch
        records = [r for r in batch.records if r[HOP_INDEX] in own]
        counters = [c for c in batch.counters if c.hop_index in own]
        refused = len(batch.records) - len(records) + len(batch.counters) - len(counters)
        if not self.foreign_records.get(batch.node):
            log.warning(
                "node %s sent %d records/counters for other nodes' hops of trace %s: refused",
                batch.node,
                refused,
                batch.trace,
            )
        self.foreign_records[batch.node] = self.foreign_records.get(batch.node, 0) + refused
        return replace(batch, records=records, counters=counters)

    def consume(self, batch: DecodedBatch) -> None:
        """Process one decoded batch through every stage and export what is ready."""
        with self._lock:
            batch = self.own_hops_only(batch)
            mapping = self.clock.update(batch.node, batch.clock)
            for c in batch.counters:
                if c.hop:
                    self.catalog.learn_hop(batch.trace, c.hop_index, c.hop, batch.node)
            if batch.counters:  # a heartbeat: every hop the node runs for the trace, with its attach time
                self.joiner.hop_attached(
                    batch.trace,
                    batch.node,
                    batch.generation,
                    {
                        c.hop or f"hop{c.hop_index}": mapping.to_master(c.attached_ns) if c.attached_ns else 0
                        for c in batch.counters
                    },
                )
            # The node's own watermark (its queue's oldest record), not its counters' time: counters
            # overtake records still queued in the agent.
            if batch.watermark_ns:
                self.joiner.heard_from(batch.node, mapping.to_master(batch.watermark_ns))
            packets = self.joiner.join_hops(
                batch.trace,
                batch.node,
                batch.records,
                mapping.delta_ns,
                drift=mapping.drift,
                ref_mono_ns=mapping.ref_mono_ns,
                values=batch.values,
                functions=batch.functions,
            )
            self.counters.add_records(batch.trace, batch.node, batch.records, mapping)
            now = self.joiner.watermark_ns or self.now_ns()
            # Hop actions, event probes and recorded values go out as they come (their growth since the
            # agent's previous report); windows go out when they close (_export).
            actions: list[Point] = []
            if batch.counters:
                for hop, ts, lost in self.counters.add_counters(
                    batch.trace, batch.node, batch.counters, now_ns=now
                ):
                    self.segments.note_tracer_lost(batch.trace, hop, batch.node, ts, lost, "ringbuf_full")
                actions += self.hop_actions.add_counters(batch.trace, batch.node, batch.counters, now_ns=now)
            if batch.events:
                actions += self.events.add_events(batch.trace, batch.node, batch.events, now_ns=now)
            if batch.values:
                path = self.catalog.get(batch.trace)
                actions += self.recorded.add_values(
                    batch.trace,
                    batch.node,
                    batch.values,
                    mapping,
                    path.hop_name if path is not None else (lambda index: f"hop{index}"),
                )
            if batch.captures:
                path = self.catalog.get(batch.trace)
                actions += self.captures.add(
                    batch.trace,
                    batch.node,
                    batch.captures,
                    mapping,
                    path.hop_name if path is not None else (lambda index: f"hop{index}"),
                )
            if batch.addresses:
                on_path = self._on_path(batch.trace, batch.addresses)
                self.addresses.add(batch.trace, on_path, time.monotonic_ns())
                if self._note_addresses is not None:
                    self._note_addresses(batch.trace, on_path)
            if actions:
                self.exporter.export(actions)
            self._note_agent_dropped(batch, now)
            self._export(packets)

    def _on_path(self, trace: str, described: list[DescribedRecord]) -> list[DescribedRecord]:
        """The described records of the trace's path hops (a drop hop's are not on the path)."""
        path = self.catalog.get(trace)
        if path is None or not path.known:
            return described
        return [d for d in described if d[0][HOP_INDEX] < len(path.hop_names)]

    def _path_hops(self, trace: str) -> list[str] | None:
        path = self.catalog.get(trace)
        if path is None or not path.known:
            return None
        return [path.hop_name(i) for i in range(len(path.hop_names))]

    def _note_agent_dropped(self, batch: DecodedBatch, now: int) -> None:
        """`agent_dropped` is cumulative per agent; its growth is tracer loss of the batch's node."""
        prev = self._agent_dropped.get(batch.node)
        value = batch.agent_dropped
        self._agent_dropped[batch.node] = value
        delta = value if prev is None or value < prev else value - prev  # smaller: the agent restarted
        if delta > 0:
            self.agent_dropped[batch.node] = self.agent_dropped.get(batch.node, 0) + delta
            self.segments.note_tracer_lost(batch.trace, "", batch.node, now, delta, "agent_dropped")

    def tick(self, now_ns: int | None = None) -> None:
        """Expire packets whose window passed (also while idle) and export closed windows."""
        with self._lock:
            self._export(self.joiner.tick(now_ns))

    def _hold_exemplars(self, samples: list[LatencySample]) -> None:
        """Keep exemplars sampled by ID (the aggregation gives them at join) until their window closes."""
        interval = self.segments.config.interval_ns
        held = self._exemplars
        for sample in samples:
            start = sample.ts_ns - sample.ts_ns % interval
            found = held.get(start)
            if found is None:
                held[start] = [sample]
            else:
                found.append(sample)

    def _closed_exemplars(self, before_ns: int | None) -> list[LatencySample]:
        """The held exemplars of the windows that start before `before_ns` (None: all), in window order:
        a late packet's, whose window had closed already, leaves at once."""
        held = self._exemplars
        starts = sorted(s for s in held if before_ns is None or s < before_ns)
        return [sample for start in starts for sample in held.pop(start)]

    def _joined(self, packets: list[JoinedPacket]) -> None:
        """Packets the join emitted: to the aggregation, and those the kernel dropped to `note_drops`."""
        if self._note_drops is not None:
            dropped = [p for p in packets if p.drop is not None]
            if dropped:
                self._note_drops(dropped)
        self._hold_exemplars(self.segments.add_packets(packets))

    def _export(self, packets: list[JoinedPacket]) -> None:
        if packets:
            self._joined(packets)
        upto = self.joiner.watermark_ns - self.joiner.config.window_ns - self.segments.config.interval_ns
        windows = self.segments.close_windows(upto)
        samples = self._closed_exemplars(self.segments.closed_before) if self._exemplars else []
        samples.extend(self.segments.take_exemplars())
        counters = self.counters.close_windows(upto)
        clocks = self.clock.due_points(self.now_ns())
        losses = self.segments.take_tracer_loss()
        self.segment_metrics.observe(windows)
        if windows:  # once a second: drop the series and attach times of deleted traces
            live = set(self.catalog.names())
            self.segment_metrics.forget_traces(live)
            self.joiner.forget_traces(live)
            self.addresses.forget_traces(live)
            self.captures.forget_traces(live)
        addresses = self.addresses.take_points(time.monotonic_ns(), self.now_ns(), self._path_hops)
        if samples or windows or counters or clocks or losses:
            self.exporter.export(window_points(samples, windows, counters, clocks, losses))
        if addresses:
            self.exporter.export(addresses)

    def flush(self) -> None:
        """Emit every pending packet and close every window (shutdown)."""
        with self._lock:
            self._joined(self.joiner.flush())
            windows = self.segments.flush()
            counters = self.counters.flush()
            samples = self._closed_exemplars(None)
            samples.extend(self.segments.take_exemplars())
            self.segment_metrics.observe(windows)
            interval = self.segments.config.interval_ns
            for start in [w.start_ns for w in windows] + [w.start_ns for w in counters]:
                self._flushed_before = max(self._flushed_before, start + interval)
            clocks, losses = self.clock.due_points(self.now_ns()), self.segments.take_tracer_loss()
            self.exporter.export(window_points(samples, windows, counters, clocks, losses))
            addresses = self.addresses.take_points(2**63 - 1, self.now_ns(), self._path_hops)  # settle all
            if addresses:
                self.exporter.export(addresses)

    def stats(self) -> dict[str, object]:
        """Counters of every stage, for logs and status."""
        j = self.joiner.stats
        return {
            "records": j.records,
            "packets": j.packets,
            "complete": j.complete,
            "incomplete": j.incomplete,
            "collisions": j.collisions,
            "repeats": j.repeats,
            "evicted": j.evicted,
            "out_of_path": j.out_of_path,
            "missing_hops": {f"{t}/{h}": n for (t, h), n in j.missing.items()},
            "before_attach": j.before_attach,
            "pending": self.joiner.pending(),
            "samples": self.segments.stats.samples,
            "below_clock_bound": self.segments.stats.below_clock_bound,
            "late": self.segments.stats.late,
            "late_records": self.counters.stats.late_records,
            "tracer_lost": self.segments.stats.tracer_lost,
            "foreign_records": dict(self.foreign_records),
            "captures_written": dict(self.captures.written),
            "captures_dropped": dict(self.captures.dropped),
        }


def start_shared_parts(
    config: CollectorConfig, catalog: TraceCatalog | None
) -> tuple[TraceCatalog, TimeServer | None]:
    """What a collector sets up before it takes records, whichever way they come (gRPC or Kafka): the trace
    catalogue (with its file), the InfluxDB database and the time service."""
    catalog = catalog if catalog is not None else TraceCatalog()
    if config.catalog_file:
        catalog.load_file(config.catalog_file)
    if config.create_database:
        ensure_database(config.influx.url, config.influx.bucket, config.influx.token)
    time_server = None
    if config.clock_listen is not None:
        if config.clock_key_file:
            keys = ClockKeys.from_file(config.clock_key_file)
        else:
            keys = ClockKeys(rotate_s=config.clock_key_rotate_s)
        try:
            time_server = TimeServer(config.clock_listen, keys).start()
        except OSError as err:  # records still flow; agents then report an unknown clock bound
            log.error("time service: cannot listen on udp %s: %s", config.clock_listen, err)
    return catalog, time_server
