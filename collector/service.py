"""The gRPC collector: receiver -> pipeline (`pipeline.py`: clock alignment, join, aggregation) -> InfluxDB
exporter.

`start_collector` starts it all - with the NTP time service the agents align their clocks on
(`timeservice.py`) and the Prometheus `/metrics` endpoint (`metrics.py`) - and returns a handle
(`CollectorService`); `main.run_collector` runs it, or the Kafka one, until SIGTERM/SIGINT.

The receive path never waits on InfluxDB: the pipeline only queues points for the exporter (bounded; see
`influx.py` for the spool that holds them while InfluxDB is away).
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections import deque
from pathlib import Path

import grpc

from hoptrace.collector.catalog import TraceCatalog
from hoptrace.collector.clockauth import ClockKeyService
from hoptrace.collector.influx import InfluxExporter
from hoptrace.collector.metrics import MetricsServer, start_metrics_server
from hoptrace.collector.otlp import beside, start_otlp_exporter
from hoptrace.collector.pipeline import CollectorConfig, CollectorPipeline, start_shared_parts
from hoptrace.collector.receiver import CollectorReceiver, start_receiver
from hoptrace.v1.clock_pb2_grpc import add_ClockKeysServicer_to_server

log = logging.getLogger(__name__)


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
        self.otlp = start_otlp_exporter(config.otlp, self.catalog, config.aggregate)  # None when off
        exporter = beside(self.exporter, self.otlp)
        self.pipeline = CollectorPipeline(
            exporter, self.catalog, config.join, config.aggregate, config.capture
        )
        # With a fixed spool, what was written survives a restart: resume after it (WrittenBeforeMark).
        self.mark = WrittenBeforeMark(config.influx.spool_dir) if config.influx.spool_dir else None
        self._marks: deque[tuple[int, int]] = deque()  # (exporter.accepted when taken, closed before)
        self._marked = 0
        if self.mark is not None and (resume := self.mark.read()):
            self.pipeline.resume_after(resume)
            log.info("resuming after windows written before %d (%s)", resume, self.mark.path)
        self.receiver = CollectorReceiver(self.pipeline.consume)
        self.server: grpc.Server
        # Beside the records, each agent's clock key (its mutual TLS vouches for the node it names).
        keys = self.time_server.keys if self.time_server is not None else None
        self.server, self.port = start_receiver(
            self.receiver,
            config.receiver,
            (lambda server: add_ClockKeysServicer_to_server(ClockKeyService(keys), server)) if keys else None,
        )
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
        if self.otlp is not None:
            self.otlp.close()
        self._advance_mark()  # everything left memory (written or spooled) unless the exporter gave up
        if self.metrics_server is not None:
            self.metrics_server.stop()
        if self.time_server is not None:
            self.time_server.stop()
        log.info("collector stopped: %s", self.pipeline.stats())


def start_collector(config: CollectorConfig, catalog: TraceCatalog | None = None) -> CollectorService:
    """Start a collector in the background; call `.stop()` to flush and shut it down."""
    return CollectorService(config, catalog)
