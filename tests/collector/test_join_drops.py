"""drops: true in the collector: each drop record (a node's skb:kfree_skb hop, with its kernel's reason and
the function that freed the packet) tied to the segment where its packet was lost, named by that node's own
kernel and agent, through the pipeline into `segment_drops` points and Prometheus."""

from __future__ import annotations

import pytest
from collector_helpers import pid, rec
from test_metrics import ListExporter, by_segment

from hoptrace.collector.catalog import DropSite, TraceCatalog
from hoptrace.collector.pipeline import CollectorPipeline
from hoptrace.collector.records import VALUES_STRUCT, RecordFlag, decode_batch, pack_records, records_pb2
from hoptrace.collector.schema import END_TO_END, SEGMENT_DROPS
from hoptrace.v1 import counters_pb2

pytestmark = pytest.mark.unit  # pure code: make test-unit runs it without root

SEC = 1_000_000_000
BASE = 1_700_000_000 * SEC
HOPS = ["a-out", "b-in", "b-read"]
NODES = ["host-a", "host-b", "host-b"]
# The two kernels number their reasons differently: 12 is NETFILTER_DROP on host-a, IP_CSUM on host-b.
REASONS_A = {2: "NOT_SPECIFIED", 3: "NO_SOCKET", 12: "NETFILTER_DROP"}
REASONS_B = {1: "CONSUMED", 2: "NOT_SPECIFIED", 3: "NO_SOCKET", 12: "IP_CSUM", 13: "NETFILTER_DROP"}
DROP_A, DROP_B = 3, 4  # the drop hops' indexes, after the path's
# The functions' IDs the agent writes in place of their addresses (any number but 0: no function), and the
# names the batch carries for them.
FUNCTIONS = {0x5EED0001: "nft_do_chain", 0x5EED0002: "__udp4_lib_rcv"}
FUNCTION_IDS = {name: number for number, name in FUNCTIONS.items()}


def drop_batch(node: str, drops: list[tuple[int, int, int, str | None]]) -> records_pb2.RecordBatch:
    """A batch of drop records: (ts, packet ID, reason value, function), each with its recorded drop_reason
    and drop_function (the function's ID; 0 for "unknown", none at all for None: an older agent's)."""
    hop = DROP_A if node == "host-a" else DROP_B
    records = [rec(ts, packet, hop, flags=int(RecordFlag.VALUES)) for ts, packet, _, _ in drops]
    values = b"".join(
        VALUES_STRUCT.pack(counters_pb2.FIELD_DROP_REASON, 0, 0, 0, 1, reason, 0, 0, 0)
        if function is None
        else VALUES_STRUCT.pack(
            counters_pb2.FIELD_DROP_REASON,
            counters_pb2.FIELD_DROP_FUNCTION,
            0,
            0,
            2,
            reason,
            FUNCTION_IDS.get(function, 0),
            0,
            0,
        )
        for _, _, reason, function in drops
    )
    named = {number: name for number, name in FUNCTIONS.items() if any(d[3] == name for d in drops)}
    return records_pb2.RecordBatch(
        node=node, trace="t", records=pack_records(records), values=values, functions=named
    )


def path_batch(node: str, records: list) -> records_pb2.RecordBatch:
    return records_pb2.RecordBatch(node=node, trace="t", records=pack_records(records))


def test_drops_are_tied_to_the_segment_where_each_packet_was_lost() -> None:
    catalog = TraceCatalog()
    catalog.set_trace(
        "t",
        HOPS,
        NODES,
        drop_hops=[
            DropSite(DROP_A, "host-a", "drops@host-a", REASONS_A),
            DropSite(DROP_B, "host-b", "drops@host-b", REASONS_B),
        ],
    )
    out = ListExporter()
    p = CollectorPipeline(out, catalog)

    def t(seq: int, hop: int) -> int:
        return BASE + seq * 5_000_000 + hop * 10_000

    a, b, drops_b = [], [], []
    for seq in range(1, 101):
        a.append(rec(t(seq, 0), pid(seq), 0))
        if seq <= 60 or seq == 75 or 70 <= seq <= 72:  # complete, or on to b-in
            b.append(rec(t(seq, 1), pid(seq), 1))
        if seq <= 60 or seq == 75 or seq > 77:
            b.append(rec(t(seq, 2), pid(seq), 2))
        if (
            61 <= seq <= 69
        ):  # lost before b-in: netfilter on host-b, an nftables rule's (the last one unnamed)
            drops_b.append((t(seq, 1), pid(seq), 13, "nft_do_chain" if seq < 69 else "unknown"))
        if 70 <= seq <= 72:  # lost after b-in: no socket
            drops_b.append((t(seq, 2), pid(seq), 3, "__udp4_lib_rcv"))
    for seq in range(78, 101):  # complete
        b.insert(0, rec(t(seq, 1), pid(seq), 1))
    drops_b.append((t(75, 2) + 1, pid(75), 1, "__udp4_lib_rcv"))  # freed as consumed after its read: no drop
    drops_b.append((t(200, 1), pid(200), 13, "nft_do_chain"))  # a packet no hop of the path saw
    # 73, 74: lost before b-in with no drop record; 76: its drop on host-a (an older agent: no function)
    # arrives before any path record
    p.consume(decode_batch(drop_batch("host-a", [(t(76, 0) + 1, pid(76), 12, None)])))
    p.consume(decode_batch(path_batch("host-a", a)))
    p.consume(decode_batch(path_batch("host-b", b)))
    p.consume(decode_batch(drop_batch("host-b", drops_b)))
    p.flush()

    segments = by_segment(out.segments)
    lost = {name: s.loss_count for name, s in segments.items()}
    assert lost == {"a-out>b-in": 9 + 2 + 1 + 1, "b-in>b-read": 3, END_TO_END: 16}, lost
    drops: dict[str, dict[tuple[str, str, str], int]] = {}
    for point in out.measurement(SEGMENT_DROPS):
        key = (point.node, point.reason, point.function)
        drops.setdefault(point.segment, {})[key] = point.count
    wire = {
        ("host-b", "NETFILTER_DROP", "nft_do_chain"): 8,
        ("host-b", "NETFILTER_DROP", "unknown"): 1,
        ("host-a", "NETFILTER_DROP", ""): 1,  # an empty tag, which the line protocol leaves out
    }
    read = {("host-b", "NO_SOCKET", "__udp4_lib_rcv"): 3}
    assert drops == {"a-out>b-in": wire, "b-in>b-read": read, END_TO_END: {**wire, **read}}
    stats = p.stats()
    assert stats["complete"] == 60 + 1 + 23 and stats["incomplete"] == 16, stats
    assert p.joiner.stats.drops_unmatched == 1
    assert p.joiner.stats.missing[("t", "b-read")] == 16  # drop hops are never missing path hops
    assert not p.foreign_records  # each node's drop records are its own
    metrics = p.segment_metrics.render()
    line = (
        'hoptrace_segment_dropped_packets_total{function="nft_do_chain",node="host-b",reason="NETFILTER_DROP",'
        'segment="a-out>b-in",trace="t"} 8.0'
    )
    assert line in metrics, metrics
    assert (
        'function="unknown",node="host-b",reason="NETFILTER_DROP",segment="a-out>b-in",trace="t"} 1.0'
        in metrics
    )
    assert 'function="",node="host-a",reason="NETFILTER_DROP",segment="a-out>b-in",trace="t"} 1.0' in metrics
    assert (
        'function="__udp4_lib_rcv",node="host-b",reason="NO_SOCKET",segment="end_to_end",trace="t"} 3.0'
        in metrics
    )


def test_catalog_takes_drop_hops_from_the_spec() -> None:
    from hoptrace.v1 import trace_pb2

    spec = trace_pb2.TraceSpec(
        name="t",
        hops=[trace_pb2.HopSpec(name=h, node=n) for h, n in zip(HOPS, NODES, strict=True)],
        drops=True,
        drop_hops=[trace_pb2.DropHop(node="host-b", hop_index=3, name="drops@host-b", reasons=REASONS_B)],
    )
    catalog = TraceCatalog()
    catalog.set_spec(spec)
    path = catalog.get("t")
    assert path is not None and path.hop_names == tuple(HOPS)
    site = path.drop_site(3)
    assert (
        site is not None and site.reason_name(13) == "NETFILTER_DROP" and site.reason_name(99) == "reason99"
    )
    assert path.hop_name(3) == "drops@host-b" and path.hop_node(3) == "host-b"
