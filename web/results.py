"""Results of a trace: where the time goes along the path, from the collector's InfluxDB.

The decomposition, percentiles, loss, jitter and throughput come from `hoptrace.collector.report`
(`build_report`, the same numbers as `hoptrace report`); the time series of each segment's p50/p99 are
`segment_stats` points read with Flux here. The page is readable without JavaScript (tables rendered on the
server); with it, charts (Chart.js, installed with npm) and a poll of the JSON endpoint every 2 s.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from flask import Blueprint, abort, current_app, jsonify, render_template, request, send_from_directory
from influxdb_client import InfluxDBClient

from hoptrace.collector.aggregate import END_TO_END
from hoptrace.collector.influx import SEGMENT_STATS
from hoptrace.collector.report import build_report, format_ns
from hoptrace.web.dispatcher import DispatcherError, get_client

bp = Blueprint("results", __name__)

SINCE_CHOICES = ("1m", "5m", "15m", "1h", "6h", "24h")
_DURATION = re.compile(r"^(\d+)(s|m|h|d)$")
_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
# At most this many points per series on the time chart (aggregateWindow widens beyond it).
MAX_POINTS = 300
CHART_JS = ("chart.js", "dist", "chart.umd.js")

__all__ = ["bp", "format_ns"]


def _since() -> str:
    """The requested time range (?since=15m), checked; the configured default otherwise."""
    since = request.args.get("since") or current_app.config["RESULTS_SINCE"]
    if not _DURATION.match(since):
        abort(400, description=f"bad since {since!r}: use e.g. 5m, 15m, 1h")
    return since


def _flux_string(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("${", "\\${") + '"'


def window_for(since: str) -> str:
    """The aggregation window that keeps a range of `since` under MAX_POINTS points (at least 1 s)."""
    number, unit = _DURATION.match(since).groups()  # type: ignore[union-attr]
    seconds = int(number) * _SECONDS[unit]
    return f"{max(1, -(-seconds // MAX_POINTS))}s"


def segment_series(trace: str, since: str) -> dict[str, dict[str, list[list[float]]]]:
    """Per segment (end to end left out), [[epoch ms, ns], ...] of the per-second p50 and p99 from
    `segment_stats`, averaged (p50) or maxed (p99) over `window_for(since)`."""
    config = current_app.config
    window = window_for(since)
    data = (
        f"data = from(bucket: {_flux_string(config['INFLUX_BUCKET'])}) |> range(start: -{since})"
        f' |> filter(fn: (r) => r._measurement == "{SEGMENT_STATS}" and r.trace == {_flux_string(trace)}'
        f' and r.segment != "{END_TO_END}")'
        ' |> keep(columns: ["_time", "_value", "_field", "segment"])\n'
        'data |> filter(fn: (r) => r._field == "p50_ns") |> group(columns: ["segment"])'
        f' |> aggregateWindow(every: {window}, fn: mean, createEmpty: false) |> yield(name: "p50")\n'
        'data |> filter(fn: (r) => r._field == "p99_ns") |> group(columns: ["segment"])'
        f' |> aggregateWindow(every: {window}, fn: max, createEmpty: false) |> yield(name: "p99")\n'
    )
    series: dict[str, dict[str, list[list[float]]]] = {}
    with InfluxDBClient(
        url=config["INFLUX_URL"], token=config["INFLUX_TOKEN"], org=config["INFLUX_ORG"], timeout=30_000
    ) as client:
        for table in client.query_api().query(data, org=config["INFLUX_ORG"]):
            for record in table.records:
                segment = record.values.get("segment")
                name = record.values.get("result")
                if segment is None or name not in ("p50", "p99") or record.get_value() is None:
                    continue
                points = series.setdefault(segment, {"p50": [], "p99": []})[name]
                points.append([record.get_time().timestamp() * 1000.0, float(record.get_value())])
    for entry in series.values():
        for points in entry.values():
            points.sort()
    return series


def _trace_path(name: str) -> tuple[list[str] | None, dict[str, Any] | None]:
    """The applied trace's hop names (the report's path order) and its state; (None, None) when it is
    not applied (any more): its data is still shown."""
    from hoptrace.web.traces import trace_view

    try:
        trace = get_client().trace(name)
    except DispatcherError:
        return None, None
    return [hop.name for hop in trace.spec.hops], trace_view(trace)


def results_data(name: str, since: str) -> dict[str, Any]:
    """Everything the results page shows, JSON-ready."""
    config = current_app.config
    path, view = _trace_path(name)
    report = build_report(
        name,
        url=config["INFLUX_URL"],
        bucket=config["INFLUX_BUCKET"],
        org=config["INFLUX_ORG"],
        token=config["INFLUX_TOKEN"],
        since=since,
        path=path,
    )
    return {
        "trace": name,
        "since": since,
        "generated_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "state": view["state"] if view else "not applied",
        "report": report,
        "series": segment_series(name, since),
    }


@bp.get("/traces/<name>/results")
def page(name: str):  # noqa: ANN201 - a view
    """The results page (tables rendered here; charts and polling in static/results.js)."""
    since = _since()
    try:
        data, error = results_data(name, since), None
    except Exception as exc:  # InfluxDB down or refusing: say so on the page instead of a 500
        data, error = None, f"cannot read InfluxDB at {current_app.config['INFLUX_URL']}: {exc}"
    return render_template(
        "results.html",
        name=name,
        since=since,
        since_choices=SINCE_CHOICES,
        data=data,
        error=error,
        poll_ms=current_app.config["POLL_INTERVAL_MS"],
    ), 502 if error else 200


@bp.get("/traces/<name>/results.json")
def data_json(name: str):  # noqa: ANN201 - a view
    """The results as JSON (polled every 2 s by the page while it is open)."""
    since = _since()
    try:
        return jsonify(results_data(name, since))
    except Exception as exc:  # same as the page: a readable error, not a 500
        return jsonify({"error": f"cannot read InfluxDB at {current_app.config['INFLUX_URL']}: {exc}"}), 502


@bp.get("/vendor/chart.umd.js")
def chartjs():  # noqa: ANN201 - a view
    """Chart.js from web/node_modules (installed by `npm ci --prefix web`, never copied into the repo)."""
    directory = Path(current_app.config["NODE_MODULES"]).joinpath(*CHART_JS[:-1])
    if not (directory / CHART_JS[-1]).is_file():
        abort(404, description=f"{directory / CHART_JS[-1]} is missing: run `npm ci --prefix web`")
    return send_from_directory(directory, CHART_JS[-1], mimetype="text/javascript", max_age=3600)
