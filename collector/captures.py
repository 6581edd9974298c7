"""The capture action's packets (`capture: N` on a hop): each traced packet's first bytes at that hop become a
`hop_capture` point at the record's aligned master time, which `hoptrace packets --pcap` writes as pcap-ng.

A trace's captures are bounded per second of master time (`CaptureConfig.per_trace_per_s`): a capture beyond
it is dropped and counted (`HopCapturesStage.dropped`), never queued, so a capturing hop on a busy flow cannot
flood the store. Every hop's capture of a packet counts against the budget.
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from hoptrace.collector.actions import ToMaster
from hoptrace.collector.points import Point
from hoptrace.collector.records import HOP_INDEX, PACKET_ID, TS_NS, CapturedRecord
from hoptrace.collector.schema import HOP_CAPTURE

_SECOND = 1_000_000_000
# Seconds of master time whose counts are kept per trace (a batch late by more finds a fresh budget).
_SECONDS_KEPT = 64


@dataclass
class CaptureConfig:
    """The bound on stored captures."""

    per_trace_per_s: int = 1000  # captured packets written per trace and second of master time, all hops

    def validate(self) -> None:
        """Raise ValueError on an unusable config."""
        if self.per_trace_per_s < 0:
            raise ValueError(f"per_trace_per_s must be >= 0, got {self.per_trace_per_s}")


class HopCapturesStage:
    """Turns each batch's captures into `hop_capture` points, within each trace's budget per second."""

    def __init__(self, config: CaptureConfig | None = None) -> None:
        self.config = config if config is not None else CaptureConfig()
        self.config.validate()
        self.written: dict[str, int] = {}  # trace -> captures turned into points
        self.dropped: dict[str, int] = {}  # trace -> captures beyond the budget
        self._counts: dict[str, dict[int, int]] = {}  # trace -> second of master time -> captures taken

    def add(
        self,
        trace: str,
        node: str,
        captures: Iterable[CapturedRecord],
        mapping: ToMaster,
        hop_name: Callable[[int], str],
    ) -> list[Point]:
        """One point per capture of the batch within the budget; the others are counted in `dropped`."""
        counts = self._counts.setdefault(trace, {})
        budget = self.config.per_trace_per_s
        points: list[Point] = []
        dropped = 0
        for rec, capture in captures:
            at = mapping.to_master(rec[TS_NS])
            second = at // _SECOND
            taken = counts.get(second, 0)
            if taken >= budget:
                dropped += 1
                continue
            counts[second] = taken + 1
            tags = (("hop", hop_name(rec[HOP_INDEX])), ("node", node), ("trace", trace))
            fields = (
                ("packet_id", rec[PACKET_ID]),
                ("wire_len", capture.wire_len),
                ("link_type", capture.link_type),
                ("bytes", base64.b64encode(capture.data).decode("ascii")),
            )
            points.append(Point(HOP_CAPTURE, tags, fields, at))
        if len(counts) > _SECONDS_KEPT:
            for second in sorted(counts)[: len(counts) - _SECONDS_KEPT]:
                del counts[second]
        if points:
            self.written[trace] = self.written.get(trace, 0) + len(points)
        if dropped:
            self.dropped[trace] = self.dropped.get(trace, 0) + dropped
        return points

    def forget_traces(self, live: set[str]) -> None:
        """Drop the budgets of traces that are gone (their counts stay)."""
        for trace in [t for t in self._counts if t not in live]:
            del self._counts[trace]
