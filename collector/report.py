"""`hoptrace report NAME [--since DURATION] [--json]`: the per-hop latency decomposition, from InfluxDB.

Statistics come from the `segment_stats` windows of the range, of every collector, merged by content:
InfluxDB sums each field over the windows (`count`, `sum_ns`, the sketches' bucket counts, ...), so count,
mean and max are exact and p50/p90/p99 are the nearest-rank percentiles of every packet in the range within
`sketch.RELATIVE_ACCURACY` (0.5 %). Jitter: `jitter_ns` is the mean of |dT(i+1) - dT(i)| over consecutive
packets within each window (pairs across a window's edge are left out), `jitter_p99_ns` their p99 from the
merged jitter sketch. `incomplete`, `packets`, `complete`, `loss_count` and `tracer_lost` are sums over
`segment_stats`; `loss_rate` = sum(loss_count) / sum(from_count); `same_node` is the last window's. A
segment is `below_clock_bound` when at least half its packets were (its median latency is below the clocks'
bound); its `clock_bound_ns` is the largest of its windows' (the sum of its two nodes' clock bounds; 0 on
one node).
Per hop, `packets_per_s` and `bytes_per_s` are the means of `hop_counters` over the seconds with traffic.

JSON shape (a contract):
    {"trace", "packets", "complete",
     "segments": [{"from", "to", "count", "mean_ns", "p50_ns", "p90_ns", "p99_ns", "max_ns", "incomplete",
                   "loss_count", "loss_rate", "tracer_lost", "jitter_ns", "jitter_p99_ns", "same_node",
                   "below_clock_bound", "clock_bound_ns"}],
     "end_to_end": {same keys},
     "hops": [{"hop", "packets_per_s", "bytes_per_s", and "container", "pod" for a hop named by a workload}]}
with segments and hops in path order (the given path, else the chain their from/to hops form). The numbers
are raw: a cross-node latency within its clock bound may be negative. Readers show it through
`latency_text`, which says "≤ ±BOUND" for it, and `most_time_text` names the segment with the largest p50.

`node_clocks` reads each node's last `node_clock` point: the clock status `ListAgents` reports.
`get_packets` answers `GetPackets`: per-packet timelines (the web's waterfall) from `hop_latency`, the
exemplars (the slowest packets of each window and 1 in N by ID), whose points carry each packet's ID.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
import time
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from google.protobuf.timestamp_pb2 import Timestamp
from influxdb_client import InfluxDBClient

from hoptrace.collector.actions import (
    count_text,
    histogram_text,
    query_hop_actions,
    query_recorded,
    recorded_text,
)
from hoptrace.collector.aggregate import END_TO_END, QUANTILES
from hoptrace.collector.events import events_lines, query_events, recorded_bits, recorded_value
from hoptrace.collector.influx import HOP_COUNTERS, HOP_LATENCY, NODE_CLOCK, SEGMENT_STATS
from hoptrace.collector.sketch import JITTER_PREFIX, LATENCY_PREFIX, sketch_from_fields
from hoptrace.common.grpcutil import INFLUX_TOKEN_ENV, add_secret_argument, secret_from
from hoptrace.v1 import api_pb2

_DURATION = re.compile(r"^(\d+(ns|us|µs|ms|s|m|h|d|w))+$")
_STATS = ("count", "mean_ns", "p50_ns", "p90_ns", "p99_ns", "max_ns")


def _flux_string(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"').replace("${", "\\${") + '"'


def flux_time(value: str | datetime | Timestamp | None, default: str) -> str:
    """A Flux time expression: a duration like "10m" (meaning -10m), a datetime/Timestamp, or `default`."""
    if (
        value is None
        or value == ""
        or (isinstance(value, Timestamp) and not value.seconds and not value.nanos)
    ):
        return default
    if isinstance(value, Timestamp):
        dt = value.ToDatetime(tzinfo=UTC)
        return dt.strftime("%Y-%m-%dT%H:%M:%S") + f".{value.nanos:09d}Z"
    if isinstance(value, datetime):
        dt = value.astimezone(UTC)
        return dt.strftime("%Y-%m-%dT%H:%M:%S") + f".{dt.microsecond:06d}000Z"
    text = value.lstrip("-")
    if not _DURATION.match(text):
        raise ValueError(f"bad duration {value!r}: use e.g. 30s, 10m, 1h, 1h30m")
    return "-" + text


def _empty_stats(from_hop: str, to_hop: str) -> dict[str, Any]:
    return {
        "from": from_hop,
        "to": to_hop,
        "count": 0,
        "mean_ns": 0.0,
        "p50_ns": 0,
        "p90_ns": 0,
        "p99_ns": 0,
        "max_ns": 0,
        "incomplete": 0,
        "loss_count": 0,
        "loss_rate": 0.0,
        "tracer_lost": 0,
        "jitter_ns": 0.0,
        "jitter_p99_ns": 0,
        "same_node": False,
        "below_clock_bound": False,
        "clock_bound_ns": 0,
    }


def _order(pairs: dict[str, tuple[str, str]], path: Sequence[str] | None) -> list[str]:
    """Segment names in path order: from `path`, else following the from>to chain."""
    if path:
        names = [f"{a}>{b}" for a, b in zip(path, path[1:], strict=False)]
        return names + sorted(s for s in pairs if s not in names)
    by_from = {a: s for s, (a, _) in pairs.items()}
    tos = {b for a, b in pairs.values()}
    ordered: list[str] = []
    for start in sorted(a for a, _ in pairs.values() if a not in tos):
        hop = start
        while hop in by_from and by_from[hop] not in ordered:
            ordered.append(by_from[hop])
            hop = pairs[by_from[hop]][1]
    return ordered + sorted(s for s in pairs if s not in ordered)


def query_report(
    client: InfluxDBClient,
    bucket: str,
    org: str,
    trace: str,
    start: str = "-1h",
    stop: str = "now()",
    path: Sequence[str] | None = None,
) -> dict[str, Any]:
    """Query InfluxDB and build the report dict. `start`/`stop` are Flux time expressions (`flux_time`)."""
    q = client.query_api()
    base = (
        f"from(bucket: {_flux_string(bucket)}) |> range(start: {start}, stop: {stop})"
        f" |> filter(fn: (r) => r.trace == {_flux_string(trace)}"
    )
    # Sketches and mergeable sums of every window of the range, from every collector, and the counts of
    # packets and losses: summed by InfluxDB in one query, so a window landing while the report is read is
    # in all of its numbers or in none (two queries once saw `complete` 100 with every segment's count 0).
    summed = (
        f'{base} and r._measurement == "{SEGMENT_STATS}" and (r._field =~ /^[bj][pnz][0-9]*$/'
        ' or r._field == "count" or r._field == "sum_ns" or r._field == "below_bound_count"'
        ' or r._field == "jitter_sum_ns" or r._field == "jitter_count"'
        ' or r._field == "incomplete" or r._field == "packets" or r._field == "complete"'
        ' or r._field == "loss_count" or r._field == "from_count" or r._field == "tracer_lost"))'
        ' |> group(columns: ["segment", "from_hop", "to_hop", "_field"]) |> sum()'
    )
    # A segment's windows may carry other hop names over the range (end to end while the path was still
    # being learned: hop0 > hop3): its tables add up by segment, named after the hops most packets had.
    stats: dict[str, dict[str, Any]] = {}
    fields: dict[str, dict[str, int]] = {}
    named: dict[str, dict[tuple[str, str], int]] = {}
    for table in q.query(summed, org=org):
        for rec in table.records:
            seg = rec.values.get("segment")
            if seg is None:
                continue
            hops = (rec.values.get("from_hop", ""), rec.values.get("to_hop", ""))
            value = int(rec.get_value() or 0)
            field = rec.get_field()
            found = fields.setdefault(seg, {})
            found[field] = found.get(field, 0) + value
            by_hops = named.setdefault(seg, {})
            by_hops[hops] = by_hops.get(hops, 0) + (value if field == "count" else 0)
    for seg, by_hops in named.items():
        stats[seg] = _empty_stats(*max(by_hops, key=by_hops.__getitem__))
    for seg, found in fields.items():
        entry = stats[seg]
        latency = sketch_from_fields(found, LATENCY_PREFIX)
        count = found.get("count", 0)
        entry["count"] = count
        entry["mean_ns"] = found.get("sum_ns", 0) / count if count else 0.0
        entry["p50_ns"], entry["p90_ns"], entry["p99_ns"] = (latency.quantile(q) for q in QUANTILES)
        jitter_count = found.get("jitter_count", 0)
        entry["jitter_ns"] = found.get("jitter_sum_ns", 0) / jitter_count if jitter_count else 0.0
        entry["jitter_p99_ns"] = sketch_from_fields(found, JITTER_PREFIX).quantile(0.99)
        for field in ("incomplete", "loss_count", "tracer_lost"):
            entry[field] = found.get(field, 0)
    extremes = (
        f'{base} and r._measurement == "{SEGMENT_STATS}" and r._field == "max_ns")'
        ' |> group(columns: ["segment"]) |> max()'
    )
    for table in q.query(extremes, org=org):
        for rec in table.records:
            seg = rec.values.get("segment")
            if seg in stats and stats[seg]["count"]:
                stats[seg]["max_ns"] = int(rec.get_value() or 0)
    same = (
        f'{base} and r._measurement == "{SEGMENT_STATS}" and r._field == "same_node")'
        ' |> group(columns: ["segment"]) |> sort(columns: ["_time"]) |> last()'
    )
    for table in q.query(same, org=org):
        for rec in table.records:
            seg = rec.values.get("segment")
            if seg in stats:
                stats[seg]["same_node"] = bool(rec.get_value())
    bounds = (
        f'{base} and r._measurement == "{SEGMENT_STATS}" and r._field == "clock_bound_ns")'
        ' |> group(columns: ["segment"]) |> max()'
    )
    for table in q.query(bounds, org=org):
        for rec in table.records:
            seg = rec.values.get("segment")
            if seg in stats:
                stats[seg]["clock_bound_ns"] = int(rec.get_value() or 0)
    for seg, entry in stats.items():
        from_count, below = fields[seg].get("from_count", 0), fields[seg].get("below_bound_count", 0)
        entry["loss_rate"] = entry["loss_count"] / from_count if from_count else 0.0
        entry["below_clock_bound"] = entry["count"] > 0 and 2 * below >= entry["count"]
    e2e = stats.pop(END_TO_END, None)
    packets, complete = (fields.get(END_TO_END, {}).get(f, 0) for f in ("packets", "complete"))
    pairs = {s: (v["from"], v["to"]) for s, v in stats.items()}
    # A path whose segments have no latency yet (just applied, or only action points) has none to show.
    segments = [stats[s] for s in _order(pairs, path) if s in stats]
    if e2e is None:
        first = path[0] if path else (segments[0]["from"] if segments else "")
        last = path[-1] if path else (segments[-1]["to"] if segments else "")
        e2e = _empty_stats(first, last)
    hops = _query_hops(q, org, base, path or _hop_order(segments))
    _add_hop_actions(hops, query_hop_actions(q, org, base), path or _hop_order(segments))
    _add_recorded(hops, query_recorded(q, org, base))
    return {
        "trace": trace,
        "packets": packets,
        "complete": complete,
        "segments": segments,
        "end_to_end": e2e,
        "hops": hops,
        "events": query_events(q, org, base),
    }


def _hop_order(segments: list[dict[str, Any]]) -> list[str]:
    """Hop names along the ordered segments."""
    hops: list[str] = []
    for s in segments:
        for h in (s["from"], s["to"]):
            if h not in hops:
                hops.append(h)
    return hops


def _query_hops(q: Any, org: str, base: str, order: Sequence[str]) -> list[dict[str, Any]]:
    """Per hop, the mean packets/s and bytes/s over the seconds with traffic, in `order` (others after)."""
    flux = (
        f'{base} and r._measurement == "{HOP_COUNTERS}"'
        ' and (r._field == "packets_per_s" or r._field == "bytes_per_s"))'
        ' |> group(columns: ["hop", "container", "pod", "_field"]) |> mean()'
    )
    found: dict[str, dict[str, Any]] = {}
    for table in q.query(flux, org=org):
        for rec in table.records:
            hop = rec.values.get("hop")
            if hop is None:
                continue
            entry = found.setdefault(hop, {"hop": hop, "packets_per_s": 0.0, "bytes_per_s": 0.0})
            entry[rec.get_field()] = float(rec.get_value() or 0.0)
            for tag in ("container", "pod"):  # the hop's workload (hop_counters tags), when named by one
                if rec.values.get(tag):
                    entry[tag] = rec.values[tag]
    names = [h for h in order if h in found] + sorted(h for h in found if h not in order)
    return [found[h] for h in names]


def _add_hop_actions(
    hops: list[dict[str, Any]], found: dict[str, dict[str, list[dict[str, Any]]]], order: Sequence[str]
) -> None:
    """Every hop entry gets its "counts" and "histograms" (empty lists when it has none); a hop with actions
    but no throughput points gets an entry of its own, in path order."""
    by_name = {h["hop"]: h for h in hops}
    for name in [h for h in order if h in found] + sorted(h for h in found if h not in order):
        if name not in by_name:
            by_name[name] = {"hop": name, "packets_per_s": 0.0, "bytes_per_s": 0.0}
            hops.append(by_name[name])
    for entry in hops:
        entry["counts"] = found.get(entry["hop"], {}).get("counts", [])
        entry["histograms"] = found.get(entry["hop"], {}).get("histograms", [])


def _add_recorded(hops: list[dict[str, Any]], found: dict[str, list[dict[str, Any]]]) -> None:
    """Every hop entry gets its "recorded" fields (an empty list without a record action)."""
    by_name = {h["hop"]: h for h in hops}
    for name in found:
        if name not in by_name:
            by_name[name] = {
                "hop": name,
                "packets_per_s": 0.0,
                "bytes_per_s": 0.0,
                "counts": [],
                "histograms": [],
            }
            hops.append(by_name[name])
    for entry in hops:
        entry["recorded"] = found.get(entry["hop"], [])


def build_report(
    trace: str,
    *,
    url: str,
    bucket: str,
    org: str = "-",
    token: str = "",
    since: str = "1h",
    path: Sequence[str] | None = None,
) -> dict[str, Any]:
    """The report of `trace` over the last `since` (a duration like "10m"), as the JSON-ready dict."""
    with InfluxDBClient(url=url, token=token, org=org, timeout=30_000) as client:
        return query_report(client, bucket, org, trace, flux_time(since, "-1h"), "now()", path)


def _stats_proto(d: dict[str, Any]) -> api_pb2.SegmentStats:
    s = api_pb2.SegmentStats(
        count=d["count"],
        mean_ns=d["mean_ns"],
        p50_ns=d["p50_ns"],
        p90_ns=d["p90_ns"],
        p99_ns=d["p99_ns"],
        max_ns=d["max_ns"],
        incomplete=d["incomplete"],
        loss_count=d.get("loss_count", 0),
        loss_rate=d.get("loss_rate", 0.0),
        jitter_ns=d.get("jitter_ns", 0.0),
        jitter_p99_ns=d.get("jitter_p99_ns", 0),
        below_clock_bound=d.get("below_clock_bound", False),
        tracer_lost=d.get("tracer_lost", 0),
        same_node=d.get("same_node", False),
        clock_bound_ns=d.get("clock_bound_ns", 0),
    )
    # `from` is a Python keyword: set through setattr.
    setattr(s, "from", d["from"])  # noqa: B010
    s.to = d["to"]
    return s


def report_to_proto(report: dict[str, Any]) -> api_pb2.Report:
    """Convert the report dict to `hoptrace.v1.Report`."""
    return api_pb2.Report(
        trace=report["trace"],
        packets=report["packets"],
        complete=report["complete"],
        segments=[_stats_proto(s) for s in report["segments"]],
        end_to_end=_stats_proto(report["end_to_end"]),
        hops=[
            api_pb2.HopThroughput(
                hop=h["hop"],
                packets_per_s=h["packets_per_s"],
                bytes_per_s=h["bytes_per_s"],
                container=h.get("container", ""),
                pod=h.get("pod", ""),
                counts=[api_pb2.HopCount(**c) for c in h.get("counts", [])],
                histograms=[
                    api_pb2.HopHistogram(
                        node=g["node"],
                        field=g["field"],
                        total=g["total"],
                        buckets=[api_pb2.HistogramBucket(**b) for b in g["buckets"]],
                    )
                    for g in h.get("histograms", [])
                ],
                recorded=[api_pb2.HopRecorded(**r) for r in h.get("recorded", [])],
            )
            for h in report.get("hops", [])
        ],
        events=[
            api_pb2.EventResult(
                name=e["name"],
                node=e["node"],
                count=e["count"],
                count_by=e.get("count_by", ""),
                by=e.get("by", {}),
                histogram_arg=e.get("histogram_arg", ""),
                histogram=[api_pb2.HistogramBucket(**b) for b in e.get("histogram", [])],
                latency_missed=e.get("latency_missed", 0),
                recorded=[
                    api_pb2.EventRecordedResult(
                        arg=r["arg"],
                        count=r["count"],
                        sum=r["sum"],
                        mean=r["mean"] or 0.0,
                        signed=r["signed"],
                        **{k: recorded_bits(r[k]) for k in ("min", "max", "last")},
                    )
                    for r in e.get("recorded", [])
                ],
            )
            for e in report.get("events", [])
        ],
    )


def _stats_data(stats: api_pb2.SegmentStats) -> dict[str, Any]:
    return {
        "from": getattr(stats, "from"),
        "to": stats.to,
        "count": stats.count,
        "mean_ns": stats.mean_ns,
        "p50_ns": stats.p50_ns,
        "p90_ns": stats.p90_ns,
        "p99_ns": stats.p99_ns,
        "max_ns": stats.max_ns,
        "incomplete": stats.incomplete,
        "loss_count": stats.loss_count,
        "loss_rate": stats.loss_rate,
        "tracer_lost": stats.tracer_lost,
        "jitter_ns": stats.jitter_ns,
        "jitter_p99_ns": stats.jitter_p99_ns,
        "same_node": stats.same_node,
        "below_clock_bound": stats.below_clock_bound,
        "clock_bound_ns": stats.clock_bound_ns,
    }


def report_from_proto(report: api_pb2.Report) -> dict[str, Any]:
    """The `hoptrace report --json` dict of a `hoptrace.v1.Report` (the inverse of `report_to_proto`)."""
    return {
        "trace": report.trace,
        "packets": report.packets,
        "complete": report.complete,
        "segments": [_stats_data(segment) for segment in report.segments],
        "end_to_end": _stats_data(report.end_to_end),
        "hops": [
            {
                "hop": h.hop,
                "packets_per_s": h.packets_per_s,
                "bytes_per_s": h.bytes_per_s,
                **({"container": h.container} if h.container else {}),
                **({"pod": h.pod} if h.pod else {}),
                "counts": [
                    {
                        "node": c.node,
                        "by": c.by,
                        "key": c.key,
                        "count": c.count,
                        **({"key_name": c.key_name} if c.key_name else {}),
                    }
                    for c in h.counts
                ],
                "histograms": [
                    {
                        "node": g.node,
                        "field": g.field,
                        "total": g.total,
                        "buckets": [{"le": b.le, "count": b.count} for b in g.buckets],
                    }
                    for g in h.histograms
                ],
                "recorded": [
                    {
                        "node": r.node,
                        "field": r.field,
                        "count": r.count,
                        "min": r.min,
                        "max": r.max,
                        "mean": r.mean,
                        "last": r.last,
                    }
                    for r in h.recorded
                ],
            }
            for h in report.hops
        ],
        "events": [
            {
                "name": e.name,
                "node": e.node,
                "count": e.count,
                "count_by": e.count_by,
                "by": dict(sorted(e.by.items(), key=lambda item: (len(item[0]), item[0]))),
                "histogram_arg": e.histogram_arg,
                "histogram": [{"le": b.le, "count": b.count} for b in e.histogram],
                "latency_missed": e.latency_missed,
                "recorded": [
                    {
                        "arg": r.arg,
                        "count": r.count,
                        "sum": r.sum,
                        "mean": r.mean if r.count else None,
                        **{k: recorded_value(getattr(r, k), r.signed) for k in ("min", "max", "last")},
                        "signed": r.signed,
                    }
                    for r in e.recorded
                ],
            }
            for e in report.events
        ],
    }


def get_report(
    request: api_pb2.GetReportRequest,
    *,
    url: str,
    bucket: str,
    org: str = "-",
    token: str = "",
    path: Sequence[str] | None = None,
) -> api_pb2.Report:
    """Answer `Hoptrace.GetReport` (the dispatcher calls this); unset start = 1 h ago, unset end = now."""
    start = flux_time(request.start if request.HasField("start") else None, "-1h")
    stop = flux_time(request.end if request.HasField("end") else None, "now()")
    with InfluxDBClient(url=url, token=token, org=org, timeout=30_000) as client:
        report = report_to_proto(query_report(client, bucket, org, request.trace, start, stop, path))
        if request.with_series:
            now = time.time()
            first = request.start.ToNanoseconds() / 1e9 if request.HasField("start") else now - 3600
            last = request.end.ToNanoseconds() / 1e9 if request.HasField("end") else now
            window = series_window(last - first)
            report.series.extend(query_series(client, bucket, org, request.trace, start, stop, window))
        return report


# At most this many points per series (the window widens beyond it).
MAX_SERIES_POINTS = 300


def series_window(range_s: float) -> str:
    """The aggregation window that keeps a range of `range_s` seconds under MAX_SERIES_POINTS points
    (at least 1 s, the collector's interval)."""
    return f"{max(1, math.ceil(range_s / MAX_SERIES_POINTS))}s"


def query_series(
    client: InfluxDBClient, bucket: str, org: str, trace: str, start: str, stop: str, window: str
) -> list[api_pb2.SegmentSeries]:
    """Per segment (end to end left out), the per-second p50 of `segment_stats` averaged and its p99 maxed
    over each `window`, oldest first."""
    query = (
        f"data = from(bucket: {_flux_string(bucket)}) |> range(start: {start}, stop: {stop})"
        f' |> filter(fn: (r) => r._measurement == "{SEGMENT_STATS}" and r.trace == {_flux_string(trace)}'
        f' and r.segment != "{END_TO_END}")'
        ' |> keep(columns: ["_time", "_value", "_field", "segment"])\n'
        'data |> filter(fn: (r) => r._field == "p50_ns") |> group(columns: ["segment"])'
        f' |> aggregateWindow(every: {window}, fn: mean, createEmpty: false) |> yield(name: "p50")\n'
        'data |> filter(fn: (r) => r._field == "p99_ns") |> group(columns: ["segment"])'
        f' |> aggregateWindow(every: {window}, fn: max, createEmpty: false) |> yield(name: "p99")\n'
    )
    points: dict[str, dict[str, list[tuple[int, float]]]] = {}
    for table in client.query_api().query(query, org=org):
        for rec in table.records:
            segment, name, value = rec.values.get("segment"), rec.values.get("result"), rec.get_value()
            if segment is None or name not in ("p50", "p99") or value is None:
                continue
            at_ns = int(rec.get_time().timestamp() * 1e9)
            points.setdefault(segment, {"p50": [], "p99": []})[name].append((at_ns, float(value)))
    out = []
    for segment in sorted(points):
        series = api_pb2.SegmentSeries(segment=segment)
        for name, target in (("p50", series.p50), ("p99", series.p99)):
            for at_ns, value in sorted(points[segment][name]):
                point = target.add(ns=value)
                point.at.FromNanoseconds(at_ns)
        out.append(series)
    return out


_WINDOW_FIELDS = {
    "count": int,
    "mean_ns": float,
    "p50_ns": int,
    "p90_ns": int,
    "p99_ns": int,
    "max_ns": int,
    "incomplete": int,
    "loss_count": int,
    "loss_rate": float,
    "tracer_lost": int,
    "jitter_ns": float,
    "jitter_p99_ns": float,
    "same_node": bool,
    "below_clock_bound": bool,
    "clock_bound_ns": int,
}


def segment_windows(
    trace: str,
    *,
    url: str,
    bucket: str,
    org: str = "-",
    token: str = "",
    after_ns: int,
    path: Sequence[str] | None = None,
) -> list[api_pb2.SegmentStats]:
    """The closed 1 s `segment_stats` windows of `trace` after `after_ns` (unix ns), oldest first and, within
    a window, segments in path order (end to end last). Feeds `Hoptrace.WatchSegmentStats`."""
    query = (
        f"from(bucket: {_flux_string(bucket)}) |> range(start: time(v: {after_ns + 1}))"
        f' |> filter(fn: (r) => r._measurement == "{SEGMENT_STATS}" and r.trace == {_flux_string(trace)}'
        " and r._field !~ /^[bj][pnz][0-9]*$/)"  # not the sketches' buckets
        ' |> pivot(rowKey: ["_time"], columnKey: ["_field"], valueColumn: "_value")'
    )
    order = {f"{a}>{b}": i for i, (a, b) in enumerate(zip(path or [], (path or [])[1:], strict=False))}
    rows: list[tuple[int, int, api_pb2.SegmentStats]] = []
    with InfluxDBClient(url=url, token=token, org=org, timeout=30_000) as client:
        for table in client.query_api().query(query, org=org):
            for rec in table.records:
                values = rec.values
                stats = api_pb2.SegmentStats(
                    **{k: conv(values[k]) for k, conv in _WINDOW_FIELDS.items() if values.get(k) is not None}
                )
                setattr(stats, "from", values.get("from_hop", ""))  # noqa: B010
                stats.to = values.get("to_hop", "")
                stats.at.FromDatetime(rec.get_time())
                segment = values.get("segment", "")
                rows.append((stats.at.ToNanoseconds(), order.get(segment, len(order)), stats))
    rows.sort(key=lambda row: row[:2])
    return [stats for _, _, stats in rows]


# GetPackets: how many slowest packets by default and at most; how far around a packet's first hop its other
# points are looked for (a packet's whole passage, with room for clock error).
DEFAULT_SLOWEST, MAX_SLOWEST = 10, 50
PASSAGE_MARGIN_NS = 100_000_000


def get_packets(
    request: api_pb2.GetPacketsRequest,
    *,
    url: str,
    bucket: str,
    org: str = "-",
    token: str = "",
    path: Sequence[str] | None = None,
) -> api_pb2.PacketList:
    """Answer `Hoptrace.GetPackets`: the slowest packets end to end over the range, slowest first, or the
    one packet `request.packet_id` (its latest passage), each with its segments in path order."""
    start = flux_time(request.start if request.HasField("start") else None, "-1h")
    stop = flux_time(request.end if request.HasField("end") else None, "now()")
    base = (
        f"from(bucket: {_flux_string(bucket)}) |> range(start: {start}, stop: {stop})"
        f' |> filter(fn: (r) => r._measurement == "{HOP_LATENCY}"'
        f" and r.trace == {_flux_string(request.trace)}"
    )
    out = api_pb2.PacketList()
    with InfluxDBClient(url=url, token=token, org=org, timeout=30_000) as client:
        q = client.query_api()
        if request.packet_id:
            # Its points, any segment: the latest one places the passage.
            found = (
                f'{base} and r._field == "packet_id" and r._value == {int(request.packet_id)})'
                ' |> group() |> sort(columns: ["_time"], desc: true) |> limit(n: 1)'
            )
            times = [_ns(rec.get_time()) for table in q.query(found, org=org) for rec in table.records]
            if times:
                timeline = _packet_timeline(q, bucket, org, request.trace, request.packet_id, times[0], path)
                if timeline is not None:
                    out.packets.append(timeline)
            return out
        count = min(request.slowest or DEFAULT_SLOWEST, MAX_SLOWEST)
        # The slowest end-to-end latencies alone (no pivot over the range: 3x faster), then each one's ID
        # from its own point's packet_id field, read back in a 1 us range (times come back in us).
        slowest = (
            f'{base} and r.segment == "{END_TO_END}" and r._field == "latency_ns")'
            f" |> group() |> top(n: {count})"
        )
        times = [_ns(rec.get_time()) for table in q.query(slowest, org=org) for rec in table.records]
        for at_ns in times:
            id_query = (
                f"from(bucket: {_flux_string(bucket)})"
                f" |> range(start: time(v: {at_ns}), stop: time(v: {at_ns + 1000}))"
                f' |> filter(fn: (r) => r._measurement == "{HOP_LATENCY}"'
                f" and r.trace == {_flux_string(request.trace)}"
                f' and r.segment == "{END_TO_END}" and r._field == "packet_id")'
            )
            ids = [int(rec.get_value()) for table in q.query(id_query, org=org) for rec in table.records]
            if not ids:
                continue
            timeline = _packet_timeline(q, bucket, org, request.trace, ids[0], at_ns, path)
            if timeline is not None:
                out.packets.append(timeline)
    out.packets.sort(key=lambda p: -p.end_to_end_ns)
    return out


def packets_from_proto(packets: api_pb2.PacketList) -> list[dict[str, Any]]:
    """`hoptrace packets --json`: each packet with its segments (raw numbers, offsets from its first hop)."""
    return [
        {
            "packet_id": p.packet_id,
            "at": p.at.ToDatetime(tzinfo=UTC).isoformat(timespec="microseconds"),
            "end_to_end_ns": p.end_to_end_ns,
            "segments": [
                {
                    "from": getattr(s, "from"),
                    "to": s.to,
                    "from_node": s.from_node,
                    "to_node": s.to_node,
                    "offset_ns": s.offset_ns,
                    "latency_ns": s.latency_ns,
                    "below_clock_bound": s.below_clock_bound,
                }
                for s in p.segments
            ],
        }
        for p in packets.packets
    ]


def render_packets_text(packets: list[dict[str, Any]], width: int = 40) -> str:
    """Each packet as a text waterfall: per segment its start, latency and a bar of `width` columns placed
    on the packet's whole passage (a segment within its clock bound reads so, never as a negative number)."""
    lines: list[str] = []
    for p in packets:
        ends = [max(s["offset_ns"], 0) + max(s["latency_ns"], 0) for s in p["segments"]]
        span = max([p["end_to_end_ns"], *ends, 1])
        e2e = format_ns(p["end_to_end_ns"]) if p["end_to_end_ns"] else "incomplete"
        lines.append(f"packet 0x{p['packet_id']:08x}  {p['at']}  end to end {e2e}")
        rows = []
        for s in p["segments"]:
            start = min(round(width * max(s["offset_ns"], 0) / span), width - 1)
            length = max(1, min(round(width * max(s["latency_ns"], 0) / span), width - start))
            nodes = s["from_node"] if s["from_node"] == s["to_node"] else f"{s['from_node']} > {s['to_node']}"
            latency = WITHIN_CLOCK_BOUND if s["below_clock_bound"] else format_ns(s["latency_ns"])
            bar = " " * start + "#" * length + " " * (width - start - length)
            rows.append(
                [f"{s['from']} > {s['to']}", nodes, f"+{format_ns(s['offset_ns'])}", latency, f"|{bar}|"]
            )
        if rows:
            widths = [max(len(r[i]) for r in rows) for i in range(4)]
            for r in rows:
                cells = [
                    r[0].ljust(widths[0]),
                    r[1].ljust(widths[1]),
                    r[2].rjust(widths[2]),
                    r[3].rjust(widths[3]),
                ]
                lines.append("  " + "  ".join([*cells, r[4]]))
        lines.append("")
    return "\n".join(lines)


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _ns(when: datetime) -> int:
    """Unix ns of a record time (the client's datetimes are microsecond precise), in integers."""
    return (when - _EPOCH) // timedelta(microseconds=1) * 1000


def _packet_timeline(
    q: Any, bucket: str, org: str, trace: str, packet_id: int, around_ns: int, path: Sequence[str] | None
) -> api_pb2.PacketTimeline | None:
    """One packet's points near `around_ns` (unix ns), as a timeline; None when none is found."""
    query = (
        f"from(bucket: {_flux_string(bucket)})"
        f" |> range(start: time(v: {around_ns - PASSAGE_MARGIN_NS}),"
        f" stop: time(v: {around_ns + PASSAGE_MARGIN_NS}))"
        f' |> filter(fn: (r) => r._measurement == "{HOP_LATENCY}" and r.trace == {_flux_string(trace)}'
        ' and (r._field == "latency_ns" or r._field == "packet_id" or r._field == "below_clock_bound"))'
        ' |> pivot(rowKey: ["_time"], columnKey: ["_field"], valueColumn: "_value")'
        f" |> filter(fn: (r) => r.packet_id == {int(packet_id)})"
    )
    rows: dict[str, dict[str, Any]] = {}
    for table in q.query(query, org=org):
        for rec in table.records:
            values = rec.values
            segment = values.get("segment")
            if segment is None or values.get("latency_ns") is None:
                continue
            at = _ns(rec.get_time())
            # The same ID again (IDs wrap): keep the passage nearest `around_ns`.
            if segment in rows and abs(rows[segment]["at"] - around_ns) <= abs(at - around_ns):
                continue
            rows[segment] = {
                "at": at,
                "from": values.get("from_hop", ""),
                "to": values.get("to_hop", ""),
                "from_node": values.get("from_node", ""),
                "to_node": values.get("to_node", ""),
                "latency_ns": int(values["latency_ns"]),
                "below": bool(values.get("below_clock_bound")),
            }
    if not rows:
        return None
    e2e = rows.pop(END_TO_END, None)
    segments = [
        rows[s] for s in _order({s: (r["from"], r["to"]) for s, r in rows.items()}, path) if s in rows
    ]
    first = e2e["at"] if e2e is not None else min(r["at"] for r in segments)
    timeline = api_pb2.PacketTimeline(packet_id=packet_id, end_to_end_ns=e2e["latency_ns"] if e2e else 0)
    timeline.at.FromNanoseconds(first)
    previous: dict[str, Any] | None = None
    for r in segments:
        # A segment starts where the one before it ended (exact, from the latencies); after a segment the
        # packet did not complete, from its own time (microsecond precise as read back).
        if previous is not None and previous["to"] == r["from"]:
            r["offset"] = previous["offset"] + previous["latency_ns"]
        elif previous is None and (e2e is None or e2e["from"] == r["from"]):
            r["offset"] = 0
        else:
            r["offset"] = r["at"] - first
        previous = r
        segment = timeline.segments.add(
            to=r["to"],
            offset_ns=r["offset"],
            latency_ns=r["latency_ns"],
            below_clock_bound=r["below"],
            from_node=r["from_node"],
            to_node=r["to_node"],
        )
        setattr(segment, "from", r["from"])  # noqa: B010
    return timeline


# How far back `node_clocks` looks for a node's last estimate (points come at most once a second per node).
CLOCK_LOOKBACK = "-30d"


def node_clocks(
    *, url: str, bucket: str, org: str = "-", token: str = "", timeout_ms: int = 3_000
) -> dict[str, api_pb2.NodeClockStatus]:
    """Each node's clock as the collector last measured it: its last `node_clock` point, by node.

    A node without a point is absent (its clock is unknown); a point with `bound_ns` 0 came from an agent
    that had no estimate yet (Cristian's bound is never 0), so it is returned with `measured` false.
    `timeout_ms` is short: ListAgents waits for this, and answers without clocks when the store is slow.
    """
    query = (
        f"from(bucket: {_flux_string(bucket)}) |> range(start: {CLOCK_LOOKBACK})"
        f' |> filter(fn: (r) => r._measurement == "{NODE_CLOCK}")'
        ' |> group(columns: ["node", "_field"]) |> last()'
    )
    fields: dict[str, dict[str, Any]] = {}
    with InfluxDBClient(url=url, token=token, org=org, timeout=timeout_ms) as client:
        for table in client.query_api().query(query, org=org):
            for rec in table.records:
                node = rec.values.get("node")
                if node is None or rec.get_value() is None:
                    continue
                entry = fields.setdefault(node, {"at": rec.get_time()})
                entry[rec.get_field()] = rec.get_value()
                entry["at"] = max(entry["at"], rec.get_time())
    out: dict[str, api_pb2.NodeClockStatus] = {}
    for node, entry in fields.items():
        status = api_pb2.NodeClockStatus(
            offset_ns=int(entry.get("offset_ns", 0)),
            bound_ns=int(entry.get("bound_ns", 0)),
            drift_ppm=float(entry.get("drift_ppm", 0.0)),
            delay_ns=int(entry.get("delay_ns", 0)),
        )
        status.measured = status.bound_ns > 0
        status.measured_at.FromDatetime(entry["at"])
        out[node] = status
    return out


def clock_data(clock: api_pb2.NodeClockStatus) -> dict[str, Any]:
    """A node's clock status, JSON-ready (`hoptrace agents --json`, the agents page): the numbers and when
    they were measured, or `measured` false and nulls when the collector has not measured the node."""
    if not clock.measured:
        return {
            "measured": False,
            "offset_ns": None,
            "bound_ns": None,
            "drift_ppm": None,
            "delay_ns": None,
            "measured_at": None,
        }
    return {
        "measured": True,
        "offset_ns": clock.offset_ns,
        "bound_ns": clock.bound_ns,
        "drift_ppm": clock.drift_ppm,
        "delay_ns": clock.delay_ns,
        "measured_at": clock.measured_at.ToDatetime(tzinfo=UTC).isoformat(timespec="seconds"),
    }


def clock_texts(clock: api_pb2.NodeClockStatus, now: datetime | None = None) -> dict[str, str]:
    """A node's clock status as a reader sees it: offset "-231ns", bound "±85ns", drift "1.50 ppm",
    measured "2026-01-02T03:04:05+00:00 (4 s ago)"; "unknown" (and "-") when it was not measured."""
    if not clock.measured:
        return {"offset": "unknown", "bound": "-", "drift": "-", "measured": "-"}
    at = clock.measured_at.ToDatetime(tzinfo=UTC)
    age = max(0.0, ((now or datetime.now(UTC)) - at).total_seconds())
    return {
        "offset": format_ns(clock.offset_ns),
        "bound": f"±{format_ns(clock.bound_ns)}",
        "drift": f"{clock.drift_ppm:.2f} ppm",
        "measured": f"{at.isoformat(timespec='seconds')} ({age:.0f} s ago)",
    }


def format_ns(ns: float) -> str:
    """Human-readable duration: 850ns, 12.3us, 4.56ms, 1.20s."""
    a = abs(ns)
    if a < 1_000:
        return f"{ns:.0f}ns"
    if a < 1_000_000:
        return f"{ns / 1e3:.1f}us"
    if a < 1_000_000_000:
        return f"{ns / 1e6:.2f}ms"
    return f"{ns / 1e9:.2f}s"


LATENCY_FIELDS = ("mean_ns", "p50_ns", "p90_ns", "p99_ns", "max_ns")
WITHIN_CLOCK_BOUND = "within clock bound"


def within_clock_bound(segment: dict[str, Any], value: float) -> bool:
    """True when `value`, one of the segment's latencies, cannot be told from zero: the segment crosses
    nodes and the value is below the sum of their clock bounds (or negative while the bound is unknown)."""
    if segment.get("same_node"):
        return False
    return value < 0 or value < segment.get("clock_bound_ns", 0)


def bound_text(segment: dict[str, Any]) -> str:
    """ "≤ ±170ns": how a latency within the segment's clock bound reads ("≤ ±?" while it is unknown)."""
    bound = segment.get("clock_bound_ns", 0)
    return f"≤ ±{format_ns(bound)}" if bound > 0 else "≤ ±?"


def latency_text(segment: dict[str, Any], field: str) -> str:
    """One latency of a segment (a LATENCY_FIELDS key) as a reader sees it: "3.7us", or "≤ ±170ns" when the
    clocks cannot resolve it (never a negative number)."""
    value = segment[field]
    return bound_text(segment) if within_clock_bound(segment, value) else format_ns(value)


def most_time(report: dict[str, Any]) -> tuple[dict[str, Any], float, float] | None:
    """The segment with the largest p50 and its shares (percent) of the end-to-end p50 and p99; None without
    packets end to end."""
    e2e = report["end_to_end"]
    segments = [s for s in report["segments"] if s["count"] > 0]
    if not segments or e2e["count"] == 0 or e2e["p50_ns"] <= 0 or e2e["p99_ns"] <= 0:
        return None
    top = max(segments, key=lambda s: s["p50_ns"])  # the first in path order on a tie
    return (
        top,
        100 * max(top["p50_ns"], 0) / e2e["p50_ns"],
        100 * max(top["p99_ns"], 0) / e2e["p99_ns"],
    )


def most_time_text(report: dict[str, Any]) -> str | None:
    """ "most time: a > b (62 % of p50, 48 % of p99)": where the time goes, in one line; None without data."""
    found = most_time(report)
    if found is None:
        return None
    segment, p50_share, p99_share = found
    return (
        f"most time: {segment['from']} > {segment['to']} ({p50_share:.0f} % of p50, {p99_share:.0f} % of p99)"
    )


def _workload_text(hop: dict[str, Any]) -> str:
    """A hop's container and pod as the report's hop table shows them ("" when it has none)."""
    container, pod = hop.get("container", ""), hop.get("pod", "")
    if pod:
        return f"pod {pod} (container {container})" if container else f"pod {pod}"
    return f"container {container}" if container else ""


def render_text(report: dict[str, Any]) -> str:
    """An aligned text table of the report (segments in path order, then end to end), under a line naming
    the segment where most time goes."""
    head = ["segment", "count", "mean", "p50", "p90", "p99", "max", "incomplete", "loss", "loss%", "jitter"]
    rows = [head]
    notes: list[str] = []
    for s in [*report["segments"], {**report["end_to_end"], "_name": "end to end"}]:
        name = s.get("_name") or f"{s['from']} > {s['to']}"
        if s.get("_name"):
            name = f"end to end ({s['from']} > {s['to']})"
        elif s.get("same_node"):
            name += " [node]"  # both hops on one node: this is the node's processing time
        if s.get("below_clock_bound"):
            name += f" ({WITHIN_CLOCK_BOUND})"
            known = s.get("clock_bound_ns", 0) > 0
            notes.append(
                f"{s['from']} > {s['to']}: p50 {bound_text(s)} ({WITHIN_CLOCK_BOUND}): "
                + (
                    "its two nodes' clocks agree only that closely, so its latency cannot be told from zero"
                    if known
                    else "the collector has not measured its nodes' clocks yet"
                )
            )
        if s.get("tracer_lost"):
            notes.append(
                f"{s['from']} > {s['to']}: {s['tracer_lost']} records lost by the tracer (not counted)"
            )
        rows.append(
            [
                name,
                str(s["count"]),
                *(latency_text(s, field) for field in LATENCY_FIELDS),
                str(s["incomplete"]),
                str(s.get("loss_count", 0)),
                f"{100 * s.get('loss_rate', 0.0):.2f}",
                format_ns(s.get("jitter_ns", 0.0)),
            ]
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = [f"trace {report['trace']}: {report['packets']} packets, {report['complete']} complete"]
    summary = most_time_text(report)
    if summary:
        lines.append(summary)
    for r in rows:
        cells = [r[0].ljust(widths[0])] + [c.rjust(w) for c, w in zip(r[1:], widths[1:], strict=True)]
        lines.append("  ".join(cells).rstrip())
    if report.get("hops"):
        hrows = [["hop", "packets/s", "bytes/s", "container / pod"]] + [
            [h["hop"], f"{h['packets_per_s']:.1f}", f"{h['bytes_per_s']:.1f}", _workload_text(h)]
            for h in report["hops"]
        ]
        if not any(r[3] for r in hrows[1:]):  # no hop named by a workload: no such column
            hrows = [r[:3] for r in hrows]
        hw = [max(len(r[i]) for r in hrows) for i in range(len(hrows[0]))]
        lines.append("")
        for r in hrows:
            cells = [r[0].ljust(hw[0]), r[1].rjust(hw[1]), r[2].rjust(hw[2]), *r[3:]]
            lines.append("  ".join(cells).rstrip())
    action_lines = hop_actions_lines(report.get("hops", []))
    if action_lines:
        lines.append("")
        lines.extend(action_lines)
    if report.get("events"):
        lines.append("")
        lines.append("events:")
        lines.extend(f"  {line}" for line in events_lines(report["events"]))
    if notes:
        lines.append("")
        lines.extend(f"note: {n}" for n in notes)
    return "\n".join(lines) + "\n"


def hop_actions_lines(hops: list[dict[str, Any]]) -> list[str]:
    """Hops' counts and histograms, briefly: one line per hop and node for counts, one per histogram."""
    out: list[str] = []
    for h in hops:
        for node in dict.fromkeys(c["node"] for c in h.get("counts", [])):
            mine = [c for c in h["counts"] if c["node"] == node]
            out.append(f"{h['hop']} @{node}: {count_text(mine)}")
        for g in h.get("histograms", []):
            fmt = format_ns if g["field"] == "latency" else str
            out.append(f"{h['hop']} @{g['node']}: histogram {histogram_text(g, fmt)}")
        for r in h.get("recorded", []):
            out.append(f"{h['hop']} @{r['node']}: recorded {recorded_text(r)}")
    return out


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of `hoptrace report` when it reads InfluxDB directly."""
    parser.add_argument("name", help="trace name")
    parser.add_argument("--since", default="1h", help="time range ending now, e.g. 30s, 10m, 1h")
    parser.add_argument("--json", action="store_true", help="print the JSON report")
    parser.add_argument("--influx-url", default="http://127.0.0.1:8086")
    parser.add_argument("--influx-bucket", default="hoptrace/autogen")
    parser.add_argument("--influx-org", default="-")
    add_secret_argument(parser, "influx-token", INFLUX_TOKEN_ENV, "the InfluxDB token (1.8: USER:PASSWORD)")


def run(args: argparse.Namespace) -> int:
    """Print the report for parsed `args`; returns the exit status."""
    report = build_report(
        args.name,
        url=args.influx_url,
        bucket=args.influx_bucket,
        org=args.influx_org,
        token=secret_from(args, "influx-token", INFLUX_TOKEN_ENV),
        since=args.since,
    )
    sys.stdout.write(json.dumps(report, indent=2) + "\n" if args.json else render_text(report))
    return 0
