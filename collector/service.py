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
from hoptrace.collector.records import DecodedBatch
from hoptrace.v1.clock_pb2_grpc import add_ClockKeysServicer_to_server

log = logging.getLogger(__name__)


class WrittenBeforeMark:
    """The master time before which a collector's windows are written (to InfluxDB, or to its fixed spool,
    which a restart replays), in a file beside the spool. Agents resend the batches a collector had in
    flight when it died, and a restarted one would write those seconds' windows again from part of their
    packets (over the whole ones: same series and time); it resumes after this mark instead, as a Kafka
    partition's next owner resumes after its commit's `written-before-ns`.

    The mark covers a window's exemplars too (the pipeline writes them with it), and it moves as soon as
    the exporter has written what it covers (`CollectorService._write_mark`, from the exporter's worker):
    a crash between a write and its mark would have the next collector write that window's exemplars a
    second time, at master times a few ns off (its clock mapping of the resent records)."""

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
        # With a fixed spool, what was written survives a restart: resume after it (WrittenBeforeMark).
        self.mark = WrittenBeforeMark(config.influx.spool_dir) if config.influx.spool_dir else None
        self._marks: deque[tuple[int, int]] = deque()  # (exporter.accepted when taken, closed before)
        self._marked = 0
        self._mark_lock = threading.Lock()
        self.exporter = InfluxExporter(config.influx, settled=self._write_mark)
        self.otlp = start_otlp_exporter(config.otlp, self.catalog, config.aggregate)  # None when off
        exporter = beside(self.exporter, self.otlp)
        self.pipeline = CollectorPipeline(
            exporter, self.catalog, config.join, config.aggregate, config.capture
        )
        if self.mark is not None and (resume := self.mark.read()):
            self.pipeline.resume_after(resume)
            log.info("resuming after windows written before %d (%s)", resume, self.mark.path)
        self.receiver = CollectorReceiver(self._consume)
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

    def _consume(self, batch: DecodedBatch) -> None:
        self.pipeline.consume(batch)
        self._advance_mark()  # windows close as batches move the watermark

    def _tick_loop(self) -> None:
        while not self._stop.wait(self.config.tick_s):
            try:
                self.pipeline.tick()
                self._advance_mark()
            except Exception:  # keep ticking; a bug here must not stop expiry forever
                log.exception("collector tick failed")

    def _advance_mark(self) -> None:
        """Note the windows closed now (with what the exporter had accepted then: their points), and write
        the mark of those whose points have all left memory."""
        if self.mark is None:
            return
        closed = self.pipeline.closed_before()  # first: the points of those windows are accepted by now
        with self._mark_lock:
            if closed > self._marked:
                self._marks.append((self.exporter.accepted, closed))
                self._marked = closed
        self._write_mark()

    def _write_mark(self) -> None:
        """Write the mark of the windows whose points have all left memory (written, spooled or counted as
        dropped); the exporter calls it after each batch."""
        if self.mark is None:
            return
        with self._mark_lock:
            durable = 0
            while self._marks and self.exporter.left_memory >= self._marks[0][0]:
                durable = self._marks.popleft()[1]
            if durable:
                self.mark.write(durable)

    def _streams_ended(self, grace_s: float) -> bool:
        """Wait up to `grace_s` for every agent's stream to end; whether they all did (the agents were
        stopping and sent everything) or some are still open (the agents run on: the stop cuts them)."""
        if grace_s <= 0:
            return not sum(st.active_streams for st in self.receiver.stats_snapshot().values())
        deadline = time.monotonic() + grace_s
        while True:
            open_streams = sum(st.active_streams for st in self.receiver.stats_snapshot().values())
            if not open_streams or time.monotonic() >= deadline:
                return not open_streams
            time.sleep(0.05)  # polling the receiver's counts: no event to wait on

    def flush(self, timeout_s: float = 30.0) -> bool:
        """Push every pending packet and window to InfluxDB and wait for the writes."""
        self.pipeline.flush()
        return self.exporter.flush(timeout_s)

    def stop(self, grace_s: float = 5.0) -> None:
        """Stop receiving (letting open streams finish for `grace_s`, and windows close meanwhile), write
        what is whole, close.

        Whole is everything when every agent ended its stream (it was stopping and sent all it had): every
        pending packet and open window is flushed and the mark moves past them. An agent whose stream the
        stop cuts still holds records of the open windows (queued, or in flight: it resends those), which it
        sends to the next collector; with a mark, only the windows the watermark closed are written and
        marked, and the rest is left to that collector, which joins it whole instead of leaving it out as
        before the mark (`late_record`) and writing those windows' packets as lost. Without a mark (no fixed
        spool: nothing would keep the next collector from writing those windows again) it flushes all."""
        # Waited here, not in the server's grace: a stream it cancels at the grace's end ends as one its agent
        # closed would (the receiver sees no difference), so what ended how is told before it cancels them.
        whole = self._streams_ended(grace_s)
        self.server.stop(0).wait()
        self._stop.set()
        self._ticker.join()
        if whole or self.mark is None:
            self.pipeline.flush()
        else:
            self.pipeline.tick()
            self._advance_mark()
            log.info(
                "agents still streaming: windows from %d on and %d packets in the join are left to the next "
                "collector (the agents send them again); windows before it are written",
                self.pipeline.closed_before(),
                self.pipeline.joiner.pending(),
            )
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
