"""trace_view.py: an applied trace's node states as `hoptrace trace ls` and the web's trace pages say them: a
node is active only with every hop and event attached, and each other node is named with its reasons."""

from __future__ import annotations

import pytest

from hoptrace.results.trace_view import node_states, status_text
from hoptrace.v1 import agent_pb2, api_pb2, trace_pb2

pytestmark = pytest.mark.unit


def trace_of(*statuses: agent_pb2.TraceStatus) -> api_pb2.Trace:
    spec = trace_pb2.TraceSpec(
        name="t",
        hops=[
            trace_pb2.HopSpec(name="a-veth-in", node="host-a"),
            trace_pb2.HopSpec(name="b-wire-in", node="host-b"),
        ],
        events=[trace_pb2.EventSpec(name="wake", node="host-c")],
    )
    return api_pb2.Trace(spec=spec, generation=3, nodes=statuses)


def test_every_node_attached_reads_active() -> None:
    hop = agent_pb2.HopStatus(name="a-veth-in", attached=True)
    event = agent_pb2.EventStatus(name="wake", attached=True)
    ok = agent_pb2.TraceStatus(trace="t", generation=3, active=True, hops=[hop])
    trace = trace_of(ok, ok, agent_pb2.TraceStatus(trace="t", generation=3, active=True, events=[event]))
    assert status_text(trace) == "3/3 nodes active"
    assert [state["node"] for state in node_states(trace)] == ["host-a", "host-b", "host-c"]


def test_a_lost_hop_an_unattached_event_and_a_missing_agent_are_named_by_node() -> None:
    """An active trace with a hop the agent found gone is not an active node (it was counted as one)."""
    lost = agent_pb2.HopStatus(name="a-veth-in", error="hop a-veth-in: device veth-c1 is gone from netns a")
    kept = agent_pb2.HopStatus(name="a-wire-out", attached=True)
    trace = trace_of(
        agent_pb2.TraceStatus(trace="t", generation=3, active=True, hops=[lost, kept]),
        agent_pb2.TraceStatus(trace="t", generation=3, error="node host-b: agent not connected"),
        agent_pb2.TraceStatus(
            trace="t",
            generation=3,
            active=True,
            events=[agent_pb2.EventStatus(name="wake", error="no such tp")],
        ),
    )
    assert status_text(trace) == (
        "0/3 nodes active: host-a: hop a-veth-in: device veth-c1 is gone from netns a; "
        "host-b: agent not connected; host-c: event wake: no such tp"
    )
    host_a = node_states(trace)[0]
    assert (host_a["active"], [hop["attached"] for hop in host_a["hops"]]) == (False, [False, True])


def test_what_would_not_outlive_its_agent_is_named_by_part() -> None:
    """The agent's not_kept (a kind it cannot pin on this kernel, a tagger or state not pinned) is named per
    hop, event and trace, and does not make a node inactive: the trace runs, only a restart would lose it."""
    kprobe = agent_pb2.HopStatus(name="a-veth-in", attached=True, not_kept="kprobe links cannot be pinned")
    pinned = agent_pb2.HopStatus(name="a-wire-out", attached=True)
    trace = trace_of(
        agent_pb2.TraceStatus(
            trace="t", generation=3, active=True, hops=[kprobe, pinned], not_kept="tcp tagging: no bpffs"
        ),
        agent_pb2.TraceStatus(trace="t", generation=3, active=True, hops=[pinned]),
        agent_pb2.TraceStatus(
            trace="t",
            generation=3,
            active=True,
            events=[agent_pb2.EventStatus(name="wake", attached=True, not_kept="not pinned (EPERM)")],
        ),
    )
    assert status_text(trace) == "3/3 nodes active"
    host_a, host_b, host_c = node_states(trace)
    assert host_a["not_kept"] == [
        "hop a-veth-in: kprobe links cannot be pinned",
        "trace: tcp tagging: no bpffs",
    ]
    assert host_a["not_kept_beside_hops"] == ["trace: tcp tagging: no bpffs"]
    assert [hop["not_kept"] for hop in host_a["hops"]] == ["kprobe links cannot be pinned", ""]
    assert host_b["not_kept"] == []
    assert host_c["not_kept"] == ["event wake: not pinned (EPERM)"]
