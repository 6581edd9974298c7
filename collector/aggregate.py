"""Aggregation stage: per-packet segment latencies, per-second segment statistics, per-second hop counters.

Segments are the consecutive pairs of the trace's path, `"from>to"`, plus `end_to_end` (first hop -> last
hop of the path), which also gets one `LatencySample` per packet so reports compute exact end-to-end
percentiles. A packet contributes a latency sample to a segment when it was seen at both endpoints;
otherwise it counts as `incomplete` for that segment. A packet's time in a segment is its master time at the
segment's first hop (or its earliest time seen when that hop is missing).

Statistics windows are `interval_ns` of master time (default 1 s). A window closes once the caller's master
watermark is `lateness_ns` past its end (the pipeline uses the join window + 1 interval): packets of a window
arrive late by at most the join window. A packet arriving after its window closed still yields `hop_latency`
points but is left out of `segment_stats` (counted in `AggregateStats.late`).

Percentiles are exact nearest-rank over the window's values: the value at sorted index ceil(q * n) - 1, the
same rule as Flux `quantile(method: "exact_selector")`, so reports and windows agree.

Cross-node clocks: a latency below the clocks' alignment bound (below 0 while the bound is unknown) is kept
but flagged `below_clock_bound`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import NamedTuple

from hoptrace.collector.catalog import TraceCatalog, TracePath
from hoptrace.collector.clock import ClockAligner
from hoptrace.collector.join import JoinedPacket
from hoptrace.v1 import records_pb2

END_TO_END = "end_to_end"
QUANTILES = (0.5, 0.9, 0.99)


@dataclass
class AggregateConfig:
    """Statistics interval of the aggregation stage."""

    interval_ns: int = 1_000_000_000

    def validate(self) -> None:
        """Raise ValueError on an unusable setting."""
        if self.interval_ns <= 0:
            raise ValueError(f"aggregation interval must be positive, got {self.interval_ns} ns")


class LatencySample(NamedTuple):
    """One packet in one segment (a `hop_latency` point)."""

    trace: str
    segment: str
    from_hop: str
    to_hop: str
    from_node: str
    to_node: str
    ts_ns: int
    latency_ns: int
    packet_id: int
    below_clock_bound: bool


@dataclass(slots=True)
class SegmentWindow:
    """Statistics of one segment over one interval (a `segment_stats` point)."""

    trace: str
    segment: str
    from_hop: str
    to_hop: str
    start_ns: int
    count: int
    mean_ns: float
    p50_ns: int
    p90_ns: int
    p99_ns: int
    max_ns: int
    incomplete: int
    # end_to_end only: packets that reached the join (count + incomplete) and those seen at every hop.
    packets: int | None = None
    complete: int | None = None


@dataclass(slots=True)
class HopCounterWindow:
    """Counter deltas of one hop over one interval (a `hop_counters` point)."""

    trace: str
    hop: str
    node: str
    start_ns: int
    matched: int = 0
    tagged: int = 0
    untagged: int = 0
    parse_errors: int = 0
    lost_events: int = 0
    bytes: int = 0


@dataclass
class AggregateStats:
    """Counters of the aggregation stage."""

    samples: int = 0
    below_clock_bound: int = 0
    late: int = 0
    counter_resets: int = 0


def quantile(sorted_values: list[int], q: float) -> int:
    """Nearest-rank quantile of sorted values (Flux exact_selector): index ceil(q * n) - 1."""
    index = math.ceil(q * len(sorted_values))
    return sorted_values[index - 1 if index > 0 else 0]


def summarize(values: Iterable[int]) -> tuple[int, float, int, int, int, int]:
    """Return (count, mean, p50, p90, p99, max) of latencies; all 0 for no values."""
    v = sorted(values)
    if not v:
        return 0, 0.0, 0, 0, 0, 0
    n = len(v)
    return n, sum(v) / n, quantile(v, 0.5), quantile(v, 0.9), quantile(v, 0.99), v[-1]


class _Window:
    __slots__ = ("from_hop", "to_hop", "values", "incomplete", "packets", "complete")

    def __init__(self, from_hop: str, to_hop: str) -> None:
        self.from_hop = from_hop
        self.to_hop = to_hop
        self.values: list[int] = []
        self.incomplete = 0
        self.packets = 0
        self.complete = 0


def path_segments(path: TracePath | None, width: int) -> list[tuple[int, int]]:
    """Consecutive (from, to) hop index pairs of a path (or of `width` hops when the path is unknown)."""
    n = len(path.hop_names) if path is not None and path.hop_names else width
    return [(i, i + 1) for i in range(n - 1)]


class SegmentAggregator:
    """Turns joined packets into `LatencySample`s and closes per-interval `SegmentWindow`s."""

    def __init__(
        self,
        catalog: TraceCatalog | None = None,
        clock: ClockAligner | None = None,
        config: AggregateConfig | None = None,
    ) -> None:
        self.catalog = catalog if catalog is not None else TraceCatalog()
        self.clock = clock
        self.config = config or AggregateConfig()
        self.config.validate()
        self.stats = AggregateStats()
        self._windows: dict[tuple[str, str, int], _Window] = {}
        self._closed_before = 0

    def _below_bound(self, latency: int, from_node: str, to_node: str) -> bool:
        if latency < 0:
            return True
        if from_node == to_node or self.clock is None:
            return False
        return latency < self.clock.bound_ns(from_node) + self.clock.bound_ns(to_node)

    def _window(self, trace: str, segment: str, ts: int, from_hop: str, to_hop: str) -> _Window | None:
        start = ts - ts % self.config.interval_ns
        if start < self._closed_before:
            self.stats.late += 1
            return None
        key = (trace, segment, start)
        w = self._windows.get(key)
        if w is None:
            w = self._windows[key] = _Window(from_hop, to_hop)
        return w

    def add_packets(self, packets: Iterable[JoinedPacket]) -> list[LatencySample]:
        """Account joined packets into the open windows; return their per-segment latency samples."""
        out: list[LatencySample] = []
        stats = self.stats
        paths: dict[str, TracePath | None] = {}
        for p in packets:
            if p.trace in paths:
                path = paths[p.trace]
            else:
                path = paths[p.trace] = self.catalog.get(p.trace)
            times, nodes = p.times, p.nodes
            seen = [t for t in times if t is not None]
            if not seen:
                continue
            earliest = min(seen)
            width = max(i for i, t in enumerate(times) if t is not None) + 1
            n = len(path.hop_names) if path is not None and path.hop_names else width

            def name(i: int, path: TracePath | None = path) -> str:
                return path.hop_name(i) if path is not None else f"hop{i}"

            for a, b in path_segments(path, width):
                ta = times[a] if a < len(times) else None
                tb = times[b] if b < len(times) else None
                from_hop, to_hop = name(a), name(b)
                segment = f"{from_hop}>{to_hop}"
                w = self._window(p.trace, segment, ta if ta is not None else earliest, from_hop, to_hop)
                if ta is None or tb is None:
                    if w is not None:
                        w.incomplete += 1
                    continue
                from_node = nodes[a] or (path.hop_node(a) if path else "")
                to_node = nodes[b] or (path.hop_node(b) if path else "")
                latency = tb - ta
                flag = self._below_bound(latency, from_node, to_node)
                stats.samples += 1
                if flag:
                    stats.below_clock_bound += 1
                if w is not None:
                    w.values.append(latency)
                out.append(
                    LatencySample(
                        p.trace, segment, from_hop, to_hop, from_node, to_node, ta, latency, p.packet_id, flag
                    )
                )
            # end to end: first -> last hop of the path
            last = n - 1
            t0 = times[0] if times else None
            tn = times[last] if 0 < last < len(times) else None
            first_hop, last_hop = name(0), name(last)
            w = self._window(p.trace, END_TO_END, t0 if t0 is not None else earliest, first_hop, last_hop)
            if w is not None:
                w.packets += 1
                if p.complete:
                    w.complete += 1
            if t0 is None or tn is None:
                if w is not None:
                    w.incomplete += 1
                continue
            from_node = nodes[0] or (path.hop_node(0) if path else "")
            to_node = nodes[last] or (path.hop_node(last) if path else "")
            latency = tn - t0
            flag = self._below_bound(latency, from_node, to_node)
            if w is not None:
                w.values.append(latency)
            out.append(
                LatencySample(
                    p.trace,
                    END_TO_END,
                    first_hop,
                    last_hop,
                    from_node,
                    to_node,
                    t0,
                    latency,
                    p.packet_id,
                    flag,
                )
            )
        return out

    def close_windows(self, upto_ns: int) -> list[SegmentWindow]:
        """Close and return every window that ends at or before `upto_ns` (master time)."""
        interval = self.config.interval_ns
        cut = upto_ns - upto_ns % interval  # windows starting before this have ended by upto_ns
        if cut <= self._closed_before:
            return []
        self._closed_before = cut
        done = [k for k in self._windows if k[2] < cut]
        return [self._close(k) for k in sorted(done, key=lambda k: k[2])]

    def flush(self) -> list[SegmentWindow]:
        """Close every window (shutdown)."""
        out = [self._close(k) for k in sorted(self._windows, key=lambda k: k[2])]
        return out

    def _close(self, key: tuple[str, str, int]) -> SegmentWindow:
        w = self._windows.pop(key)
        count, mean, p50, p90, p99, mx = summarize(w.values)
        e2e = key[1] == END_TO_END
        return SegmentWindow(
            key[0],
            key[1],
            w.from_hop,
            w.to_hop,
            key[2],
            count,
            mean,
            p50,
            p90,
            p99,
            mx,
            w.incomplete,
            w.packets if e2e else None,
            w.complete if e2e else None,
        )


_COUNTER_FIELDS = (
    "seen",
    "matched",
    "recorded",
    "tagged",
    "untagged",
    "too_big",
    "gso_skipped",
    "not_matched",
    "parse_truncated",
    "parse_malformed",
    "parse_non_ip",
    "ringbuf_full",
    "bytes",
    "tag_failed",
)


class HopCounterAggregator:
    """Turns cumulative `HopCounters` into per-interval deltas per (trace, hop, node).

    The first report of a hop counts in full (counters start at 0 when the hop is attached); a counter
    going backwards means the agent re-attached, and the new value is taken as the delta.
    """

    def __init__(self, clock: ClockAligner | None = None, config: AggregateConfig | None = None) -> None:
        self.clock = clock
        self.config = config or AggregateConfig()
        self.config.validate()
        self.stats = AggregateStats()
        self._last: dict[tuple[str, str, int], tuple[int, ...]] = {}
        self._windows: dict[tuple[str, str, str, int], HopCounterWindow] = {}

    def add_counters(
        self, trace: str, node: str, counters: Iterable[records_pb2.HopCounters], now_ns: int | None = None
    ) -> None:
        """Account one batch's cumulative counters. `now_ns` (master time) is used when `at` is unset."""
        interval = self.config.interval_ns
        for c in counters:
            values = tuple(getattr(c, f) for f in _COUNTER_FIELDS)
            key = (trace, node, c.hop_index)
            prev = self._last.get(key)
            self._last[key] = values
            if prev is None:
                delta = values
            elif any(v < p for v, p in zip(values, prev, strict=True)):
                self.stats.counter_resets += 1
                delta = values
            else:
                delta = tuple(v - p for v, p in zip(values, prev, strict=True))
            if c.HasField("at"):
                ts = c.at.ToNanoseconds()
                if self.clock is not None:
                    ts = self.clock.wall_to_master(node, ts)
            else:
                ts = now_ns if now_ns is not None else time.time_ns()
            start = ts - ts % interval
            hop = c.hop or f"hop{c.hop_index}"
            wkey = (trace, hop, node, start)
            w = self._windows.get(wkey)
            if w is None:
                w = self._windows[wkey] = HopCounterWindow(trace, hop, node, start)
            d = dict(zip(_COUNTER_FIELDS, delta, strict=True))
            w.matched += d["matched"]
            w.tagged += d["tagged"]
            w.untagged += d["untagged"]
            w.parse_errors += d["parse_truncated"] + d["parse_malformed"] + d["parse_non_ip"]
            w.lost_events += d["ringbuf_full"]
            w.bytes += d["bytes"]

    def close_windows(self, upto_ns: int) -> list[HopCounterWindow]:
        """Close and return the windows that end at or before `upto_ns`."""
        interval = self.config.interval_ns
        done = sorted((k for k in self._windows if k[3] + interval <= upto_ns), key=lambda k: k[3])
        return [self._windows.pop(k) for k in done]

    def flush(self) -> list[HopCounterWindow]:
        """Close every window (shutdown)."""
        return [self._windows.pop(k) for k in sorted(self._windows, key=lambda k: k[3])]
