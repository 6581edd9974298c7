"""The stored results of a trace, read from the collector's InfluxDB as the API's objects: the report
(`Hoptrace.GetReport`), per-second windows (`WatchSegmentStats`), per-packet timelines (`GetPackets`) and
the nodes' clocks (`ListAgents`). The dispatcher's report providers (`hoptrace.dispatcher.reports`) call it;
every client reads the answers through the views of `hoptrace.results` (`report_view`, `packets_view`, ...).

Statistics come from the `segment_stats` windows of the range, of every collector, merged by content:
InfluxDB sums each field over the windows (`count`, `sum_ns`, the sketches' bucket counts, ...), so count,
mean and max are exact and p50/p90/p99 are the nearest-rank percentiles of every packet in the range within
`sketch.RELATIVE_ACCURACY` (0.5 %). Jitter: `jitter_ns` is the mean of |dT(i+1) - dT(i)| over consecutive
packets within each window (pairs across a window's edge are left out), `jitter_p99_ns` their p99 from the
merged jitter sketch. `incomplete`, `packets`, `complete`, `loss_count`, `tracer_lost` and `before_attach`
are sums over `segment_stats`; `loss_rate` = sum(loss_count) / sum(from_count); `same_node` is the last
window's. A segment is `below_clock_bound` when at least half its packets were (its median latency is below
the clocks' bound); its `drops` (a trace with `drops: true`) are the sums of `segment_drops` by node,
reason and kernel function, most first; its `clock_bound_ns` is the largest of its windows' (the sum of its
two nodes' clock bounds; 0 on one node). Per hop, `packets_per_s` and `bytes_per_s` are the means of
`hop_counters` over the seconds with traffic. Segments and hops come in path order (the given path, else the
chain their from/to hops form). The numbers are raw: a cross-node latency within its clock bound may be
negative (`report_view` says so).

`node_clocks` reads each node's last `node_clock` point (and the last with a clock jump); a report's
`clock_jumps` are the jumps within its range of the nodes its cross-node segments join (by `hop_counters`'
nodes), each naming those segments. `get_packets` reads `hop_latency`, the exemplars
(the slowest packets of each window and 1 in N by ID), whose points carry each packet's ID.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from influxdb_client import InfluxDBClient

from hoptrace.collector.schema import (
    ADDRESS_TRANSLATIONS,
    END_TO_END,
    HOP_ADDRESSES,
    HOP_COUNTERS,
    HOP_LATENCY,
    JITTER_PREFIX,
    LATENCY_PREFIX,
    NODE_CLOCK,
    QUANTILES,
    SEGMENT_DROPS,
    SEGMENT_STATS,
)
from hoptrace.collector.sketch import sketch_from_fields
from hoptrace.results.flux import flux_string, flux_time, records, request_range
from hoptrace.results.packets_view import DEFAULT_SLOWEST, MAX_SLOWEST
from hoptrace.results.store_actions import query_events, query_hop_actions, query_recorded
from hoptrace.results.store_captures import query_captured
from hoptrace.results.timerange import DEFAULT_RANGE_S
from hoptrace.v1 import api_pb2


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


def _segment(from_hop: str, to_hop: str) -> api_pb2.SegmentStats:
    stats = api_pb2.SegmentStats(to=to_hop)
    setattr(stats, "from", from_hop)  # noqa: B010 - `from` is a Python keyword
    return stats


def query_report(
    client: InfluxDBClient,
    bucket: str,
    org: str,
    trace: str,
    start: str = "-1h",
    stop: str = "now()",
    path: Sequence[str] | None = None,
) -> api_pb2.Report:
    """The report of `trace` between `start` and `stop` (Flux time expressions: `flux_time`)."""
    q = client.query_api()
    base = (
        f"from(bucket: {flux_string(bucket)}) |> range(start: {start}, stop: {stop})"
        f" |> filter(fn: (r) => r.trace == {flux_string(trace)}"
    )
    # Sketches and mergeable sums of every window of the range, from every collector, and the counts of
    # packets and losses: summed by InfluxDB in one query, so a window landing while the report is read is
    # in all of its numbers or in none.
    summed = (
        f'{base} and r._measurement == "{SEGMENT_STATS}" and (r._field =~ /^[bj][pnz][0-9]*$/'
        ' or r._field == "count" or r._field == "sum_ns" or r._field == "below_bound_count"'
        ' or r._field == "jitter_sum_ns" or r._field == "jitter_count"'
        ' or r._field == "incomplete" or r._field == "packets" or r._field == "complete"'
        ' or r._field == "loss_count" or r._field == "from_count" or r._field == "tracer_lost"'
        ' or r._field == "before_attach"))'
        ' |> group(columns: ["segment", "from_hop", "to_hop", "_field"]) |> sum()'
    )
    # A segment's windows may carry other hop names over the range (end to end while the path was still
    # being learned: hop0 > hop3): its tables add up by segment, named after the hops most packets had.
    stats: dict[str, api_pb2.SegmentStats] = {}
    fields: dict[str, dict[str, int]] = {}
    named: dict[str, dict[tuple[str, str], int]] = {}
    for rec in records(q, org, summed):
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
        stats[seg] = _segment(*max(by_hops, key=by_hops.__getitem__))
    for seg, found in fields.items():
        entry = stats[seg]
        latency = sketch_from_fields(found, LATENCY_PREFIX)
        entry.count = count = found.get("count", 0)
        entry.mean_ns = found.get("sum_ns", 0) / count if count else 0.0
        entry.p50_ns, entry.p90_ns, entry.p99_ns = (latency.quantile(q) for q in QUANTILES)
        jitter_count = found.get("jitter_count", 0)
        entry.jitter_ns = found.get("jitter_sum_ns", 0) / jitter_count if jitter_count else 0.0
        entry.jitter_p99_ns = sketch_from_fields(found, JITTER_PREFIX).quantile(0.99)
        entry.incomplete = found.get("incomplete", 0)
        entry.loss_count = found.get("loss_count", 0)
        entry.tracer_lost = found.get("tracer_lost", 0)
        entry.before_attach = found.get("before_attach", 0)
        from_count, below = found.get("from_count", 0), found.get("below_bound_count", 0)
        entry.loss_rate = entry.loss_count / from_count if from_count else 0.0
        entry.below_clock_bound = count > 0 and 2 * below >= count
    extremes = (
        f'{base} and r._measurement == "{SEGMENT_STATS}" and r._field == "max_ns")'
        ' |> group(columns: ["segment"]) |> max()'
    )
    for rec in records(q, org, extremes):
        seg = rec.values.get("segment")
        if seg in stats and stats[seg].count:
            stats[seg].max_ns = int(rec.get_value() or 0)
    same = (
        f'{base} and r._measurement == "{SEGMENT_STATS}" and r._field == "same_node")'
        ' |> group(columns: ["segment"]) |> sort(columns: ["_time"]) |> last()'
    )
    for rec in records(q, org, same):
        seg = rec.values.get("segment")
        if seg in stats:
            stats[seg].same_node = bool(rec.get_value())
    bounds = (
        f'{base} and r._measurement == "{SEGMENT_STATS}" and r._field == "clock_bound_ns")'
        ' |> group(columns: ["segment"]) |> max()'
    )
    for rec in records(q, org, bounds):
        seg = rec.values.get("segment")
        if seg in stats:
            stats[seg].clock_bound_ns = int(rec.get_value() or 0)
    _query_drops(q, org, base, stats)
    e2e = stats.pop(END_TO_END, None)
    pairs = {s: (getattr(v, "from"), v.to) for s, v in stats.items()}
    # A path whose segments have no latency yet (just applied, or only action points) has none to show.
    segments = [stats[s] for s in _order(pairs, path) if s in stats]
    if e2e is None:
        first = path[0] if path else (getattr(segments[0], "from") if segments else "")
        last = path[-1] if path else (segments[-1].to if segments else "")
        e2e = _segment(first, last)
    order = list(path or _hop_order(segments))
    end_to_end = fields.get(END_TO_END, {})
    addresses, translations = _query_addresses(q, org, base, order)
    return api_pb2.Report(
        trace=trace,
        packets=end_to_end.get("packets", 0),
        complete=end_to_end.get("complete", 0),
        segments=segments,
        end_to_end=e2e,
        hops=_query_hops(q, org, base, order),
        events=query_events(q, org, base),
        addresses=addresses,
        translations=translations,
        clock_jumps=_query_clock_jumps(q, org, bucket, start, stop, base, [*segments, e2e]),
    )


def _query_clock_jumps(
    q: Any, org: str, bucket: str, start: str, stop: str, base: str, segments: Sequence[api_pb2.SegmentStats]
) -> list[api_pb2.ClockJump]:
    """The clock jumps (`node_clock` points with `jump_ns`) within the range of the nodes whose hops the
    trace's cross-node segments join, oldest first, each naming those segments ("from > to")."""
    node_of: dict[str, str] = {}
    flux = (
        f'{base} and r._measurement == "{HOP_COUNTERS}" and (r._field == "packets" or r._field == "matched"))'
        ' |> group(columns: ["hop", "node"]) |> last()'
    )
    for rec in records(q, org, flux):
        if rec.values.get("hop") and rec.values.get("node"):
            node_of[rec.values["hop"]] = rec.values["node"]
    across: dict[str, list[str]] = {}  # node -> the cross-node segments with a hop on it
    for segment in segments:
        ends = (node_of.get(getattr(segment, "from"), ""), node_of.get(segment.to, ""))
        if segment.same_node or not all(ends) or ends[0] == ends[1]:
            continue
        for node in ends:
            across.setdefault(node, []).append(f"{getattr(segment, 'from')} > {segment.to}")
    if not across:
        return []
    flux = (
        f"from(bucket: {flux_string(bucket)}) |> range(start: {start}, stop: {stop})"
        f' |> filter(fn: (r) => r._measurement == "{NODE_CLOCK}"'
        ' and (r._field == "jump_ns" or r._field == "jump_allowed_ns"))'
    )
    found: dict[tuple[str, datetime], dict[str, int]] = {}
    for rec in records(q, org, flux):
        node = rec.values.get("node")
        if node in across and rec.get_value() is not None:
            found.setdefault((node, rec.get_time()), {})[rec.get_field()] = int(rec.get_value())
    jumps = []
    for (node, at), values in sorted(found.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        jump = api_pb2.ClockJump(
            node=node,
            jump_ns=values.get("jump_ns", 0),
            allowed_ns=values.get("jump_allowed_ns", 0),
            segments=across[node],
        )
        jump.at.FromDatetime(at)
        jumps.append(jump)
    return jumps


# Per hop, and per pair of hops, the most packets first: a Service's clients vary, its backends do not.
MAX_ADDRESSES_PER_HOP = 8


def _query_addresses(
    q: Any, org: str, base: str, order: Sequence[str]
) -> tuple[list[api_pb2.HopAddresses], list[api_pb2.AddressTranslation]]:
    """What each hop saw of the packets that describe their addresses (`hop_addresses`), and where two
    consecutive hops saw them differ (`address_translations`), over the range: hops in `order`, the most
    packets first within a hop (or pair of hops)."""
    seen: dict[tuple[str, str, str, str], int] = {}
    flux = (
        f'{base} and r._measurement == "{HOP_ADDRESSES}" and r._field == "packets")'
        ' |> group(columns: ["hop", "protocol", "source", "destination"]) |> sum()'
    )
    for rec in records(q, org, flux):
        key = tuple(rec.values.get(tag, "") for tag in ("hop", "protocol", "source", "destination"))
        seen[key] = seen.get(key, 0) + int(rec.get_value() or 0)
    rewritten: dict[tuple[str, str, str, str, str], int] = {}
    flux = (
        f'{base} and r._measurement == "{ADDRESS_TRANSLATIONS}" and r._field == "packets")'
        ' |> group(columns: ["from_hop", "to_hop", "kind", "before", "after"]) |> sum()'
    )
    for rec in records(q, org, flux):
        key = tuple(rec.values.get(tag, "") for tag in ("from_hop", "to_hop", "kind", "before", "after"))
        rewritten[key] = rewritten.get(key, 0) + int(rec.get_value() or 0)

    def position(hop: str) -> tuple[int, str]:
        return (order.index(hop), "") if hop in order else (len(order), hop)

    addresses: list[api_pb2.HopAddresses] = []
    per_hop: dict[str, int] = {}
    for (hop, protocol, source, destination), packets in sorted(
        seen.items(), key=lambda kv: (position(kv[0][0]), -kv[1], kv[0])
    ):
        per_hop[hop] = per_hop.get(hop, 0) + 1
        if per_hop[hop] <= MAX_ADDRESSES_PER_HOP:
            addresses.append(
                api_pb2.HopAddresses(
                    hop=hop, protocol=protocol, source=source, destination=destination, packets=packets
                )
            )
    translations: list[api_pb2.AddressTranslation] = []
    per_pair: dict[tuple[str, str], int] = {}
    for (frm, to, kind, before, after), packets in sorted(
        rewritten.items(), key=lambda kv: (position(kv[0][0]), position(kv[0][1]), -kv[1], kv[0])
    ):
        per_pair[(frm, to)] = per_pair.get((frm, to), 0) + 1
        if per_pair[(frm, to)] <= MAX_ADDRESSES_PER_HOP:
            translations.append(
                api_pb2.AddressTranslation(
                    from_hop=frm, to_hop=to, kind=kind, before=before, after=after, packets=packets
                )
            )
    return addresses, translations


def _query_drops(q: Any, org: str, base: str, stats: dict[str, api_pb2.SegmentStats]) -> None:
    """Each segment's lost packets that its nodes' kernels dropped (`segment_drops`), by node, reason and
    kernel function, most first (ties by node, reason, then function)."""
    summed = (
        f'{base} and r._measurement == "{SEGMENT_DROPS}" and r._field == "count")'
        ' |> group(columns: ["segment", "node", "reason", "function"]) |> sum()'
    )
    found: dict[str, dict[tuple[str, str, str], int]] = {}
    for rec in records(q, org, summed):
        seg = rec.values.get("segment")
        if seg in stats:
            values = rec.values  # an older agent's points have no function: None here
            key = (values.get("node") or "", values.get("reason") or "", values.get("function") or "")
            found.setdefault(seg, {})[key] = found.get(seg, {}).get(key, 0) + int(rec.get_value() or 0)
    for seg, counts in found.items():
        for (node, reason, function), count in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])):
            if count:
                stats[seg].drops.add(node=node, reason=reason, count=count, function=function)


def _hop_order(segments: list[api_pb2.SegmentStats]) -> list[str]:
    """Hop names along the ordered segments."""
    hops: list[str] = []
    for s in segments:
        for h in (getattr(s, "from"), s.to):
            if h not in hops:
                hops.append(h)
    return hops


def _in_order(names: Sequence[str], order: Sequence[str]) -> list[str]:
    """`names` in `order`, the others after it, sorted."""
    return [h for h in order if h in names] + sorted(h for h in names if h not in order)


def _query_hops(q: Any, org: str, base: str, order: Sequence[str]) -> list[api_pb2.HopThroughput]:
    """Every hop with throughput, actions or recorded values: the mean packets/s and bytes/s over the seconds
    with traffic, its counts, histograms and recorded fields; hops with throughput first, in `order` (others
    after, sorted), then hops with actions alone, then hops with recorded values alone."""
    flux = (
        f'{base} and r._measurement == "{HOP_COUNTERS}"'
        ' and (r._field == "packets_per_s" or r._field == "bytes_per_s"))'
        ' |> group(columns: ["hop", "container", "pod", "_field"]) |> mean()'
    )
    found: dict[str, api_pb2.HopThroughput] = {}
    for rec in records(q, org, flux):
        hop = rec.values.get("hop")
        if hop is None:
            continue
        entry = found.setdefault(hop, api_pb2.HopThroughput(hop=hop))
        setattr(entry, rec.get_field(), float(rec.get_value() or 0.0))
        for tag in ("container", "pod"):  # the hop's workload (hop_counters tags), when named by one
            if rec.values.get(tag):
                setattr(entry, tag, rec.values[tag])
    hops = {name: found[name] for name in _in_order(list(found), order)}
    actions = query_hop_actions(q, org, base)
    recorded = query_recorded(q, org, base)
    for name in [*_in_order(list(actions), order), *recorded]:
        hops.setdefault(name, api_pb2.HopThroughput(hop=name))
    for name, entry in hops.items():
        if name in actions:
            entry.counts.extend(actions[name].counts)
            entry.histograms.extend(actions[name].histograms)
        entry.recorded.extend(recorded.get(name, []))
    return list(hops.values())


def read_report(
    trace: str,
    *,
    url: str,
    bucket: str,
    org: str = "-",
    token: str = "",
    since: str = "1h",
    path: Sequence[str] | None = None,
) -> api_pb2.Report:
    """The report of `trace` over the last `since` (a duration like "10m")."""
    with InfluxDBClient(url=url, token=token, org=org, timeout=30_000) as client:
        return query_report(client, bucket, org, trace, flux_time(since, "-1h"), "now()", path)


def get_report(
    request: api_pb2.GetReportRequest,
    *,
    url: str,
    bucket: str,
    org: str = "-",
    token: str = "",
    path: Sequence[str] | None = None,
) -> api_pb2.Report:
    """Answer `Hoptrace.GetReport` (the dispatcher calls this); unset end = now, unset start = an hour before
    the end."""
    start, stop = request_range(request)
    with InfluxDBClient(url=url, token=token, org=org, timeout=30_000) as client:
        report = query_report(client, bucket, org, request.trace, start, stop, path)
        if request.with_series:
            last = request.end.ToNanoseconds() / 1e9 if request.HasField("end") else time.time()
            first = (
                request.start.ToNanoseconds() / 1e9 if request.HasField("start") else last - DEFAULT_RANGE_S
            )
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
        f"data = from(bucket: {flux_string(bucket)}) |> range(start: {start}, stop: {stop})"
        f' |> filter(fn: (r) => r._measurement == "{SEGMENT_STATS}" and r.trace == {flux_string(trace)}'
        f' and r.segment != "{END_TO_END}")'
        ' |> keep(columns: ["_time", "_value", "_field", "segment"])\n'
        'data |> filter(fn: (r) => r._field == "p50_ns") |> group(columns: ["segment"])'
        f' |> aggregateWindow(every: {window}, fn: mean, createEmpty: false) |> yield(name: "p50")\n'
        'data |> filter(fn: (r) => r._field == "p99_ns") |> group(columns: ["segment"])'
        f' |> aggregateWindow(every: {window}, fn: max, createEmpty: false) |> yield(name: "p99")\n'
    )
    points: dict[str, dict[str, list[tuple[int, float]]]] = {}
    for rec in records(client.query_api(), org, query):
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
    "before_attach": int,
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
        f"from(bucket: {flux_string(bucket)}) |> range(start: time(v: {after_ns + 1}))"
        f' |> filter(fn: (r) => r._measurement == "{SEGMENT_STATS}" and r.trace == {flux_string(trace)}'
        " and r._field !~ /^[bj][pnz][0-9]*$/)"  # not the sketches' buckets
        ' |> pivot(rowKey: ["_time"], columnKey: ["_field"], valueColumn: "_value")'
    )
    order = {f"{a}>{b}": i for i, (a, b) in enumerate(zip(path or [], (path or [])[1:], strict=False))}
    rows: list[tuple[int, int, api_pb2.SegmentStats]] = []
    with InfluxDBClient(url=url, token=token, org=org, timeout=30_000) as client:
        for rec in records(client.query_api(), org, query):
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


# How far around a packet's first hop its other points are looked for (a packet's whole passage, with room
# for clock error).
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
    one packet `request.packet_id` (its latest passage), each with its segments in path order; with
    `request.captured`, the packets hops captured instead (`store_captures.query_captured`)."""
    if request.captured:
        with InfluxDBClient(url=url, token=token, org=org, timeout=30_000) as client:
            return query_captured(client.query_api(), org, bucket, request, path)
    start, stop = request_range(request)
    base = (
        f"from(bucket: {flux_string(bucket)}) |> range(start: {start}, stop: {stop})"
        f' |> filter(fn: (r) => r._measurement == "{HOP_LATENCY}"'
        f" and r.trace == {flux_string(request.trace)}"
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
            times = [_ns(rec.get_time()) for rec in records(q, org, found)]
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
        times = [_ns(rec.get_time()) for rec in records(q, org, slowest)]
        for at_ns in times:
            id_query = (
                f"from(bucket: {flux_string(bucket)})"
                f" |> range(start: time(v: {at_ns}), stop: time(v: {at_ns + 1000}))"
                f' |> filter(fn: (r) => r._measurement == "{HOP_LATENCY}"'
                f" and r.trace == {flux_string(request.trace)}"
                f' and r.segment == "{END_TO_END}" and r._field == "packet_id")'
            )
            ids = [int(rec.get_value()) for rec in records(q, org, id_query)]
            if not ids:
                continue
            timeline = _packet_timeline(q, bucket, org, request.trace, ids[0], at_ns, path)
            if timeline is not None:
                out.packets.append(timeline)
    out.packets.sort(key=lambda p: -p.end_to_end_ns)
    return out


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _ns(when: datetime) -> int:
    """Unix ns of a record time (the client's datetimes are microsecond precise), in integers."""
    return (when - _EPOCH) // timedelta(microseconds=1) * 1000


def _packet_timeline(
    q: Any, bucket: str, org: str, trace: str, packet_id: int, around_ns: int, path: Sequence[str] | None
) -> api_pb2.PacketTimeline | None:
    """One packet's points near `around_ns` (unix ns), as a timeline; None when none is found."""
    query = (
        f"from(bucket: {flux_string(bucket)})"
        f" |> range(start: time(v: {around_ns - PASSAGE_MARGIN_NS}),"
        f" stop: time(v: {around_ns + PASSAGE_MARGIN_NS}))"
        f' |> filter(fn: (r) => r._measurement == "{HOP_LATENCY}" and r.trace == {flux_string(trace)}'
        ' and (r._field == "latency_ns" or r._field == "packet_id" or r._field == "below_clock_bound"))'
        ' |> pivot(rowKey: ["_time"], columnKey: ["_field"], valueColumn: "_value")'
        f" |> filter(fn: (r) => r.packet_id == {int(packet_id)})"
    )
    rows: dict[str, dict[str, Any]] = {}
    for rec in records(q, org, query):
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
        f"from(bucket: {flux_string(bucket)}) |> range(start: {CLOCK_LOOKBACK})"
        f' |> filter(fn: (r) => r._measurement == "{NODE_CLOCK}")'
        ' |> group(columns: ["node", "_field"]) |> last()'
    )
    fields: dict[str, dict[str, Any]] = {}
    jumped_at: dict[str, datetime] = {}  # a jump's fields come with its own point, not every estimate's
    with InfluxDBClient(url=url, token=token, org=org, timeout=timeout_ms) as client:
        for rec in records(client.query_api(), org, query):
            node = rec.values.get("node")
            if node is None or rec.get_value() is None:
                continue
            entry = fields.setdefault(node, {})
            entry[rec.get_field()] = rec.get_value()
            if rec.get_field() in ("jump_ns", "jump_allowed_ns"):
                jumped_at[node] = rec.get_time()
            else:
                entry["at"] = max(entry.get("at", rec.get_time()), rec.get_time())
    out: dict[str, api_pb2.NodeClockStatus] = {}
    for node, entry in fields.items():
        status = api_pb2.NodeClockStatus(
            offset_ns=int(entry.get("offset_ns", 0)),
            bound_ns=int(entry.get("bound_ns", 0)),
            drift_ppm=float(entry.get("drift_ppm", 0.0)),
            delay_ns=int(entry.get("delay_ns", 0)),
        )
        status.measured = status.bound_ns > 0
        if "at" in entry:
            status.measured_at.FromDatetime(entry["at"])
        if node in jumped_at:
            status.last_jump.node = node
            status.last_jump.jump_ns = int(entry.get("jump_ns", 0))
            status.last_jump.allowed_ns = int(entry.get("jump_allowed_ns", 0))
            status.last_jump.at.FromDatetime(jumped_at[node])
        out[node] = status
    return out
