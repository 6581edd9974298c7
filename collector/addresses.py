"""What each hop saw of its packets' addresses, and where a translation rewrote them.

One packet in `ADDRESSES_EVERY` (hoptrace.h) of a trace carries, at every hop, the innermost 5-tuple that
hop saw (`struct hoptrace_addresses`; which packets is decided by the ID alone, so every hop describes the
same ones). The stage gathers each such packet's tuples across nodes and, once no record of it has come for
`settle_ns`, compares the path's hops in order: where two consecutive hops that described it saw different
tuples, a translation between them rewrote the packet (a Service's DNAT, a masquerade). It leaves as
`hop_addresses` and `address_translations` points (`schema.py`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from hoptrace.collector.points import Point
from hoptrace.collector.records import HOP_INDEX, PACKET_ID, DescribedRecord, FiveTuple
from hoptrace.collector.schema import ADDRESS_TRANSLATIONS, HOP_ADDRESSES


def translation(before: FiveTuple, after: FiveTuple) -> tuple[str, str, str]:
    """(kind, before, after) of what changed between two hops' tuples: "dnat" (the destination), "snat"
    (the source) or "dnat+snat" (both ends shown); a port that stayed is left out."""
    src_moved = (before.source, before.source_port) != (after.source, after.source_port)
    dst_moved = (before.destination, before.destination_port) != (after.destination, after.destination_port)
    if dst_moved and not src_moved:
        ports = before.destination_port != after.destination_port
        return "dnat", before.endpoint("destination", ports), after.endpoint("destination", ports)
    if src_moved and not dst_moved:
        ports = before.source_port != after.source_port
        return "snat", before.endpoint("source", ports), after.endpoint("source", ports)
    return (
        "dnat+snat",
        f"{before.endpoint('source')} > {before.endpoint('destination')}",
        f"{after.endpoint('source')} > {after.endpoint('destination')}",
    )


@dataclass(slots=True)
class _Described:
    """One packet's tuples so far, by hop index, and when its last one came (collector time)."""

    hops: dict[int, FiveTuple]
    last_ns: int


class HopAddressesStage:
    """Gathers the packets that describe their addresses and compares their hops once they settle."""

    def __init__(self, settle_ns: int = 3_000_000_000, max_pending: int = 16384) -> None:
        self.settle_ns = settle_ns
        self.max_pending = max_pending  # packets waiting to settle; past it the oldest settle early
        self._pending: dict[tuple[str, int], _Described] = {}  # (trace, packet ID), oldest first
        self._seen: Counter[tuple[str, int, FiveTuple]] = Counter()  # (trace, hop index, tuple)
        self._rewritten: Counter[tuple[str, int, int, str, str, str]] = Counter()
        self._last_master_ns = 0  # each take's points at a later time: InfluxDB keeps one point per time

    def add(self, trace: str, described: list[DescribedRecord], now_ns: int) -> None:
        """Take a batch's described records (at collector time `now_ns`) of the trace's path hops."""
        for rec, five_tuple in described:
            key = (trace, rec[PACKET_ID])
            entry = self._pending.pop(key, None)  # re-inserted: the dict stays in order of last arrival
            if entry is None:
                entry = _Described({}, now_ns)
            entry.hops[rec[HOP_INDEX]] = five_tuple
            entry.last_ns = now_ns
            self._pending[key] = entry
        while len(self._pending) > self.max_pending:
            key = next(iter(self._pending))
            self._settle(key, self._pending.pop(key))

    def take_points(
        self, now_ns: int, master_ns: int, path_hops: Callable[[str], list[str] | None]
    ) -> list[Point]:
        """Settle the packets whose last record is `settle_ns` old and return what the settled packets
        showed since the last call, at master time `master_ns`. `path_hops(trace)` names the path's hops
        (None while the trace's path is unknown: its packets wait)."""
        for key in list(self._pending):
            entry = self._pending[key]
            if now_ns - entry.last_ns < self.settle_ns:
                break  # the rest came later
            del self._pending[key]
            self._settle(key, entry)
        if not self._seen and not self._rewritten:
            return []
        master_ns = self._last_master_ns = max(master_ns, self._last_master_ns + 1)
        points = []
        for (trace, index, seen), packets in self._seen.items():
            names = path_hops(trace) or []
            hop = names[index] if index < len(names) else f"hop{index}"
            tags = (
                ("destination", seen.endpoint("destination")),
                ("hop", hop),
                ("protocol", seen.protocol_name),
                ("source", seen.endpoint("source", with_port=False)),
                ("trace", trace),
            )
            points.append(Point(HOP_ADDRESSES, tags, (("packets", packets),), master_ns))
        for (trace, frm, to, kind, before, after), packets in self._rewritten.items():
            names = path_hops(trace) or []
            tags = (
                ("after", after),
                ("before", before),
                ("from_hop", names[frm] if frm < len(names) else f"hop{frm}"),
                ("kind", kind),
                ("to_hop", names[to] if to < len(names) else f"hop{to}"),
                ("trace", trace),
            )
            points.append(Point(ADDRESS_TRANSLATIONS, tags, (("packets", packets),), master_ns))
        self._seen.clear()
        self._rewritten.clear()
        return points

    def _settle(self, key: tuple[str, int], entry: _Described) -> None:
        trace = key[0]
        previous: tuple[int, FiveTuple] | None = None
        for index in sorted(entry.hops):
            seen = entry.hops[index]
            self._seen[(trace, index, seen)] += 1
            if previous is not None and previous[1] != seen:
                self._rewritten[(trace, previous[0], index, *translation(previous[1], seen))] += 1
            previous = (index, seen)

    def forget_traces(self, live: set[str]) -> None:
        """Drop the packets of deleted traces."""
        for key in [k for k in self._pending if k[0] not in live]:
            del self._pending[key]

    def pending(self) -> int:
        return len(self._pending)
