"""`/metrics`: the collector's counters in the Prometheus text exposition format (version 0.0.4), served by a
plain `http.server` in a thread on `--metrics-listen` (default 127.0.0.1:9171).

Every drop is counted by reason in `hoptrace_collector_dropped_total{reason}`: `out_of_path` (record whose hop
index is outside its trace's path), `decode_error` (batches whose records did not decode), `late_record`
(record whose throughput window had closed), `late_sample` (segment sample whose window had closed: left
out of the window and its sketch; still an exemplar when its ID is sampled), `capture_budget` (a captured
packet beyond `--capture-budget` per trace and second: not stored), and the exporter's
`queue_full`, `spool_overflow`, `spool_error`, `rejected`, `closed` (points). Records the tracer lost
before the collector (ring buffer full, agent drops) are `hoptrace_collector_tracer_lost_records_total`.
The OpenTelemetry export (`otlp.py`, with `--otlp-endpoint`) counts what it sent and dropped by signal
(`traces`: packets; `metrics`: histogram points) in `hoptrace_collector_otlp_exported_total{signal}` and
`hoptrace_collector_otlp_dropped_total{signal,reason}` (`queue_full`, `export_failed`, `closed`).
The per-segment latency, loss and jitter users alert on follow them (`hoptrace.collector.segment_metrics`).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Protocol

from hoptrace.collector.influx import InfluxExporter
from hoptrace.collector.otlp import OTLP_DROP_REASONS, OtlpExporter
from hoptrace.collector.pipeline import CollectorPipeline
from hoptrace.collector.receiver import CollectorReceiver
from hoptrace.collector.timeservice import TimeServer, parse_addr

log = logging.getLogger(__name__)

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
PREFIX = "hoptrace_collector_"


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _format(value: float) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int):
        return str(value)
    return repr(float(value))


class RunningCollector(Protocol):
    """What `/metrics` reads of a running gRPC collector (`service.CollectorService`)."""

    pipeline: CollectorPipeline
    exporter: InfluxExporter
    receiver: CollectorReceiver
    time_server: TimeServer | None
    otlp: OtlpExporter | None


class MetricsWriter:
    """The exposition text, one metric family at a time."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def metric(
        self, name: str, kind: str, help_text: str, samples: Iterable[tuple[dict[str, str], float]]
    ) -> None:
        full = PREFIX + name
        self.lines.append(f"# HELP {full} {help_text}")
        self.lines.append(f"# TYPE {full} {kind}")
        for labels, value in samples:
            tag = ",".join(f'{k}="{_label(v)}"' for k, v in labels.items())
            self.lines.append(f"{full}{{{tag}}} {_format(value)}" if tag else f"{full} {_format(value)}")

    def one(self, name: str, kind: str, help_text: str, value: float) -> None:
        self.metric(name, kind, help_text, [({}, value)])


def render_metrics(service: RunningCollector) -> str:
    """The exposition text of a running collector's counters."""
    pipe = service.pipeline
    join = pipe.joiner.stats
    exp = service.exporter
    nodes = service.receiver.stats_snapshot()
    w = MetricsWriter()
    per_node = sorted(nodes.items())
    w.metric(
        "records_received_total",
        "counter",
        "Records received from agents.",
        [({"node": n}, s.records) for n, s in per_node],
    )
    w.metric(
        "batches_received_total",
        "counter",
        "RecordBatches received.",
        [({"node": n}, s.batches) for n, s in per_node],
    )
    w.metric(
        "reconnects_total",
        "counter",
        "Streams a node opened after its first one.",
        [({"node": n}, max(0, s.streams - 1)) for n, s in per_node],
    )
    w.metric(
        "active_streams",
        "gauge",
        "Open agent streams.",
        [({"node": n}, s.active_streams) for n, s in per_node],
    )
    w.metric(
        "batch_seq_gaps_total",
        "counter",
        "Gaps in batch_seq within a stream.",
        [({"node": n}, s.seq_gaps) for n, s in per_node],
    )
    w.one("records_joined_total", "counter", "Records through the join.", join.records)
    w.one("packets_emitted_total", "counter", "Packets the join emitted.", join.packets)
    w.one("packets_complete_total", "counter", "Packets seen at every hop.", join.complete)
    w.one("packets_incomplete_total", "counter", "Packets missing a hop when emitted.", join.incomplete)
    w.one(
        "packets_before_attach_total",
        "counter",
        "Packets emitted without a hop they passed before it was attached (not loss).",
        join.before_attach,
    )
    w.one("collisions_total", "counter", "Packet ID collisions in the join window.", join.collisions)
    w.one(
        "repeats_total",
        "counter",
        "Records of a packet at a hop it was already seen at (the segments of a GSO skb cut on the way).",
        join.repeats,
    )
    w.one(
        "segments_total",
        "counter",
        "Wire segments of the packets the join emitted (a GSO skb's count, one for any other packet).",
        join.segments,
    )
    w.one(
        "segments_missing_total",
        "counter",
        "Segments of emitted packets a hop that saw the packet did not see (lost or unrecorded on the way).",
        join.segments_missing,
    )
    w.one("evictions_total", "counter", "Packets evicted from the join at its bound.", join.evicted)
    w.one("join_pending_packets", "gauge", "Packets waiting in the join window.", pipe.joiner.pending())
    drops: dict[str, int] = {
        "out_of_path": join.out_of_path,
        "decode_error": sum(s.decode_errors for s in nodes.values()),
        "late_record": pipe.counters.stats.late_records,
        "late_sample": pipe.segments.stats.late,
        "capture_budget": sum(pipe.captures.dropped.values()),
    }
    for reason in ("queue_full", "spool_overflow", "spool_error", "rejected", "closed"):
        drops[reason] = exp.drops.get(reason, 0)
    w.metric(
        "dropped_total",
        "counter",
        "Records, samples or points the collector dropped, by reason.",
        [({"reason": r}, v) for r, v in sorted(drops.items())],
    )
    w.metric(
        "foreign_records_total",
        "counter",
        "Records and counters a node sent for hops of another node: refused (forged or corrupt).",
        [({"node": n}, v) for n, v in sorted(pipe.foreign_records.items())],
    )
    w.metric(
        "tracer_lost_records_total",
        "counter",
        "Records lost before the collector (ring buffer full, agent drops); never network loss.",
        [({}, pipe.segments.stats.tracer_lost)],
    )
    w.metric(
        "agent_dropped_records_total",
        "counter",
        "Records agents report they dropped.",
        [({"node": n}, v) for n, v in sorted(pipe.agent_dropped.items())],
    )
    cap = exp.config.max_pending
    w.one("export_queue_points", "gauge", "Points waiting in memory for the exporter.", exp.pending)
    w.one("export_queue_capacity_points", "gauge", "Bound of the export queue.", cap)
    w.one("export_queue_fill_ratio", "gauge", "export_queue_points / capacity.", exp.pending / cap)
    w.one("spool_bytes", "gauge", "Bytes spooled on disk while InfluxDB is away.", exp.spool_bytes)
    w.one("spool_points", "gauge", "Points spooled on disk.", exp.spool_points)
    w.one("spool_capacity_bytes", "gauge", "Bound of the spool.", exp.config.spool_bytes)
    w.one("points_written_total", "counter", "Points InfluxDB accepted.", exp.written)
    w.one("influx_errors_total", "counter", "Failed InfluxDB writes.", exp.influx_errors)
    w.one(
        "influx_reconnects_total", "counter", "Times InfluxDB answered again after failing.", exp.reconnects
    )
    w.one("influx_up", "gauge", "1 while InfluxDB takes writes.", 0 if exp.failing else 1)
    clocks = sorted(pipe.clock.nodes().items())
    w.metric(
        "node_clock_offset_ns",
        "gauge",
        "Node wall clock - master clock.",
        [({"node": n}, m.offset_ns) for n, m in clocks],
    )
    w.metric(
        "node_clock_bound_ns",
        "gauge",
        "Error bound of the offset.",
        [({"node": n}, m.bound_ns) for n, m in clocks],
    )
    w.metric(
        "node_clock_delay_ns",
        "gauge",
        "Round trip of the offset's probe.",
        [({"node": n}, m.delay_ns) for n, m in clocks],
    )
    w.metric(
        "node_clock_drift_ppm",
        "gauge",
        "Drift of the offset.",
        [({"node": n}, m.drift_ppm) for n, m in clocks],
    )
    w.metric(
        "node_clock_jumps_total",
        "counter",
        "Times a node's offset moved beyond its bounds between two estimates without a step of its own "
        "clock: its cross-node segments are suspect around then.",
        [({"node": n}, pipe.clock.jump_counts.get(n, 0)) for n, _ in clocks],
    )
    w.metric(
        "node_clock_last_jump_ns",
        "gauge",
        "By how much the node's offset moved at its last clock jump (new - predicted).",
        [({"node": n}, j.jump_ns) for n, j in sorted(pipe.clock.last_jump.items())],
    )
    ts = service.time_server
    w.one("time_requests_total", "counter", "NTP requests answered.", ts.requests if ts else 0)
    w.one(
        "time_requests_authenticated_total",
        "counter",
        "NTP requests answered with a MAC (clock rounds authenticated).",
        ts.authenticated if ts else 0,
    )
    w.metric(
        "time_requests_refused_total",
        "counter",
        "Authenticated NTP requests left unanswered, by reason: mac (forged or changed), key (a key_id "
        "not taken now), malformed.",
        [({"reason": r}, (ts.refused.get(r, 0) if ts else 0)) for r in ("key", "mac", "malformed")],
    )
    write_otlp_metrics(w, service.otlp)
    return "\n".join(w.lines) + "\n" + pipe.segment_metrics.render()


def write_otlp_metrics(w: MetricsWriter, otlp: OtlpExporter | None) -> None:
    """The OpenTelemetry export's counters (none while it is off)."""
    if otlp is None:
        return
    signals = ("metrics", "traces")
    w.metric(
        "otlp_exported_total",
        "counter",
        "What the OTLP backend took: packets (traces) and histogram points (metrics).",
        [({"signal": s}, otlp.exported(s)) for s in signals],
    )
    dropped = otlp.dropped
    w.metric(
        "otlp_dropped_total",
        "counter",
        "What the OTLP export dropped (queue full, export failed after retries, closed), never waiting.",
        [({"reason": r, "signal": s}, dropped.get((s, r), 0)) for s in signals for r in OTLP_DROP_REASONS],
    )


class MetricsServer:
    """`ThreadingHTTPServer` serving GET /metrics in a daemon thread."""

    def __init__(self, listen: str, service: Any, render: Callable[[Any], str] = render_metrics) -> None:
        host, port = parse_addr(listen)

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                if self.path.split("?", 1)[0] != "/metrics":
                    self.send_error(404)
                    return
                try:
                    body = render(service).encode()
                except Exception:  # noqa: BLE001 - a scrape must not kill the server
                    log.exception("rendering /metrics failed")
                    self.send_error(500)
                    return
                self.send_response(200)
                self.send_header("Content-Type", CONTENT_TYPE)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - quiet
                pass

        self.httpd = ThreadingHTTPServer((host, port), Handler)
        self.httpd.daemon_threads = True
        self.port: int = self.httpd.server_address[1]
        self._thread = threading.Thread(
            target=self.httpd.serve_forever, name="collector-metrics", daemon=True
        )

    def start(self) -> MetricsServer:
        """Start serving; returns self."""
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and close the socket."""
        self.httpd.shutdown()
        self.httpd.server_close()


def start_metrics_server(
    listen: str, service: Any, render: Callable[[Any], str] = render_metrics
) -> MetricsServer:
    """Serve `/metrics` of `service` on `listen` ("HOST:PORT"; port 0 picks one: see `.port`), rendered by
    `render` (the gRPC collector's by default; the Kafka collector brings its own)."""
    return MetricsServer(listen, service, render).start()
