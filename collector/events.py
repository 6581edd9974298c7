"""Events stage: the in-kernel counts and histograms of a trace's event probes (`RecordBatch.events`) as
InfluxDB points, and their totals per event and node for the report.

Agents send cumulative values since the probe was attached; this stage writes their growth since the
previous batch (a value that went down means the probe was attached again: it counts in full), as
`collector/actions.py` does for hops, so any range of points sums to what the probe saw in it.
Measurements:

* `event_counts` - tags `trace`, `event`, `node`, `by` (`cpu`, the argument, or `total`), `key` (its value,
  0 for `total`); int field `count`.
* `event_histogram` - tags `trace`, `event`, `node`, `arg`, `le` (the log2 bucket's inclusive upper bound,
  2^b - 1); int field `count`. An event-to-event latency (`histogram: latency, since: EVENT`) has
  `arg=latency`, in nanoseconds.
* `event_recorded` - the record action (`record: [ARGS]`): tags `trace`, `event`, `node`, `arg`; int field
  `count` and float field `sum` (their growth, like counts), int fields `min`, `max`, `last` (since the
  probe was attached: the kernel keeps no per-interval extremes).
* `event_latency_missed` - tags `trace`, `event`, `node`; int field `count`: hits of a latency event that
  found no time of its `since` event for their key.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from hoptrace.collector.actions import TOTAL, CumulativeGrowth, WallToMaster, bucket_le, escape_tag
from hoptrace.v1 import records_pb2

EVENT_COUNTS = "event_counts"
EVENT_HISTOGRAM = "event_histogram"
EVENT_RECORDED = "event_recorded"
EVENT_LATENCY_MISSED = "event_latency_missed"


class EventsStage(CumulativeGrowth):
    """Turns each batch's cumulative `EventValues` into `event_counts` / `event_histogram` lines."""

    # keys: (trace, node, event_index, "count"|"hist", key-or-bucket), (trace, node, event_index, "missed"),
    # (trace, node, event_index, "recorded", arg, "count")

    def __init__(self, clock: WallToMaster | None = None) -> None:
        super().__init__(clock)
        # the last cumulative sum of each recorded argument (trace, node, event_index, "recorded", arg)
        self._sums: dict[tuple[Any, ...], float] = {}

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
            missed_key = (trace, node, e.event_index, "missed")
            missed = (
                self._delta(missed_key, e.latency_missed)
                if e.latency_missed or missed_key in self._last
                else 0
            )
            if missed:
                lines.append(f"{EVENT_LATENCY_MISSED}{base} count={missed}i {ts}")
            for r in e.recorded:
                lines.extend(self._recorded_line(trace, node, e.event_index, base, r, ts))
        return lines

    def _recorded_line(
        self, trace: str, node: str, index: int, base: str, r: records_pb2.EventRecorded, ts: int
    ) -> list[str]:
        """One argument's statistics: the growth of count and sum (a count that went down is a new
        attach: it counts in full; sum follows the count's verdict, since signed values may lower it)."""
        key = (trace, node, index, "recorded", r.arg)
        count = self._delta(key + ("count",), r.count)
        previous_sum = self._sums.get(key, 0.0)
        self._sums[key] = r.sum
        if not count:
            return []
        grown = r.sum if count == r.count else r.sum - previous_sum
        return [
            f"{EVENT_RECORDED},arg={escape_tag(r.arg)}{base},signed={str(r.signed).lower()}"
            f" count={count}i,sum={float(grown)!r},min={r.min}i,max={r.max}i,last={r.last}i {ts}"
        ]


def recorded_bits(value: int | None) -> int:
    """An argument's integer as the int64 InfluxDB and the API keep (the inverse of `recorded_value`)."""
    if value is None:
        return 0
    return value - (1 << 64) if value >= 1 << 63 else value


def recorded_value(value: int, signed: bool) -> int:
    """A stored min/max/last of an event's record as the argument's own integer: InfluxDB's integers are
    int64, so an unsigned argument's values are stored as their two's complement bits (tag signed=false)."""
    return value if signed else value % (1 << 64)


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
                "latency_missed": 0,
                "recorded": [],
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
    missed = (
        f'{base} and r._measurement == "{EVENT_LATENCY_MISSED}" and r._field == "count")'
        ' |> group(columns: ["event", "node"]) |> sum()'
    )
    for table in q.query(missed, org=org):
        for rec in table.records:
            if rec.values.get("event") is not None:
                entry(rec.values["event"], rec.values.get("node", ""))["latency_missed"] += int(
                    rec.get_value() or 0
                )
    for (name, node), per_arg in _query_recorded(q, org, base).items():
        entry(name, node)["recorded"] = [per_arg[arg] for arg in sorted(per_arg)]
    for e in found.values():
        e["by"] = dict(sorted(e["by"].items(), key=lambda item: int(item[0])))
    return [found[key] for key in sorted(found)]


def _query_recorded(q: Any, org: str, base: str) -> dict[tuple[str, str], dict[str, dict[str, Any]]]:
    """Per (event, node) and argument, the record action's summary over the query's range: count and sum
    added up, the least min, the greatest max, the newest last, and the mean."""
    out: dict[tuple[str, str], dict[str, dict[str, Any]]] = {}
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
        for table in q.query(flux, org=org):
            for rec in table.records:
                name, arg = rec.values.get("event"), rec.values.get("arg")
                if name is None or arg is None:
                    continue
                signed = rec.values.get("signed") == "true"
                stats = out.setdefault((name, rec.values.get("node", "")), {}).setdefault(
                    arg,
                    {
                        "arg": arg,
                        "count": 0,
                        "sum": 0.0,
                        "mean": None,
                        "min": None,
                        "max": None,
                        "last": None,
                        "signed": signed,
                    },
                )
                value = rec.get_value()
                field = rec.get_field()
                if field in ("count", "sum"):
                    stats[field] += int(value or 0) if field == "count" else float(value or 0.0)
                elif value is not None:
                    stats[field] = recorded_value(int(value), signed)
    for per_arg in out.values():
        for stats in per_arg.values():
            if stats["count"]:
                stats["mean"] = stats["sum"] / stats["count"]
    return out


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
            unit = " ns" if e["histogram_arg"] == "latency" else ""
            missed = f", {e['latency_missed']} without a start" if e.get("latency_missed") else ""
            lines.append(f"  {e['histogram_arg']}{unit} (n={total}{missed}): {buckets}")
        for r in e.get("recorded", []):
            lines.append(
                f"  {r['arg']}: n={r['count']} sum={r['sum']:g} mean={r['mean'] or 0:.6g} min={r['min']}"
                f" max={r['max']} last={r['last']}"
            )
    return lines
