"""The stored in-kernel actions of a trace, read back from InfluxDB as the report's API objects: hops' counts,
histograms and recorded values (`HopCount`, `HopHistogram`, `HopRecorded`) and event probes
(`EventResult`), summed over a range.

The collector writes each action's growth since the previous report (`hoptrace.collector.actions`,
`hoptrace.collector.events`), so the sum of a range's points is what the kernel counted in it. Every query
takes `base`, the report's ``from(...) |> range(...) |> filter(fn: (r) => r.trace == ...`` prefix, left
open for more conditions.
"""

from __future__ import annotations

from typing import Any

from hoptrace.collector.schema import (
    EVENT_COUNTS,
    EVENT_HISTOGRAM,
    EVENT_LATENCY_MISSED,
    EVENT_RECORDED,
    HOP_COUNTS,
    HOP_HISTOGRAM,
    HOP_RECORDED,
    TOTAL,
)
from hoptrace.results.flux import records
from hoptrace.v1 import api_pb2

# Fields whose value is a name: hoptrace.h's comm, the task name's first 8 bytes as a little-endian u64.
NAME_FIELDS = frozenset({"comm"})


def key_name(by: str, key: int) -> str:
    """A count key as text where its field is a name (``sockperf`` for comm), else ""."""
    if by not in NAME_FIELDS:
        return ""
    return key.to_bytes(8, "little").rstrip(b"\0").decode("utf-8", errors="replace")


class HopActions:
    """One hop's counts and histograms over a range."""

    __slots__ = ("counts", "histograms")

    def __init__(self) -> None:
        self.counts: list[api_pb2.HopCount] = []
        self.histograms: list[api_pb2.HopHistogram] = []


def query_hop_actions(q: Any, org: str, base: str) -> dict[str, HopActions]:
    """Per hop, its counts (by node, field and key) and histograms summed over the query's range."""
    out: dict[str, HopActions] = {}
    counts = (
        f'{base} and r._measurement == "{HOP_COUNTS}" and r._field == "count")'
        ' |> group(columns: ["hop", "node", "by", "key"]) |> sum()'
    )
    for rec in records(q, org, counts):
        hop = rec.values.get("hop")
        if hop is None:
            continue
        by = "" if rec.values.get("by") == TOTAL else rec.values.get("by", "")
        key = int(rec.values.get("key") or 0)
        out.setdefault(hop, HopActions()).counts.append(
            api_pb2.HopCount(
                node=rec.values.get("node", ""),
                by=by,
                key=key,
                count=int(rec.get_value() or 0),
                key_name=key_name(by, key),
            )
        )
    hist = (
        f'{base} and r._measurement == "{HOP_HISTOGRAM}" and r._field == "count")'
        ' |> group(columns: ["hop", "node", "field", "le"]) |> sum()'
    )
    histograms: dict[tuple[str, str, str], dict[int, int]] = {}
    for rec in records(q, org, hist):
        hop = rec.values.get("hop")
        if hop is None:
            continue
        key = (hop, rec.values.get("node", ""), rec.values.get("field", ""))
        le = int(rec.values.get("le") or 0)
        histograms.setdefault(key, {})[le] = int(rec.get_value() or 0)
    for (hop, node, name), buckets in sorted(histograms.items()):
        out.setdefault(hop, HopActions()).histograms.append(
            api_pb2.HopHistogram(
                node=node,
                field=name,
                total=sum(buckets.values()),
                buckets=[api_pb2.HistogramBucket(le=le, count=n) for le, n in sorted(buckets.items()) if n],
            )
        )
    for actions in out.values():
        actions.counts.sort(key=lambda c: (c.node, c.by, c.key))
    return out


def query_recorded(q: Any, org: str, base: str) -> dict[str, list[api_pb2.HopRecorded]]:
    """Per hop, each recorded field's count, min, mean, max and last value over the query's range."""
    found: dict[tuple[str, str, str], dict[str, Any]] = {}
    for column, reduce in (
        ("count", "sum()"),
        ("sum", "sum()"),
        ("min", "min()"),
        ("max", "max()"),
        ("last", "last()"),
    ):
        flux = (
            f'{base} and r._measurement == "{HOP_RECORDED}" and r._field == "{column}")'
            f' |> group(columns: ["hop", "node", "field"]) |> {reduce}'
        )
        for rec in records(q, org, flux):
            hop = rec.values.get("hop")
            if hop is None:
                continue
            key = (hop, rec.values.get("node", ""), rec.values.get("field", ""))
            found.setdefault(key, {})[column] = rec.get_value() or 0
    out: dict[str, list[api_pb2.HopRecorded]] = {}
    for (hop, node, name), v in sorted(found.items()):
        count = int(v.get("count", 0))
        out.setdefault(hop, []).append(
            api_pb2.HopRecorded(
                node=node,
                field=name,
                count=count,
                min=int(v.get("min", 0)),
                max=int(v.get("max", 0)),
                mean=float(v.get("sum", 0.0)) / count if count else 0.0,
                last=int(v.get("last", 0)),
            )
        )
    return out


def query_events(q: Any, org: str, base: str) -> list[api_pb2.EventResult]:
    """Per event and node, its count (by key), histogram, latency misses and recorded arguments summed over
    the query's range, ordered by event and node."""
    found: dict[tuple[str, str], api_pb2.EventResult] = {}

    def entry(name: str, node: str) -> api_pb2.EventResult:
        if (name, node) not in found:
            found[(name, node)] = api_pb2.EventResult(name=name, node=node)
        return found[(name, node)]

    counts = (
        f'{base} and r._measurement == "{EVENT_COUNTS}" and r._field == "count")'
        ' |> group(columns: ["event", "node", "by", "key"]) |> sum()'
    )
    for rec in records(q, org, counts):
        name = rec.values.get("event")
        if name is None:
            continue
        e = entry(name, rec.values.get("node", ""))
        n = int(rec.get_value() or 0)
        by = rec.values.get("by", TOTAL)
        e.count += n
        if by != TOTAL:
            e.count_by = by
            key = str(rec.values.get("key") or 0)
            e.by[key] = e.by.get(key, 0) + n
    hist = (
        f'{base} and r._measurement == "{EVENT_HISTOGRAM}" and r._field == "count")'
        ' |> group(columns: ["event", "node", "arg", "le"]) |> sum()'
    )
    buckets: dict[tuple[str, str], dict[int, int]] = {}
    for rec in records(q, org, hist):
        name = rec.values.get("event")
        if name is None:
            continue
        node = rec.values.get("node", "")
        entry(name, node).histogram_arg = rec.values.get("arg", "")
        le = int(rec.values.get("le") or 0)
        per = buckets.setdefault((name, node), {})
        per[le] = per.get(le, 0) + int(rec.get_value() or 0)
    for key, per in buckets.items():
        found[key].histogram.extend(
            api_pb2.HistogramBucket(le=le, count=n) for le, n in sorted(per.items()) if n
        )
    missed = (
        f'{base} and r._measurement == "{EVENT_LATENCY_MISSED}" and r._field == "count")'
        ' |> group(columns: ["event", "node"]) |> sum()'
    )
    for rec in records(q, org, missed):
        if rec.values.get("event") is not None:
            entry(rec.values["event"], rec.values.get("node", "")).latency_missed += int(rec.get_value() or 0)
    for (name, node), per_arg in _query_event_recorded(q, org, base).items():
        entry(name, node).recorded.extend(per_arg[arg] for arg in sorted(per_arg))
    return [found[key] for key in sorted(found)]


def _query_event_recorded(
    q: Any, org: str, base: str
) -> dict[tuple[str, str], dict[str, api_pb2.EventRecordedResult]]:
    """Per (event, node) and argument, the record action's summary over the query's range: count and sum
    added up, the least min, the greatest max, the newest last, and the mean. min, max and last stay the
    int64 InfluxDB keeps (an unsigned argument's two's complement bits: `report_view.recorded_value`)."""
    out: dict[tuple[str, str], dict[str, api_pb2.EventRecordedResult]] = {}
    group = ' |> group(columns: ["event", "node", "arg", "signed", "_field"])'
    for fields, reduce in (
        ('"count" or r._field == "sum"', "sum()"),
        ('"min"', "min()"),
        ('"max"', "max()"),
        ('"last"', "last()"),
    ):
        flux = (
            f'{base} and r._measurement == "{EVENT_RECORDED}" and (r._field == {fields})){group} |> {reduce}'
        )
        for rec in records(q, org, flux):
            name, arg = rec.values.get("event"), rec.values.get("arg")
            if name is None or arg is None:
                continue
            per_arg = out.setdefault((name, rec.values.get("node", "")), {})
            if arg not in per_arg:
                per_arg[arg] = api_pb2.EventRecordedResult(arg=arg, signed=rec.values.get("signed") == "true")
            stats = per_arg[arg]
            value = rec.get_value()
            field = rec.get_field()
            if field == "count":
                stats.count += int(value or 0)
            elif field == "sum":
                stats.sum += float(value or 0.0)
            elif value is not None:
                setattr(stats, field, int(value))
    for per_arg in out.values():
        for stats in per_arg.values():
            if stats.count:
                stats.mean = stats.sum / stats.count
    return out
