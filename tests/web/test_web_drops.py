"""The results page's drops (a trace with `drops: true`): each segment's loss with the kernel's reason, the
node and the kernel function that freed the packets, the line `hoptrace report` prints."""

from __future__ import annotations

import pytest

from hoptrace.results.report_view import report_from_proto
from hoptrace.v1 import api_pb2
from hoptrace.web.results import drops_html

pytestmark = pytest.mark.unit  # pure code: make test-unit runs it without root


def test_drops_name_reason_node_and_function() -> None:
    report = api_pb2.Report(trace="t", packets=100, complete=88)
    wire = report.segments.add(to="b-in", count=88, loss_count=12)
    setattr(wire, "from", "a-out")  # noqa: B010 - `from` is a Python keyword
    wire.drops.add(node="hy", reason="NETFILTER_DROP", count=9, function="nf_hook_slow")
    wire.drops.add(node="cy", reason="NO_SOCKET", count=3, function="unknown")
    report.end_to_end.CopyFrom(api_pb2.SegmentStats(to="b-in", count=88, loss_count=12))
    setattr(report.end_to_end, "from", "a-out")  # noqa: B010
    html = drops_html(report_from_proto(report))
    assert (
        "<li>a-out → b-in: lost 12: 9 NETFILTER_DROP on hy (nf_hook_slow), 3 NO_SOCKET on cy (unknown)</li>"
        in html
    )
    assert "<li>end to end: lost 12</li>" in html
