"""A clock jump as every client shows it: `hoptrace agents` (and --json, the web), and the report's note on
the segments across the node."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from hoptrace.cli.agents import agent_row, summary_table
from hoptrace.results.agent_view import clock_data, clock_texts
from hoptrace.results.report_view import render_text, report_from_proto
from hoptrace.v1 import agent_pb2, api_pb2

pytestmark = pytest.mark.unit

AT = datetime(2026, 11, 29, 4, 0, 0, tzinfo=UTC)


def jumped_clock() -> api_pb2.NodeClockStatus:
    clock = api_pb2.NodeClockStatus(offset_ns=-5_001_200, bound_ns=4_200, measured=True, delay_ns=8_400)
    clock.measured_at.FromDatetime(AT)
    clock.last_jump.node = "host-b"
    clock.last_jump.jump_ns = -5_000_900
    clock.last_jump.allowed_ns = 18_400
    clock.last_jump.at.FromDatetime(AT)
    return clock


def test_agents_show_the_last_jump() -> None:
    clock = jumped_clock()
    assert clock_data(clock)["last_jump"] == {
        "jump_ns": -5_000_900,
        "allowed_ns": 18_400,
        "at": "2026-11-29T04:00:00+00:00",
    }
    assert clock_data(api_pb2.NodeClockStatus())["last_jump"] is None
    later = datetime(2026, 11, 29, 4, 0, 40, tzinfo=UTC)
    assert clock_texts(clock, later)["jump"] == "-5.00ms at 2026-11-29T04:00:00+00:00 (40 s ago)"
    assert clock_texts(api_pb2.NodeClockStatus())["jump"] == "-"
    agents = [
        api_pb2.Agent(registration=agent_pb2.Register(node="host-a"), clock=api_pb2.NodeClockStatus()),
        api_pb2.Agent(registration=agent_pb2.Register(node="host-b"), clock=clock),
    ]
    text = summary_table(agents, later)
    assert text.splitlines()[-1] == (
        "note: host-b clock jumped by -5.00ms at 2026-11-29T04:00:00+00:00 (40 s ago), beyond the ±18.4us "
        "its bounds allow: cross-node segments at host-b are suspect around then (hoptrace report names them)"
    )
    assert "host-a clock" not in text
    assert any(cell.startswith("-5.00ms at 2026-11-29T04:00:00+00:00") for cell in agent_row(agents[1]))


def test_the_report_notes_the_segments_across_a_jumped_node() -> None:
    report = api_pb2.Report(trace="t", packets=10, complete=10)
    segment = report.segments.add(to="b-wire-in", count=10, p50_ns=3_000)
    setattr(segment, "from", "a-wire-out")  # noqa: B010
    report.end_to_end.CopyFrom(segment)
    jump = report.clock_jumps.add(node="host-b", jump_ns=-5_000_900, allowed_ns=18_400)
    jump.segments.extend(["a-wire-out > b-wire-in"])
    jump.at.FromDatetime(AT)
    data = report_from_proto(report)
    assert data["clock_jumps"] == [
        {
            "node": "host-b",
            "jump_ns": -5_000_900,
            "allowed_ns": 18_400,
            "at": "2026-11-29T04:00:00+00:00",
            "segments": ["a-wire-out > b-wire-in"],
        }
    ]
    assert render_text(data).splitlines()[-1] == (
        "note: clock of host-b jumped by -5.00ms at 2026-11-29T04:00:00+00:00 (its bounds allow ±18.4us): "
        "segments across it are suspect: a-wire-out > b-wire-in"
    )
    assert "clock of" not in render_text(report_from_proto(api_pb2.Report(trace="t")))
