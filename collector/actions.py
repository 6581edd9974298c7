"""Hop actions stage: the in-kernel counts and histograms of hops (`HopCounters.actions`) as InfluxDB points.

Agents send cumulative values since the hop was attached; this stage writes their growth since the previous
report (a value that went down means the hop was attached again: it counts in full), so any range of points
sums to what the hops saw in it, as `hop_counters` does. Measurements:

* `hop_counts` - tags `trace`, `hop`, `node`, `by` (a field name, or `total`), `key` (the field's value,
  0 for `total`); int field `count`.
* `hop_histogram` - tags `trace`, `hop`, `node`, `field`, `le` (the log2 bucket's inclusive upper bound,
  2^b - 1); int field `count`.

The record action (`record: [FIELDS]`) carries each traced packet's values with its record
(`RecordBatch.values`). `RecordedValuesStage` aggregates them per batch, per hop and field, into one point
of `hop_recorded` - tags `trace`, `hop`, `node`, `field`; int fields `count` (packets), `min`, `max`,
`last` (the batch's newest packet's value), float field `sum` - at the master time of the batch's newest
packet at that hop. Summing `count` and `sum`, and taking min of `min`, max of `max` and the newest `last`,
over any range gives that range's distribution summary, exactly (the report does so:
`hoptrace.results.store_actions`). The per-packet
values themselves are not written: like latencies, one point per packet would cost InfluxDB a series
point per packet; a user who needs one packet's value counts or histograms by the field instead.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any, Protocol

from hoptrace import kernel_abi
from hoptrace.collector.points import Point
from hoptrace.collector.records import DROP_FUNCTION, HOP_INDEX, TS_NS, RecordedValues
from hoptrace.collector.schema import HOP_COUNTS, HOP_HISTOGRAM, HOP_RECORDED, TOTAL
from hoptrace.v1 import records_pb2


class WallToMaster(Protocol):
    """The clock stage's mapping of a node's wall clock onto the master's."""

    def wall_to_master(self, node: str, ts_ns: int) -> int: ...


def field_name(number: int) -> str:
    """The field catalogue's name of a `Field` number (enum hoptrace_field)."""
    return kernel_abi.FIELDS[number] if 0 < number < len(kernel_abi.FIELDS) else f"field{number}"


def bucket_le(bucket: int) -> int:
    """Inclusive upper bound of log2 bucket `bucket` (hop.bpf.h: bucket b holds [2^(b-1), 2^b - 1])."""
    return (1 << bucket) - 1


class CumulativeGrowth:
    """Agents send in-kernel counts and histograms cumulative since the probe was attached; this keeps the
    last value per key and gives the growth since (a value that went down means the probe was attached
    again: it counts in full, and `resets` counts that), so any range of points sums to what it saw."""

    def __init__(self, clock: WallToMaster | None = None) -> None:
        self.clock = clock
        self._last: dict[tuple[Any, ...], int] = {}
        self.resets = 0
        # A stream replayed from a commit (`resume_after_commit`): the previous owner wrote the growth up to
        # the first message seen here, so each source's first message is only the baseline.
        self._first_is_baseline = False
        self._sources: set[tuple[str, str]] = set()
        self._baseline_now = False
        self.baselines = 0

    def resume_after_commit(self) -> None:
        """This stream resumes where an earlier reader committed (a Kafka partition with a commit): the
        values of each (trace, node)'s first message here are cumulative over what that reader already
        wrote, so they set the baseline instead of counting in full (which would count them twice).
        Without a commit the stream is read from its start and the first values are growth since attach."""
        self._first_is_baseline = True

    def _begin(self, trace: str, node: str) -> None:
        """Called before the deltas of one message of (trace, node)."""
        source = (trace, node)
        self._baseline_now = self._first_is_baseline and source not in self._sources
        self._sources.add(source)

    def _delta(self, key: tuple[Any, ...], value: int) -> int:
        prev = self._last.get(key)
        self._last[key] = value
        if prev is None and self._baseline_now:
            self.baselines += 1
            return 0
        if prev is None or value < prev:
            if prev is not None:
                self.resets += 1
            return value
        return value - prev

    def _master_ns(self, node: str, message: Any, now_ns: int | None) -> int:
        """The master time of a message's `at` (the node's wall clock), or now when it has none."""
        if message.HasField("at"):
            ts = message.at.ToNanoseconds()
            return self.clock.wall_to_master(node, ts) if self.clock is not None else ts
        return now_ns if now_ns is not None else time.time_ns()


class HopActionsStage(CumulativeGrowth):
    """Turns each batch's cumulative `HopCounters.actions` into `hop_counts` / `hop_histogram` points."""

    # keys: (trace, node, hop_index, "count"|"hist", by-or-field, key-or-bucket)

    def add_counters(
        self, trace: str, node: str, counters: Iterable[records_pb2.HopCounters], now_ns: int | None = None
    ) -> list[Point]:
        """The points of the growth of every hop's count and histogram in one batch."""
        points: list[Point] = []
        self._begin(trace, node)
        for c in counters:
            if not c.HasField("actions"):
                continue
            a = c.actions
            ts = self._master_ns(node, c, now_ns)
            hop = (("hop", c.hop or f"hop{c.hop_index}"), ("node", node), ("trace", trace))
            if a.count:
                by = field_name(a.count_by) if a.count_by else TOTAL
                for key, value in sorted(a.counts.items()):
                    delta = self._delta((trace, node, c.hop_index, "count", a.count_by, key), value)
                    if delta:
                        tags = (("by", by), *hop, ("key", str(key)))
                        points.append(Point(HOP_COUNTS, tags, (("count", delta),), ts))
            if a.histogram:
                name = field_name(a.histogram)
                for bucket, value in enumerate(a.buckets):
                    delta = self._delta((trace, node, c.hop_index, "hist", a.histogram, bucket), value)
                    if delta:
                        tags = (("field", name), *hop, ("le", str(bucket_le(bucket))))
                        points.append(Point(HOP_HISTOGRAM, tags, (("count", delta),), ts))
        return points


class ToMaster(Protocol):
    """A node's mapping of its monotonic timestamps onto the master's clock."""

    def to_master(self, ts_ns: int) -> int: ...


class RecordedValuesStage:
    """Turns each batch's recorded values (record action) into `hop_recorded` points."""

    def add_values(
        self,
        trace: str,
        node: str,
        values: Iterable[RecordedValues],
        mapping: ToMaster,
        hop_name: Callable[[int], str],
    ) -> list[Point]:
        """One point per (hop, field) of the batch: count, sum, min, max and last of its packets' values."""
        # (hop_index, field) -> [count, sum, min, max, last, newest ts_ns]
        summary: dict[tuple[int, int], list[int]] = {}
        for rec, fields in values:
            ts = rec[TS_NS]
            for number, value in fields.items():
                if number == DROP_FUNCTION:  # a name's ID, no quantity: the report's drops name the function
                    continue
                entry = summary.get((rec[HOP_INDEX], number))
                if entry is None:
                    summary[(rec[HOP_INDEX], number)] = [1, value, value, value, value, ts]
                    continue
                entry[0] += 1
                entry[1] += value
                entry[2] = min(entry[2], value)
                entry[3] = max(entry[3], value)
                if ts >= entry[5]:
                    entry[4], entry[5] = value, ts
        points = []
        for (hop_index, number), (count, total, low, high, last, ts) in sorted(summary.items()):
            tags = (
                ("field", field_name(number)),
                ("hop", hop_name(hop_index)),
                ("node", node),
                ("trace", trace),
            )
            fields = (("count", count), ("sum", float(total)), ("min", low), ("max", high), ("last", last))
            points.append(Point(HOP_RECORDED, tags, fields, mapping.to_master(ts)))
        return points
