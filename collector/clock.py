"""Clock alignment stage: maps each node's record timestamps onto the master clock.

A record's `ts_ns` is the node's CLOCK_MONOTONIC. The agent samples `monotonic_to_realtime_ns`
(CLOCK_REALTIME - CLOCK_MONOTONIC) and the node's offset from the master (`offset_ns`, wall - master), so

    ts_master = ts_ns + monotonic_to_realtime_ns - offset_ns

The latest mapping per node wins; a batch without a clock reuses the node's last one (0 before any).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from hoptrace.v1 import records_pb2


@dataclass(frozen=True, slots=True)
class NodeMapping:
    """The mapping in force for one node."""

    delta_ns: int  # add to a node's monotonic ts to get master time
    offset_ns: int  # node wall clock - master clock
    bound_ns: int  # error bound of offset_ns (0 = unknown)


_ZERO = NodeMapping(0, 0, 0)


class ClockAligner:
    """Keeps the latest `NodeClock` per node and converts node timestamps to master time."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._nodes: dict[str, NodeMapping] = {}

    def update(self, node: str, clock: records_pb2.NodeClock | None) -> NodeMapping:
        """Take a node's newest clock (None keeps the previous one); return the mapping now in force."""
        if clock is None:
            return self._nodes.get(node, _ZERO)
        mapping = NodeMapping(
            clock.monotonic_to_realtime_ns - clock.offset_ns, clock.offset_ns, clock.bound_ns
        )
        with self._lock:
            self._nodes[node] = mapping
        return mapping

    def mapping(self, node: str) -> NodeMapping:
        """The node's current mapping (zero before its first clock)."""
        return self._nodes.get(node, _ZERO)

    def delta_ns(self, node: str) -> int:
        """Nanoseconds to add to the node's monotonic timestamps to get master time."""
        return self._nodes.get(node, _ZERO).delta_ns

    def to_master(self, node: str, ts_ns: int) -> int:
        """Convert one node monotonic timestamp to master time."""
        return ts_ns + self.delta_ns(node)

    def wall_to_master(self, node: str, wall_ns: int) -> int:
        """Convert a node wall-clock time (e.g. `HopCounters.at`) to master time."""
        return wall_ns - self._nodes.get(node, _ZERO).offset_ns

    def bound_ns(self, node: str) -> int:
        """The node's clock error bound (0 when unknown)."""
        return self._nodes.get(node, _ZERO).bound_ns
