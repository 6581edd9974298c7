"""Events stage: the in-kernel counts and histograms of a trace's event probes (`RecordBatch.events`) as
InfluxDB points, and their totals per event and node for the report.

Agents send cumulative values since the probe was attached; this stage writes their growth since the
previous batch (a value that went down means the probe was attached again: it counts in full), as
`collector/actions.py` does for hops, so any range of points sums to what the probe saw in it.
Measurements:

* `event_counts` - tags `trace`, `event`, `node`, `by` (`cpu`, the argument, or `total`), `key` (its value,
  0 for `total`); int field `count`.
* `event_histogram` - tags `trace`, `event`, `node`, `arg`, `le` (the log2 bucket's inclusive upper bound,
  2^b - 1); int field `count`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from hoptrace.collector.actions import TOTAL, CumulativeGrowth, bucket_le, escape_tag
from hoptrace.v1 import records_pb2

EVENT_COUNTS = "event_counts"
EVENT_HISTOGRAM = "event_histogram"


class EventsStage(CumulativeGrowth):
    """Turns each batch's cumulative `EventValues` into `event_counts` / `event_histogram` lines."""

    # keys: (trace, node, event_index, "count"|"hist", key-or-bucket)

    def add_events(
        self, trace: str, node: str, events: Iterable[records_pb2.EventValues], now_ns: int | None = None
    ) -> list[str]:
        """Line protocol for the growth of every event's count and histogram in one batch."""
        lines: list[str] = []
        self._begin(trace, node)
        for e in events:
            ts = self._master_ns(node, e, now_ns)
            name = e.event or f"event{e.event_index}"
            base = f",event={escape_tag(name)},node={escape_tag(node)},trace={escape_tag(trace)}"
            if e.count:
                by = e.count_by or TOTAL
                for key, value in sorted(e.counts.items()):
                    delta = self._delta((trace, node, e.event_index, "count", key), value)
                    if delta:
                        lines.append(
                            f"{EVENT_COUNTS},by={escape_tag(by)}{base},key={key} count={delta}i {ts}"
                        )
            if e.histogram:
                for bucket, value in enumerate(e.buckets):
                    delta = self._delta((trace, node, e.event_index, "hist", bucket), value)
                    if delta:
                        lines.append(
                            f"{EVENT_HISTOGRAM},arg={escape_tag(e.histogram)}{base},le={bucket_le(bucket)}"
                            f" count={delta}i {ts}"
                        )
        return lines


def query_events(q: Any, org: str, base: str) -> list[dict[str, Any]]:
    """Per event and node, its count (by key) and histogram summed over the query's range, as the report's
    ``"events"``: `base` is the report's ``from(...) |> range(...) |> filter(fn: (r) => r.trace == ...``
    prefix, left open for more conditions."""
    found: dict[tuple[str, str], dict[str, Any]] = {}

    def entry(name: str, node: str) -> dict[str, Any]:
        return found.setdefault(
            (name, node),
            {
                "name": name,
                "node": node,
                "count": 0,
                "count_by": "",
                "by": {},
                "histogram_arg": "",
                "histogram": [],
            },
        )

    counts = (
        f'{base} and r._measurement == "{EVENT_COUNTS}" and r._field == "count")'
        ' |> group(columns: ["event", "node", "by", "key"]) |> sum()'
    )
    for table in q.query(counts, org=org):
        for rec in table.records:
            name = rec.values.get("event")
            if name is None:
                continue
            e = entry(name, rec.values.get("node", ""))
            n = int(rec.get_value() or 0)
            by = rec.values.get("by", TOTAL)
            e["count"] += n
            if by != TOTAL:
                e["count_by"] = by
                key = str(rec.values.get("key") or 0)
                e["by"][key] = e["by"].get(key, 0) + n
    hist = (
        f'{base} and r._measurement == "{EVENT_HISTOGRAM}" and r._field == "count")'
        ' |> group(columns: ["event", "node", "arg", "le"]) |> sum()'
    )
    buckets: dict[tuple[str, str], dict[int, int]] = {}
    for table in q.query(hist, org=org):
        for rec in table.records:
            name = rec.values.get("event")
            if name is None:
                continue
            node = rec.values.get("node", "")
            entry(name, node)["histogram_arg"] = rec.values.get("arg", "")
            le = int(rec.values.get("le") or 0)
            per = buckets.setdefault((name, node), {})
            per[le] = per.get(le, 0) + int(rec.get_value() or 0)
    for key, per in buckets.items():
        found[key]["histogram"] = [{"le": le, "count": n} for le, n in sorted(per.items()) if n]
    for e in found.values():
        e["by"] = dict(sorted(e["by"].items(), key=lambda item: int(item[0])))
    return [found[key] for key in sorted(found)]


def events_lines(events: list[dict[str, Any]], limit: int = 16) -> list[str]:
    """The report's text section: one line per event and node, one more for its histogram."""
    lines = []
    for e in events:
        line = f"{e['name']} on {e['node']}: count {e['count']}"
        if e["count_by"]:
            keys = list(e["by"].items())
            more = f" (+{len(keys) - limit} keys)" if len(keys) > limit else ""
            line += f"; by {e['count_by']}: " + " ".join(f"{k}={n}" for k, n in keys[:limit]) + more
        lines.append(line)
        if e["histogram"]:
            total = sum(b["count"] for b in e["histogram"])
            buckets = ", ".join(f"<={b['le']} {b['count']}" for b in e["histogram"])
            lines.append(f"  {e['histogram_arg']} (n={total}): {buckets}")
    return lines
