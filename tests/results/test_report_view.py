"""report_view.py: the report's one view, from the API's message to the dict and the text table (the report
read from InfluxDB is checked in tests/collector/test_integration.py)."""

from __future__ import annotations

import pytest

from hoptrace.results.format import format_ns
from hoptrace.results.report_view import loss_text, most_time_text, render_text, report_from_proto
from hoptrace.v1 import api_pb2

pytestmark = pytest.mark.unit  # pure code: make test-unit runs it without root


def stats(a: str, b: str, count: int = 3, **fields: object) -> api_pb2.SegmentStats:
    values = {
        "to": b,
        "count": count,
        "mean_ns": 1500.0,
        "p50_ns": 1200,
        "p90_ns": 2000,
        "p99_ns": 2500,
        "max_ns": 3_000_000,
        "incomplete": 1,
        **fields,
    }
    segment = api_pb2.SegmentStats(**values)
    setattr(segment, "from", a)  # noqa: B010 - `from` is a Python keyword
    return segment


def test_text_table_and_dict() -> None:
    message = api_pb2.Report(
        trace="demo",
        packets=4,
        complete=3,
        segments=[
            stats("a", "b", loss_count=2, loss_rate=0.02, jitter_ns=350.0, same_node=True),
            stats("b", "c", below_clock_bound=True, tracer_lost=7, before_attach=4),
        ],
        end_to_end=stats("a", "c", before_attach=4),
        hops=[api_pb2.HopThroughput(hop="a", packets_per_s=100.0, bytes_per_s=12_800.0)],
    )
    report = report_from_proto(message)
    lines = render_text(report).splitlines()
    assert lines[0] == "trace demo: 4 packets, 3 complete"
    assert lines[1] == "most time: a > b (100 % of p50, 100 % of p99)"  # a tie: the first in path order
    head = ["segment", "count", "mean", "p50", "p90", "p99", "max", "incomplete", "loss", "loss%", "jitter"]
    assert lines[2].split() == head
    assert lines[3].split() == [
        *["a", ">", "b", "[node]", "3", "1.5us", "1.2us", "2.0us", "2.5us", "3.00ms", "1"],
        *["2", "2.00", "350ns"],
    ]
    assert lines[4].split()[:6] == ["b", ">", "c", "(within", "clock", "bound)"]
    assert lines[5].startswith("end to end (a > c)")
    assert len({len(line) for line in lines[2:6]}) == 1  # aligned columns
    assert lines[7].split() == ["hop", "packets/s", "bytes/s"] and lines[8].split() == [
        "a",
        "100.0",
        "12800.0",
    ]
    assert (
        "note: b > c: p50 ≤ ±? (within clock bound): the collector has not measured its nodes' clocks yet"
        in lines
    )
    assert "note: b > c: 7 records lost by the tracer (not counted)" in lines
    in_flight = "before it was attached, in flight while the trace was applied (not counted as loss)"
    assert f"note: b > c: 4 packets passed c {in_flight}" in lines
    assert f"note: a > c: 4 packets passed a hop {in_flight}" in lines
    assert format_ns(850) == "850ns" and format_ns(2.5e9) == "2.50s"
    assert [(s["from"], s["to"]) for s in report["segments"]] == [("a", "b"), ("b", "c")]
    assert (report["end_to_end"]["p99_ns"], report["packets"], report["complete"]) == (2500, 4, 3)
    first, second = report["segments"]
    assert (first["loss_count"], first["loss_rate"], first["jitter_ns"]) == (2, 0.02, 350)
    assert first["same_node"] and second["below_clock_bound"] and second["tracer_lost"] == 7
    assert (first["before_attach"], second["before_attach"], report["end_to_end"]["before_attach"]) == (
        0,
        4,
        4,
    )
    assert report["hops"] == [
        {
            "hop": "a",
            "packets_per_s": 100.0,
            "bytes_per_s": 12_800.0,
            "counts": [],
            "histograms": [],
            "recorded": [],
        }
    ]


def test_a_latency_within_the_clock_bound_reads_as_such_and_json_keeps_the_numbers() -> None:
    """A cross-host segment whose p50 came out at -231 ns with clocks good to ±170 ns."""
    wire = stats(
        "a-wire-out",
        "b-wire-in",
        count=1000,
        mean_ns=-100.0,
        p50_ns=-231,
        p90_ns=80,
        p99_ns=400,
        max_ns=2_000,
        below_clock_bound=True,
        clock_bound_ns=170,
    )
    veth = stats("a-c1-out", "a-wire-out", count=1000, p50_ns=3_700, p99_ns=10_000, same_node=True)
    e2e = stats("a-c1-out", "b-wire-in", count=1000, p50_ns=4_000, p99_ns=12_500, clock_bound_ns=170)
    report = report_from_proto(
        api_pb2.Report(trace="t", packets=1000, complete=1000, segments=[veth, wire], end_to_end=e2e)
    )
    text = render_text(report)
    lines = text.splitlines()
    assert lines[1] == "most time: a-c1-out > a-wire-out (92 % of p50, 80 % of p99)"
    row = next(line for line in lines if line.startswith("a-wire-out > b-wire-in"))
    assert row.split()[3:11] == [
        *["(within", "clock", "bound)", "1000"],
        *["≤", "±170ns", "≤", "±170ns"],  # mean -100 ns, p50 -231 ns
    ]
    cells = row.split("  ")
    assert [c.strip() for c in cells if c.strip().startswith("≤")] == ["≤ ±170ns"] * 3  # + p90 (80 ns)
    numbers = row.split("(within clock bound)")[1]
    assert "400ns" in numbers and "2.0us" in numbers and "-" not in numbers  # never a negative number
    assert (
        "note: a-wire-out > b-wire-in: p50 ≤ ±170ns (within clock bound): its two nodes' clocks agree only "
        "that closely, so its latency cannot be told from zero" in lines
    )
    # the JSON keeps the raw numbers and adds the bound
    data = report
    assert data["segments"][1]["p50_ns"] == -231 and data["segments"][1]["clock_bound_ns"] == 170
    assert data["segments"][1]["below_clock_bound"] and data["segments"][0]["clock_bound_ns"] == 0


def test_no_summary_without_packets_end_to_end() -> None:
    empty = stats("a", "c", count=0, p50_ns=0, p99_ns=0)
    report = report_from_proto(api_pb2.Report(trace="t", end_to_end=empty))
    assert most_time_text(report) is None
    assert not any(line.startswith("most time") for line in render_text(report).splitlines())


def test_hops_named_by_workloads_show_their_container_and_pod() -> None:
    report = report_from_proto(
        api_pb2.Report(
            trace="demo",
            packets=1,
            complete=1,
            segments=[stats("a", "b")],
            end_to_end=stats("a", "b"),
            hops=[
                api_pb2.HopThroughput(hop="a", packets_per_s=1.0, bytes_per_s=64.0, container="web"),
                api_pb2.HopThroughput(
                    hop="b", packets_per_s=1.0, bytes_per_s=64.0, container="app", pod="shop/web-0"
                ),
            ],
        )
    )
    lines = render_text(report).splitlines()
    table = lines[lines.index("") + 1 :]
    assert table[0].split() == ["hop", "packets/s", "bytes/s", "container", "/", "pod"]
    assert table[1].endswith("container web") and table[2].endswith("pod shop/web-0 (container app)")
    # the dict has them where a hop has them
    assert [(h["hop"], h.get("container"), h.get("pod")) for h in report["hops"]] == [
        ("a", "web", None),
        ("b", "app", "shop/web-0"),
    ]


def test_lost_packets_say_where_and_why() -> None:
    """drops: true: each segment's loss with the kernel's reasons, most first, and what no kernel reported."""
    report = api_pb2.Report(trace="t", packets=100, complete=84)
    wire = report.segments.add(to="b-in", count=87, loss_count=13, loss_rate=0.13)
    setattr(wire, "from", "a-out")  # noqa: B010 - `from` is a Python keyword
    wire.drops.add(node="host-b", reason="NETFILTER_DROP", count=9, function="nft_do_chain")
    wire.drops.add(node="host-a", reason="NETFILTER_DROP", count=1)  # an older agent: no function
    read = report.segments.add(to="b-read", count=84, loss_count=3, loss_rate=0.03)
    setattr(read, "from", "b-in")  # noqa: B010
    read.drops.add(node="host-b", reason="NO_SOCKET", count=3, function="__udp4_lib_rcv")
    report.end_to_end.CopyFrom(api_pb2.SegmentStats(to="b-read", count=84, loss_count=16))
    setattr(report.end_to_end, "from", "a-out")  # noqa: B010
    data = report_from_proto(report)
    assert data["segments"][0]["drops"] == [
        {"node": "host-b", "reason": "NETFILTER_DROP", "function": "nft_do_chain", "count": 9},
        {"node": "host-a", "reason": "NETFILTER_DROP", "function": "", "count": 1},
    ]
    assert loss_text(data["segments"][0]) == (
        "lost 13: 9 NETFILTER_DROP on host-b (nft_do_chain), 1 NETFILTER_DROP on host-a, 3 not seen dropped"
    )
    assert loss_text(data["segments"][1]) == "lost 3: 3 NO_SOCKET on host-b (__udp4_lib_rcv)"
    assert loss_text(data["end_to_end"]) == "lost 16"  # no drops end to end in this report
    lines = render_text(data).splitlines()
    start = lines.index("drops (where the kernel freed the lost packets, and why):")
    assert lines[start + 1 : start + 4] == [
        "  a-out > b-in: lost 13: 9 NETFILTER_DROP on host-b (nft_do_chain), 1 NETFILTER_DROP on host-a,"
        " 3 not seen dropped",
        "  b-in > b-read: lost 3: 3 NO_SOCKET on host-b (__udp4_lib_rcv)",
        "  end to end: lost 16",
    ]
    report.segments[0].ClearField("drops")
    report.segments[1].ClearField("drops")
    assert "drops (" not in render_text(report_from_proto(report))  # a trace without drops: no section


def test_addresses_each_hop_saw_and_the_translations_between_them() -> None:
    report = api_pb2.Report(
        trace="svc",
        segments=[stats("client", "node"), stats("node", "backend")],
        end_to_end=stats("client", "backend"),
        addresses=[
            api_pb2.HopAddresses(
                hop="client", protocol="udp", source="198.18.0.1", destination="198.18.99.9:8080", packets=9
            ),
            api_pb2.HopAddresses(
                hop="node", protocol="udp", source="198.18.0.1", destination="198.18.2.2:11111", packets=9
            ),
        ],
        translations=[
            api_pb2.AddressTranslation(
                from_hop="client",
                to_hop="node",
                kind="dnat",
                before="198.18.99.9:8080",
                after="198.18.2.2:11111",
                packets=9,
            )
        ],
    )
    data = report_from_proto(report)
    assert data["translations"] == [
        {
            "from": "client",
            "to": "node",
            "kind": "dnat",
            "before": "198.18.99.9:8080",
            "after": "198.18.2.2:11111",
            "packets": 9,
        }
    ]
    assert data["addresses"][1] == {
        "hop": "node",
        "protocol": "udp",
        "source": "198.18.0.1",
        "destination": "198.18.2.2:11111",
        "packets": 9,
    }
    text = render_text(data)
    assert "  client: udp 198.18.0.1 > 198.18.99.9:8080 (9 packets)" in text
    assert "  client > node: DNAT 198.18.99.9:8080 -> 198.18.2.2:11111 (9 packets)" in text
    assert "translations" not in render_text(report_from_proto(api_pb2.Report(trace="svc")))
