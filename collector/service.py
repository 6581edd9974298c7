"""The collector: receiver -> clock alignment -> join -> aggregation -> InfluxDB exporter.

`CollectorPipeline` wires the processing stages and is driven by the receiver (one call per batch) and by a
ticker (idle expiry, window closing). `start_collector` starts it all and returns a handle; `run_collector`
runs until SIGTERM/SIGINT and flushes everything before returning.
"""

from __future__ import annotations

import base64
import logging
import signal
import threading
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from typing import Protocol

import grpc

from hoptrace.collector.aggregate import (
    AggregateConfig,
    HopCounterAggregator,
    HopCounterWindow,
    LatencySample,
    SegmentAggregator,
    SegmentWindow,
)
from hoptrace.collector.catalog import TraceCatalog
from hoptrace.collector.clock import ClockAligner
from hoptrace.collector.influx import InfluxConfig, InfluxExporter
from hoptrace.collector.join import HopJoiner, JoinConfig, JoinedPacket
from hoptrace.collector.receiver import CollectorReceiver, ReceiverConfig, start_receiver
from hoptrace.collector.records import DecodedBatch

log = logging.getLogger(__name__)


class Exporter(Protocol):
    """What the pipeline needs from its exporter (the InfluxDB one, or a list in tests)."""

    def export(
        self,
        samples: list[LatencySample] = ...,
        segments: list[SegmentWindow] = ...,
        counters: list[HopCounterWindow] = ...,
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

    def validate(self) -> None:
        """Validate every stage's config."""
        self.receiver.validate()
        self.join.validate()
        self.aggregate.validate()
        self.influx.validate()
        if self.tick_s <= 0:
            raise ValueError("tick_s must be positive")


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
        self.counters = HopCounterAggregator(self.clock, aggregate_config)
        self._lock = threading.Lock()

    def consume(self, batch: DecodedBatch) -> None:
        """Process one decoded batch through every stage and export what is ready."""
        with self._lock:
            mapping = self.clock.update(batch.node, batch.clock)
            for c in batch.counters:
                if c.hop:
                    self.catalog.learn_hop(batch.trace, c.hop_index, c.hop, batch.node)
            packets = self.joiner.join_hops(batch.trace, batch.node, batch.records, mapping.delta_ns)
            if batch.counters:
                now = self.joiner.watermark_ns or time.time_ns()
                self.counters.add_counters(batch.trace, batch.node, batch.counters, now_ns=now)
            self._export(packets)

    def tick(self, now_ns: int | None = None) -> None:
        """Expire packets whose window passed (also while idle) and export closed windows."""
        with self._lock:
            self._export(self.joiner.tick(now_ns))

    def _export(self, packets: list[JoinedPacket]) -> None:
        samples = self.segments.add_packets(packets) if packets else []
        upto = self.joiner.watermark_ns - self.joiner.config.window_ns - self.segments.config.interval_ns
        windows = self.segments.close_windows(upto)
        counters = self.counters.close_windows(upto)
        if samples or windows or counters:
            self.exporter.export(samples, windows, counters)

    def flush(self) -> None:
        """Emit every pending packet and close every window (shutdown)."""
        with self._lock:
            samples = self.segments.add_packets(self.joiner.flush())
            self.exporter.export(samples, self.segments.flush(), self.counters.flush())

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
        }


def ensure_database(config: InfluxConfig) -> None:
    """InfluxDB 1.8: create the bucket's database if missing (best effort; the v2 API cannot)."""
    db = config.bucket.split("/", 1)[0]
    q = urllib.parse.urlencode({"q": f'CREATE DATABASE "{db}"'}).encode()
    req = urllib.request.Request(config.url.rstrip("/") + "/query", data=q, method="POST")
    if config.token:
        req.add_header("Authorization", "Basic " + base64.b64encode(config.token.encode()).decode())
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            resp.read()
    except OSError as err:
        log.warning("could not create database %s at %s: %s", db, config.url, err)


class CollectorService:
    """A running collector: gRPC server, pipeline, exporter and ticker."""

    def __init__(self, config: CollectorConfig, catalog: TraceCatalog | None = None) -> None:
        config.validate()
        self.config = config
        self.catalog = catalog if catalog is not None else TraceCatalog()
        if config.catalog_file:
            self.catalog.load_file(config.catalog_file)
        if config.create_database:
            ensure_database(config.influx)
        self.exporter = InfluxExporter(config.influx)
        self.pipeline = CollectorPipeline(self.exporter, self.catalog, config.join, config.aggregate)
        self.receiver = CollectorReceiver(self.pipeline.consume)
        self.server: grpc.Server
        self.server, self.port = start_receiver(self.receiver, config.receiver)
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
            except Exception:  # keep ticking; a bug here must not stop expiry forever
                log.exception("collector tick failed")

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
) -> int:
    """Run the collector until SIGTERM/SIGINT (or `stop_event`), then flush everything. Returns 0."""
    config = CollectorConfig(
        receiver=ReceiverConfig(listen=listen),
        join=JoinConfig(window_ns=int(join_window_s * 1e9), max_entries=max_entries),
        influx=InfluxConfig(url=influx_url, bucket=influx_bucket, org=influx_org, token=influx_token),
        catalog_file=catalog_file,
    )
    stop = stop_event or threading.Event()
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
    service = start_collector(config, catalog)
    try:
        while not stop.wait(0.5):  # short waits keep the main thread responsive to signals
            pass
    finally:
        service.stop()
    return 0
