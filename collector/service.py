"""The collector: receiver -> clock alignment -> join -> aggregation -> InfluxDB exporter.

`CollectorPipeline` wires the processing stages and is driven by the receiver (one call per batch) and by a
ticker (idle expiry, window closing). `start_collector` starts it all - with the NTP time service the agents
align their clocks on (`timeservice.py`) and the Prometheus `/metrics` endpoint (`metrics.py`) - and returns
a handle; `run_collector` runs until SIGTERM/SIGINT and flushes everything before returning.

The receive path never waits on InfluxDB: the pipeline only queues points for the exporter (bounded; see
`influx.py` for the spool that holds them while InfluxDB is away).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
from collections import deque
from dataclasses import dataclass, field, replace
from operator import itemgetter
from pathlib import Path
from typing import Any, Protocol

import grpc

from hoptrace.collector.actions import HopActionsStage, RecordedValuesStage
from hoptrace.collector.aggregate import (
    AggregateConfig,
    HopCounterAggregator,
    HopCounterWindow,
    LatencySample,
    SegmentAggregator,
    SegmentWindow,
    TracerLossWindow,
)
from hoptrace.collector.catalog import TraceCatalog
from hoptrace.collector.clock import ClockAligner, NodeClockPoint
from hoptrace.collector.events import EventsStage
from hoptrace.collector.influx import InfluxConfig, InfluxExporter, ensure_database
from hoptrace.collector.join import HopJoiner, JoinConfig, JoinedPacket
from hoptrace.collector.metrics import MetricsServer, start_metrics_server
from hoptrace.collector.receiver import CollectorReceiver, ReceiverConfig, start_receiver
from hoptrace.collector.records import HOP_INDEX, DecodedBatch
from hoptrace.collector.segment_metrics import SegmentMetrics
from hoptrace.collector.timeservice import TimeServer, parse_addr
from hoptrace.common.grpcutil import TLSFiles

log = logging.getLogger(__name__)


class Exporter(Protocol):
    """What the pipeline needs from its exporter (the InfluxDB one, or a list in tests)."""

    def export(
        self,
        samples: list[LatencySample] = ...,
        segments: list[SegmentWindow] = ...,
        counters: list[HopCounterWindow] = ...,
        clocks: list[NodeClockPoint] = ...,
        tracer_loss: list[TracerLossWindow] = ...,
    ) -> None: ...


@dataclass
class CollectorConfig:
    """Configuration of every stage."""

    receiver: ReceiverConfig = field(default_factory=ReceiverConfig)
    join: JoinConfig = field(default_factory=JoinConfig)
    aggregate: AggregateConfig = field(default_factory=AggregateConfig)
    influx: InfluxConfig = field(default_factory=InfluxConfig)
    catalog_file: str | None = None
    tick_s: float = 0.25
    create_database: bool = True
    clock_listen: str | None = "127.0.0.1:7123"  # NTP time service (UDP); None: off
    metrics_listen: str | None = "127.0.0.1:9171"  # Prometheus /metrics (HTTP); None: off

    def validate(self) -> None:
        """Validate every stage's config."""
        self.receiver.validate()
        self.join.validate()
        self.aggregate.validate()
        self.influx.validate()
        if self.tick_s <= 0:
            raise ValueError("tick_s must be positive")
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
        self._lock = threading.Lock()
        self._agent_dropped: dict[str, int] = {}  # node -> last cumulative agent_dropped
        self.agent_dropped: dict[str, int] = {}  # node -> records the agent dropped, summed over restarts
        # node -> records and counters it sent for hops of another node (refused, see own_hops_only)
        self.foreign_records: dict[str, int] = {}
        self.segment_metrics = SegmentMetrics()
        self._flushed_before = 0  # flush() closed every window before this (master time)

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
            )
            self.counters.add_records(batch.trace, batch.node, batch.records, mapping)
            now = self.joiner.watermark_ns or time.time_ns()
            if batch.counters:
                for hop, ts, lost in self.counters.add_counters(
                    batch.trace, batch.node, batch.counters, now_ns=now
                ):
                    self.segments.note_tracer_lost(batch.trace, hop, batch.node, ts, lost, "ringbuf_full")
                self._export_actions(
                    self.hop_actions.add_counters(batch.trace, batch.node, batch.counters, now_ns=now)
                )
            if batch.events:
                self._export_actions(
                    self.events.add_events(batch.trace, batch.node, batch.events, now_ns=now)
                )
            if batch.values:
                path = self.catalog.get(batch.trace)
                self._export_actions(
                    self.recorded.add_values(
                        batch.trace,
                        batch.node,
                        batch.values,
                        mapping,
                        path.hop_name if path is not None else (lambda index: f"hop{index}"),
                    )
                )
            self._note_agent_dropped(batch, now)
            self._export(packets)

    def _export_actions(self, lines: list[str]) -> None:
        """Hop counts and histograms (collector/actions.py) go out as they come, to exporters that take
        lines (InfluxExporter); others (test lists) do not see them."""
        submit = getattr(self.exporter, "submit_lines", None)
        if lines and submit is not None:
            submit(lines)

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

    def _export(self, packets: list[JoinedPacket]) -> None:
        samples = self.segments.add_packets(packets) if packets else []
        upto = self.joiner.watermark_ns - self.joiner.config.window_ns - self.segments.config.interval_ns
        windows = self.segments.close_windows(upto)
        samples.extend(self.segments.take_exemplars())
        counters = self.counters.close_windows(upto)
        clocks = self.clock.due_points()
        losses = self.segments.take_tracer_loss()
        self.segment_metrics.observe(windows)
        if windows:  # once a second: drop the series of deleted traces
            self.segment_metrics.forget_traces(set(self.catalog.names()))
        if samples or windows or counters or clocks or losses:
            self.exporter.export(samples, windows, counters, clocks, losses)

    def flush(self) -> None:
        """Emit every pending packet and close every window (shutdown)."""
        with self._lock:
            samples = self.segments.add_packets(self.joiner.flush())
            windows = self.segments.flush()
            counters = self.counters.flush()
            samples.extend(self.segments.take_exemplars())
            self.segment_metrics.observe(windows)
            interval = self.segments.config.interval_ns
            for start in [w.start_ns for w in windows] + [w.start_ns for w in counters]:
                self._flushed_before = max(self._flushed_before, start + interval)
            self.exporter.export(
                samples, windows, counters, self.clock.due_points(), self.segments.take_tracer_loss()
            )

    def stats(self) -> dict[str, object]:
        """Counters of every stage, for logs and status."""
        j = self.joiner.stats
        return {
            "records": j.records,
            "packets": j.packets,
            "complete": j.complete,
            "incomplete": j.incomplete,
            "collisions": j.collisions,
            "evicted": j.evicted,
            "out_of_path": j.out_of_path,
            "missing_hops": {f"{t}/{h}": n for (t, h), n in j.missing.items()},
            "pending": self.joiner.pending(),
            "samples": self.segments.stats.samples,
            "below_clock_bound": self.segments.stats.below_clock_bound,
            "late": self.segments.stats.late,
            "late_records": self.counters.stats.late_records,
            "tracer_lost": self.segments.stats.tracer_lost,
            "foreign_records": dict(self.foreign_records),
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
        try:
            time_server = TimeServer(config.clock_listen).start()
        except OSError as err:  # records still flow; agents then report an unknown clock bound
            log.error("time service: cannot listen on udp %s: %s", config.clock_listen, err)
    return catalog, time_server


class WrittenBeforeMark:
    """The master time before which a collector's windows are written (to InfluxDB, or to its fixed spool,
    which a restart replays), in a file beside the spool. Agents resend the batches a collector had in
    flight when it died, and a restarted one would write those seconds' windows again from part of their
    packets (over the whole ones: same series and time); it resumes after this mark instead, as a Kafka
    partition's next owner resumes after its commit's `written-before-ns`."""

    NAME = "written-before-ns"

    def __init__(self, directory: str) -> None:
        self.path = Path(directory) / self.NAME

    def read(self) -> int:
        """The mark, or 0 when there is none (a first start) or it cannot be used (logged)."""
        try:
            text = self.path.read_text().strip()
        except FileNotFoundError:
            return 0
        except OSError as err:
            log.warning("resume: cannot read %s: %s; windows start afresh", self.path, err)
            return 0
        try:
            mark = int(text)
        except ValueError:
            log.warning("resume: %s holds %r, not a time; windows start afresh", self.path, text[:40])
            return 0
        if mark > time.time_ns():  # this host's clock is behind the one that wrote it: not ours to trust
            log.warning("resume: %s is in the future (%d); windows start afresh", self.path, mark)
            return 0
        return mark

    def write(self, mark_ns: int) -> None:
        """Replace the mark (a rename: a crash leaves the old one or the new one, never half)."""
        tmp = self.path.with_name(self.NAME + ".tmp")
        try:
            tmp.write_text(f"{mark_ns}\n")
            os.replace(tmp, self.path)
        except OSError as err:  # a restart then writes those windows again: say so, keep collecting
            log.warning("resume: cannot write %s: %s", self.path, err)
            with contextlib.suppress(OSError):
                tmp.unlink()


class CollectorService:
    """A running collector: gRPC server, pipeline, exporter and ticker."""

    def __init__(self, config: CollectorConfig, catalog: TraceCatalog | None = None) -> None:
        config.validate()
        self.config = config
        self.catalog, self.time_server = start_shared_parts(config, catalog)
        self.exporter = InfluxExporter(config.influx)
        self.pipeline = CollectorPipeline(self.exporter, self.catalog, config.join, config.aggregate)
        # With a fixed spool, what was written survives a restart: resume after it (WrittenBeforeMark).
        self.mark = WrittenBeforeMark(config.influx.spool_dir) if config.influx.spool_dir else None
        self._marks: deque[tuple[int, int]] = deque()  # (exporter.accepted when taken, closed before)
        self._marked = 0
        if self.mark is not None and (resume := self.mark.read()):
            self.pipeline.resume_after(resume)
            log.info("resuming after windows written before %d (%s)", resume, self.mark.path)
        self.receiver = CollectorReceiver(self.pipeline.consume)
        self.server: grpc.Server
        self.server, self.port = start_receiver(self.receiver, config.receiver)
        self.metrics_server: MetricsServer | None = None
        if config.metrics_listen is not None:
            try:
                self.metrics_server = start_metrics_server(config.metrics_listen, self)
            except OSError as err:  # observability must not stop ingestion
                log.error("/metrics: cannot listen on %s: %s", config.metrics_listen, err)
        self._stop = threading.Event()
        self._ticker = threading.Thread(target=self._tick_loop, name="collector-tick", daemon=True)
        self._ticker.start()
        log.info(
            "collector listening on port %d, writing %s %s",
            self.port,
            config.influx.url,
            config.influx.bucket,
        )

    def _tick_loop(self) -> None:
        while not self._stop.wait(self.config.tick_s):
            try:
                self.pipeline.tick()
                self._advance_mark()
            except Exception:  # keep ticking; a bug here must not stop expiry forever
                log.exception("collector tick failed")

    def _advance_mark(self) -> None:
        """Note the windows closed now; write the mark of those whose points have all left memory."""
        if self.mark is None:
            return
        closed = self.pipeline.closed_before()
        if closed > self._marked:
            self._marks.append((self.exporter.accepted, closed))
            self._marked = closed
        durable = 0
        while self._marks and self.exporter.left_memory >= self._marks[0][0]:
            durable = self._marks.popleft()[1]
        if durable:
            self.mark.write(durable)

    def flush(self, timeout_s: float = 30.0) -> bool:
        """Push every pending packet and window to InfluxDB and wait for the writes."""
        self.pipeline.flush()
        return self.exporter.flush(timeout_s)

    def stop(self, grace_s: float = 5.0) -> None:
        """Stop receiving (letting open streams finish for `grace_s`), flush everything, close."""
        self._stop.set()
        self.server.stop(grace_s).wait()
        self._ticker.join()
        self.pipeline.flush()
        self.exporter.close()
        self._advance_mark()  # everything left memory (written or spooled) unless the exporter gave up
        if self.metrics_server is not None:
            self.metrics_server.stop()
        if self.time_server is not None:
            self.time_server.stop()
        log.info("collector stopped: %s", self.pipeline.stats())


def start_collector(config: CollectorConfig, catalog: TraceCatalog | None = None) -> CollectorService:
    """Start a collector in the background; call `.stop()` to flush and shut it down."""
    return CollectorService(config, catalog)


def run_collector(
    listen: str,
    influx_url: str,
    influx_bucket: str,
    influx_org: str = "-",
    influx_token: str = "",
    *,
    catalog: TraceCatalog | None = None,
    catalog_file: str | None = None,
    join_window_s: float = 2.0,
    max_entries: int = 500_000,
    stop_event: threading.Event | None = None,
    clock_listen: str | None = "127.0.0.1:7123",
    metrics_listen: str | None = "127.0.0.1:9171",
    spool_dir: str | None = None,
    spool_bytes: int = 1 << 30,
    max_export_points: int = 1_000_000,
    tls: TLSFiles | None = None,
    kafka: Any = None,
    aggregate: AggregateConfig | None = None,
) -> int:
    """Run the collector until SIGTERM/SIGINT (or `stop_event`), then flush everything. Returns 0.

    With `kafka` (a `hoptrace.collector.kafka.KafkaConfig`) it consumes the records topic in a consumer
    group instead of serving gRPC on `listen`."""
    config = CollectorConfig(
        receiver=ReceiverConfig(listen=listen, tls=tls),
        join=JoinConfig(window_ns=int(join_window_s * 1e9), max_entries=max_entries),
        aggregate=aggregate or AggregateConfig(),
        influx=InfluxConfig(
            url=influx_url,
            bucket=influx_bucket,
            org=influx_org,
            token=influx_token,
            spool_dir=spool_dir,
            spool_bytes=spool_bytes,
            max_pending=max_export_points,
        ),
        catalog_file=catalog_file,
        clock_listen=clock_listen or None,
        metrics_listen=metrics_listen or None,
    )
    stop = stop_event or threading.Event()
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
    service: Any
    if kafka is not None:
        from hoptrace.collector.kafka import KafkaCollectorService  # imports this module

        service = KafkaCollectorService(config, kafka, catalog)
    else:
        service = start_collector(config, catalog)
    try:
        while not stop.wait(0.5):  # short waits keep the main thread responsive to signals
            pass
    finally:
        service.stop()
    return 0
