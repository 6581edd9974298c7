"""The collector's one output: `Point`s (measurement, tags, fields, time), whatever stage made them and
whichever exporter takes them. The stages of the pipeline hand points to every exporter alike; only the
InfluxDB exporter turns them into line protocol (`influx.line`), and a second exporter (OpenTelemetry, say)
takes the same points. The names are the schema's (`schema.py`); the windows of the aggregation stage
become points here.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from hoptrace.collector.aggregate import HopCounterWindow, LatencySample, SegmentWindow, TracerLossWindow
from hoptrace.collector.clock import NodeClockPoint
from hoptrace.collector.schema import (
    HOP_COUNTERS,
    HOP_LATENCY,
    JITTER_PREFIX,
    LATENCY_PREFIX,
    NODE_CLOCK,
    SEGMENT_DROPS,
    SEGMENT_STATS,
    TRACER_LOSS,
)

# A field's value: bool, int, float and str are kept apart (InfluxDB types its fields by the first one
# written).
FieldValue = bool | int | float | str


@dataclass(frozen=True, slots=True)
class Point:
    """One point of a measurement: its tags in order (a tag with an empty value is left out when written),
    its fields in order, and its time (unix ns, master clock)."""

    measurement: str
    tags: tuple[tuple[str, str], ...]
    fields: tuple[tuple[str, FieldValue], ...]
    time_ns: int

    def tag(self, name: str) -> str:
        """The value of tag `name`, "" when it has none."""
        return next((value for key, value in self.tags if key == name), "")

    def field(self, name: str) -> FieldValue | None:
        """The value of field `name`, None when it has none."""
        return next((value for key, value in self.fields if key == name), None)


def latency_point(s: LatencySample) -> Point:
    """The `hop_latency` point of one exemplar's segment."""
    tags = (
        ("from_hop", s.from_hop),
        ("from_node", s.from_node),
        ("segment", s.segment),
        ("to_hop", s.to_hop),
        ("to_node", s.to_node),
        ("trace", s.trace),
    )
    fields: tuple[tuple[str, FieldValue], ...] = (("latency_ns", s.latency_ns), ("packet_id", s.packet_id))
    if s.below_clock_bound:  # written only when true
        fields += (("below_clock_bound", True),)
    return Point(HOP_LATENCY, tags, fields, s.ts_ns)


def segment_point(w: SegmentWindow) -> Point:
    """The `segment_stats` point of one window: its statistics and sketches."""
    tags = (
        ("collector", w.instance),
        ("from_hop", w.from_hop),
        ("segment", w.segment),
        ("to_hop", w.to_hop),
        ("trace", w.trace),
    )
    fields: list[tuple[str, FieldValue]] = [
        ("count", w.count),
        ("mean_ns", float(w.mean_ns)),
        ("p50_ns", w.p50_ns),
        ("p90_ns", w.p90_ns),
        ("p99_ns", w.p99_ns),
        ("max_ns", w.max_ns),
        ("incomplete", w.incomplete),
    ]
    if w.packets is not None:  # end to end
        fields += [("packets", w.packets), ("complete", w.complete or 0)]
    fields += [
        ("from_count", w.from_count),
        ("loss_count", w.loss_count),
        ("loss_rate", float(w.loss_rate)),
        ("tracer_lost", w.tracer_lost),
        ("jitter_ns", float(w.jitter_ns)),
        ("jitter_p99_ns", w.jitter_p99_ns),
        ("same_node", bool(w.same_node)),
        ("below_clock_bound", bool(w.below_clock_bound)),
        ("below_bound_count", w.below_bound_count),
        ("clock_bound_ns", w.clock_bound_ns),
        ("sum_ns", w.sum_ns),
        ("min_ns", w.min_ns),
        ("jitter_sum_ns", w.jitter_sum_ns),
        ("jitter_count", w.jitter_count),
    ]
    if w.before_attach:  # rare (a trace applied to live traffic): written only when some passed
        fields.append(("before_attach", w.before_attach))
    fields += w.sketch.fields(LATENCY_PREFIX).items()
    fields += w.jitter_sketch.fields(JITTER_PREFIX).items()
    return Point(SEGMENT_STATS, tags, tuple(fields), w.start_ns)


def drops_points(w: SegmentWindow) -> list[Point]:
    """The `segment_drops` points of one window: its lost packets' drops, one per node, reason and kernel
    function."""
    return [
        Point(
            SEGMENT_DROPS,
            (
                ("collector", w.instance),
                ("function", function),
                ("node", node),
                ("reason", reason),
                ("segment", w.segment),
                ("trace", w.trace),
            ),
            (("count", count),),
            w.start_ns,
        )
        for (node, reason, function), count in sorted(w.drops.items())
    ]


def counters_points(w: HopCounterWindow) -> list[Point]:
    """The `hop_counters` points of one window: the counter deltas and the throughput, two points of the
    same series and time (InfluxDB merges their fields)."""
    tags = (("container", w.container), ("hop", w.hop), ("node", w.node), ("pod", w.pod), ("trace", w.trace))
    out = []
    if w.has_counters:
        counters = (
            ("matched", w.matched),
            ("tagged", w.tagged),
            ("untagged", w.untagged),
            ("parse_errors", w.parse_errors),
            ("lost_events", w.lost_events),
            ("bytes", w.bytes),
        )
        out.append(Point(HOP_COUNTERS, tags, counters, w.start_ns))
    if w.has_records:
        throughput = (
            ("packets", w.packets),
            ("packets_per_s", float(w.packets_per_s)),
            ("bytes_per_s", float(w.bytes_per_s)),
        )
        out.append(Point(HOP_COUNTERS, tags, throughput, w.start_ns))
    return out


def node_clock_point(p: NodeClockPoint) -> Point:
    """The `node_clock` point of one node's new clock estimate."""
    fields: tuple[tuple[str, FieldValue], ...] = (
        ("offset_ns", p.offset_ns),
        ("delay_ns", p.delay_ns),
        ("bound_ns", p.bound_ns),
        ("drift_ppm", float(p.drift_ppm)),
    )
    if p.jump is not None:  # written only with a clock jump
        fields += (("jump_ns", p.jump.jump_ns), ("jump_allowed_ns", p.jump.allowed_ns))
    return Point(NODE_CLOCK, (("node", p.node),), fields, p.ts_ns)


def tracer_loss_point(w: TracerLossWindow) -> Point:
    """The `tracer_loss` point of the records one node (or one hop) lost in a window."""
    tags = (("hop", w.hop), ("node", w.node), ("reason", w.reason), ("trace", w.trace))
    return Point(TRACER_LOSS, tags, (("records", w.records),), w.start_ns)


def window_points(
    samples: Iterable[LatencySample] = (),
    segments: Iterable[SegmentWindow] = (),
    counters: Iterable[HopCounterWindow] = (),
    clocks: Iterable[NodeClockPoint] = (),
    tracer_loss: Iterable[TracerLossWindow] = (),
) -> list[Point]:
    """The points of the aggregation's output: exemplars, windows, clock estimates and tracer losses."""
    points = [latency_point(s) for s in samples]
    for w in segments:
        points.append(segment_point(w))
        if w.drops:
            points.extend(drops_points(w))
    for w in counters:
        points.extend(counters_points(w))
    points.extend(node_clock_point(p) for p in clocks)
    points.extend(tracer_loss_point(w) for w in tracer_loss)
    return points
