"""Clock alignment stage: maps each node's record timestamps onto the master clock.

The collector is the master clock: it serves time over NTP (`timeservice.py`) and agents measure their
offset against it with Cristian's algorithm (`clocksync.py` is the reference client). A record's `ts_ns` is
the node's CLOCK_MONOTONIC. The agent samples `monotonic_to_realtime_ns` (CLOCK_REALTIME - CLOCK_MONOTONIC),
the node's offset from the master (`offset_ns`, node wall - master) measured at node wall time
`sampled_at_ns`, and the drift of that offset (`drift_ppm`). With `wall = ts_ns + monotonic_to_realtime_ns`:

    offset(wall) = offset_ns + drift_ppm * 1e-6 * (wall - sampled_at_ns)
    ts_master    = wall - offset(wall)

`sampled_at_ns` 0 means the sample time is unknown; the drift is then not applied (a drift extrapolated
from an unknown origin could only add error). The latest mapping per node wins; a batch without a clock
reuses the node's last one (the identity before any).

Clock jumps: when a node's estimate changes, the new offset is compared with what the previous one predicts
at the new sample time (its offset plus its drift over the wall time between). Cristian's bound holds for
each estimate whatever the path does, so an honest change stays within the sum of the two bounds (the older
one grown by its drift's error with age, as the agent reports it; 100 ppm over the gap while no drift is
known yet), plus `JUMP_SLACK_NS` for the server's T3 correction. A step of the node's own CLOCK_REALTIME moves
its offset and its `monotonic_to_realtime_ns` alike: a change that the mapping's change (between the first
batches of the two estimates) explains is no jump either. Anything else is a `ClockJump`: a time exchange
shifted on the path (an unauthenticated one rewritten, or a delay of one direction that changed), or a clock
that changed its rate; the cross-node segments at that node are suspect around it. A step of the master (the
collector's own clock) shows as a jump of every node, which it is for the segments between them.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from hoptrace.v1 import records_pb2


@dataclass(frozen=True, slots=True)
class NodeMapping:
    """The mapping in force for one node: master = ts + delta_ns - drift * (ts - ref_mono_ns)."""

    delta_ns: int  # add to a node's monotonic ts to get master time at ref_mono_ns
    offset_ns: int  # node wall clock - master clock, at sampled_at_ns
    bound_ns: int  # error bound of offset_ns (0 = unknown)
    drift: float = 0.0  # drift_ppm * 1e-6 (0 when sampled_at_ns is unknown)
    ref_mono_ns: int = 0  # sampled_at_ns on the node's monotonic clock
    delay_ns: int = 0
    drift_ppm: float = 0.0
    sampled_at_ns: int = 0
    monotonic_to_realtime_ns: int = 0

    def to_master(self, ts_ns: int) -> int:
        """Convert one node monotonic timestamp to master time."""
        if self.drift:
            return ts_ns + self.delta_ns - round(self.drift * (ts_ns - self.ref_mono_ns))
        return ts_ns + self.delta_ns

    def wall_to_master(self, wall_ns: int) -> int:
        """Convert a node wall-clock time (e.g. `HopCounters.at`) to master time."""
        if self.drift:
            return wall_ns - self.offset_ns - round(self.drift * (wall_ns - self.sampled_at_ns))
        return wall_ns - self.offset_ns

    def same_value(self, other: NodeMapping) -> bool:
        """True when `other` carries the same clock estimate (the periodic mapping refresh is not news)."""
        return (self.offset_ns, self.bound_ns, self.drift_ppm, self.delay_ns, self.sampled_at_ns) == (
            other.offset_ns,
            other.bound_ns,
            other.drift_ppm,
            other.delay_ns,
            other.sampled_at_ns,
        )


_ZERO = NodeMapping(0, 0, 0)


def mapping_of(clock: records_pb2.NodeClock) -> NodeMapping:
    """The `NodeMapping` of one `NodeClock` message."""
    drift = clock.drift_ppm * 1e-6 if clock.sampled_at_ns else 0.0
    return NodeMapping(
        delta_ns=clock.monotonic_to_realtime_ns - clock.offset_ns,
        offset_ns=clock.offset_ns,
        bound_ns=clock.bound_ns,
        drift=drift,
        ref_mono_ns=clock.sampled_at_ns - clock.monotonic_to_realtime_ns,
        delay_ns=clock.delay_ns,
        drift_ppm=clock.drift_ppm,
        sampled_at_ns=clock.sampled_at_ns,
        monotonic_to_realtime_ns=clock.monotonic_to_realtime_ns,
    )


@dataclass(frozen=True, slots=True)
class ClockJump:
    """A node's offset moved by `jump_ns` between two estimates, beyond the `allowed_ns` their bounds (and
    drift) allow, unexplained by a step of its own clock; seen at master time `ts_ns`."""

    node: str
    ts_ns: int
    jump_ns: int
    allowed_ns: int


@dataclass(frozen=True, slots=True)
class NodeClockPoint:
    """A new clock estimate of one node (a `node_clock` point), at master time `ts_ns`; `jump` when it came
    with a clock jump."""

    node: str
    ts_ns: int
    offset_ns: int
    delay_ns: int
    bound_ns: int
    drift_ppm: float
    jump: ClockJump | None = None


# What no honest change of offset exceeds on top of the two bounds: the time service's T3 correction may
# be beaten by a little (timeservice.py), and kernel timestamps have their own granularity.
JUMP_SLACK_NS = 10_000
# The drift assumed while a node reports none (its first rounds): crystals stay well within it.
UNKNOWN_DRIFT_PPM = 100.0


@dataclass(slots=True)
class _Estimate:
    """One estimate of a node as the jump check keeps it: its mapping when first seen, and its largest bound
    (which grows with the drift's error as batches come further from the round)."""

    first: NodeMapping
    bound_ns: int


def clock_jump(old: _Estimate, new: NodeMapping) -> tuple[int, int] | None:
    """(jump_ns, allowed_ns) when `new`'s offset is beyond what `old` predicts, else None."""
    o = old.first
    elapsed = new.sampled_at_ns - o.sampled_at_ns
    predicted = o.offset_ns + round(o.drift_ppm * 1e-6 * elapsed)
    allowed = old.bound_ns + new.bound_ns + JUMP_SLACK_NS
    if not o.drift_ppm:
        allowed += round(UNKNOWN_DRIFT_PPM * 1e-6 * abs(elapsed))
    jump = new.offset_ns - predicted
    # The node's own step out: it moved the offset and the wall time between the rounds by as much.
    step = new.monotonic_to_realtime_ns - o.monotonic_to_realtime_ns
    stepped = new.offset_ns - step - o.offset_ns - round(o.drift_ppm * 1e-6 * (elapsed - step))
    if min(abs(jump), abs(stepped)) <= allowed:
        return None
    return (jump if abs(jump) <= abs(stepped) else stepped), allowed


class ClockAligner:
    """Keeps the latest `NodeClock` per node and converts node timestamps to master time.

    `update` also reports each new estimate as a `NodeClockPoint`, at most one per node per `min_interval_ns`
    of the collector's clock (an estimate arriving sooner is held and reported with the next batch after the
    interval).
    """

    def __init__(self, min_interval_ns: int = 1_000_000_000) -> None:
        self._lock = threading.Lock()
        self._nodes: dict[str, NodeMapping] = {}
        self._reported: dict[str, tuple[NodeMapping, int]] = {}  # node -> (last reported, when)
        self._estimates: dict[str, _Estimate] = {}  # node -> its current estimate, for the jump check
        self._jumps: dict[str, tuple[int, int]] = {}  # node -> (jump_ns, allowed_ns) not reported yet
        self.jump_counts: dict[str, int] = {}  # node -> clock jumps seen
        self.last_jump: dict[str, ClockJump] = {}  # node -> its last one (master time of its point)
        self.min_interval_ns = min_interval_ns
        self.updates = 0

    def update(self, node: str, clock: records_pb2.NodeClock | None) -> NodeMapping:
        """Take a node's newest clock (None keeps the previous one); return the mapping now in force."""
        if clock is None:
            return self._nodes.get(node, _ZERO)
        mapping = mapping_of(clock)
        with self._lock:
            self._nodes[node] = mapping
            self.updates += 1
            if mapping.bound_ns > 0 and mapping.sampled_at_ns:
                self._check_jump(node, mapping)
        return mapping

    def _check_jump(self, node: str, mapping: NodeMapping) -> None:
        current = self._estimates.get(node)
        if current is not None and (current.first.offset_ns, current.first.sampled_at_ns) == (
            mapping.offset_ns,
            mapping.sampled_at_ns,
        ):
            current.bound_ns = max(current.bound_ns, mapping.bound_ns)
            return
        if current is not None and (found := clock_jump(current, mapping)) is not None:
            self._jumps[node] = found
            self.jump_counts[node] = self.jump_counts.get(node, 0) + 1
        self._estimates[node] = _Estimate(mapping, mapping.bound_ns)

    def due_points(self, now_ns: int | None = None) -> list[NodeClockPoint]:
        """Clock estimates not reported yet and allowed by the rate limit (`node_clock` points); an estimate
        that came with a jump is reported at once, with it."""
        now = time.time_ns() if now_ns is None else now_ns
        out: list[NodeClockPoint] = []
        with self._lock:
            for node, m in self._nodes.items():
                last = self._reported.get(node)
                jumped = self._jumps.pop(node, None)
                if jumped is None and (
                    last is not None and (last[0].same_value(m) or now - last[1] < self.min_interval_ns)
                ):
                    continue
                self._reported[node] = (m, now)
                jump = ClockJump(node, now, *jumped) if jumped is not None else None
                if jump is not None:
                    self.last_jump[node] = jump
                out.append(NodeClockPoint(node, now, m.offset_ns, m.delay_ns, m.bound_ns, m.drift_ppm, jump))
        return out

    def nodes(self) -> dict[str, NodeMapping]:
        """A copy of every node's current mapping."""
        with self._lock:
            return dict(self._nodes)

    def mapping(self, node: str) -> NodeMapping:
        """The node's current mapping (zero before its first clock)."""
        return self._nodes.get(node, _ZERO)

    def delta_ns(self, node: str) -> int:
        """Nanoseconds to add to the node's monotonic timestamps to get master time (drift not included)."""
        return self._nodes.get(node, _ZERO).delta_ns

    def to_master(self, node: str, ts_ns: int) -> int:
        """Convert one node monotonic timestamp to master time."""
        return self._nodes.get(node, _ZERO).to_master(ts_ns)

    def wall_to_master(self, node: str, wall_ns: int) -> int:
        """Convert a node wall-clock time (e.g. `HopCounters.at`) to master time."""
        return self._nodes.get(node, _ZERO).wall_to_master(wall_ns)

    def bound_ns(self, node: str) -> int:
        """The node's clock error bound (0 when unknown)."""
        return self._nodes.get(node, _ZERO).bound_ns
