"""join.py: joining one packet's records across hops and nodes inside the reorder window."""

from __future__ import annotations

import random

import pytest
from collector_helpers import pid, rec

from hoptrace.collector.catalog import TraceCatalog
from hoptrace.collector.join import HopJoiner, JoinConfig, join_hops
from hoptrace.collector.records import RecordFlag
from hoptrace.spec.actions import FIELD_NUMBERS

pytestmark = pytest.mark.unit  # pure code: make test-unit runs it without root

HOPS = ["a-egress", "bridge", "b-ingress"]
NODES = ["node-a", "node-a", "node-b"]
SEC = 1_000_000_000


def catalog() -> TraceCatalog:
    c = TraceCatalog()
    c.set_trace("t", HOPS, NODES)
    return c


def test_join_across_hops_and_nodes_in_shuffled_order() -> None:
    rng = random.Random(1)
    per_hop = {
        h: [rec(SEC + i * 1000 + h * 10 + i % 5, pid(i + 1), h, flow=i % 4) for i in range(300)]
        for h in range(3)
    }
    # node-a reports hops 0 and 1, node-b hop 2; batches of 7 records, delivered in shuffled order
    node_a = per_hop[0] + per_hop[1]
    rng.shuffle(node_a)
    node_b = list(per_hop[2])
    rng.shuffle(node_b)
    batches = [("t", "node-a", node_a[i : i + 7]) for i in range(0, len(node_a), 7)]
    batches += [("t", "node-b", node_b[i : i + 7]) for i in range(0, len(node_b), 7)]
    rng.shuffle(batches)
    packets, stats = join_hops(batches, catalog())
    assert stats.records == 900
    assert stats.packets == stats.complete == 300
    assert stats.incomplete == stats.collisions == 0
    by_id = {p.packet_id: p for p in packets}
    for i in range(300):
        p = by_id[pid(i + 1)]
        assert p.complete and p.origin == 7
        assert p.times == [SEC + i * 1000 + h * 10 + i % 5 for h in range(3)]
        assert p.nodes == NODES


def test_complete_packet_is_emitted_as_soon_as_every_hop_is_seen() -> None:
    j = HopJoiner(catalog())
    assert j.join_hops("t", "node-b", [rec(SEC + 30, pid(1), 2)]) == []
    assert j.join_hops("t", "node-a", [rec(SEC + 10, pid(1), 0)]) == []
    out = j.join_hops("t", "node-a", [rec(SEC + 20, pid(1), 1)])
    assert len(out) == 1 and out[0].complete and out[0].times == [SEC + 10, SEC + 20, SEC + 30]
    assert j.pending() == 0


def test_window_expiry_emits_incomplete_and_counts_the_missing_hop() -> None:
    j = HopJoiner(catalog(), JoinConfig(window_ns=2 * SEC))
    # 5 packets never reach b-ingress (hop 2)
    assert j.join_hops("t", "node-a", [rec(SEC + i, pid(i + 1), h) for i in range(5) for h in (0, 1)]) == []
    # newer traffic 1.9 s later, node-b's heartbeat as far: still inside the window
    j.heard_from("node-b", SEC + 19 * SEC // 10)
    assert j.join_hops("t", "node-a", [rec(SEC + 19 * SEC // 10, pid(100), 0)]) == []
    # and 2.1 s later on both nodes: the first five expire
    j.heard_from("node-b", SEC + 21 * SEC // 10)
    out = j.join_hops("t", "node-a", [rec(SEC + 21 * SEC // 10, pid(101), 0)])
    assert sorted(p.packet_id for p in out) == [pid(i + 1) for i in range(5)]
    assert all(not p.complete and p.times[2] is None for p in out)
    assert j.stats.incomplete == 5
    assert j.stats.missing[("t", "b-ingress")] == 5
    assert j.stats.missing[("t", "a-egress")] == 0


def test_heartbeats_expire_an_idle_window() -> None:
    j = HopJoiner(catalog(), JoinConfig(window_ns=2 * SEC))
    j.join_hops("t", "node-a", [rec(SEC, pid(1), 0)], now_ns=50 * SEC)
    for node in ("node-a", "node-b"):  # agents send counters every second even without traffic
        j.heard_from(node, 2 * SEC, now_ns=51 * SEC)
    assert j.tick(now_ns=51 * SEC) == []
    for node in ("node-a", "node-b"):
        j.heard_from(node, 3 * SEC + 1, now_ns=52 * SEC)
    out = j.tick(now_ns=52 * SEC)
    assert [p.packet_id for p in out] == [pid(1)]
    assert j.stats.missing[("t", "bridge")] == 1 and j.stats.missing[("t", "b-ingress")] == 1


def test_a_lagging_node_holds_packets_back_instead_of_cutting_them() -> None:
    """After a collector restart one agent drains its backlog first: the other's hops must still join."""
    j = HopJoiner(catalog(), JoinConfig(window_ns=2 * SEC))
    j.heard_from("node-b", SEC, now_ns=100 * SEC)  # node-b reconnected, its backlog still to come
    old = [rec(SEC + i, pid(i + 1), h) for i in range(5) for h in (0, 1)]
    assert j.join_hops("t", "node-a", old, now_ns=100 * SEC) == []
    # node-a is current
    assert j.join_hops("t", "node-a", [rec(30 * SEC, pid(99), 0)], now_ns=100 * SEC) == []
    out = j.join_hops("t", "node-b", [rec(SEC + 50 + i, pid(i + 1), 2) for i in range(5)], now_ns=101 * SEC)
    assert sorted(p.packet_id for p in out) == [pid(i + 1) for i in range(5)]
    assert all(p.complete for p in out) and j.stats.incomplete == 0


def test_a_node_silent_past_the_timeout_is_not_waited_for() -> None:
    j = HopJoiner(catalog(), JoinConfig(window_ns=2 * SEC, node_timeout_ns=10 * SEC))
    j.join_hops("t", "node-a", [rec(SEC, pid(1), 0)], now_ns=50 * SEC)
    j.heard_from("node-b", SEC, now_ns=50 * SEC)
    assert j.tick(now_ns=59 * SEC) == []  # node-b may still send
    out = j.tick(now_ns=61 * SEC)  # both silent past the timeout: the collector's clock moves the window
    assert [p.packet_id for p in out] == [pid(1)]
    assert j.stats.missing[("t", "bridge")] == 1 and j.stats.missing[("t", "b-ingress")] == 1


def test_segments_of_one_packet_at_a_hop_are_that_packet_at_its_first_segment() -> None:
    """A TCP packet cut into wire segments after hop 0 (GSO): hop 1 records each, with the same ID. One
    packet, complete, its time at hop 1 its earliest segment's, whatever order the records came in."""
    j = HopJoiner(catalog())
    tcp = int(RecordFlag.TCP)
    j.join_hops("t", "node-a", [rec(SEC, pid(9), 0, flags=tcp)])
    out = j.join_hops("t", "node-a", [rec(SEC + 7, pid(9), 1, flags=tcp), rec(SEC + 5, pid(9), 1, flags=tcp)])
    assert out == [] and j.stats.repeats == 1
    out = j.join_hops("t", "node-b", [rec(SEC + 20, pid(9), 2, flags=tcp)])
    assert len(out) == 1 and out[0].complete and out[0].times == [SEC, SEC + 5, SEC + 20]
    # the last segments reach the last hop after the packet left complete: still that packet, not a new one
    out = j.join_hops(
        "t", "node-b", [rec(SEC + 21, pid(9), 2, flags=tcp), rec(SEC + 22, pid(9), 2, flags=tcp)]
    )
    assert out == [] and j.pending() == 0 and j.stats.repeats == 3
    assert j.stats.incomplete == j.stats.collisions == 0
    # two sweeps later (a sweep is window/16 apart) the packet is forgotten (bounded memory)
    for sweep in (1, 2):
        j.heard_from("node-a", sweep * 10 * SEC)
        j.heard_from("node-b", sweep * 10 * SEC)
        j.expire()
    st = j._traces["t"]
    assert st.completed == st.completed_before == set()


GSO_SEGS = FIELD_NUMBERS["gso_segs"]
TCP = int(RecordFlag.TCP)
SEGMENTED = TCP | int(RecordFlag.VALUES)


def gso(ts: int, packet: int, hop: int, segs: int) -> tuple[tuple, tuple[tuple, dict[int, int]]]:
    """A record of a skb standing for `segs` wire segments, and its recorded gso_segs value."""
    r = rec(ts, pid(packet), hop, flags=SEGMENTED)
    return r, (r, {GSO_SEGS: segs})


def test_a_cut_packet_is_complete_once_every_hop_saw_every_segment() -> None:
    """Hop 0 sees the GSO skb (3 segments), hop 1 after the cut each segment, hop 2 after GRO one skb of 2 and
    the third alone. Shuffled within the node's batches: one packet, complete only once each hop saw all 3,
    at each hop its first record's time; 3 segments counted, none missing."""
    j = HopJoiner(catalog())
    r0, v0 = gso(SEC, 9, 0, 3)
    assert j.join_hops("t", "node-a", [rec(SEC + 7, pid(9), 1, flags=TCP), r0], values=[v0]) == []
    assert j.join_hops("t", "node-a", [rec(SEC + 5, pid(9), 1, flags=TCP)]) == []
    r2, v2 = gso(SEC + 30, 9, 2, 2)
    # every hop seen, not every segment: it waits
    assert j.join_hops("t", "node-b", [r2], values=[v2]) == [] and j.pending() == 1
    assert j.join_hops("t", "node-a", [rec(SEC + 9, pid(9), 1, flags=TCP)]) == []
    out = j.join_hops("t", "node-b", [rec(SEC + 31, pid(9), 2, flags=TCP)])
    assert len(out) == 1 and out[0].complete, out
    assert out[0].times == [SEC, SEC + 5, SEC + 30] and out[0].segments == (3, 3, 3)
    assert j.stats.segments == 3 and j.stats.segments_missing == 0 and j.stats.incomplete == 0
    # a plain packet beside it: one segment, no segment counts
    j.join_hops("t", "node-a", [rec(SEC, pid(10), 0, flags=TCP), rec(SEC + 1, pid(10), 1, flags=TCP)])
    out = j.join_hops("t", "node-b", [rec(SEC + 2, pid(10), 2, flags=TCP)])
    assert len(out) == 1 and out[0].complete and out[0].segments is None and j.stats.segments == 4


def test_segments_before_the_count_are_counted_too() -> None:
    """The segments after the cut come first (their node's batch before the sender's): they are counted one
    each, and the packet is whole once the record of the whole skb says how many there were."""
    j = HopJoiner(catalog())
    j.join_hops("t", "node-b", [rec(SEC + 40 + i, pid(6), 2, flags=TCP) for i in range(3)])
    j.join_hops("t", "node-a", [rec(SEC + 10 + i, pid(6), 1, flags=TCP) for i in range(3)])
    assert j.pending() == 1
    r0, v0 = gso(SEC, 6, 0, 3)
    out = j.join_hops("t", "node-a", [r0], values=[v0])
    assert len(out) == 1 and out[0].complete and out[0].segments == (3, 3, 3)
    assert out[0].times == [SEC, SEC + 10, SEC + 40] and j.stats.segments == 3


def test_a_lost_segment_loses_the_packet_where_it_went_missing() -> None:
    """Hop 0 sends 4 segments' skb, hop 1 sees 4 after the cut, hop 2 only 3 (one lost between 1 and 2). The
    packet is lost at hop 2: no latency pairs hop 1's first segment with hop 2's (they need not be the same
    segment), and the missing segment is counted."""
    j = HopJoiner(catalog())
    r0, v0 = gso(SEC, 4, 0, 4)
    j.join_hops(
        "t", "node-a", [r0, *(rec(SEC + 10 + i, pid(4), 1, flags=TCP) for i in range(4))], values=[v0]
    )
    out = j.join_hops("t", "node-b", [rec(SEC + 40 + i, pid(4), 2, flags=TCP) for i in range(1, 4)])
    assert out == [] and j.pending() == 1  # every hop seen, hop 2 not whole: waits for the window
    j.heard_from("node-a", 10 * SEC)
    j.heard_from("node-b", 10 * SEC)
    out = j.tick()
    assert len(out) == 1 and not out[0].complete and out[0].segments == (4, 4, 3)
    assert out[0].times == [SEC, SEC + 10, None]
    assert j.stats.segments == 4 and j.stats.segments_missing == 1
    assert j.stats.missing[("t", "b-ingress")] == 1  # the whole packet never reached it


def test_a_hop_that_could_not_count_is_taken_whole() -> None:
    """Hop 1 is a kernel hop at a tap's receive: the guest's GSO skb has no count there (UNCOUNTED, one record
    for 4 segments). The packet is complete, lost nowhere; a later segment loss is still seen (hop 2)."""
    j = HopJoiner(catalog())
    uncounted = TCP | int(RecordFlag.UNCOUNTED)
    for packet, at_hop_2 in ((7, 4), (8, 3)):
        r0, v0 = gso(SEC, packet, 0, 4)
        j.join_hops("t", "node-a", [r0, rec(SEC + 10, pid(packet), 1, flags=uncounted)], values=[v0])
        out = j.join_hops(
            "t", "node-b", [rec(SEC + 40 + i, pid(packet), 2, flags=TCP) for i in range(at_hop_2)]
        )
        if at_hop_2 == 4:
            assert len(out) == 1 and out[0].complete and out[0].segments == (4, 4, 4), out
    j.heard_from("node-a", 10 * SEC)
    j.heard_from("node-b", 10 * SEC)
    out = j.tick()
    assert len(out) == 1 and not out[0].complete and out[0].times == [SEC, SEC + 10, None], out
    assert j.stats.segments == 8 and j.stats.segments_missing == 1


def test_a_duplicate_without_a_segment_count_is_the_packet_once() -> None:
    """No record says more than one segment (a duplicate, or a path whose hops all lie after the cut): the
    packet's records at a hop are its first's repeats, it is complete once every hop saw it, one segment."""
    j = HopJoiner(catalog())
    j.join_hops("t", "node-a", [rec(SEC, pid(5), 0), rec(SEC + 1, pid(5), 1), rec(SEC + 2, pid(5), 1)])
    out = j.join_hops("t", "node-b", [rec(SEC + 3, pid(5), 2)])
    assert len(out) == 1 and out[0].complete and out[0].segments is None
    assert j.stats.segments == 1 and j.stats.segments_missing == 0 and j.stats.repeats == 1


def test_a_udp_packet_seen_again_after_it_left_starts_anew() -> None:
    """UDP packets are never cut with their ID (the tagger leaves GSO skbs untagged): none is remembered once
    complete, so a record after that is a packet of its own."""
    j = HopJoiner(catalog())
    j.join_hops("t", "node-a", [rec(SEC, pid(3), 0), rec(SEC + 1, pid(3), 1)])
    assert len(j.join_hops("t", "node-b", [rec(SEC + 2, pid(3), 2)])) == 1
    j.join_hops("t", "node-b", [rec(SEC + 3, pid(3), 2)])
    assert j.pending() == 1 and j._traces["t"].completed == set()


def test_same_id_of_another_origin_is_another_packet() -> None:
    j = HopJoiner(catalog())
    j.join_hops("t", "node-a", [rec(SEC, pid(1), 0, flow=1), rec(SEC, pid(1, salt=8), 0, flow=1)])
    assert j.pending() == 2 and j.stats.collisions == 0


def test_a_packet_whose_addresses_were_translated_is_one_packet() -> None:
    """A DNAT between hops 0 and 1 changes the 5-tuple (and its hash) later hops see: the ID joins them."""
    j = HopJoiner(catalog())
    j.join_hops("t", "node-a", [rec(SEC, pid(1), 0, flow=1), rec(SEC + 5, pid(1), 1, flow=2)])
    out = j.join_hops("t", "node-b", [rec(SEC + 9, pid(1), 2, flow=2)])
    assert len(out) == 1 and out[0].complete and out[0].times == [SEC, SEC + 5, SEC + 9]
    assert j.stats.collisions == 0


def test_max_entries_evicts_the_oldest() -> None:
    j = HopJoiner(catalog(), JoinConfig(max_entries=10))
    out = j.join_hops("t", "node-a", [rec(SEC + i, pid(i + 1), 0) for i in range(15)])
    assert j.pending() == 10
    assert sorted(p.packet_id for p in out) == [pid(i + 1) for i in range(5)]
    assert j.stats.evicted == 5


def test_clock_delta_maps_to_master_time() -> None:
    j = HopJoiner(catalog())
    j.join_hops("t", "node-a", [rec(100, pid(1), 0), rec(200, pid(1), 1)], delta_ns=10 * SEC)
    out = j.join_hops("t", "node-b", [rec(5_000, pid(1), 2)], delta_ns=10 * SEC - 4_000)
    assert out[0].times == [10 * SEC + 100, 10 * SEC + 200, 10 * SEC + 1_000]


def test_hop_beyond_the_path_is_dropped_and_counted() -> None:
    j = HopJoiner(catalog())
    j.join_hops("t", "node-a", [rec(SEC, pid(1), 3)])
    assert j.stats.out_of_path == 1 and j.pending() == 0


def test_trace_without_a_known_path_joins_until_expiry() -> None:
    c = TraceCatalog()
    c.learn_hop("u", 0, "x", "n1")  # learned from HopCounters only
    c.learn_hop("u", 1, "y", "n2")
    j = HopJoiner(c, JoinConfig(window_ns=SEC))
    out = j.join_hops("u", "n1", [rec(SEC, pid(1), 0), rec(SEC, pid(2), 0)])
    out += j.join_hops("u", "n2", [rec(SEC + 10, pid(1), 1)])
    # hop index 12 grows the slot array; pending packets keep what they had
    out += j.join_hops("u", "n3", [rec(SEC + 20, pid(1), 12)])
    assert out == []
    out = j.flush()
    by_id = {p.packet_id: p for p in out}
    assert set(by_id) == {pid(1), pid(2)}
    assert all(not p.complete for p in out)
    t1 = by_id[pid(1)].times
    assert (t1[0], t1[1], t1[12]) == (SEC, SEC + 10, SEC + 20)
    assert by_id[pid(1)].nodes[12] == "n3" and by_id[pid(1)].nodes[0] == "n1"
    assert j.stats.missing[("u", "y")] == 1  # pid 2 never reached the learned hop y


def test_path_learned_late_keeps_pending_packets() -> None:
    c = TraceCatalog()
    j = HopJoiner(c)
    assert j.join_hops("t", "node-a", [rec(SEC, pid(1), 0), rec(SEC + 1, pid(1), 1)]) == []
    c.set_trace("t", HOPS, NODES)  # the dispatcher's catalog arrives
    out = j.join_hops("t", "node-b", [rec(SEC + 2, pid(1), 2)])
    assert len(out) == 1 and out[0].complete and out[0].times == [SEC, SEC + 1, SEC + 2]


def test_single_hop_trace_completes_immediately() -> None:
    c = TraceCatalog()
    c.set_trace("one", ["only"], ["n"])
    j = HopJoiner(c)
    out = j.join_hops("one", "n", [rec(SEC, pid(1), 0)])
    assert len(out) == 1 and out[0].complete


def test_path_change_emits_packets_that_do_not_fit() -> None:
    c = catalog()
    j = HopJoiner(c)
    j.join_hops("t", "node-a", [rec(SEC, pid(1), 2), rec(SEC, pid(3), 0)])
    c.set_trace("t", ["a", "b"], ["n", "n"])
    out = j.join_hops("t", "n", [rec(SEC + 1, pid(2), 0)])
    assert [p.packet_id for p in out] == [pid(1)]  # seen at hop 2, which the new path lacks
    out = j.join_hops("t", "n", [rec(SEC + 2, pid(2), 1)])
    assert out[0].complete and out[0].times == [SEC + 1, SEC + 2]
    assert j.pending() == 1  # pid 3 kept


# -- hops attached after the packet passed them ------------------------------------------------------------


def test_a_hop_attached_after_the_packet_passed_it_is_marked_not_lost() -> None:
    """A packet missing at a hop whose attach time is later than its time at the nearest hop before that saw
    it may have passed it unwatched: that hop's bit is set in `before_attach`. A hop attached by then is not
    marked: the packet never reached it."""
    j = HopJoiner(catalog())
    j.hop_attached("t", "node-a", 1, {"a-egress": SEC, "bridge": 2 * SEC})
    j.hop_attached("t", "node-b", 1, {"b-ingress": 3 * SEC})
    t0 = 2 * SEC + SEC // 2
    j.join_hops(
        "t",
        "node-a",
        [
            # in flight while b-ingress attached: seen at both of node-a's hops before its attach time
            rec(t0, pid(1), 0),
            rec(t0 + 10, pid(1), 1),
            # tagged before bridge attached, and gone before b-ingress attached: missing at both
            rec(SEC + SEC // 2, pid(2), 0),
            # missing at bridge, attached long before: lost there (so end to end too)
            rec(t0, pid(3), 0),
            # tagged before b-ingress attached but at bridge after: lost between bridge and b-ingress
            rec(3 * SEC - 10, pid(4), 0),
            rec(3 * SEC + 10, pid(4), 1),
            # every hop attached: lost
            rec(4 * SEC, pid(5), 0),
            rec(4 * SEC + 10, pid(5), 1),
        ],
    )
    out = {p.packet_id: p for p in j.flush()}
    assert {i: out[pid(i)].before_attach for i in range(1, 6)} == {1: 0b100, 2: 0b110, 3: 0b100, 4: 0, 5: 0}
    assert not any(p.complete or p.cut for p in out.values())
    assert j.stats.before_attach == 3 and j.stats.incomplete == 5


def test_a_hop_no_node_has_named_yet_is_not_attached() -> None:
    """Once one node gave its attach times, a hop no node named is not attached (its node has not applied
    the trace yet); a trace no node gave them for is joined as before: every hop always attached."""
    j = HopJoiner(catalog())
    j.join_hops("t", "node-a", [rec(SEC, pid(1), 0), rec(SEC + 10, pid(1), 1)])
    assert [p.before_attach for p in j.flush()] == [0]

    j.hop_attached("t", "node-a", 1, {"a-egress": 0, "bridge": 0})  # 0: an agent that does not say when
    j.join_hops("t", "node-a", [rec(SEC, pid(2), 0), rec(SEC + 10, pid(2), 1)])
    assert [p.before_attach for p in j.flush()] == [0b100]
    j.hop_attached("t", "node-b", 1, {"b-ingress": 0})
    j.join_hops("t", "node-a", [rec(SEC, pid(3), 0), rec(SEC + 10, pid(3), 1)])
    assert [p.before_attach for p in j.flush()] == [0]


def test_attach_times_follow_each_nodes_newest_generation() -> None:
    """Each node's newest generation says which of its hops are attached and since when: an older one
    arriving late changes nothing, a newer one replaces it (a hop it no longer names is not attached), and
    a deleted trace's times are forgotten."""
    j = HopJoiner(catalog())
    j.hop_attached("t", "node-a", 5, {"a-egress": SEC, "bridge": SEC})
    j.hop_attached("t", "node-b", 5, {"b-ingress": 4 * SEC})
    j.hop_attached("t", "node-b", 4, {"b-ingress": SEC})  # late: the generation it replaced
    packet = [rec(3 * SEC, pid(1), 0), rec(3 * SEC + 10, pid(1), 1)]
    j.join_hops("t", "node-a", packet)
    assert [p.before_attach for p in j.flush()] == [0b100]

    j.hop_attached("t", "node-b", 6, {"b-ingress": 2 * SEC})
    j.join_hops("t", "node-a", [rec(3 * SEC, pid(2), 0), rec(3 * SEC + 10, pid(2), 1)])
    assert [p.before_attach for p in j.flush()] == [0]
    j.hop_attached("t", "node-a", 7, {"a-egress": SEC})  # generation 7 runs no bridge on node-a
    j.join_hops("t", "node-a", [rec(3 * SEC, pid(3), 0)])
    assert [p.before_attach for p in j.flush()] == [0b010]

    j.forget_traces({"other"})
    j.join_hops("t", "node-a", [rec(3 * SEC, pid(4), 0)])
    assert [p.before_attach for p in j.flush()] == [0]
