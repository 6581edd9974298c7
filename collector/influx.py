"""Export stage: writes the aggregation's output to InfluxDB (line protocol, ns precision).

Schema (a contract: dashboards, the report and the web UI query these names):

* `hop_latency` - one point per packet per segment. Tags `trace`, `segment` ("from>to"), `from_hop`,
  `to_hop`, `from_node`, `to_node`; fields `latency_ns` (int), `packet_id` (int), and `below_clock_bound`
  (bool, written only when true: a cross-node latency below the clocks' alignment bound, e.g. negative).
  Time: the packet's master time at `from_hop`. Each packet seen at the first and last hop of the path also
  gets a point with segment `end_to_end` (from_hop = first hop, to_hop = last hop): filter on `segment` when
  summing over segments.
  InfluxDB keeps one point per measurement + tag set + timestamp, so two packets of a segment seen at the
  same nanosecond would overwrite each other. The packet ID is NOT a tag (one series per packet would explode
  the series index); instead the exporter moves a colliding point's timestamp forward by 1 ns until it is
  unused in that series (tracked over `dedupe_horizon_ns`). `latency_ns` is never changed.
* `segment_stats` - per trace, segment and interval (1 s, time = window start). Tags `trace`, `segment`,
  `from_hop`, `to_hop`; fields `count`, `mean_ns` (float), `p50_ns`, `p90_ns`, `p99_ns`, `max_ns`,
  `incomplete` (ints). Segment `end_to_end` (first hop -> last hop of the path) also carries `packets`
  (packets joined in the window) and `complete` (packets seen at every hop).
* `hop_counters` - per trace, hop, node and interval. Tags `trace`, `hop`, `node`; int fields `matched`,
  `tagged`, `untagged`, `parse_errors`, `lost_events`, `bytes` (deltas over the interval).

Tags with an empty value are left out (line protocol does not allow them).

Writes are batched by a worker thread (`batch_size` points or every `flush_interval_s`) through the
synchronous write API, retried, and counted when dropped; `max_pending` bounds the memory held when InfluxDB
is slow or down.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass

from influxdb_client import InfluxDBClient, WritePrecision
from influxdb_client.client.write_api import SYNCHRONOUS

from hoptrace.collector.aggregate import HopCounterWindow, LatencySample, SegmentWindow

log = logging.getLogger(__name__)

HOP_LATENCY = "hop_latency"
SEGMENT_STATS = "segment_stats"
HOP_COUNTERS = "hop_counters"

_TAG_ESCAPE = str.maketrans({",": r"\,", "=": r"\=", " ": r"\ ", "\n": "", "\\": "\\\\"})


def _tag(value: str) -> str:
    return value.translate(_TAG_ESCAPE)


def _tags(pairs: Iterable[tuple[str, str]]) -> str:
    return "".join(f",{k}={_tag(v)}" for k, v in pairs if v)


def latency_line(s: LatencySample, ts_ns: int | None = None) -> str:
    """Line protocol of one `hop_latency` point (`ts_ns` overrides the sample's time)."""
    tags = _tags(
        (
            ("from_hop", s.from_hop),
            ("from_node", s.from_node),
            ("segment", s.segment),
            ("to_hop", s.to_hop),
            ("to_node", s.to_node),
            ("trace", s.trace),
        )
    )
    flag = ",below_clock_bound=true" if s.below_clock_bound else ""
    ts = s.ts_ns if ts_ns is None else ts_ns
    return f"{HOP_LATENCY}{tags} latency_ns={s.latency_ns}i,packet_id={s.packet_id}i{flag} {ts}"


def segment_line(w: SegmentWindow) -> str:
    """Line protocol of one `segment_stats` point."""
    tags = _tags((("from_hop", w.from_hop), ("segment", w.segment), ("to_hop", w.to_hop), ("trace", w.trace)))
    fields = (
        f"count={w.count}i,mean_ns={float(w.mean_ns)!r},p50_ns={w.p50_ns}i,p90_ns={w.p90_ns}i,"
        f"p99_ns={w.p99_ns}i,max_ns={w.max_ns}i,incomplete={w.incomplete}i"
    )
    if w.packets is not None:
        fields += f",packets={w.packets}i,complete={w.complete or 0}i"
    return f"{SEGMENT_STATS}{tags} {fields} {w.start_ns}"


def counters_line(w: HopCounterWindow) -> str:
    """Line protocol of one `hop_counters` point."""
    tags = _tags((("hop", w.hop), ("node", w.node), ("trace", w.trace)))
    return (
        f"{HOP_COUNTERS}{tags} matched={w.matched}i,tagged={w.tagged}i,untagged={w.untagged}i,"
        f"parse_errors={w.parse_errors}i,lost_events={w.lost_events}i,bytes={w.bytes}i {w.start_ns}"
    )


class TimestampDeduper:
    """Makes `hop_latency` timestamps unique per series by moving collisions forward 1 ns at a time."""

    def __init__(self, horizon_ns: int = 10_000_000_000) -> None:
        self.horizon_ns = horizon_ns
        self.moved = 0
        self._used: dict[tuple[str, str, str, str], dict[int, None]] = {}
        self._newest: dict[tuple[str, str, str, str], int] = {}

    def unique(self, s: LatencySample) -> int:
        """Return a timestamp for `s` not used before in its series (within the horizon)."""
        series = (s.trace, s.segment, s.from_node, s.to_node)
        used = self._used.get(series)
        if used is None:
            used = self._used[series] = {}
            self._newest[series] = s.ts_ns
        ts = s.ts_ns
        while ts in used:
            ts += 1
            self.moved += 1
        used[ts] = None
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


@dataclass
class InfluxConfig:
    """Where and how the exporter writes."""

    url: str = "http://127.0.0.1:8086"
    bucket: str = "hoptrace/autogen"
    org: str = "-"
    token: str = ""
    batch_size: int = 5000
    flush_interval_s: float = 1.0
    max_pending: int = 2_000_000
    retries: int = 3
    timeout_ms: int = 10_000

    def validate(self) -> None:
        """Raise ValueError on an unusable setting."""
        if not self.url.startswith(("http://", "https://")):
            raise ValueError(f"influx url must be http(s)://..., got {self.url!r}")
        if not self.bucket:
            raise ValueError("influx bucket is empty (InfluxDB 1.8: DATABASE/RETENTION-POLICY)")
        if self.batch_size < 1 or self.flush_interval_s <= 0 or self.max_pending < self.batch_size:
            raise ValueError("influx batch_size >= 1, flush_interval_s > 0 and max_pending >= batch_size")


class InfluxExporter:
    """Batched, threaded writer of line protocol into InfluxDB."""

    def __init__(self, config: InfluxConfig) -> None:
        config.validate()
        self.config = config
        self.written = 0
        self.dropped = 0
        self.dedupe = TimestampDeduper()
        self._client = InfluxDBClient(
            url=config.url, token=config.token, org=config.org, timeout=config.timeout_ms
        )
        self._write_api = self._client.write_api(write_options=SYNCHRONOUS)
        self._queue: queue.Queue[list[str] | None] = queue.Queue()
        self._pending = 0
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="influx-exporter", daemon=True)
        self._thread.start()

    # -- producers -------------------------------------------------------------------------------------

    def submit_lines(self, lines: list[str]) -> None:
        """Queue line-protocol lines; when `max_pending` would be exceeded they are dropped and counted."""
        if not lines:
            return
        with self._lock:
            if self._closed or self._pending + len(lines) > self.config.max_pending:
                self.dropped += len(lines)
                log.warning("influx exporter: dropped %d points (pending bound or closed)", len(lines))
                return
            self._pending += len(lines)
        self._queue.put(lines)

    def export(
        self,
        samples: Iterable[LatencySample] = (),
        segments: Iterable[SegmentWindow] = (),
        counters: Iterable[HopCounterWindow] = (),
    ) -> None:
        """Queue the aggregation's output as points of the three measurements."""
        unique = self.dedupe.unique
        lines = [latency_line(s, unique(s)) for s in samples]
        lines.extend(segment_line(w) for w in segments)
        lines.extend(counters_line(w) for w in counters)
        self.submit_lines(lines)

    def flush(self, timeout_s: float = 30.0) -> bool:
        """Wait until everything queued so far is written (or dropped). False on timeout."""
        self._queue.put([])  # wake the worker so it writes its partial batch now
        deadline = time.monotonic() + timeout_s
        with self._idle:
            while self._pending:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._idle.wait(left)
        return True

    def close(self, timeout_s: float = 30.0) -> None:
        """Flush, stop the worker and close the client."""
        self.flush(timeout_s)
        with self._lock:
            self._closed = True
        self._queue.put(None)
        self._thread.join(timeout_s)
        self._client.close()

    # -- worker ----------------------------------------------------------------------------------------

    def _run(self) -> None:
        batch: list[str] = []
        deadline = time.monotonic() + self.config.flush_interval_s
        stop = False
        while not stop:
            try:
                item = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                item = []
                force = True
            else:
                force = not item  # [] = flush request, None = stop
                if item is None:
                    stop = True
                else:
                    batch.extend(item)
            while len(batch) >= self.config.batch_size:
                self._write(batch[: self.config.batch_size])
                del batch[: self.config.batch_size]
            if batch and (force or time.monotonic() >= deadline):
                self._write(batch)
                batch = []
            if force or time.monotonic() >= deadline:
                deadline = time.monotonic() + self.config.flush_interval_s

    def _write(self, lines: list[str]) -> None:
        body = "\n".join(lines)
        try:
            for attempt in range(self.config.retries):
                try:
                    self._write_api.write(
                        bucket=self.config.bucket,
                        org=self.config.org,
                        record=body,
                        write_precision=WritePrecision.NS,
                    )
                    self.written += len(lines)
                    return
                except Exception as err:  # noqa: BLE001 - any client/server error: retry, then drop
                    log.warning(
                        "influx write of %d points failed (attempt %d): %s", len(lines), attempt + 1, err
                    )
                    time.sleep(0.2 * 2**attempt)
            self.dropped += len(lines)
        finally:
            with self._idle:
                self._pending -= len(lines)
                self._idle.notify_all()
