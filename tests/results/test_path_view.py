"""The discovery's one view (`hoptrace discover`, its --json, the web's form): each path's hops with their
time after the first crossing, and the path graph's segments with each step's median and p99."""

from __future__ import annotations

import pytest

from hoptrace.results.path_view import path_data, paths_text, segment_data
from hoptrace.v1 import api_pb2, trace_pb2

pytestmark = pytest.mark.unit


def test_segments_are_printed_with_median_p99_and_share() -> None:
    out = trace_pb2.HopSpec(name="a-eth0-out", node="host-a", dev="eth0", at="tc-egress")
    into = trace_pb2.HopSpec(name="b-eth0-in", node="host-b", dev="eth0", at="tc-ingress")
    step = api_pb2.DiscoveredSegment(
        from_hop=out, to_hop=into, packets=30, share=0.75, median_ns=12_345, p99_ns=2_500_000
    )
    result = api_pb2.DiscoverResult(
        packets=40,
        paths=[api_pb2.DiscoveredPath(packets=40, share=1.0, hops=[out, into], since_first_ns=[0, 12_000])],
        segments=[step],
    )
    assert path_data(result.paths[0])["hops"][1] == {
        "name": "b-eth0-in", "node": "host-b", "netns": "", "dev": "eth0", "at": "tc-ingress",
        "since_first_ns": 12_000,
    }  # fmt: skip
    assert segment_data(step) == {
        "from": "a-eth0-out", "to": "b-eth0-in", "packets": 30, "share": 0.75, "median_ns": 12_345,
        "p99_ns": 2_500_000, "translated": False,
    }  # fmt: skip
    lines = paths_text(result).splitlines()
    assert lines[-2] == "segments (median / p99 of each step, share of packets):"
    assert lines[-1].split() == ["a-eth0-out", "->", "b-eth0-in", "12.3us", "/", "2.50ms", "75%"]


def test_a_step_where_the_addresses_changed_says_so() -> None:
    """A discovery that followed its packets by their IDs through a translation marks that step."""
    out = trace_pb2.HopSpec(name="a-veth-c1-in", node="host-a", dev="veth-c1", at="tc-ingress")
    into = trace_pb2.HopSpec(name="a-br0-in", node="host-a", dev="br0", at="tc-ingress")
    step = api_pb2.DiscoveredSegment(
        from_hop=out, to_hop=into, packets=5, share=1.0, median_ns=4_000, p99_ns=9_000, translated=True
    )
    result = api_pb2.DiscoverResult(
        packets=5,
        paths=[api_pb2.DiscoveredPath(packets=5, share=1.0, hops=[out, into], since_first_ns=[0, 4_000])],
        segments=[step],
    )
    assert segment_data(step)["translated"] is True
    last = paths_text(result).splitlines()[-1]
    assert last.endswith("100%  addresses translated (followed by the packets' IDs)"), last
