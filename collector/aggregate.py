"""Aggregation stage: per-packet segment latencies, per-second segment statistics, per-second hop counters.

Segments are the consecutive pairs of the trace's path, `"from>to"`, plus `end_to_end` (first hop -> last
hop of the path), accounted like the others. A packet contributes a latency to a segment when it was seen
at both endpoints; otherwise it counts as `incomplete` for that segment. A packet's time in a segment is its
master time at the segment's first hop (or its earliest time seen when that hop is missing).

Statistics windows are `interval_ns` of master time (default 1 s). A window closes once the caller's master
watermark is `lateness_ns` past its end (the pipeline uses the join window + 1 interval): packets of a window
arrive late by at most the join window. A packet arriving after its window closed is left out of
`segment_stats` (counted in `AggregateStats.late`); it is still an exemplar when its ID is sampled.

Each window also carries what merges across windows and collectors (`sketch.py`): the sum and min of its
latencies, their sketch (DDSketch buckets), and the jitter's sum, count and sketch. Per-packet samples
(`LatencySample`, `hop_latency` points) are made only for exemplars: per trace and window the
`exemplar_slowest` slowest packets end to end (kept in a min-heap, emitted when the window closes:
`take_exemplars`), and at once every packet whose ID sequence is a multiple of `exemplar_every` (the pipeline
holds those until their window closes too, so a window and its exemplars are written together: what the
written-before mark of a restart says, `service.WrittenBeforeMark`).

A window's own percentiles are exact nearest-rank over its values: the value at sorted index ceil(q * n) - 1,
the rule the sketches' quantiles follow too (`sketch.py`), so reports and windows agree.

Cross-node clocks: a latency below the clocks' alignment bound (below 0 while the bound is unknown) is kept
but flagged `below_clock_bound`; a segment window is flagged when at least half its packets are (its median
latency is below the bound). Each cross-node window also carries `clock_bound_ns`, the sum of its two nodes'
bounds (the largest seen in the window): what a reader needs to say "within ±N ns" instead of showing a
latency the clocks cannot resolve.

vNetTracer's metrics (section III-D of the paper), per segment and window:

* Loss: `loss_count` = packets seen at the segment's first hop but not at its second (N_i - N_j over the
  packets of the window, all of whose join windows have closed), `loss_rate` = loss_count / N_i
  (`from_count`). Records the tracer itself lost are never network loss, so they are taken out: packets the
  collector cut short (join eviction, ID collision: `JoinedPacket.cut`) are not counted at all, and the
  records lost at the segment's second hop in the window (ring buffer full = `HopCounters.ringbuf_full`
  deltas, and `agent_dropped` deltas of that hop's node) are subtracted from loss_count (floor 0): a lost
  record cannot be told apart from a lost packet one by one, only by count. Records lost at the first hop
  cannot inflate the loss (such a packet is not counted in N_i), so they are not subtracted. The records
  subtracted, plus the packets cut short, are reported as `tracer_lost`, and each loss as a `TracerLossWindow`
  (measurement `tracer_loss`). Nor is a packet lost at a hop it passed before that hop was attached (in
  flight while the trace was applied: `JoinedPacket.before_attach`): it is counted in `before_attach`, the
  segment's when its second hop is such a hop, end to end's when every hop it lacks is. A packet that lacks
  a hop that was attached is lost end to end even when it also passed one unwatched.
* Drops (a trace with ``drops: true``): a lost packet that a node's kernel reported dropping
  (`JoinedPacket.drop`: node, reason and function, from the drop hops' skb:kfree_skb records) is counted by
  (node, reason, function) in the window of the segment it was lost in (`SegmentWindow.drops`), and end to
  end. The loss itself is counted as before: drops say why, for as many of the lost packets as the kernel
  said so.
* Jitter: the mean of |dT(i+1) - dT(i)| over consecutive packets of the window, in the order of their time at
  the first hop (`jitter_ns`), and the nearest-rank p99 of those differences (`jitter_p99_ns`).
* Per-device processing time: a segment whose two hops are on one node is flagged `same_node`.
* Throughput per hop (`HopCounterAggregator.add_records`): packets/s and bytes/s of the recorded packets, the
  bytes being the wire length minus the packet ID hoptrace added (4 bytes of UDP surplus area, an 8-byte TCP
  option; `records.RecordFlag`).
"""

from __future__ import annotations

import heapq
import socket
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import NamedTuple

from hoptrace import kernel_abi
from hoptrace.collector.catalog import TraceCatalog, TracePath
from hoptrace.collector.clock import ClockAligner, NodeMapping
from hoptrace.collector.join import JoinedPacket
from hoptrace.collector.records import (
    F_TCP,
    F_UDP,
    HOPTRACE_TCPOPT_LEN,
    HOPTRACE_UDP_ID_LEN,
    ID_SEQ_MASK,
    Record,
)
from hoptrace.collector.schema import END_TO_END, QUANTILES
from hoptrace.collector.sketch import LatencySketch
from hoptrace.common.stats import quantile
from hoptrace.v1 import records_pb2


@dataclass
class AggregateConfig:
    """Statistics interval, exemplars and instance name of the aggregation stage.

    Exemplars are the packets written one point per segment (`hop_latency`): per trace and window the
    `exemplar_slowest` slowest end to end, and every packet whose ID sequence is a multiple of
    `exemplar_every` (deterministic: every collector and every replay picks the same; 1 = every packet,
    0 = none). `instance` tags this collector's windows, so windows of one trace, segment and second written
    by several collectors add up instead of overwriting each other.
    """

    interval_ns: int = 1_000_000_000
    exemplar_slowest: int = 3
    exemplar_every: int = 1000
    instance: str = field(default_factory=socket.gethostname)

    def validate(self) -> None:
        """Raise ValueError on an unusable setting."""
        if self.interval_ns <= 0:
            raise ValueError(f"aggregation interval must be positive, got {self.interval_ns} ns")
        if self.exemplar_slowest < 0 or self.exemplar_every < 0:
            raise ValueError(
                f"exemplar settings must be >= 0, got slowest {self.exemplar_slowest},"
                f" every {self.exemplar_every}"
            )
        if not self.instance or any(c in self.instance for c in "\n\r"):
            raise ValueError(f"collector instance name must be one non-empty line, got {self.instance!r}")


class LatencySample(NamedTuple):
    """One packet in one segment (a `hop_latency` point, written for exemplar packets only)."""

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
    from_count: int = 0  # N_i: packets seen at from_hop
    loss_count: int = 0
    loss_rate: float = 0.0
    tracer_lost: int = 0
    # Packets seen at from_hop that passed to_hop before it was attached: neither a latency nor loss.
    before_attach: int = 0
    # The lost packets a node's kernel dropped, by (node, reason name, kernel function): `drops: true`.
    drops: dict[tuple[str, str, str], int] = field(default_factory=dict)
    jitter_ns: float = 0.0
    jitter_p99_ns: int = 0
    same_node: bool = False
    below_clock_bound: bool = False
    below_bound_count: int = 0
    clock_bound_ns: int = 0  # cross-node: bound(from node) + bound(to node); 0 = same node or unknown
    # Mergeable over time and collectors (`sketch.py`): the sum and min of the latencies, their sketch, and
    # the jitter's (sum, count and sketch of |dT(i+1) - dT(i)|). `instance`: the collector that wrote it.
    sum_ns: int = 0
    min_ns: int = 0
    sketch: LatencySketch = field(default_factory=LatencySketch)
    jitter_sum_ns: int = 0
    jitter_count: int = 0
    jitter_sketch: LatencySketch = field(default_factory=LatencySketch)
    instance: str = ""
    values: list[int] = field(default_factory=list, repr=False)  # sorted latencies (metrics), not written


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
    # throughput from the records themselves (`add_records`)
    packets: int = 0
    payload_bytes: int = 0
    interval_ns: int = 1_000_000_000
    has_counters: bool = True
    has_records: bool = False
    # The hop's container and pod (namespace/name) when its spec named it by one (tags `container`, `pod`).
    container: str = ""
    pod: str = ""

    @property
    def packets_per_s(self) -> float:
        """Recorded packets per second over the window."""
        return self.packets * 1e9 / self.interval_ns

    @property
    def bytes_per_s(self) -> float:
        """Recorded bytes per second (wire length minus hoptrace's ID bytes) over the window."""
        return self.payload_bytes * 1e9 / self.interval_ns


@dataclass(slots=True)
class TracerLossWindow:
    """Records the tracer lost over one interval (a `tracer_loss` point). `hop` is "" for a node-wide loss."""

    trace: str
    node: str
    hop: str
    reason: str
    start_ns: int
    records: int


@dataclass
class AggregateStats:
    """Counters of the aggregation stage."""

    samples: int = 0
    below_clock_bound: int = 0
    late: int = 0
    counter_resets: int = 0
    late_records: int = 0  # records whose throughput window had closed
    tracer_lost: int = 0


def summarize(values: Iterable[int]) -> tuple[int, float, int, int, int, int]:
    """Return (count, mean, p50, p90, p99, max) of latencies; all 0 for no values."""
    v = sorted(values)
    if not v:
        return 0, 0.0, 0, 0, 0, 0
    n = len(v)
    return n, sum(v) / n, quantile(v, 0.5), quantile(v, 0.9), quantile(v, 0.99), v[-1]


def jitter_diffs(times: list[int], latencies: list[int]) -> list[int]:
    """|dT(i+1) - dT(i)| of consecutive packets ordered by `times` (ties in arrival order), sorted; empty
    below 2 packets."""
    if len(latencies) < 2:
        return []
    if sorted(times) == times:  # the usual case, checked in C: packets leave the join nearly in time order
        ordered = latencies
    else:
        ordered = [latencies[i] for i in sorted(range(len(times)), key=times.__getitem__)]
    diffs = [b - a for a, b in zip(ordered, ordered[1:], strict=False)]
    return sorted(map(abs, diffs))


def jitter(times: list[int], latencies: list[int]) -> tuple[float, int]:
    """(mean, nearest-rank p99) of |dT(i+1) - dT(i)|, packets ordered by `times`; (0, 0) below 2."""
    diffs = jitter_diffs(times, latencies)
    if not diffs:
        return 0.0, 0
    return sum(diffs) / len(diffs), quantile(diffs, 0.99)


def id_overhead(flags: int) -> int:
    """Bytes hoptrace added to a recorded packet: the UDP ID (4) or the TCP option (8)."""
    if flags & F_UDP:
        return HOPTRACE_UDP_ID_LEN
    if flags & F_TCP:
        return HOPTRACE_TCPOPT_LEN
    return 0


class _Window:
    __slots__ = (
        "from_hop",
        "to_hop",
        "to_node",
        "values",
        "times",
        "incomplete",
        "packets",
        "complete",
        "from_count",
        "lost",
        "drops",
        "cut_lost",
        "before_attach",
        "flagged",
        "same_node",
        "clock_bound",
    )

    def __init__(self, from_hop: str, to_hop: str) -> None:
        self.from_hop = from_hop
        self.to_hop = to_hop
        self.to_node = ""
        self.values: list[int] = []
        self.times: list[int] = []
        self.incomplete = 0
        self.packets = 0
        self.complete = 0
        self.from_count = 0
        self.lost = 0
        self.drops: dict[tuple[str, str, str], int] = {}
        self.cut_lost = 0
        self.before_attach = 0
        self.flagged = 0
        self.same_node: bool | None = None
        self.clock_bound = 0


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
        # Windows before this were written by an earlier pipeline of the same stream (`resume_after`).
        self._written_before = 0
        # records the tracer lost, by window: (trace, hop, start) and node-wide (trace, node, start)
        self._lost_hop: dict[tuple[str, str, int], int] = {}
        self._lost_node: dict[tuple[str, str, int], int] = {}
        self._loss_points: dict[tuple[str, str, str, str, int], int] = {}
        self._loss_out: list[TracerLossWindow] = []
        # slowest packets per (trace, window start): min-heaps of (rank, seq, samples)
        self._slowest: dict[tuple[str, int], list] = {}
        self._exemplar_seq = 0
        self._exemplar_out: list[LatencySample] = []

    @property
    def closed_before(self) -> int:
        """Master time before which every window is closed (and handed out by `close_windows`)."""
        return self._closed_before

    def resume_after(self, written_before_ns: int) -> None:
        """Continue a stream whose windows before `written_before_ns` an earlier pipeline closed and wrote
        (a replay from a commit): what falls before it was counted there, so it is left out here (packets
        as late, tracer losses dropped) instead of overwriting those windows with a part of their packets."""
        interval = self.config.interval_ns
        cut = written_before_ns - written_before_ns % interval
        self._closed_before = max(self._closed_before, cut)
        self._written_before = max(self._written_before, cut)

    def note_tracer_lost(
        self, trace: str, hop: str, node: str, ts_ns: int, records: int, reason: str
    ) -> None:
        """Records the tracer lost at `hop` of `node` ("" hop: anywhere on the node) at master `ts_ns`.

        A loss reported for a window already closed counts in the oldest open one, unless an earlier
        pipeline wrote that window (`resume_after`): then it was counted there.
        """
        if records <= 0 or ts_ns < self._written_before:
            return
        interval = self.config.interval_ns
        start = max(ts_ns - ts_ns % interval, self._closed_before)
        self.stats.tracer_lost += records
        if hop:
            self._lost_hop[(trace, hop, start)] = self._lost_hop.get((trace, hop, start), 0) + records
        else:
            self._lost_node[(trace, node, start)] = self._lost_node.get((trace, node, start), 0) + records
        key = (trace, node, hop, reason, start)
        self._loss_points[key] = self._loss_points.get(key, 0) + records

    def take_tracer_loss(self) -> list[TracerLossWindow]:
        """The `tracer_loss` windows closed since the last call."""
        out, self._loss_out = self._loss_out, []
        return out

    def _segment_bound(self, from_node: str, to_node: str) -> int:
        """The clock error bound of a latency between two nodes' timestamps (0: one node, or unknown)."""
        if from_node == to_node or self.clock is None:
            return 0
        return self.clock.bound_ns(from_node) + self.clock.bound_ns(to_node)

    def _below_bound(self, latency: int, bound: int) -> bool:
        return latency < 0 or latency < bound

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
        """Account joined packets into the open windows (their latencies go into the windows' sketches).

        Returns the per-segment samples of the packets sampled as exemplars by ID (`exemplar_every`); the
        slowest of each window come with `take_exemplars` once it closes.
        """
        out: list[LatencySample] = []
        paths: dict[str, TracePath | None] = {}
        # Complete packets of a known path go through the batch path (per segment, list at a time),
        # grouped by trace and the nodes that saw them; the rest one by one.
        groups: dict[tuple[str, tuple[str | None, ...]], list[JoinedPacket]] = {}
        others: list[JoinedPacket] = []
        for p in packets:
            trace = p.trace
            if trace in paths:
                path = paths[trace]
            else:
                path = paths[trace] = self.catalog.get(trace)
            if p.complete and path is not None and path.known and len(p.times) == len(path.hop_names) > 1:
                key = (trace, tuple(p.nodes))
                group = groups.get(key)
                if group is None:
                    groups[key] = [p]
                else:
                    group.append(p)
            else:
                others.append(p)
        for (trace, nodes), group in groups.items():
            path = paths[trace]
            assert path is not None
            self._add_complete(trace, path, nodes, group, out)
        if others:
            self._add_each(others, paths, out)
        if self._written_before and out:
            # An earlier pipeline closed and wrote these windows (`resume_after`), and these exemplars before
            # them: the records came again (an agent's resend), the exemplars do not.
            interval = self.config.interval_ns
            written = self._written_before
            out = [s for s in out if s.ts_ns - s.ts_ns % interval >= written]
        return out

    def _segments_of(
        self, path: TracePath, nodes: tuple[str | None, ...]
    ) -> list[tuple[int, int, str, str, str, str, str, int]]:
        """(a, b, segment, from_hop, to_hop, from_node, to_node, clock bound) of each segment of a known
        path, end to end last, for packets seen by `nodes`."""
        names = path.hop_names
        n = len(names)
        pairs = [(i, i + 1, f"{names[i]}>{names[i + 1]}") for i in range(n - 1)] + [(0, n - 1, END_TO_END)]
        out = []
        for a, b, segment in pairs:
            from_node = nodes[a] or path.hop_node(a)
            to_node = nodes[b] or path.hop_node(b)
            bound = self._segment_bound(from_node, to_node)
            out.append((a, b, segment, names[a], names[b], from_node, to_node, bound))
        return out

    def _add_complete(
        self,
        trace: str,
        path: TracePath,
        nodes: tuple[str | None, ...],
        group: list[JoinedPacket],
        out: list[LatencySample],
    ) -> None:
        """Account complete packets of one trace seen by the same nodes: a list per segment at a time (the
        same result as `_add_each`, several times faster)."""
        interval = self.config.interval_ns
        stats = self.stats
        windows = self._windows
        closed = self._closed_before
        segments = self._segments_of(path, nodes)
        all_times = [p.times for p in group]
        for a, b, segment, from_hop, to_hop, from_node, to_node, bound in segments:
            e2e = segment == END_TO_END
            threshold = bound if bound > 0 else 0  # `_below_bound`: below 0, or below a known bound
            same = bool(from_node) and from_node == to_node
            starts = [t[a] for t in all_times]
            latencies = [t[b] - t[a] for t in all_times]
            lo, hi = min(starts), max(starts)
            if lo - lo % interval == hi - hi % interval:
                parts = [(lo - lo % interval, starts, latencies)]
            else:  # the batch spans windows
                split: dict[int, tuple[list[int], list[int]]] = {}
                for ta, latency in zip(starts, latencies, strict=True):
                    part = split.get(ta - ta % interval)
                    if part is None:
                        part = split[ta - ta % interval] = ([], [])
                    part[0].append(ta)
                    part[1].append(latency)
                parts = [(start, ts, lats) for start, (ts, lats) in split.items()]
            for start, ts, lats in parts:
                m = len(lats)
                flagged = sum(1 for x in lats if x < threshold)
                if not e2e:
                    stats.samples += m
                    stats.below_clock_bound += flagged
                if start < closed:
                    stats.late += m
                    continue
                key = (trace, segment, start)
                w = windows.get(key)
                if w is None:
                    w = windows[key] = _Window(from_hop, to_hop)
                w.values.extend(lats)
                w.times.extend(ts)
                w.flagged += flagged
                w.from_count += m
                if e2e:
                    w.packets += m
                    w.complete += m
                if to_node and not w.to_node:
                    w.to_node = to_node
                w.same_node = same if w.same_node is None else (w.same_node and same)
                if bound > w.clock_bound:
                    w.clock_bound = bound
        self._complete_exemplars(trace, segments, group, out)

    def _complete_exemplars(
        self,
        trace: str,
        segments: list[tuple[int, int, str, str, str, str, str, int]],
        group: list[JoinedPacket],
        out: list[LatencySample],
    ) -> None:
        """The exemplars among complete packets: sampled by ID (into `out`), and the slowest candidates of
        their windows (into the windows' heaps)."""
        every = self.config.exemplar_every
        slowest = self.config.exemplar_slowest
        interval = self.config.interval_ns
        candidates: dict[int, list[int]] = {}  # e2e window start -> indices in group
        for i, p in enumerate(group):
            if every > 0 and (p.packet_id & ID_SEQ_MASK) % every == 0:
                out.extend(self._complete_samples(trace, segments, p))
            elif slowest > 0:
                t0 = p.times[0]
                start = t0 - t0 % interval
                found = candidates.get(start)
                if found is None:
                    candidates[start] = [i]
                else:
                    found.append(i)
        last = len(segments) - 1
        for start, indices in candidates.items():
            heap = self._slowest_heap(trace, start)
            if heap is None:
                continue
            ranks = {i: group[i].times[segments[last][1]] - group[i].times[0] for i in indices}
            for i in heapq.nlargest(slowest, indices, key=ranks.__getitem__):
                rank = ranks[i]
                if len(heap) >= slowest and rank <= heap[0][0]:
                    break
                self._exemplar_seq += 1
                item = (rank, self._exemplar_seq, self._complete_samples(trace, segments, group[i]))
                if len(heap) < slowest:
                    heapq.heappush(heap, item)
                else:
                    heapq.heapreplace(heap, item)

    @staticmethod
    def _complete_samples(
        trace: str, segments: list[tuple[int, int, str, str, str, str, str, int]], p: JoinedPacket
    ) -> list[LatencySample]:
        """The per-segment samples (end to end last) of one complete packet."""
        times = p.times
        out = []
        for a, b, segment, from_hop, to_hop, from_node, to_node, bound in segments:
            latency = times[b] - times[a]
            out.append(
                LatencySample(
                    trace,
                    segment,
                    from_hop,
                    to_hop,
                    from_node,
                    to_node,
                    times[a],
                    latency,
                    p.packet_id,
                    latency < 0 or latency < bound,
                )
            )
        return out

    def _add_each(
        self, packets: list[JoinedPacket], paths: dict[str, TracePath | None], out: list[LatencySample]
    ) -> None:
        """Account packets one by one: incomplete ones, and those of a path not known yet."""
        stats = self.stats
        config = self.config
        every = config.exemplar_every
        slowest = config.exemplar_slowest
        for p in packets:
            path = paths[p.trace]
            times, nodes = p.times, p.nodes
            seen = [t for t in times if t is not None]
            if not seen:
                continue
            earliest = min(seen)
            width = max(i for i, t in enumerate(times) if t is not None) + 1
            n = len(path.hop_names) if path is not None and path.hop_names else width
            last = n - 1
            t0 = times[0] if times else None
            tn = times[last] if 0 < last < len(times) else None
            # Exemplars: sampled by ID, or a candidate for its window's slowest (ranked end to end, or by
            # its whole seen passage when incomplete).
            sampled = every > 0 and (p.packet_id & ID_SEQ_MASK) % every == 0
            rank = tn - t0 if t0 is not None and tn is not None else max(seen) - earliest
            e2e_start = t0 if t0 is not None else earliest
            heap: list | None = None
            if not sampled and slowest > 0:
                heap = self._slowest_heap(p.trace, e2e_start)
                if heap is not None and len(heap) >= slowest and rank <= heap[0][0]:
                    heap = None
            keep: list[LatencySample] | None = [] if sampled or heap is not None else None

            def name(i: int, path: TracePath | None = path) -> str:
                return path.hop_name(i) if path is not None else f"hop{i}"

            for a, b in path_segments(path, width):
                ta = times[a] if a < len(times) else None
                tb = times[b] if b < len(times) else None
                from_hop, to_hop = name(a), name(b)
                segment = f"{from_hop}>{to_hop}"
                w = self._window(p.trace, segment, ta if ta is not None else earliest, from_hop, to_hop)
                from_node = nodes[a] if a < len(nodes) and nodes[a] else (path.hop_node(a) if path else "")
                to_node = nodes[b] if b < len(nodes) and nodes[b] else (path.hop_node(b) if path else "")
                if w is not None:
                    self._count_path(w, ta, tb, p.cut, from_node, to_node, p.before_attach >> b & 1, p.drop)
                if ta is None or tb is None:
                    if w is not None:
                        w.incomplete += 1
                    continue
                latency = tb - ta
                bound = self._segment_bound(from_node, to_node)
                flag = self._below_bound(latency, bound)
                stats.samples += 1
                if flag:
                    stats.below_clock_bound += 1
                if w is not None:
                    w.values.append(latency)
                    w.times.append(ta)
                    w.flagged += flag
                    w.clock_bound = max(w.clock_bound, bound)
                if keep is not None:
                    keep.append(
                        LatencySample(
                            p.trace,
                            segment,
                            from_hop,
                            to_hop,
                            from_node,
                            to_node,
                            ta,
                            latency,
                            p.packet_id,
                            flag,
                        )
                    )
            # end to end: first -> last hop of the path
            first_hop, last_hop = name(0), name(last)
            w = self._window(p.trace, END_TO_END, e2e_start, first_hop, last_hop)
            from_node = nodes[0] or (path.hop_node(0) if path else "")
            to_node = (
                nodes[last] if last < len(nodes) and nodes[last] else (path.hop_node(last) if path else "")
            )
            if w is not None:
                w.packets += 1
                if p.complete:
                    w.complete += 1
                # lost end to end unless every hop it lacks is one it passed before that was attached
                missing = sum(1 << i for i in range(n) if i >= len(times) or times[i] is None)
                unwatched = bool(p.before_attach) and not missing & ~p.before_attach
                self._count_path(w, t0, tn, p.cut, from_node, to_node, unwatched, p.drop)
            if t0 is None or tn is None:
                if w is not None:
                    w.incomplete += 1
            else:
                latency = tn - t0
                bound = self._segment_bound(from_node, to_node)
                flag = self._below_bound(latency, bound)
                if w is not None:
                    w.values.append(latency)
                    w.times.append(t0)
                    w.flagged += flag
                    w.clock_bound = max(w.clock_bound, bound)
                if keep is not None:
                    keep.append(
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
            if keep:
                if sampled:
                    out.extend(keep)
                elif heap is not None:
                    self._exemplar_seq += 1
                    item = (rank, self._exemplar_seq, keep)
                    if len(heap) < slowest:
                        heapq.heappush(heap, item)
                    else:
                        heapq.heapreplace(heap, item)

    def _slowest_heap(self, trace: str, ts: int) -> list | None:
        """The min-heap of the slowest packets of `trace` in the window of `ts`; None when it is closed."""
        start = ts - ts % self.config.interval_ns
        if start < self._closed_before:
            return None
        key = (trace, start)
        heap = self._slowest.get(key)
        if heap is None:
            heap = self._slowest[key] = []
        return heap

    def take_exemplars(self) -> list[LatencySample]:
        """The samples of the slowest packets of the windows closed since the last call."""
        out, self._exemplar_out = self._exemplar_out, []
        return out

    def _close_exemplars(self, closed: Callable[[int], bool]) -> None:
        for key in sorted((k for k in self._slowest if closed(k[1])), key=lambda k: k[1]):
            for _, _, samples in sorted(self._slowest.pop(key)):
                self._exemplar_out.extend(samples)

    @staticmethod
    def _count_path(
        w: _Window,
        ta: int | None,
        tb: int | None,
        cut: bool,
        from_node: str,
        to_node: str,
        before_attach: bool | int = False,
        drop: tuple[str, str, int, str, int] | None = None,
    ) -> None:
        """Loss and node bookkeeping of one packet in one segment window. `before_attach`: the packet
        passed the segment's second hop (end to end: every hop it lacks) before that was attached;
        `drop`: where and why its kernel dropped it (`JoinedPacket.drop`), counted with a loss."""
        if to_node and not w.to_node:
            w.to_node = to_node
        if ta is not None:
            w.from_count += 1
            if tb is None:
                if cut:
                    w.cut_lost += 1
                elif before_attach:
                    w.before_attach += 1
                else:
                    w.lost += 1
                    if drop is not None:
                        key = (drop[0], drop[1], drop[3])
                        w.drops[key] = w.drops.get(key, 0) + 1
        if ta is not None and tb is not None:
            same = bool(from_node) and from_node == to_node
            w.same_node = same if w.same_node is None else (w.same_node and same)

    def close_windows(self, upto_ns: int) -> list[SegmentWindow]:
        """Close and return every window that ends at or before `upto_ns` (master time).

        The `tracer_loss` windows closed with them are kept for `take_tracer_loss`.
        """
        interval = self.config.interval_ns
        cut = upto_ns - upto_ns % interval  # windows starting before this have ended by upto_ns
        if cut <= self._closed_before:
            return []
        self._closed_before = cut
        done = [k for k in self._windows if k[2] < cut]
        out = [self._close(k) for k in sorted(done, key=lambda k: k[2])]
        self._close_losses(lambda start: start < cut)
        self._close_exemplars(lambda start: start < cut)
        return out

    def flush(self) -> list[SegmentWindow]:
        """Close every window (shutdown)."""
        out = [self._close(k) for k in sorted(self._windows, key=lambda k: k[2])]
        self._close_losses(lambda start: True)
        self._close_exemplars(lambda start: True)
        return out

    def _close_losses(self, closed: Callable[[int], bool]) -> None:
        for key in sorted((k for k in self._loss_points if closed(k[4])), key=lambda k: k[4]):
            self._loss_out.append(TracerLossWindow(*key, records=self._loss_points.pop(key)))
        for table in (self._lost_hop, self._lost_node):
            for key in [k for k in table if closed(k[2])]:
                del table[key]

    def _close(self, key: tuple[str, str, int]) -> SegmentWindow:
        w = self._windows.pop(key)
        ordered = sorted(w.values)
        count = len(ordered)
        total = sum(ordered)
        if count:
            mean, mx = total / count, ordered[-1]
            p50, p90, p99 = (quantile(ordered, q) for q in QUANTILES)
        else:
            mean, p50, p90, p99, mx = 0.0, 0, 0, 0, 0
        e2e = key[1] == END_TO_END
        trace, start = key[0], key[2]
        lost_at_to = self._lost_hop.get((trace, w.to_hop, start), 0)
        if w.to_node:
            lost_at_to += self._lost_node.get((trace, w.to_node, start), 0)
        loss = max(0, w.lost - lost_at_to)
        diffs = jitter_diffs(w.times, w.values)
        jit = sum(diffs) / len(diffs) if diffs else 0.0
        jit_p99 = quantile(diffs, 0.99) if diffs else 0
        same_node = bool(w.same_node)
        if w.same_node is None:  # no packet crossed it: use the path's nodes
            path = self.catalog.get(trace)
            if path is not None and path.known:
                names = list(path.hop_names)
                if w.from_hop in names and w.to_hop in names:
                    a, b = path.hop_node(names.index(w.from_hop)), path.hop_node(names.index(w.to_hop))
                    same_node = bool(a) and a == b
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
            from_count=w.from_count,
            loss_count=loss,
            loss_rate=loss / w.from_count if w.from_count else 0.0,
            tracer_lost=lost_at_to + w.cut_lost,
            before_attach=w.before_attach,
            drops=w.drops,
            jitter_ns=jit,
            jitter_p99_ns=jit_p99,
            same_node=same_node,
            below_clock_bound=count > 0 and 2 * w.flagged >= count,
            below_bound_count=w.flagged,
            clock_bound_ns=w.clock_bound,
            sum_ns=total,
            min_ns=ordered[0] if ordered else 0,
            sketch=LatencySketch.of_sorted(ordered),
            jitter_sum_ns=sum(diffs),
            jitter_count=len(diffs),
            jitter_sketch=LatencySketch.of_sorted(diffs),
            instance=self.config.instance,
            values=ordered,
        )


class HopCounterAggregator:
    """Per-interval windows per (trace, hop, node): deltas of the cumulative `HopCounters`, and the
    throughput of the recorded packets (`add_records`).

    The first report of a hop counts in full (counters start at 0 when the hop is attached); a counter
    going backwards means the agent re-attached, and the new value is taken as the delta. A delta reported
    for a window already closed counts in the oldest open one, so totals are kept (a closed window is never
    written twice: its point would overwrite the first).
    """

    def __init__(
        self,
        clock: ClockAligner | None = None,
        config: AggregateConfig | None = None,
        catalog: TraceCatalog | None = None,
    ) -> None:
        self.clock = clock
        self.catalog = catalog
        self.config = config or AggregateConfig()
        self.config.validate()
        self.stats = AggregateStats()
        self._last: dict[tuple[str, str, int], tuple[int, ...]] = {}
        self._windows: dict[tuple[str, str, str, int], HopCounterWindow] = {}
        self._closed_before = 0
        # Windows before this were written by an earlier pipeline of the same stream (`resume_after`).
        self._written_before = 0

    @property
    def closed_before(self) -> int:
        """Master time before which every window is closed (and handed out by `close_windows`)."""
        return self._closed_before

    def resume_after(self, written_before_ns: int) -> None:
        """Continue a stream whose windows before `written_before_ns` an earlier pipeline wrote (see
        `SegmentAggregator.resume_after`): records before it are left out as late, and counters reported
        before it only set the base their next report's delta is taken from, as a hop's first report after
        it does when the hop was attached before it."""
        interval = self.config.interval_ns
        cut = written_before_ns - written_before_ns % interval
        self._closed_before = max(self._closed_before, cut)
        self._written_before = max(self._written_before, cut)

    def _attached_before_resume(self, node: str, c: records_pb2.HopCounters) -> bool:
        """Whether the hop of `c` was attached before the windows this pipeline resumed after (unknown:
        taken as before): its counters hold growth an earlier pipeline counted."""
        if not c.attached_ns:
            return True
        attached = self.clock.to_master(node, c.attached_ns) if self.clock is not None else c.attached_ns
        return attached < self._written_before

    def _get(self, trace: str, hop: str, node: str, start: int, counters: bool) -> HopCounterWindow:
        wkey = (trace, hop, node, start)
        w = self._windows.get(wkey)
        if w is None:
            w = self._windows[wkey] = HopCounterWindow(
                trace, hop, node, start, interval_ns=self.config.interval_ns, has_counters=counters
            )
        elif counters:
            w.has_counters = True
        return w

    def add_records(self, trace: str, node: str, records: Iterable[Record], mapping: NodeMapping) -> None:
        """Count one batch's records per hop and window (master time) for the throughput fields.

        Records of a window already closed are counted in `stats.late_records` and left out.
        """
        interval = self.config.interval_ns
        closed = self._closed_before
        delta, drift, ref = mapping.delta_ns, mapping.drift, mapping.ref_mono_ns  # to_master, inline
        acc: dict[tuple[int, int], list[int]] = {}
        late = 0
        for ts, _pid, _fh, _ifindex, wire_len, hop, _slot, _cpu, flags in records:
            t = ts + delta - round(drift * (ts - ref)) if drift else ts + delta
            start = t - t % interval
            if start < closed:
                late += 1
                continue
            a = acc.get((hop, start))
            if a is None:
                a = acc[(hop, start)] = [0, 0]
            a[0] += 1
            a[1] += wire_len - id_overhead(flags)
        self.stats.late_records += late
        path = self.catalog.get(trace) if self.catalog is not None else None
        for (hop, start), (packets, nbytes) in acc.items():
            name = path.hop_name(hop) if path is not None else f"hop{hop}"
            w = self._get(trace, name, node, start, counters=False)
            if path is not None:
                w.container, w.pod = path.hop_workload(hop)
            w.packets += packets
            w.payload_bytes += nbytes
            w.has_records = True

    def add_counters(
        self, trace: str, node: str, counters: Iterable[records_pb2.HopCounters], now_ns: int | None = None
    ) -> list[tuple[str, int, int]]:
        """Account one batch's cumulative counters. `now_ns` (master time) is used when `at` is unset.

        Returns the records each hop lost in its ring buffer since the last report, as (hop, master time,
        records) for every nonzero `ringbuf_full` delta.
        """
        interval = self.config.interval_ns
        lost: list[tuple[str, int, int]] = []
        for c in counters:
            # HopCounters.values is indexed by enum hoptrace_counter; an older agent may send fewer.
            values = tuple(c.values) + (0,) * (len(kernel_abi.COUNTERS) - len(c.values))
            key = (trace, node, c.hop_index)
            prev = self._last.get(key)
            self._last[key] = values
            if prev is None and self._written_before and self._attached_before_resume(node, c):
                # The stream of an earlier pipeline resumed (a restart): what the hop counted until that
                # pipeline's last report was written there, and what it grew since cannot be told apart
                # from it: this report only sets the base (in full, a restart counted it all again, a
                # hop's lost records among it as tracer loss).
                delta = (0,) * len(values)
            elif prev is None:
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
            if ts < self._written_before:
                continue  # its delta is in a window an earlier pipeline wrote
            start = max(ts - ts % interval, self._closed_before)
            hop = c.hop or f"hop{c.hop_index}"
            w = self._get(trace, hop, node, start, counters=True)
            path = self.catalog.get(trace) if self.catalog is not None else None
            if path is not None:
                w.container, w.pod = path.hop_workload(c.hop_index)
            d = dict(zip(kernel_abi.COUNTERS, delta, strict=False))
            w.matched += d["matched"]
            w.tagged += d["tagged"]
            w.untagged += d["untagged"]
            w.parse_errors += d["parse_truncated"] + d["parse_malformed"] + d["parse_non_ip"]
            w.lost_events += d["ringbuf_full"]
            w.bytes += d["bytes"]
            if d["ringbuf_full"]:
                lost.append((hop, ts, d["ringbuf_full"]))
        return lost

    def close_windows(self, upto_ns: int) -> list[HopCounterWindow]:
        """Close and return the windows that end at or before `upto_ns`."""
        interval = self.config.interval_ns
        cut = upto_ns - upto_ns % interval
        if cut > self._closed_before:
            self._closed_before = cut
        done = sorted((k for k in self._windows if k[3] + interval <= upto_ns), key=lambda k: k[3])
        return [self._windows.pop(k) for k in done]

    def flush(self) -> list[HopCounterWindow]:
        """Close every window (shutdown)."""
        return [self._windows.pop(k) for k in sorted(self._windows, key=lambda k: k[3])]
