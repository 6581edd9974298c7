"""addresses.py: the tuples hops saw, decoded from the wire, and the translations between hops."""

from __future__ import annotations

import ipaddress

import pytest
from collector_helpers import batch, pid, rec

from hoptrace.collector.addresses import HopAddressesStage, translation
from hoptrace.collector.catalog import DropSite, TraceCatalog
from hoptrace.collector.pipeline import CollectorPipeline
from hoptrace.collector.records import (
    ADDRESSES_STRUCT,
    F_ADDRESSES,
    FiveTuple,
    RecordDecodeError,
    decode_addresses,
    decode_batch,
)
from hoptrace.collector.schema import ADDRESS_TRANSLATIONS, HOP_ADDRESSES

pytestmark = pytest.mark.unit  # pure code: make test-unit runs it without root

UDP = 17
CLIENT = FiveTuple(UDP, "198.18.0.1", 40000, "198.18.99.9", 8080)  # to the Service's address
BACKEND = FiveTuple(UDP, "198.18.0.1", 40000, "198.18.2.2", 11111)  # after kube-proxy's DNAT
MASQUERADED = FiveTuple(UDP, "198.18.2.1", 40000, "198.18.2.2", 11111)  # and a masquerade


def packed(t: FiveTuple) -> bytes:
    """struct hoptrace_addresses as a hop writes it."""
    src, dst = ipaddress.ip_address(t.source), ipaddress.ip_address(t.destination)
    return ADDRESSES_STRUCT.pack(
        src.packed.ljust(16, b"\0"),
        dst.packed.ljust(16, b"\0"),
        t.source_port,
        t.destination_port,
        t.protocol,
        src.version,
    )


def test_decode_pairs_each_described_record_with_its_tuple_in_order():
    v6 = FiveTuple(6, "fd00::1", 5555, "fd00:1::2", 80)
    records = [
        rec(1, pid(1), 0, flags=F_ADDRESSES),
        rec(2, pid(2), 0),
        rec(3, pid(65), 0, flags=F_ADDRESSES),
    ]
    got = decode_addresses(records, packed(CLIENT) + packed(v6))
    assert got == [(records[0], CLIENT), (records[2], v6)]
    assert v6.endpoint("destination") == "[fd00:1::2]:80" and v6.protocol_name == "tcp"
    with pytest.raises(RecordDecodeError, match="40 bytes of addresses for 2 records"):
        decode_addresses(records, packed(CLIENT))


def test_decode_batch_carries_the_addresses():
    msg = batch("a", "t", [rec(1, pid(1), 0, flags=F_ADDRESSES)])
    msg.addresses, msg.addresses_size = packed(BACKEND), len(packed(BACKEND))
    assert [t for _, t in decode_batch(msg).addresses] == [BACKEND]


def test_translation_names_what_changed_and_leaves_out_ports_that_stayed():
    assert translation(CLIENT, BACKEND) == ("dnat", "198.18.99.9:8080", "198.18.2.2:11111")
    assert translation(BACKEND, MASQUERADED) == ("snat", "198.18.0.1", "198.18.2.1")
    assert translation(CLIENT, MASQUERADED) == (
        "dnat+snat",
        "198.18.0.1:40000 > 198.18.99.9:8080",
        "198.18.2.1:40000 > 198.18.2.2:11111",
    )
    same_address = FiveTuple(UDP, "198.18.0.1", 40000, "198.18.99.9", 9090)
    assert translation(CLIENT, same_address) == ("dnat", "198.18.99.9:8080", "198.18.99.9:9090")


def described(hop: int, seq: int, t: FiveTuple):
    return (rec(hop * 10, pid(seq), hop, flags=F_ADDRESSES), t)


def test_stage_compares_a_packets_hops_once_it_settled():
    stage = HopAddressesStage(settle_ns=1000)
    names = ["client", "node", "backend"]
    # two packets; hop 1 (the node's egress) comes in a later batch, from another node
    stage.add(
        "t", [described(0, 1, CLIENT), described(2, 1, MASQUERADED), described(0, 65, CLIENT)], now_ns=0
    )
    stage.add("t", [described(1, 1, BACKEND), described(2, 65, MASQUERADED)], now_ns=500)
    assert stage.take_points(now_ns=1200, master_ns=7, path_hops=lambda trace: names) == []  # not settled
    points = stage.take_points(now_ns=1500, master_ns=7, path_hops=lambda trace: names)
    seen = {
        (p.tag("hop"), p.tag("source"), p.tag("destination")): p.field("packets")
        for p in points
        if p.measurement == HOP_ADDRESSES
    }
    assert seen == {
        ("client", "198.18.0.1", "198.18.99.9:8080"): 2,
        ("node", "198.18.0.1", "198.18.2.2:11111"): 1,
        ("backend", "198.18.2.1", "198.18.2.2:11111"): 2,
    }
    rewritten = {
        (p.tag("from_hop"), p.tag("to_hop"), p.tag("kind"), p.tag("before"), p.tag("after")): p.field(
            "packets"
        )
        for p in points
        if p.measurement == ADDRESS_TRANSLATIONS
    }
    assert rewritten == {
        ("client", "node", "dnat", "198.18.99.9:8080", "198.18.2.2:11111"): 1,
        ("node", "backend", "snat", "198.18.0.1", "198.18.2.1"): 1,
        # the second packet was not described at the node: one translation of both ends between its hops
        (
            "client",
            "backend",
            "dnat+snat",
            "198.18.0.1:40000 > 198.18.99.9:8080",
            "198.18.2.1:40000 > 198.18.2.2:11111",
        ): 1,
    }
    assert all(p.time_ns == 7 for p in points)
    assert stage.take_points(now_ns=9999, master_ns=8, path_hops=lambda trace: names) == []  # counted once
    # a later packet settled at the same master time is written 1 ns later, not over the first
    stage.add("t", [described(0, 129, CLIENT)], now_ns=10000)
    [point] = stage.take_points(now_ns=20000, master_ns=7, path_hops=lambda trace: names)
    assert point.time_ns == 8


def test_stage_settles_the_oldest_early_past_its_bound_and_forgets_deleted_traces():
    stage = HopAddressesStage(settle_ns=10**12, max_pending=2)
    stage.add("t", [described(0, n, CLIENT) for n in (1, 65, 129)], now_ns=0)
    assert stage.pending() == 2
    points = stage.take_points(now_ns=1, master_ns=1, path_hops=lambda trace: None)
    assert [(p.tag("hop"), p.field("packets")) for p in points] == [("hop0", 1)]
    stage.forget_traces(set())
    assert stage.pending() == 0


class ListExporter:
    def __init__(self) -> None:
        self.points = []

    def export(self, points) -> None:
        self.points.extend(points)


def test_pipeline_leaves_drop_hops_out_and_writes_translations_on_flush():
    catalog = TraceCatalog()
    catalog.set_trace("t", ["client", "backend"], ["a", "b"], drop_hops=[DropSite(2, "b", "drops-b")])
    exporter = ListExporter()
    pipeline = CollectorPipeline(exporter, catalog)
    for node, hop, t in (("a", 0, CLIENT), ("b", 1, BACKEND), ("b", 2, MASQUERADED)):  # 2: b's drop hop
        msg = batch(node, "t", [rec(100 + hop, pid(1), hop, flags=F_ADDRESSES)], seq=hop + 1)
        msg.addresses, msg.addresses_size = packed(t), ADDRESSES_STRUCT.size
        pipeline.consume(decode_batch(msg))
    pipeline.flush()
    rewritten = [p for p in exporter.points if p.measurement == ADDRESS_TRANSLATIONS]
    assert [(p.tag("from_hop"), p.tag("to_hop"), p.tag("kind"), p.field("packets")) for p in rewritten] == [
        ("client", "backend", "dnat", 1)
    ]
    assert {p.tag("hop") for p in exporter.points if p.measurement == HOP_ADDRESSES} == {"client", "backend"}
