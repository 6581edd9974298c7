"""Export stage: writes the aggregation's output to InfluxDB (line protocol, ns precision), in the schema
of `schema.py`.

Delivery (`InfluxExporter`): the pipeline only queues points (bounded by `max_pending` points; beyond it they
are dropped and counted, reason `queue_full`), so the receive path never waits for InfluxDB. A worker writes
batches (`batch_size` points or every `flush_interval_s`). A batch InfluxDB does not take (down, slow past
`timeout_ms`, 5xx) goes to the disk spool (`Spool`, bounded by `spool_bytes`: beyond it the oldest files are
dropped and counted, reason `spool_overflow`); from then on every batch goes behind it, and the worker
retries the oldest file with a capped exponential backoff, replaying the spool in order once InfluxDB answers.
A spool in a fixed `spool_dir` also survives a collector restart, and so does the mark of what was written
(`service.WrittenBeforeMark`, beside the spool): a restarted collector does not write again the windows
before it from the batches agents resend. Nothing depends on how long the outage
lasts, only on the spool's size. Each point is written once in effect: every point is fully determined
(measurement, tags, timestamp, fields) before it is queued, so a batch written twice (a write that timed out
after InfluxDB had stored it, then replayed) overwrites itself. A batch InfluxDB rejects (400, 413) is
dropped and counted (reason `rejected`): retrying cannot help.
"""

from __future__ import annotations

import base64
import logging
import os
import queue
import shutil
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from influxdb_client import InfluxDBClient, WritePrecision
from influxdb_client.client.write_api import SYNCHRONOUS
from influxdb_client.rest import ApiException

from hoptrace.collector.points import FieldValue, Point
from hoptrace.collector.schema import HOP_LATENCY

log = logging.getLogger(__name__)


_TAG_ESCAPE = str.maketrans({",": r"\,", "=": r"\=", " ": r"\ ", "\n": "", "\\": "\\\\"})


def _field_text(value: FieldValue) -> str:
    if isinstance(value, bool):  # before int: a bool is an int
        return "true" if value else "false"
    if isinstance(value, int):
        return f"{value}i"
    if isinstance(value, str):  # line protocol: double-quoted, with " and \ escaped
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return repr(float(value))


def line(point: Point, time_ns: int | None = None) -> str:
    """The line protocol of `point` (`time_ns` overrides its time): tags in the point's order, those with an
    empty value left out (line protocol has none), escaped; ints as `<n>i`, floats as Python's shortest
    repr, bools as `true` / `false`."""
    tags = "".join(f",{key}={value.translate(_TAG_ESCAPE)}" for key, value in point.tags if value)
    fields = ",".join(f"{key}={_field_text(value)}" for key, value in point.fields)
    return f"{point.measurement}{tags} {fields} {point.time_ns if time_ns is None else time_ns}"


def latency_series(point: Point) -> tuple[tuple[str, str, str, str], int]:
    """The series of a `hop_latency` point (trace, segment, from_node, to_node) and its packet's ID."""
    series = (point.tag("trace"), point.tag("segment"), point.tag("from_node"), point.tag("to_node"))
    return series, int(point.field("packet_id") or 0)


class TimestampDeduper:
    """Makes `hop_latency` timestamps unique per series by moving collisions forward 1 ns at a time.

    The same packet written again (same series, time and packet ID: an exemplar exported twice) gets its
    first timestamp back, so its point overwrites itself instead of appearing twice.
    """

    def __init__(self, horizon_ns: int = 10_000_000_000) -> None:
        self.horizon_ns = horizon_ns
        self.moved = 0
        self._used: dict[tuple[str, str, str, str], dict[int, tuple[int, int]]] = {}
        self._newest: dict[tuple[str, str, str, str], int] = {}

    def same_packet(self, taken: tuple[int, int], time_ns: int, packet_id: int) -> bool:
        """Whether the point that took a timestamp, (its own time, its packet ID), is the one at `time_ns` of
        packet `packet_id` again."""
        return taken == (time_ns, packet_id)

    def unique(self, point: Point) -> int:
        """A timestamp for `point` (a `hop_latency` point) not used before in its series by another packet
        (within the horizon)."""
        series, packet_id = latency_series(point)
        used = self._used.get(series)
        if used is None:
            used = self._used[series] = {}
            self._newest[series] = point.time_ns
        ts = point.time_ns
        while (taken := used.get(ts)) is not None:
            if self.same_packet(taken, point.time_ns, packet_id):
                return ts  # this very packet again: its point overwrites itself
            ts += 1
            self.moved += 1
        used[ts] = (point.time_ns, packet_id)
        newest = self._newest[series]
        if ts > newest + self.horizon_ns // 4:
            # prune now and then: the dict is in insertion order, which is nearly time order
            self._newest[series] = ts
            cutoff = ts - self.horizon_ns
            old = []
            for t in used:
                if t >= cutoff:
                    break
                old.append(t)
            for t in old:
                del used[t]
        return ts


def ensure_database(url: str, bucket: str, token: str = "") -> bool:
    """InfluxDB 1.8: create the bucket's database if missing (the v2 API cannot). False when unreachable."""
    db = bucket.split("/", 1)[0]
    q = urllib.parse.urlencode({"q": f'CREATE DATABASE "{db}"'}).encode()
    req = urllib.request.Request(url.rstrip("/") + "/query", data=q, method="POST")
    if token:
        req.add_header("Authorization", "Basic " + base64.b64encode(token.encode()).decode())
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            resp.read()
        return True
    except OSError as err:
        log.warning("could not create database %s at %s: %s", db, url, err)
        return False


@dataclass
class InfluxConfig:
    """Where and how the exporter writes, and how much it holds while InfluxDB is away."""

    url: str = "http://127.0.0.1:8086"
    bucket: str = "hoptrace/autogen"
    org: str = "-"
    token: str = ""
    batch_size: int = 5000
    flush_interval_s: float = 1.0
    max_pending: int = 1_000_000  # points in memory (about 200 B each)
    timeout_ms: int = 10_000
    spool_dir: str | None = None  # None: a fresh temporary directory, removed at close when empty
    spool_bytes: int = 1 << 30
    retry_min_s: float = 0.25
    retry_max_s: float = 5.0

    def validate(self) -> None:
        """Raise ValueError on an unusable setting."""
        if not self.url.startswith(("http://", "https://")):
            raise ValueError(f"influx url must be http(s)://..., got {self.url!r}")
        if not self.bucket:
            raise ValueError("influx bucket is empty (InfluxDB 1.8: DATABASE/RETENTION-POLICY)")
        if self.batch_size < 1 or self.flush_interval_s <= 0 or self.max_pending < self.batch_size:
            raise ValueError("influx batch_size >= 1, flush_interval_s > 0 and max_pending >= batch_size")
        if self.spool_bytes < 1 or self.retry_min_s <= 0 or self.retry_max_s < self.retry_min_s:
            raise ValueError("spool_bytes >= 1 and 0 < retry_min_s <= retry_max_s")


class Spool:
    """Batches of line protocol waiting on disk for InfluxDB, oldest first, at most `max_bytes` in total.

    One file per batch, `<seq:016d>-<points>.lp`, written to a temporary name and renamed (a crash leaves
    whole files only). Files already in the directory are taken over in name order (a restarted collector
    replays what its predecessor could not write). Not thread-safe: the exporter's worker owns it.
    """

    def __init__(self, directory: str | Path, max_bytes: int) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.max_bytes = max_bytes
        self.dropped = 0  # points dropped beyond max_bytes
        self._files: list[tuple[Path, int, int]] = []  # (path, points, bytes)
        for path in sorted(self.directory.glob("*.lp")):
            try:
                points = int(path.stem.split("-", 1)[1])
                self._files.append((path, points, path.stat().st_size))
            except (IndexError, ValueError, OSError):
                log.warning("spool: ignoring %s", path)
        self._seq = int(self._files[-1][0].stem.split("-", 1)[0]) + 1 if self._files else 0
        self.bytes = sum(f[2] for f in self._files)
        self.points = sum(f[1] for f in self._files)

    def __len__(self) -> int:
        return len(self._files)

    def append(self, lines: list[str]) -> int:
        """Store one batch behind the others; drop the oldest beyond `max_bytes`. Returns points dropped."""
        data = "\n".join(lines).encode()
        path = self.directory / f"{self._seq:016d}-{len(lines)}.lp"
        self._seq += 1
        tmp = path.with_suffix(".tmp")
        try:
            tmp.write_bytes(data)
            os.replace(tmp, path)
        except OSError:  # a full disk: the part written would hold its space for good (never replayed)
            tmp.unlink(missing_ok=True)
            raise
        self._files.append((path, len(lines), len(data)))
        self.bytes += len(data)
        self.points += len(lines)
        dropped = 0
        while self.bytes > self.max_bytes and self._files:
            dropped += self._pop_oldest()
        self.dropped += dropped
        return dropped

    def oldest(self) -> tuple[Path, list[str]] | None:
        """The oldest batch (its file and lines), or None when empty."""
        while self._files:
            path = self._files[0][0]
            try:
                return path, path.read_text().split("\n")
            except OSError as err:  # removed under us: count it as dropped
                log.warning("spool: cannot read %s: %s", path, err)
                self.dropped += self._pop_oldest()
        return None

    def remove_oldest(self) -> None:
        """Forget the oldest batch (written, or rejected)."""
        self._pop_oldest()

    def _pop_oldest(self) -> int:
        path, points, size = self._files.pop(0)
        self.bytes -= size
        self.points -= points
        path.unlink(missing_ok=True)
        return points


class InfluxExporter:
    """The InfluxDB exporter: takes the pipeline's points (`export`), writes them as line protocol from a
    worker thread, and spools them to disk while InfluxDB is away."""

    def __init__(self, config: InfluxConfig, settled: Callable[[], None] | None = None) -> None:
        config.validate()
        self.config = config
        # Called from the worker each time points left memory (`left_memory` grew): the written-before mark.
        self._on_settled = settled
        self.written = 0
        # In queue order: points queued (`accepted`) and since out of memory (`left_memory`: written,
        # spooled or dropped). Once left_memory reaches the accepted of some moment, every point queued
        # before it is in InfluxDB, in the spool, or counted as dropped.
        self.accepted = 0
        self.left_memory = 0
        self.influx_errors = 0
        self.reconnects = 0  # times InfluxDB answered again after failing
        self.drops: Counter[str] = Counter()
        self.dedupe = TimestampDeduper()
        self._client = InfluxDBClient(
            url=config.url, token=config.token, org=config.org, timeout=config.timeout_ms, retries=False
        )
        self._write_api = self._client.write_api(write_options=SYNCHRONOUS)
        self._own_spool_dir = config.spool_dir is None
        spool_dir = config.spool_dir or tempfile.mkdtemp(prefix="hoptrace-spool-")
        self.spool = Spool(spool_dir, config.spool_bytes)
        self._queue: queue.Queue[list[str] | None] = queue.Queue()
        self._pending = 0  # points in memory: queued or in the worker's current batch
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._closed = False
        self._stopping = False
        self._failing = False
        self._retry_at = 0.0
        self._backoff = config.retry_min_s
        self._spool_bytes = self.spool.bytes
        self._spool_points = self.spool.points
        self._thread = threading.Thread(target=self._run, name="influx-exporter", daemon=True)
        self._thread.start()

    # -- state, for /metrics -----------------------------------------------------------------------------

    @property
    def dropped(self) -> int:
        """Points dropped for any reason."""
        return sum(self.drops.values())

    @property
    def pending(self) -> int:
        """Points held in memory (the export queue)."""
        return self._pending

    @property
    def spool_bytes(self) -> int:
        """Bytes waiting in the disk spool."""
        return self._spool_bytes

    @property
    def spool_points(self) -> int:
        """Points waiting in the disk spool."""
        return self._spool_points

    @property
    def failing(self) -> bool:
        """True while InfluxDB does not take writes."""
        return self._failing

    # -- producers -------------------------------------------------------------------------------------

    def export(self, points: Iterable[Point]) -> None:
        """Queue points as line protocol; never blocks. Beyond `max_pending` they are dropped and counted.
        A `hop_latency` point gets a timestamp of its own in its series (`TimestampDeduper`)."""
        unique = self.dedupe.unique
        self._submit([line(p, unique(p)) if p.measurement == HOP_LATENCY else line(p) for p in points])

    def _submit(self, lines: list[str]) -> None:
        if not lines:
            return
        with self._lock:
            if self._closed or self._pending + len(lines) > self.config.max_pending:
                self.drops["closed" if self._closed else "queue_full"] += len(lines)
                log.warning("influx exporter: dropped %d points (export queue full or closed)", len(lines))
                return
            self._pending += len(lines)
            self.accepted += len(lines)
        self._queue.put(lines)

    def flush(self, timeout_s: float = 30.0, give_up_when_down: bool = False) -> bool:
        """Wait until everything queued so far is written to InfluxDB (spool included) or dropped.

        False on timeout; with `give_up_when_down`, also as soon as only the spool is left and InfluxDB is
        failing (what is spooled stays on disk).
        """
        self._queue.put([])  # wake the worker so it writes its partial batch now
        deadline = time.monotonic() + timeout_s
        with self._idle:
            while self._pending or self._spool_points:
                if give_up_when_down and not self._pending and self._failing:
                    return False
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._idle.wait(min(left, 0.1))
        return True

    def close(self, timeout_s: float = 30.0) -> None:
        """Flush (giving up on a down InfluxDB once memory is spooled), stop the worker, close the client."""
        self.flush(timeout_s, give_up_when_down=True)
        with self._lock:
            self._closed = True
            self._stopping = True
        self._queue.put(None)
        self._thread.join(timeout_s)
        self._client.close()
        if self._own_spool_dir and not self.spool.points:
            shutil.rmtree(self.spool.directory, ignore_errors=True)

    # -- worker ----------------------------------------------------------------------------------------

    def _run(self) -> None:
        batch: list[str] = []
        deadline = time.monotonic() + self.config.flush_interval_s
        while not self._stopping:
            now = time.monotonic()
            wait = deadline - now
            if len(self.spool):
                wait = min(wait, self._retry_at - now)
            try:
                item = self._queue.get(timeout=max(0.0, wait))
            except queue.Empty:
                item = []
            force = not item  # timer, flush request ([]) or stop (None)
            if item:
                batch.extend(item)
            size = self.config.batch_size
            while len(batch) >= size:
                self._deliver(batch[:size])
                del batch[:size]
            now = time.monotonic()
            if batch and (force or now >= deadline):
                self._deliver(batch)
                batch = []
            if force or now >= deadline:
                deadline = now + self.config.flush_interval_s
            if len(self.spool) and time.monotonic() >= self._retry_at:
                if batch:  # older than what arrives during the replay: behind the backlog first
                    self._deliver(batch)
                    batch = []
                self._replay()
        if batch:
            self._deliver(batch)

    def _settled(self, points: int) -> None:
        """`points` left memory (written, spooled or dropped): update the counts flush() waits on."""
        with self._idle:
            self._pending -= points
            self.left_memory += points
            self._spool_bytes = self.spool.bytes
            self._spool_points = self.spool.points
            self._idle.notify_all()
        if self._on_settled is not None and points:
            try:
                self._on_settled()
            except Exception:  # the worker must go on writing whatever the callback does
                log.exception("influx exporter: settled callback failed")

    def _deliver(self, lines: list[str]) -> None:
        try:
            if len(self.spool):  # a backlog: keep the order, the replay writes it
                self._to_spool(lines)
                return
            outcome = self._write(lines)
            if outcome == "retry":
                self._to_spool(lines)
        finally:
            self._settled(len(lines))

    def _to_spool(self, lines: list[str]) -> None:
        try:
            dropped = self.spool.append(lines)
        except OSError as err:  # disk full or gone: nothing else can hold them
            log.error("spool: cannot write %d points: %s", len(lines), err)
            self.drops["spool_error"] += len(lines)
            return
        if dropped:
            self.drops["spool_overflow"] += dropped
            log.warning("spool over %d bytes: dropped the oldest %d points", self.spool.max_bytes, dropped)

    def _replay(self) -> None:
        """Write the spool, oldest first, until it is empty or InfluxDB fails again."""
        while not self._stopping:
            item = self.spool.oldest()
            if item is None:
                break
            _, lines = item
            outcome = self._write(lines)
            if outcome == "retry":
                break
            self.spool.remove_oldest()
            self._settled(0)
            # A long backlog: keep what arrives meanwhile on disk, not in memory, and behind the backlog.
            while True:
                try:
                    more = self._queue.get_nowait()
                except queue.Empty:
                    break
                if more:
                    self._deliver(more)
        self._settled(0)

    def _write(self, lines: list[str]) -> str:
        """Write one batch: "ok", "rejected" (dropped) or "retry" (InfluxDB away; backoff scheduled)."""
        try:
            self._write_api.write(
                bucket=self.config.bucket,
                org=self.config.org,
                record="\n".join(lines),
                write_precision=WritePrecision.NS,
            )
        except ApiException as err:
            self.influx_errors += 1
            if err.status in (400, 413):
                log.error("influx rejected %d points (%s): dropped", len(lines), err.status)
                self.drops["rejected"] += len(lines)
                return "rejected"
            if err.status == 404:  # database missing (InfluxDB restarted empty): create it, then retry
                ensure_database(self.config.url, self.config.bucket, self.config.token)
            return self._failed(err)
        except Exception as err:  # noqa: BLE001 - connection refused, timeouts: InfluxDB is away
            self.influx_errors += 1
            return self._failed(err)
        self.written += len(lines)
        if self._failing:
            self._failing = False
            self.reconnects += 1
            log.warning("influx answers again at %s", self.config.url)
        self._backoff = self.config.retry_min_s
        return "ok"

    def _failed(self, err: Exception) -> str:
        if not self._failing:
            log.warning("influx write failed, spooling to %s: %s", self.spool.directory, err)
        self._failing = True
        self._retry_at = time.monotonic() + self._backoff
        self._backoff = min(self._backoff * 2, self.config.retry_max_s)
        return "retry"
