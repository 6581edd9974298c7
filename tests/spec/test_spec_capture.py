"""The capture action (`capture: N`): where it is refused and why, naming the spec field; a good one
round-trips and compiles to the hop's typed HopActions.capture (the agent's act_capture)."""

from __future__ import annotations

import pytest
from spec_fixtures import ACTIONS_HEAD, example_registrations, with_items

from hoptrace import kernel_abi
from hoptrace.dispatcher.compile import build_plans, refused_action_fields
from hoptrace.spec import SpecError, actions, check_spec, load_spec, spec_to_json, spec_to_yaml
from hoptrace.v1 import agent_pb2

pytestmark = pytest.mark.unit

CAPTURING = (
    "{name: a-wire, node: host-a, at: tc-egress, dev: wire0, actions: [timestamp, {capture: 96}]}",
    "{name: b-xdp, node: host-b, at: xdp, dev: wire0, actions: [timestamp, {capture: 1}]}",
    "{name: b-rx, node: host-b, at: 'tracepoint:net:netif_receive_skb', dev: wire0,"
    " actions: [timestamp, {record: [len]}, {capture: 128}]}",
    "{name: b-c2, node: host-b, at: cgroup-ingress, cgroup: app, actions: [timestamp, {capture: 64}]}",
)


def _errors(*hops: str) -> list[str]:
    with pytest.raises(SpecError) as caught:
        load_spec(with_items(ACTIONS_HEAD, *hops), example_registrations())
    return [str(error) for error in caught.value.errors]


def test_the_bound_is_the_kernels() -> None:
    assert actions.CAPTURE_MAX == kernel_abi.CAPTURE_MAX == 128


def test_capture_round_trips_and_compiles_to_the_hops_constant() -> None:
    spec = load_spec(with_items(ACTIONS_HEAD, *CAPTURING), example_registrations())
    assert load_spec(spec_to_yaml(spec)) == spec
    assert load_spec(spec_to_json(spec)) == spec
    assert [a.bytes for hop in spec.hops for a in hop.actions if a.kind == "capture"] == [96, 1, 128, 64]
    plans = build_plans(check_spec(spec, example_registrations()), 1)
    capture = {hop.name: hop.actions.capture for plan in plans.values() for hop in plan.hops}
    assert capture == {"a-out": 0, "a-wire": 96, "b-xdp": 1, "b-rx": 128, "b-c2": 64}
    # An agent's report that its verifier refused the action names it by its spec field.
    assert refused_action_fields(spec.hops, 3, agent_pb2.HopActions(capture=128)) == ["hops[3].actions[2]"]


@pytest.mark.parametrize(
    ("hop", "expected"),
    [
        (
            "{name: x, node: host-b, at: tc-ingress, dev: wire0, actions: [timestamp, {capture: 129}]}",
            "hops[1].actions[1]: capture: must be 1 to 128 bytes, got 129",
        ),
        (
            "{name: x, node: host-b, at: tc-ingress, dev: wire0, actions: [timestamp, {capture: 0}]}",
            "hops[1].actions[1]: capture: must be 1 to 128 bytes, got 0",
        ),
        (
            "{name: x, node: host-b, at: tc-ingress, dev: wire0, actions: [timestamp, {capture: -5}]}",
            "hops[1].actions[1]: capture: must be 1 to 128 bytes, got -5",
        ),
        (
            "{name: x, node: host-b, at: tc-ingress, dev: wire0, actions: [timestamp, capture]}",
            "hops[1].actions[1]: capture: must be a number of bytes (1 to 128), got None",
        ),
        (
            "{name: x, node: host-b, at: tc-ingress, dev: wire0, actions: [timestamp, {capture: all}]}",
            "hops[1].actions[1]: capture: must be a number of bytes (1 to 128), got 'all'",
        ),
        (
            "{name: x, node: host-b, at: tc-ingress, dev: wire0, actions: [timestamp, {capture: true}]}",
            "hops[1].actions[1]: capture: must be a number of bytes (1 to 128), got True",
        ),
        (
            "{name: x, node: host-b, at: tc-ingress, dev: wire0,"
            " actions: [timestamp, {capture: 64}, {capture: 96}]}",
            "hops[1].actions[2]: a hop has one capture action (also hops[1].actions[1])",
        ),
        (
            "{name: x, node: host-b, at: tc-ingress, dev: wire0,"
            " actions: [timestamp, {capture: 64, by: cpu}]}",
            "hops[1].actions[1]: capture takes no other keys, got 'by'",
        ),
        (
            "{name: x, node: host-b, at: socket-read, actions: [timestamp, {capture: 64}]}",
            "hops[1].actions[1]: capture is not available at socket-read hops: they find a packet parsed"
            " earlier by its ID, with no bytes of it (capture at a device or kernel hop before it)",
        ),
    ],
)
def test_bad_captures_name_their_field(hop: str, expected: str) -> None:
    errors = _errors(hop)
    assert any(error.startswith(expected) for error in errors), errors
    assert len(errors) == 1, errors  # one problem, said once


def test_a_uprobe_hop_has_no_bytes_to_capture() -> None:
    errors = _errors(
        "{name: read, node: host-b, at: socket-read}",
        "{name: app, node: host-b, at: 'uprobe:/usr/bin/server:handle', actions: [timestamp, {capture: 64}]}",
    )
    expected = "hops[2].actions[1]: capture is not available at uprobe hops: they find a packet parsed"
    assert any(error.startswith(expected) for error in errors), errors
    assert len(errors) == 1, errors  # one problem, said once
