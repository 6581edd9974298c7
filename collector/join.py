"""Join stage: joins each packet's records across hops and nodes.

Key: (trace, packet_id). The dispatcher gives each applied trace its own ID origin (the ID's top 8 bits) and
only the trace's first hop writes IDs, so an ID names one packet of one trace; the 5-tuple is not in the key
because an address translation (DNAT, SNAT) changes it between hops. Records of one packet wait in a bounded
reorder window; a packet is emitted

* complete, as soon as every hop of the trace's path was seen (path known from the `TraceCatalog`);
* incomplete, when its window expires: the watermark passed `window_ns` beyond the master time of the packet's
  first record. Each hop missing from it is counted (`JoinStats.missing`), and those it passed before they
  were attached are marked (`JoinedPacket.before_attach`, below). The watermark is the *slowest*
  node's: every node has its own (the newest master time of its records and of its counter heartbeats, which
  agents send every second), and the join's is the minimum over the nodes it expects (those of the traces'
  paths, and any heard from) that are alive. A node that lags (an agent draining its backlog after a
  collector restart, a slow link) holds packets back instead of having them cut; a node silent for
  `node_timeout_ns` of the collector's own time is taken as gone and no longer waited for. While the catalog
  awaits its paths (`TraceCatalog.awaiting_paths`: a restarted collector that has the agents' backlog before
  the dispatcher's specs) the watermark stands still, for at most `node_timeout_ns` from the first input:
  without the paths the join knows neither which nodes to wait for nor when a packet is complete;
* never twice: a packet seen again at a hop it was already seen at is the same packet there, and its time at
  that hop is its first record's (`JoinStats.repeats`). A TCP packet's ID rides the one TCP header of a large
  (GSO) skb; where the skb is cut into wire segments (software GSO on a device without the offload, a NIC's
  TSO) every segment carries a copy of it, so a hop after the cut (before GRO merges them again, if it does)
  records each segment. Segments that come after their packet left complete are recognised for a window
  too (TCP packets only: UDP packets are never cut with their ID, their tagger leaves GSO skbs untagged);
* whole, segment for segment. A record of a skb that stands for several wire segments (before the cut, or
  after GRO merged them) carries their number as its `gso_segs` value; any other record is one segment. A
  packet's segments are the most any one hop saw of it (`JoinedPacket.segments`, the sum at each hop); a
  packet with more than one segment is complete once every hop saw all of them, and leaves as soon as a
  single record said how many there are (a hop that saw the whole skb), else when its window expires. At a
  hop that saw only some of them the packet is lost (its time there is None, its missing segments counted in
  `JoinStats.segments_missing`), so a latency is only ever taken between two hops that saw the same
  segments, each at its first: one segment's records are never paired with another's;
* when `max_entries` is reached, the oldest entries are emitted incomplete (`JoinStats.evicted`).

Hops attached after the packet passed them. A trace applied to live traffic attaches its hops one by one,
and its nodes at different moments, so a packet tagged at the first hop can pass a later one before that is
attached: it is missing there, and not lost. Each node's agent says since when each hop has watched its place
(`HopCounters.attached_ns`, mapped to master time: `hop_attached`); a missing hop whose attach time is later
than the packet's time at the nearest hop before it that saw it is one it may have passed unwatched, and is
marked in `JoinedPacket.before_attach`, which the aggregation counts apart from loss. Once any node has said
so for a trace, a hop of it no node has named yet is not attached (its node has not applied the trace, or
its counters are on the way). A trace no node has said it for (an agent that does not send the time) is
joined as if every hop had always been attached.

Drops (a trace with ``drops: true``): its drop hops' records (skb:kfree_skb on each node and namespace of the
path, `catalog.DropSite`) are no hops of the path: they never make a packet complete, and their indexes follow
the path's. Each is kept in the packet's entry, in a slot after the path's, with its node, reason (the
record's `drop_reason` value, from the batch's recorded values, named by its node's kernel) and the kernel
function that freed it (its `drop_function`, named by the batch: `records.function_name`); an incomplete
packet leaves with the earliest as `JoinedPacket.drop`, which the aggregation counts at the segment where the
packet went missing. A drop of a packet that never reaches the path's hops (or was complete already) is
counted in `JoinStats.drops_unmatched`; a freed packet whose reason is no drop (`CONSUMED`) is ignored.

Memory bound: at most `max_entries` pending packets. One entry is a key tuple (2 items), a list of
2 * hops + 2 slots and one int per timestamp seen: about 250 + 50 * hops bytes on CPython 3.11 (measured by
`bench/collector_join.py`: 330 B for 2 hops, 430 B for 4), so the default 500 000 entries of a 4-hop trace
hold about 220 MB at most. Throughput measured there: about 1.2 M hop records/s joined on one core (4 hops).

Hot path (`HopJoiner.join_hops`): one dict lookup keyed by a tuple and one list per packet; no per-record
object other than the decoded tuple and the key (trace, packet_id: the origin is the ID's top 8 bits); a
packet completed by a record is emitted inline.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

from hoptrace.collector.catalog import MAX_HOPS, TraceCatalog, TracePath
from hoptrace.collector.records import (
    F_TCP,
    F_VALUES,
    HOP_INDEX,
    ID_SEQ_BITS,
    PACKET_ID,
    TS_NS,
    Record,
    RecordedValues,
    RecordFlag,
    function_name,
)
from hoptrace.spec.actions import FIELD_NUMBERS
from hoptrace.spec.drops import DROP_REASON_FIELD, NOT_DROPS

_DROP_REASON = FIELD_NUMBERS[DROP_REASON_FIELD]
_GSO_SEGS = FIELD_NUMBERS["gso_segs"]
_F_UNCOUNTED = int(RecordFlag.UNCOUNTED)
_SEGMENT_FLAGS = F_VALUES | _F_UNCOUNTED

# Width of the per-packet slot array of a trace whose path is not known yet (grown when needed).
_UNKNOWN_WIDTH = 8


@dataclass
class JoinConfig:
    """Reorder window of the join stage."""

    window_ns: int = 2_000_000_000
    max_entries: int = 500_000
    # A node silent this long is not waited for: 3x the agents' longest reconnect backoff (plus jitter).
    node_timeout_ns: int = 30_000_000_000

    def validate(self) -> None:
        """Raise ValueError on an unusable setting."""
        if self.window_ns <= 0:
            raise ValueError(f"join window must be positive, got {self.window_ns} ns")
        if self.max_entries < 1:
            raise ValueError(f"join max_entries must be >= 1, got {self.max_entries}")


class JoinedPacket(NamedTuple):
    """One packet across its hops. `times[i]`/`nodes[i]`: master time and node at hop i (None if unseen)."""

    trace: str
    origin: int
    packet_id: int
    times: list[int | None]
    nodes: list[str | None]
    complete: bool
    # Emitted early by the collector (evicted at `max_entries`, or the first of an ID collision): a hop it
    # lacks may still have seen it, so its missing hops are tracer loss, not network loss.
    cut: bool = False
    # Bit i set: hop i is missing and was attached only after the packet's time at the nearest hop before
    # it that saw it, so the packet may have passed it unwatched (in flight while the trace was applied):
    # not lost there.
    before_attach: int = 0
    # The kernel dropped the packet after its last hop seen (`drops: true`): (node, reason name, drop hop
    # index, the kernel function that freed it, the drop's master time), the earliest of its drop hops'
    # records; None when none saw it.
    drop: tuple[str, str, int, str, int] | None = None
    # A packet of several wire segments (a GSO skb cut on the way, or merged by GRO): the segments each hop
    # of the path saw of it, the packet's own being the most; None: one segment, each hop saw it once.
    segments: tuple[int, ...] | None = None


@dataclass
class JoinStats:
    """Counters of the join stage."""

    records: int = 0
    packets: int = 0
    complete: int = 0
    incomplete: int = 0
    collisions: int = 0  # kept for the metric's sake: a repeat is one packet now (repeats)
    # records of a packet at a hop it was already seen at: the segments of a GSO skb cut on the way
    repeats: int = 0
    # wire segments of the packets emitted (a packet of one segment counts one), and those of them a hop that
    # saw the packet missed (lost on the way, or not recorded)
    segments: int = 0
    segments_missing: int = 0
    evicted: int = 0
    out_of_path: int = 0
    # (trace, hop name) -> packets emitted without that hop
    missing: Counter[tuple[str, str]] = field(default_factory=Counter)
    # packets emitted without a hop they passed before it was attached
    before_attach: int = 0
    # drop records (drops: true) of packets no hop of the path saw in the window, or complete ones
    drops_unmatched: int = 0


class _TraceState:
    __slots__ = ("path", "version", "width", "path_len", "limit", "template", "completed", "completed_before")

    def __init__(self, path: TracePath | None, width: int) -> None:
        self.path = path
        # IDs of TCP packets that left complete since the last sweep, and in the sweep before: their later
        # segments are repeats (they come microseconds after; a sweep is window/16 apart)
        self.completed: set[int] = set()
        self.completed_before: set[int] = set()
        self.version = path.version if path else 0
        known = path is not None and path.known
        self.path_len = len(path.hop_names) if known else 0  # 0: never complete before expiry
        self.width = width
        # Hop indexes from here on are no hops of the path: a known path's drop hops up to `width`.
        self.limit = self.path_len or width
        # entry layout: [ts_0 .. ts_{w-1}, node_0 .. node_{w-1}, open_watermark, hops_seen]
        self.template: list = [None] * (2 * width) + [0, 0]


class HopJoiner:
    """The join stage. Not thread-safe: the pipeline serialises calls."""

    def __init__(self, catalog: TraceCatalog | None = None, config: JoinConfig | None = None) -> None:
        self.catalog = catalog if catalog is not None else TraceCatalog()
        self.config = config or JoinConfig()
        self.config.validate()
        self.stats = JoinStats()
        # key (trace, packet_id): the origin is the ID's top 8 bits, so it needs no slot of its own
        self._pending: dict[tuple[str, int], list] = {}
        # key -> segments seen at each hop index, then the hops that could not count them (a bit each), then
        # the most one record said (`_segments_entry`): packets of several segments, or seen twice at a hop
        self._segs: dict[tuple[str, int], list[int]] = {}
        self._traces: dict[str, _TraceState] = {}
        self._watermark = 0
        self._next_sweep = 0
        self._wm_at_input = 0
        self._wall_at_input = time.monotonic_ns()
        self._started: int | None = None  # collector time of the first input (the clock callers pass)
        self._node_wm: dict[str, int] = {}  # node -> newest master time of its records or heartbeats
        self._node_heard: dict[str, int] = {}  # node -> collector monotonic time it was last heard
        # trace -> node -> (generation, {hop name: master time attached}), as the node said last
        self._attached_by_node: dict[str, dict[str, tuple[int, dict[str, int]]]] = {}
        self._attached: dict[str, dict[str, int]] = {}  # trace -> hop name -> master time attached

    @property
    def watermark_ns(self) -> int:
        """Master-time watermark: the slowest live node's (advanced by idle time, see `tick`)."""
        return self._watermark

    def heard_from(self, node: str, master_ns: int = 0, now_ns: int | None = None) -> None:
        """A node is alive, and has sent everything up to `master_ns` (0: time unknown), e.g. a heartbeat."""
        self._node_heard[node] = time.monotonic_ns() if now_ns is None else now_ns
        if master_ns > self._node_wm.get(node, 0):
            self._node_wm[node] = master_ns

    def hop_attached(self, trace: str, node: str, generation: int, attached: dict[str, int]) -> None:
        """The hops `node` runs for `trace` (at `generation`), each with the master time since which it has
        watched its place (0: always, as far as the agent says). Replaces what the node said before for an
        older or the same generation: a hop it no longer names is no longer attached there."""
        nodes = self._attached_by_node.setdefault(trace, {})
        known = nodes.get(node)
        if known is not None and (known[0] > generation or known == (generation, attached)):
            return
        nodes[node] = (generation, dict(attached))
        merged: dict[str, int] = {}
        for _, hops in nodes.values():
            merged.update(hops)
        self._attached[trace] = merged

    def forget_traces(self, live: set[str]) -> None:
        """Drop the attach times of the traces not in `live` (deleted: applied again, it attaches anew)."""
        for trace in [t for t in self._attached if t not in live]:
            del self._attached[trace]
            del self._attached_by_node[trace]

    def _before_attach(self, trace: str, path: TracePath | None, times: list[int | None], n: int) -> int:
        """The `JoinedPacket.before_attach` bits of an incomplete packet's first `n` hops."""
        attached = self._attached.get(trace)
        if attached is None or path is None:
            return 0
        bits = 0
        last = None  # the packet's latest time at the hops before i that saw it
        for i in range(n):
            t = times[i]
            if t is not None:
                if last is None or t > last:
                    last = t
            elif last is not None:
                at = attached.get(path.hop_name(i))
                if at is None or at > last:
                    bits |= 1 << i
        return bits

    def _advance_watermark(self, now: int) -> None:
        """Move the watermark to the slowest live expected node's, never backwards."""
        timeout = self.config.node_timeout_ns
        if self._started is None:
            self._started = now
        young = now - self._started < timeout
        if young and self.catalog.awaiting_paths:
            return  # the paths are on their way: nothing expires before they name the nodes and hops
        slowest = None
        for node in self.catalog.nodes() | self._node_heard.keys():
            heard = self._node_heard.get(node)
            if heard is None:
                if young:  # a node of a trace not heard yet (just restarted): wait for it a while
                    return
                continue
            if now - heard > timeout:
                continue  # gone: do not wait for it
            wm = self._node_wm.get(node, 0)
            slowest = wm if slowest is None or wm < slowest else slowest
        if slowest is not None and slowest > self._watermark:
            self._watermark = slowest

    def pending(self) -> int:
        """Number of packets waiting in the window."""
        return len(self._pending)

    # -- trace state ---------------------------------------------------------------------------------------

    def _state(self, trace: str, out: list[JoinedPacket]) -> _TraceState:
        st = self._traces.get(trace)
        path = self.catalog.get(trace)
        if st is not None and (path is None or path.version == st.version):
            return st
        if path is not None and path.known:
            width = len(path.hop_names) + len(path.drop_hops)
        else:
            width = max(_UNKNOWN_WIDTH, len(path.hop_names) if path else 0, st.width if st else 0)
        new = _TraceState(path, width)
        self._traces[trace] = new
        if st is not None and st.width != width:
            out.extend(self._rewidth(trace, st, new))
        return new

    def _grow(self, trace: str, st: _TraceState, hop: int, out: list[JoinedPacket]) -> _TraceState:
        """A trace of unknown path met a hop index beyond its slot array: widen it."""
        new = _TraceState(st.path, min(MAX_HOPS, max(hop + 1, 2 * st.width)))
        self._traces[trace] = new
        out.extend(self._rewidth(trace, st, new))
        return new

    def _rewidth(self, trace: str, old: _TraceState, new: _TraceState) -> list[JoinedPacket]:
        """Move a trace's pending entries to a new slot width (rare: a path learned or changed).

        Entries using a hop the new width lacks are emitted as they are. Runs over the whole window.
        """
        out: list[JoinedPacket] = []
        ow, nw = old.width, new.width
        for key in [k for k in self._pending if k[0] == trace]:
            e = self._pending[key]
            if any(t is not None for t in e[nw:ow]):
                del self._pending[key]
                out.append(self._emit(key, e, old))
                continue
            pad = [None] * (nw - ow) if nw > ow else []
            self._pending[key] = e[: min(ow, nw)] + pad + e[ow : ow + min(ow, nw)] + pad + e[-2:]
        return out

    # -- emission ------------------------------------------------------------------------------------------

    def _emit(self, key: tuple[str, int], e: list, st: _TraceState, cut: bool = False) -> JoinedPacket:
        w = st.width
        pw = st.limit  # the path's slots; drop hops' after them
        times = e[:pw]
        stats = self.stats
        sg = self._segs.pop(key, None) if self._segs else None
        segments = None
        complete = st.path_len > 0 and e[-1] == st.path_len
        if sg is None or sg[-1] == 1:
            # one segment (seen twice at a hop with no record saying more: a duplicate, its first counts)
            stats.segments += 1
        else:
            # the packet's segments: the most any hop saw; a hop that saw fewer saw part of it, not the packet
            uncounted = sg[-2]
            whole = max(sg[-1], *(got for i, got in enumerate(sg[:pw]) if not uncounted >> i & 1))
            # a hop that could not count (HOPTRACE_F_UNCOUNTED) is taken whole where it saw the packet
            segments = tuple(whole if got and uncounted >> i & 1 else got for i, got in enumerate(sg[:pw]))
            stats.segments += whole
            for i, got in enumerate(segments):
                if got and got < whole:
                    stats.segments_missing += whole - got
                    times[i] = None
                    complete = False
        stats.packets += 1
        unattached = 0
        if complete:
            stats.complete += 1
        else:
            stats.incomplete += 1
            path = st.path
            n = min(st.path_len or (len(path.hop_names) if path else 0), w)
            for i in range(n):
                if times[i] is None:
                    stats.missing[(key[0], path.hop_name(i))] += 1
            unattached = self._before_attach(key[0], path, times, n)
            if unattached:
                stats.before_attach += 1
        drop = None
        if not complete and pw < w:
            dropped = [i for i in range(pw, w) if e[i] is not None]
            if dropped:
                first = min(dropped, key=e.__getitem__)
                node, reason, function = e[w + first]
                drop = (node, reason, first, function, e[first])
        return JoinedPacket(
            key[0],
            key[1] >> ID_SEQ_BITS,
            key[1],
            times,
            e[w : w + pw],
            complete,
            cut and not complete,
            unattached,
            drop,
            segments,
        )

    # -- the hot path ------------------------------------------------------------------------------------

    def join_hops(
        self,
        trace: str,
        node: str,
        records: Iterable[Record],
        delta_ns: int = 0,
        now_ns: int | None = None,
        drift: float = 0.0,
        ref_mono_ns: int = 0,
        values: Iterable[RecordedValues] = (),
        functions: Mapping[int, str] | None = None,
    ) -> list[JoinedPacket]:
        """Join one batch of records (one trace, one node) and return the packets this completes or expires.

        Master time of a record: `ts + delta_ns - drift * (ts - ref_mono_ns)` (`clock.NodeMapping`).
        `now_ns` is the collector's monotonic clock (default: now), used only to advance the watermark while
        idle. `values`: the batch's recorded values, where its drop hops' records have their reasons and
        functions, which `functions` names (`DecodedBatch.functions`).
        """
        out: list[JoinedPacket] = []
        st = self._state(trace, out)
        width = st.width
        limit = st.limit
        plen = st.path_len
        tmpl = st.template
        known = plen > 0
        pending = self._pending
        get = pending.get
        newest = 0
        n = 0
        repeats = 0
        dropped = 0
        completed = 0
        done, done_before = st.completed, st.completed_before
        make = tuple.__new__  # JoinedPacket without its Python-level __new__ (the hot path's one object)
        reasons: dict[tuple[int, int, int], dict[int, int]] | None = None
        # (ts, packet ID, hop) -> the wire segments a record stands for, where it says (its gso_segs value)
        counts: dict[tuple[int, int, int], int] | None = None
        segs_of = self._segs
        for ts, pid, _flow_hash, _ifindex, _wire_len, hop, _slot, _cpu, flags in records:
            n += 1
            segs = 1
            uncounted = 0
            if flags & _SEGMENT_FLAGS:
                if flags & F_VALUES:
                    if counts is None:
                        counts = {
                            (r[TS_NS], r[PACKET_ID], r[HOP_INDEX]): v[_GSO_SEGS]
                            for r, v in values
                            if v.get(_GSO_SEGS)
                        }
                    segs = counts.get((ts, pid, hop), 1)
                uncounted = flags & _F_UNCOUNTED
            if hop >= limit:
                if hop < width:  # a drop hop of a known path
                    if reasons is None:
                        reasons = {(r[TS_NS], r[PACKET_ID], r[HOP_INDEX]): v for r, v in values}
                    t = ts + delta_ns - (round(drift * (ts - ref_mono_ns)) if drift else 0)
                    drop_values = reasons.get((ts, pid, hop), {})
                    self._note_drop(st, (trace, pid), hop, t, node, drop_values, functions or {})
                    continue
                if known or hop >= MAX_HOPS:
                    dropped += 1
                    continue
                st = self._grow(trace, st, hop, out)
                width, tmpl, limit = st.width, st.template, st.limit
            t = ts + delta_ns
            if drift:
                t -= round(drift * (ts - ref_mono_ns))
            if t > newest:
                newest = t
            key = (trace, pid)
            e = get(key)
            if e is not None:
                sg = segs_of.get(key) if segs_of else None
                if e[hop] is None:
                    if sg is None and (segs > 1 or uncounted):
                        sg = segs_of[key] = _segments_entry(e)
                    e[hop] = t
                    e[width + hop] = node
                    seen = e[-1] + 1
                    if sg is not None:
                        sg[hop] += segs
                        if uncounted:
                            sg[-2] |= 1 << hop
                        if segs > sg[-1]:
                            sg[-1] = segs
                        e[-1] = seen
                        if seen == plen and (sg[-1] == 1 or _whole(sg, plen)):
                            del pending[key]
                            out.append(self._emit(key, e, st))
                            if flags & F_TCP:
                                done.add(pid)
                        continue
                    if seen == plen:  # complete: what _emit does for it, inline
                        del pending[key]
                        completed += 1
                        if flags & F_TCP:
                            done.add(pid)
                        out.append(
                            make(
                                JoinedPacket,
                                (
                                    trace,
                                    pid >> ID_SEQ_BITS,
                                    pid,
                                    e[:plen],
                                    e[width : width + plen],
                                    True,
                                    False,
                                    0,
                                    None,
                                    None,
                                ),
                            )
                        )
                    else:
                        e[-1] = seen
                    continue
                # Seen at this hop already: another segment of the packet; its first is its time here.
                repeats += 1
                if t < e[hop]:
                    e[hop] = t
                if sg is None:
                    sg = segs_of[key] = _segments_entry(e)
                sg[hop] += segs
                if uncounted:
                    sg[-2] |= 1 << hop
                if segs > sg[-1]:
                    sg[-1] = segs
                if e[-1] == plen and _whole(sg, plen):
                    del pending[key]
                    out.append(self._emit(key, e, st))
                    if flags & F_TCP:
                        done.add(pid)
                continue
            if (done or done_before) and (pid in done or pid in done_before):  # a segment of one that left
                repeats += 1
                continue
            e = tmpl.copy()
            e[hop] = t
            e[width + hop] = node
            e[-2] = t  # the window runs from the packet's first record
            e[-1] = 1
            if segs > 1 or uncounted:
                sg = segs_of[key] = [0] * (MAX_HOPS + 2)
                sg[hop] = sg[-1] = segs
                if uncounted:
                    sg[-2] = 1 << hop
            if plen == 1:
                out.append(self._emit(key, e, st))
            else:
                pending[key] = e
        now = time.monotonic_ns() if now_ns is None else now_ns
        self.heard_from(node, newest, now)
        self._advance_watermark(now)
        wm = self._watermark
        self._wm_at_input = wm
        self._wall_at_input = now
        stats = self.stats
        stats.records += n
        stats.packets += completed
        stats.complete += completed
        stats.segments += completed  # one each: a packet of several leaves through _emit
        stats.repeats += repeats
        stats.out_of_path += dropped
        if wm >= self._next_sweep or len(pending) > self.config.max_entries:
            out.extend(self.expire())
        return out

    def _note_drop(
        self,
        st: _TraceState,
        key: tuple[str, int],
        hop: int,
        t: int,
        node: str,
        drop_values: dict[int, int],
        functions: Mapping[int, str],
    ) -> None:
        """A drop hop's record, with its recorded values (the reason, the function by the batch's
        `functions`): kept in the packet's entry (a new one when the packet has none yet: its path records
        may come later from other nodes), the earliest per drop hop."""
        value = drop_values.get(_DROP_REASON, 0)
        path = st.path
        site = path.drop_site(hop) if path is not None else None
        reason = site.reason_name(value) if site is not None else f"reason{value}"
        if reason in NOT_DROPS:
            return
        e = self._pending.get(key)
        if e is None:
            e = self._pending[key] = st.template.copy()
            e[-2] = t  # the window runs from the packet's first record
        if e[hop] is None or t < e[hop]:
            e[hop] = t
            e[st.width + hop] = (node, reason, function_name(drop_values, functions))

    # -- expiry --------------------------------------------------------------------------------------------

    def expire(self) -> list[JoinedPacket]:
        """Emit the packets whose window has passed, and the oldest beyond `max_entries`."""
        out: list[JoinedPacket] = []
        pending = self._pending
        window = self.config.window_ns
        cutoff = self._watermark - window
        self._next_sweep = self._watermark + window // 16
        for trace in list(self._traces):
            # a path learned since the trace's last records (the catalog's first specs after a restart):
            # its waiting packets leave on it
            st = self._state(trace, out)
            st.completed_before, st.completed = st.completed, set()
        excess = len(pending) - self.config.max_entries
        expired: list[tuple[str, int, int]] = []
        # Entries sit in creation order, which follows their first record's time closely (each node sends in
        # time order), so the expired ones are taken as a prefix: one that is not expired ends the sweep.
        for key, e in pending.items():
            if e[-2] > cutoff and len(expired) >= excess:
                break
            expired.append(key)
        if not expired:
            return out
        evicted = 0
        traces = self._traces
        for key in expired:
            e = pending.pop(key)
            if not e[-1]:  # drop records alone: no hop of the path saw the packet (or it left complete)
                self.stats.drops_unmatched += 1
                continue
            if e[-2] > cutoff:
                evicted += 1
            out.append(self._emit(key, e, traces[key[0]], cut=e[-2] > cutoff))
        self.stats.evicted += evicted
        return out

    def tick(self, now_ns: int | None = None) -> list[JoinedPacket]:
        """Advance the watermark by the time elapsed since the last input, then expire.

        While records flow the watermark follows them; when they stop, master time is assumed to advance at
        the rate of the collector's monotonic clock, so the last packets still leave within the window.
        """
        now = time.monotonic_ns() if now_ns is None else now_ns
        self._advance_watermark(now)
        # With nobody left to wait for (every node gone), master time advances with the collector's clock,
        # so the last packets still leave.
        alive = any(now - heard <= self.config.node_timeout_ns for heard in self._node_heard.values())
        idle = now - self._wall_at_input
        if not alive and idle > 0 and self._wm_at_input + idle > self._watermark:
            self._watermark = self._wm_at_input + idle
        return self.expire()

    def flush(self) -> list[JoinedPacket]:
        """Emit every pending packet (shutdown)."""
        out: list[JoinedPacket] = []
        for trace in list(self._traces):
            self._state(trace, out)  # on the trace's path as the catalog has it now
        traces = self._traces
        out += [self._emit(k, e, traces[k[0]]) for k, e in self._pending.items() if e[-1]]
        self.stats.drops_unmatched += len(self._pending) - len(out)
        self._pending.clear()
        return out


def _segments_entry(e: list) -> list[int]:
    """A packet's segment counts from its entry as it is: one at each hop that saw it, no hop that could not
    count, one the most a record said."""
    sg = [0] * (MAX_HOPS + 2)
    hops = (len(e) - 2) // 2
    for i in range(hops):
        if e[i] is not None:
            sg[i] = 1
    sg[-1] = 1
    return sg


def _whole(sg: list[int], plen: int) -> bool:
    """Has every hop of the path seen every segment a record said the packet has (more than one)? Where no
    record said more (no hop saw the whole skb: each segment alone, or a duplicate), a packet's later records
    at a hop are its first's repeats, and it is whole once every hop saw it (the callers' test)."""
    whole, uncounted = sg[-1], sg[-2]
    return whole > 1 and all(sg[i] == whole or uncounted >> i & 1 for i in range(plen))


def join_hops(
    batches: Iterable[tuple[str, str, Iterable[Record]]],
    catalog: TraceCatalog | None = None,
    config: JoinConfig | None = None,
) -> tuple[list[JoinedPacket], JoinStats]:
    """Join a finite sequence of `(trace, node, records)` batches (timestamps already on the master clock).

    Returns every packet (the rest of the window is flushed at the end) and the join counters.
    """
    joiner = HopJoiner(catalog, config)
    out: list[JoinedPacket] = []
    for trace, node, records in batches:
        out.extend(joiner.join_hops(trace, node, records))
    out.extend(joiner.flush())
    return out, joiner.stats
