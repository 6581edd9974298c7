"""Results of a trace: where the time goes along the path, through the dispatcher's `GetReport`.

The decomposition, percentiles, loss, jitter and throughput are the report of `hoptrace report` (the same
numbers, the same call), with each segment's p50/p99 over time (`with_series`). The web reads nothing of
InfluxDB itself: Flux lives only in `hoptrace.results.store`. The page is readable without JavaScript
(tables rendered on the server, hop actions and events too: `hoptrace.web.actions`); with it, charts
(Chart.js, installed with npm) and a poll of the JSON endpoint every 2 s.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from flask import Blueprint, abort, current_app, jsonify, render_template, request, send_from_directory
from markupsafe import escape

from hoptrace.common.client import ApiError
from hoptrace.common.durations import parse_duration
from hoptrace.results.format import WITHIN_CLOCK_BOUND, format_ns
from hoptrace.results.report_view import (
    LATENCY_FIELDS,
    bound_text,
    latency_text,
    loss_text,
    most_time_text,
    report_from_proto,
    translation_text,
)
from hoptrace.results.timerange import parse_time
from hoptrace.v1 import api_pb2
from hoptrace.web import actions, pathgraph
from hoptrace.web.dispatcher import get_client, http_status

bp = Blueprint("results", __name__)

SINCE_CHOICES = ("1m", "5m", "15m", "1h", "6h", "24h")
CHART_JS = ("chart.js", "dist", "chart.umd.js")

__all__ = ["bp", "format_ns"]


def requested_since() -> str:
    """The requested time range (?since=15m, any duration of hoptrace.common.durations up to its limit),
    checked; the configured default otherwise. 400 with the reason when it is not one."""
    since = request.args.get("since") or current_app.config["RESULTS_SINCE"]
    try:
        seconds = parse_duration(since)
    except ValueError as error:
        abort(400, description=f"since: {error}")
    if seconds <= 0:
        abort(400, description=f"since: {since!r}: want a time range > 0, e.g. 5m, 15m, 1h")
    return since


def requested_bounds() -> dict[str, str]:
    """?start= and ?end= as given (each an ISO 8601 time, UTC unless it names a zone, or a duration ago:
    hoptrace.results.timerange.parse_time), checked; 400 naming the parameter when one is no time. The
    dispatcher checks the range they make (an end before its start: 400 with its reason)."""
    bounds = {}
    for key in ("start", "end"):
        text = request.args.get(key, "").strip()
        if text:
            try:
                parse_time(text)
            except ValueError as error:
                abort(400, description=f"{key}: {error}")
            bounds[key] = text
    return bounds


def bounds_ns(bounds: dict[str, str]) -> dict[str, int]:
    """The checked ?start= and ?end= of requested_bounds() as the client's start_ns and end_ns."""
    return {f"{key}_ns": parse_time(text) for key, text in bounds.items()}


def range_text(since: str, bounds: dict[str, str]) -> str:
    """The range as a page says it: "the last 15m", "2025-03-01T14:05:00Z to now"."""
    if not bounds:
        return f"the last {since}"
    start = bounds.get("start") or (f"{since} before the end" if "end" in bounds else f"the last {since}")
    return f"{start} to {bounds.get('end', 'now')}"


def since_seconds(since: str) -> float:
    """Seconds of a checked ?since value (15m: 900)."""
    return parse_duration(since)


def series_data(report: api_pb2.Report) -> dict[str, dict[str, Any]]:
    """Report.series as the charts take it: per segment, [[epoch ms, ns], ...] of p50 and p99, with a
    [ms, None] where windows are missing (no packet then: the chart's line breaks there instead of joining
    across the gap), and the segment's clock bound (cross-node: the chart draws it; 0 within a node).

    The windows are aggregated to one step (hoptrace.results.store.series_window): the smallest distance
    between two points of any series is it, and a distance over 1.5 steps is a gap."""
    times = sorted({point.at.ToMilliseconds() for series in report.series for point in series.p50})
    steps = [b - a for a, b in zip(times, times[1:], strict=False) if b > a]
    step = min(steps) if steps else 0
    bounds = {f"{getattr(s, 'from')}>{s.to}": s for s in report.segments}

    def points(found: Any) -> list[list[float | None]]:
        out: list[list[float | None]] = []
        for point in found:
            at = point.at.ToMilliseconds() * 1.0
            if out and step and at - out[-1][0] > 1.5 * step:  # type: ignore[operator]
                out.append([out[-1][0] + step, None])  # type: ignore[operator]
            out.append([at, point.ns])
        return out

    data: dict[str, dict[str, Any]] = {}
    for series in report.series:
        segment = bounds.get(series.segment)
        data[series.segment] = {
            "p50": points(series.p50),
            "p99": points(series.p99),
            "clock_bound_ns": segment.clock_bound_ns if segment is not None and not segment.same_node else 0,
        }
    return data


def with_display(segment: dict[str, Any]) -> dict[str, Any]:
    """A report segment plus `display`: its latencies as the CLI's table shows them ("≤ ±170ns" for one
    within the clock bound, never a negative number) and, when its median is, the label's note."""
    display: dict[str, str] = {field: latency_text(segment, field) for field in LATENCY_FIELDS}
    if segment.get("below_clock_bound"):
        display["clock_note"] = f"{bound_text(segment)} ({WITHIN_CLOCK_BOUND})"
    return {**segment, "display": display}


def _applied_trace(name: str) -> api_pb2.Trace | None:
    """The applied trace; None when it is not applied (any more): its data is still shown."""
    try:
        return get_client().trace(name)
    except ApiError:
        return None


def results_data(name: str, since: str, bounds: dict[str, str] | None = None) -> dict[str, Any]:
    """Everything the results page shows, JSON-ready, over `since` (or the `bounds` of requested_bounds());
    raises ApiError when there is no report."""
    from hoptrace.web.traces import trace_view

    trace = _applied_trace(name)
    view = trace_view(trace) if trace is not None else None
    report = get_client().report(name, since_seconds(since), with_series=True, **bounds_ns(bounds or {}))
    data = report_from_proto(report)  # the numbers of `hoptrace report --json`, raw
    summary = most_time_text(data)
    data["segments"] = [with_display(segment) for segment in data["segments"]]
    data["end_to_end"] = with_display(data["end_to_end"])
    return {
        "trace": name,
        "since": since,
        "generated_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "state": view["state"] if view else "not applied",
        "report": data,
        "summary": summary,
        "series": series_data(report),
        # The path graph of the trace's hops with each segment's p50/p99 (none once it is deleted: the
        # report keeps hop names, not where they were).
        "graph_html": pathgraph.render(pathgraph.from_trace(trace.spec, data["segments"]))
        if trace is not None and trace.spec.hops
        else "",
        # Hop counts/histograms and event probes, drawn by the server from the same report.
        "actions_html": actions.render(data),
        "drops_html": drops_html(data),
        "addresses_html": addresses_html(data),
    }


def addresses_html(report: dict[str, Any]) -> str:
    """What each hop saw of the packets that describe their addresses, and the translations between hops,
    as `hoptrace report` says them; "" when no packet described them yet."""
    if not report.get("addresses"):
        return ""
    rows = "".join(
        "<tr>"
        + "".join(f"<td>{escape(str(a[k]))}</td>" for k in ("hop", "protocol", "source", "destination"))
        + f'<td class="num">{a["packets"]}</td></tr>'
        for a in report["addresses"]
    )
    html = (
        "<h2>Addresses each hop saw (the packets that describe them, one in 64)</h2>"
        "<table><thead><tr><th>hop</th><th>protocol</th><th>source</th><th>destination</th>"
        f"<th>packets</th></tr></thead><tbody>{rows}</tbody></table>"
    )
    if report.get("translations"):
        items = "".join(f"<li>{escape(translation_text(t))}</li>" for t in report["translations"])
        html += f"<h2>Translations (where consecutive hops saw different addresses)</h2><ul>{items}</ul>"
    return html


def drops_html(report: dict[str, Any]) -> str:
    """A trace with `drops: true`: each segment's loss and why, as `hoptrace report` says it
    (`report_view.loss_text`); "" when no segment has drops."""
    segments = [*report["segments"], {**report["end_to_end"], "_e2e": True}]
    if not any(s.get("drops") for s in segments):
        return ""
    items = "".join(
        f"<li>{escape('end to end' if s.get('_e2e') else s['from'] + ' → ' + s['to'])}: "
        f"{escape(loss_text(s))}</li>"
        for s in segments
        if s.get("loss_count") or s.get("drops")
    )
    return f"<h2>Drops (where the kernel freed the lost packets, and why)</h2><ul>{items}</ul>"


@bp.get("/traces/<name>/results")
def page(name: str):  # noqa: ANN201 - a view
    """The results page (tables rendered here; charts and polling in static/results.js)."""
    since, bounds = requested_since(), requested_bounds()
    try:
        data, error, status = results_data(name, since, bounds), None, 200
    except ApiError as exc:  # no such trace, or no report (store down, not configured): say so, never a 500
        data, error, status = None, f"no report of {name}: {exc.message}", http_status(exc)
    return render_template(
        "results.html",
        name=name,
        since=since,
        bounds=bounds,
        range_text=range_text(since, bounds),
        since_choices=SINCE_CHOICES,
        data=data,
        error=error,
        poll_ms=current_app.config["POLL_INTERVAL_MS"],
    ), status


@bp.get("/traces/<name>/results.json")
def data_json(name: str):  # noqa: ANN201 - a view
    """The results as JSON (polled every 2 s by the page while it is open)."""
    since, bounds = requested_since(), requested_bounds()
    try:
        return jsonify(results_data(name, since, bounds))
    except ApiError as exc:  # same as the page: a readable error, not a 500
        return jsonify({"error": f"no report of {name}: {exc.message}"}), http_status(exc)


@bp.get("/vendor/chart.umd.js")
def chartjs():  # noqa: ANN201 - a view
    """Chart.js from web/node_modules (installed by `npm ci --prefix web`, never copied into the repo)."""
    directory = Path(current_app.config["NODE_MODULES"]).joinpath(*CHART_JS[:-1])
    if not (directory / CHART_JS[-1]).is_file():
        abort(404, description=f"{directory / CHART_JS[-1]} is missing: run `npm ci --prefix web`")
    return send_from_directory(directory, CHART_JS[-1], mimetype="text/javascript", max_age=3600)
