"""The path graph's layout and SVG (web/pathgraph.py) on crafted discoveries and traces: parallel paths on
their own rows, shared crossings once, hosts and namespaces round their vertices, and a trace's segment
without packets saying so instead of a number."""

from __future__ import annotations

import re

import pytest

from hoptrace.v1 import api_pb2, trace_pb2
from hoptrace.web import create_app, pathgraph

pytestmark = pytest.mark.unit


def hop(name: str, node: str, dev: str, at: str = "tc-egress", netns: str = "") -> trace_pb2.HopSpec:
    return trace_pb2.HopSpec(name=name, node=node, dev=dev, at=at, netns=netns)


C1 = hop("a-c1-eth0-out", "host-a", "eth0", netns="/run/netns/t-c1")
BR = hop("a-br0-in", "host-a", "br0", "tc-ingress")
W0 = hop("a-w0-out", "host-a", "w0")
W1 = hop("a-w1-out", "host-a", "w1")
RX = hop("b-rx-in", "host-b", "rx", "tc-ingress")


def segment(a: trace_pb2.HopSpec, b: trace_pb2.HopSpec, packets: int, median: int, p99: int):
    return api_pb2.DiscoveredSegment(
        from_hop=a, to_hop=b, packets=packets, share=packets / 100, median_ns=median, p99_ns=p99
    )


def ecmp_result() -> api_pb2.DiscoverResult:
    return api_pb2.DiscoverResult(
        packets=100,
        paths=[
            api_pb2.DiscoveredPath(packets=70, share=0.7, hops=[C1, BR, W0, RX]),
            api_pb2.DiscoveredPath(packets=30, share=0.3, hops=[C1, BR, W1, RX]),
        ],
        segments=[
            segment(C1, BR, 100, 2_500, 9_000),
            segment(BR, W0, 70, 1_200, 3_000),
            segment(W0, RX, 70, 41_000, 88_000),
            segment(BR, W1, 30, 1_300, 3_100),
            segment(W1, RX, 30, 1_500_000, 2_000_000),
        ],
    )


def test_parallel_paths_share_their_common_crossings_and_branch_on_a_row_of_their_own() -> None:
    graph = pathgraph.from_discovery(ecmp_result())
    grid = {v.dev: (v.column, v.row) for v in graph.vertices}
    assert grid == {"eth0": (0, 0), "br0": (1, 0), "w0": (2, 0), "w1": (2, 1), "rx": (3, 0)}
    assert [(h.label, h.node) for h in graph.hosts] == [("host-a", "host-a"), ("host-b", "host-b")]
    host_a, host_b = graph.hosts
    assert host_a.x + host_a.w <= host_b.x  # hosts side by side, in path order
    assert [(n.label, n.node) for n in graph.namespaces] == [("t-c1", "host-a")]
    edges = {(e.source.dev, e.target.dev): e for e in graph.edges}
    assert (edges[("w1", "rx")].median_text, edges[("w1", "rx")].p99_text) == ("1.50ms", "2.00ms")
    assert edges[("br0", "w1")].color != edges[("br0", "w0")].color  # path 2's own edge in its colour
    assert edges[("eth0", "br0")].share == 1.0


def test_the_svg_carries_every_vertex_and_edge_with_its_numbers() -> None:
    app = create_app({"TESTING": True, "SECRET_KEY": "x"})
    with app.test_request_context():
        html = pathgraph.render(pathgraph.from_discovery(ecmp_result()), applicable=True)
    assert re.findall(r'class="vertex" data-id="[^"]*" data-name="([^"]+)"', html) == [
        "a-c1-eth0-out", "a-br0-in", "a-w0-out", "a-w1-out", "b-rx-in",
    ]  # fmt: skip
    medians = re.findall(r'<tspan class="median"[^>]*>([^<]+)</tspan>', html)
    assert medians == ["2.5us", "1.2us", "41.0us", "1.3us", "1.50ms"]
    assert re.findall(r'class="path-share">([^<]+)<', html) == ["70 packets (70%)", "30 packets (30%)"]
    assert html.count('class="apply-path"') == 2


def test_a_traces_segment_without_packets_says_so() -> None:
    spec = trace_pb2.TraceSpec(name="t", hops=[C1, BR, W0])
    measured = {"from": C1.name, "to": BR.name, "count": 12, "p50_ns": 900, "p99_ns": 4_000}
    graph = pathgraph.from_trace(spec, [{**measured, "display": {"p50_ns": "900ns", "p99_ns": "4.0us"}}])
    assert [(e.median_text, e.p99_text) for e in graph.edges] == [("900ns", "4.0us"), ("no packets", "")]
    assert [v.column for v in graph.vertices] == [0, 1, 2] and {v.row for v in graph.vertices} == {0}
