"""Events stage: the in-kernel counts and histograms of a trace's event probes (`RecordBatch.events`) as
InfluxDB points (the report reads their totals per event and node: `hoptrace.results.store_actions`).

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

from hoptrace.collector.actions import CumulativeGrowth, WallToMaster, bucket_le
from hoptrace.collector.points import Point
from hoptrace.collector.schema import (
    EVENT_COUNTS,
    EVENT_HISTOGRAM,
    EVENT_LATENCY_MISSED,
    EVENT_RECORDED,
    TOTAL,
)
from hoptrace.v1 import records_pb2


class EventsStage(CumulativeGrowth):
    """Turns each batch's cumulative `EventValues` into `event_counts` / `event_histogram` /
    `event_latency_missed` / `event_recorded` points."""

    # keys: (trace, node, event_index, "count"|"hist", key-or-bucket), (trace, node, event_index, "missed"),
    # (trace, node, event_index, "recorded", arg, "count")

    def __init__(self, clock: WallToMaster | None = None) -> None:
        super().__init__(clock)
        # the last cumulative sum of each recorded argument (trace, node, event_index, "recorded", arg)
        self._sums: dict[tuple[Any, ...], float] = {}

    def add_events(
        self, trace: str, node: str, events: Iterable[records_pb2.EventValues], now_ns: int | None = None
    ) -> list[Point]:
        """The points of the growth of every event's count, histogram, misses and recorded arguments in one
        batch."""
        points: list[Point] = []
        self._begin(trace, node)
        for e in events:
            ts = self._master_ns(node, e, now_ns)
            event = (("event", e.event or f"event{e.event_index}"), ("node", node), ("trace", trace))
            if e.count:
                by = e.count_by or TOTAL
                for key, value in sorted(e.counts.items()):
                    delta = self._delta((trace, node, e.event_index, "count", key), value)
                    if delta:
                        tags = (("by", by), *event, ("key", str(key)))
                        points.append(Point(EVENT_COUNTS, tags, (("count", delta),), ts))
            if e.histogram:
                for bucket, value in enumerate(e.buckets):
                    delta = self._delta((trace, node, e.event_index, "hist", bucket), value)
                    if delta:
                        tags = (("arg", e.histogram), *event, ("le", str(bucket_le(bucket))))
                        points.append(Point(EVENT_HISTOGRAM, tags, (("count", delta),), ts))
            missed_key = (trace, node, e.event_index, "missed")
            missed = (
                self._delta(missed_key, e.latency_missed)
                if e.latency_missed or missed_key in self._last
                else 0
            )
            if missed:
                points.append(Point(EVENT_LATENCY_MISSED, event, (("count", missed),), ts))
            for r in e.recorded:
                points.extend(self._recorded_point(trace, node, e.event_index, event, r, ts))
        return points

    def _recorded_point(
        self,
        trace: str,
        node: str,
        index: int,
        event: tuple[tuple[str, str], ...],
        r: records_pb2.EventRecorded,
        ts: int,
    ) -> list[Point]:
        """One argument's statistics: the growth of count and sum (a count that went down is a new
        attach: it counts in full; sum follows the count's verdict, since signed values may lower it)."""
        key = (trace, node, index, "recorded", r.arg)
        count = self._delta(key + ("count",), r.count)
        previous_sum = self._sums.get(key, 0.0)
        self._sums[key] = r.sum
        if not count:
            return []
        grown = r.sum if count == r.count else r.sum - previous_sum
        tags = (("arg", r.arg), *event, ("signed", str(r.signed).lower()))
        fields = (("count", count), ("sum", float(grown)), ("min", r.min), ("max", r.max), ("last", r.last))
        return [Point(EVENT_RECORDED, tags, fields, ts)]
