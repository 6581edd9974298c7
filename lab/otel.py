"""An OpenTelemetry backend for the collector's OTLP export (collector/otlp.py): Jaeger v2, built by `make
jaeger` at the version lab/jaeger/go.mod pins, run with its in-memory storage on loopback ports.

Traces are read back through Jaeger's own HTTP query API (`/api/v3/traces/{id}`: OTLP JSON, times in
nanoseconds as sent). Jaeger stores no metrics: its metrics pipeline relays what it receives (its `otlphttp`
exporter) to `MetricsSink`, an HTTP server in this process that decodes each request with the OTLP protos,
so a histogram is read as the backend took it.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tempfile
import threading
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2

from hoptrace.lab.lifecycle import dies_with_parent
from hoptrace.lab.processes import REPO_ROOT, _tail, free_port, wait_http_ok

JAEGER_MODULE_DIR = REPO_ROOT / "lab" / "jaeger"


class OtelBackendError(RuntimeError):
    """The backend is not built or did not start; the message says why."""


def jaeger_version() -> str:
    """The github.com/jaegertracing/jaeger version lab/jaeger/go.mod pins (the one `make jaeger` builds)."""
    match = re.search(
        r"^\s*github\.com/jaegertracing/jaeger (v\S+)", (JAEGER_MODULE_DIR / "go.mod").read_text(), re.M
    )
    if match is None:
        raise OtelBackendError(
            f"{JAEGER_MODULE_DIR / 'go.mod'} does not require github.com/jaegertracing/jaeger"
        )
    return match.group(1)


def jaeger_binary(version: str | None = None) -> Path:
    """The jaeger `make jaeger` builds into .tools/jaeger/VERSION; OtelBackendError when it is not built."""
    binary = REPO_ROOT / ".tools" / "jaeger" / (version or jaeger_version()) / "jaeger"
    if not binary.is_file():
        raise OtelBackendError(f"{binary} is not built: run `make jaeger`")
    return binary


class MetricsSink:
    """OTLP/HTTP metrics receiver (POST /v1/metrics, protobuf) keeping every request, decoded."""

    def __init__(self) -> None:
        self.requests: list[metrics_service_pb2.ExportMetricsServiceRequest] = []
        self._lock = threading.Lock()
        sink = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                request = metrics_service_pb2.ExportMetricsServiceRequest.FromString(body)
                with sink._lock:
                    sink.requests.append(request)
                answer = metrics_service_pb2.ExportMetricsServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - quiet
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.port: int = self.httpd.server_address[1]
        self._thread = threading.Thread(
            target=self.httpd.serve_forever, name="otlp-metrics-sink", daemon=True
        )
        self._thread.start()

    def exponential_histograms(self, name: str) -> list[tuple[dict[str, Any], Any]]:
        """Every exponential-histogram point of metric `name` received so far: (attributes, point)."""
        with self._lock:
            requests = list(self.requests)
        return [
            ({a.key: _any_value(a.value) for a in p.attributes}, p)
            for request in requests
            for rm in request.resource_metrics
            for sm in rm.scope_metrics
            for m in sm.metrics
            if m.name == name
            for p in m.exponential_histogram.data_points
        ]

    def stop(self) -> None:
        """Stop serving and close the socket."""
        self.httpd.shutdown()
        self.httpd.server_close()


def _any_value(value: Any) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [_any_value(v) for v in value.array_value.values]
    return getattr(value, kind) if kind else None


def _jaeger_config(otlp_port: int, query_port: int, query_grpc_port: int, sink_port: int) -> str:
    return f"""\
service:
  extensions: [jaeger_storage, jaeger_query]
  pipelines:
    traces:
      receivers: [otlp]
      exporters: [jaeger_storage_exporter]
    metrics:
      receivers: [otlp]
      exporters: [otlphttp/sink]
  telemetry:
    metrics:
      level: none
extensions:
  jaeger_storage:
    backends:
      memstore:
        memory:
          max_traces: 100000
  jaeger_query:
    storage:
      traces: memstore
    max_clock_skew_adjust: 0s  # the spans' times as sent
    enable_tracing: false  # its own traces would go to localhost:4317 (and its stop wait for them)
    http:
      endpoint: 127.0.0.1:{query_port}
    grpc:
      endpoint: 127.0.0.1:{query_grpc_port}
receivers:
  otlp:
    protocols:
      grpc:
        endpoint: 127.0.0.1:{otlp_port}
exporters:
  jaeger_storage_exporter:
    trace_storage: memstore
  otlphttp/sink:
    endpoint: http://127.0.0.1:{sink_port}
    compression: none
"""


@dataclass
class Jaeger:
    """A running Jaeger: its OTLP/gRPC receiver, its query API, and the sink of the metrics it relays."""

    process: subprocess.Popen[bytes]
    workdir: Path
    otlp_port: int
    query_port: int
    sink: MetricsSink
    log_path: Path = field(init=False)

    def __post_init__(self) -> None:
        self.log_path = self.workdir / "jaeger.log"

    @property
    def otlp_endpoint(self) -> str:
        """HOST:PORT of the OTLP/gRPC receiver (plaintext)."""
        return f"127.0.0.1:{self.otlp_port}"

    def trace_spans(self, trace_id: int) -> list[dict[str, Any]]:
        """The spans of trace `trace_id` as Jaeger stored them (OTLP JSON: name, spanId, parentSpanId,
        startTimeUnixNano, endTimeUnixNano, attributes decoded into a dict); [] when it has none."""
        url = f"http://127.0.0.1:{self.query_port}/api/v3/traces/{trace_id:032x}"
        try:
            with urllib.request.urlopen(url, timeout=10) as response:
                answer = json.loads(response.read())
        except urllib.error.HTTPError as err:
            if err.code == 404:
                return []
            raise
        spans = []
        for rs in answer.get("result", {}).get("resourceSpans", []):
            for ss in rs.get("scopeSpans", []):
                for span in ss.get("spans", []):
                    span["attributes"] = {
                        a["key"]: _json_value(a["value"]) for a in span.get("attributes", [])
                    }
                    spans.append(span)
        return spans

    def log_tail(self, lines: int = 30) -> str:
        """The end of Jaeger's log, for failure messages."""
        return _tail(self.log_path, lines)

    def stop(self) -> None:
        """Stop Jaeger and the sink, remove the working directory."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.sink.stop()
        shutil.rmtree(self.workdir, ignore_errors=True)


def _json_value(value: dict[str, Any]) -> Any:
    """An OTLP JSON AnyValue as Python (intValue comes as a string, as OTLP JSON encodes int64)."""
    for kind, item in value.items():
        if kind == "intValue":
            return int(item)
        if kind == "arrayValue":
            return [_json_value(v) for v in item.get("values", [])]
        return item
    return None


def start_jaeger(timeout_s: float = 60.0, attempts: int = 3) -> Jaeger:
    """Start Jaeger on free loopback ports with all state in a temporary directory; waits until its query
    API answers. Call `stop()`."""
    binary = jaeger_binary()
    error = ""
    for _ in range(attempts):  # a "free" port can be taken before Jaeger binds it
        workdir = Path(tempfile.mkdtemp(prefix="hoptrace-jaeger-"))
        sink = MetricsSink()
        otlp_port, query_port, query_grpc_port = free_port(), free_port(), free_port()
        config = workdir / "jaeger.yaml"
        config.write_text(_jaeger_config(otlp_port, query_port, query_grpc_port, sink.port))
        with open(workdir / "jaeger.log", "wb") as log:
            process = subprocess.Popen(
                dies_with_parent([str(binary), "--config", str(config)]), stdout=log, stderr=subprocess.STDOUT
            )
        jaeger = Jaeger(process, workdir, otlp_port, query_port, sink)
        if wait_http_ok(f"http://127.0.0.1:{query_port}/api/v3/services", timeout_s, process):
            return jaeger
        error = jaeger.log_tail()
        jaeger.stop()
    raise OtelBackendError(
        f"jaeger did not answer its query API after {attempts} attempts; its log:\n{error}"
    )
