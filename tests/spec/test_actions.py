"""Hop actions in specs: each bad action or field is refused naming its spec field; good ones round-trip
(tests/dispatcher/test_dispatcher_plans.py: they compile to typed HopActions)."""

from __future__ import annotations

from pathlib import Path

import pytest
from spec_fixtures import ACTION_HOPS, ACTIONS_HEAD, example_registrations, make_registration, with_items

from hoptrace import kernel_abi
from hoptrace.spec import SpecError, actions, load_spec, spec_to_json, spec_to_yaml
from hoptrace.spec.attach import KIND_FAMILY
from hoptrace.v1 import counters_pb2

pytestmark = pytest.mark.unit


def _spec(*hops: str) -> str:
    return with_items(ACTIONS_HEAD, *hops)


def _errors(text: str, agents=None) -> list[str]:
    with pytest.raises(SpecError) as caught:
        load_spec(text, example_registrations() if agents is None else agents)
    return [str(error) for error in caught.value.errors]


def test_catalogue_is_the_generated_one_and_every_field_has_its_kinds() -> None:
    assert tuple(kernel_abi.FIELDS[1:]) == actions.FIELDS
    assert set(actions.FIELD_AVAILABILITY) == set(actions.FIELDS)
    # The proto's enum Field is generated from the same enum: names and numbers agree.
    for number, name in enumerate(kernel_abi.FIELDS):
        expected = "FIELD_UNSPECIFIED" if number == 0 else f"FIELD_{name.upper()}"
        assert counters_pb2.Field.Name(number) == expected
    families = {family for family, _ in KIND_FAMILY.values()}
    for name, where in actions.FIELD_AVAILABILITY.items():
        assert where <= families, name


def test_actions_round_trip() -> None:
    text = _spec(*ACTION_HOPS)
    spec = load_spec(text, example_registrations())
    assert load_spec(spec_to_yaml(spec)) == spec
    assert load_spec(spec_to_json(spec)) == spec


@pytest.mark.parametrize(
    ("hop", "expected"),
    [
        (
            "{name: x, node: host-b, at: xdp, dev: wire0, actions: [timestamp, {count: {by: mark}}]}",
            "hops[1].actions[1]: field 'mark' is not available at xdp hops;"
            " available: cpu, len, ifindex, latency, tos, ttl, ip_id, tcp_flags, tcp_window",
        ),
        (
            "{name: x, node: host-b, at: cgroup-ingress, cgroup: app,"
            " actions: [timestamp, {count: {by: pid}}]}",
            "hops[1].actions[1]: field 'pid' is not available at cgroup-ingress hops (only at cgroup-egress"
            " hops (where the sending task runs the program), socket-read and uprobe hops (the reader));"
            " available: cpu, len, ifindex, mark, priority, latency, netns, cgroup, queue_mapping, gso_segs,"
            " gso_size, tos, ttl, ip_id, tcp_flags, tcp_window",
        ),
        (
            "{name: x, node: host-b, at: socket-read, actions: [timestamp, {count: {by: ttl}}]}",
            "hops[1].actions[1]: field 'ttl' is not available at socket-read hops; available: cpu, len,"
            " latency, pid, rmem, backlog, comm",
        ),
        (
            "{name: x, node: host-b, at: socket-read, actions: [timestamp, {histogram: comm}]}",
            "hops[1].actions[1]: field 'comm' is a name: use count: {by: comm}",
        ),
        (
            "{name: x, node: host-b, at: tc-ingress, dev: wire0, actions: [timestamp, {count: {by: comm}}]}",
            "hops[1].actions[1]: field 'comm' is not available at tc-ingress hops;",
        ),
        (
            "{name: x, node: host-b, at: socket-read, actions: [timestamp, {record: [pid, ifindex]}]}",
            "hops[1].actions[1].record[1]: field 'ifindex' is not available at socket-read hops;",
        ),
        (
            "{name: x, node: host-b, at: tc-ingress, dev: wire0, actions: [timestamp, {count: {by: pid}}]}",
            "hops[1].actions[1]: field 'pid' is not available at tc-ingress hops (only at cgroup-egress",
        ),
        (
            "{name: x, node: host-b, at: 'tracepoint:net:netif_receive_skb', dev: wire0,"
            " actions: [timestamp, {count: {by: drop_reason}}]}",
            "hops[1].actions[1]: field 'drop_reason' is not available at tracepoint:net:netif_receive_skb"
            " hops (only at tracepoint:skb:kfree_skb hops (its reason argument)); available: cpu, len,"
            " ifindex, mark, priority, latency, netns, queue_mapping, gso_segs, gso_size, tos, ttl, ip_id,"
            " tcp_flags, tcp_window",
        ),
        (
            "{name: x, node: host-b, at: 'tracepoint:skb:kfree_skb',"
            " actions: [timestamp, {record: [drop_reason, drop_function]}]}",
            "hops[1].actions[1].record[1]: field 'drop_function' is for drops: true, whose report names where"
            " the kernel freed lost packets",
        ),
        (
            "{name: x, node: host-b, at: xdp, dev: wire0, actions: [timestamp, {histogram: gso_size}]}",
            "hops[1].actions[1]: field 'gso_size' is not available at xdp hops;",
        ),
        (
            "{name: x, node: host-b, at: tc-ingress, dev: wire0, actions: [timestamp, {histogram: colour}]}",
            "hops[1].actions[1]: unknown field 'colour'; fields: " + ", ".join(actions.FIELDS),
        ),
        (
            "{name: x, node: host-b, at: tc-ingress, dev: wire0, actions: [timestamp, sum]}",
            "hops[1].actions[1]: unknown action 'sum'; expected timestamp, count, histogram",
        ),
        (
            "{name: x, node: host-b, at: tc-ingress, dev: wire0,"
            " actions: [timestamp, {count: {by: latency}}]}",
            "hops[1].actions[1]: field 'latency' is a duration: use histogram: latency, not count by",
        ),
        (
            "{name: x, node: host-b, at: tc-ingress, dev: wire0, actions: [timestamp, count, count]}",
            "hops[1].actions[2]: a hop has one count action (also hops[1].actions[1])",
        ),
        (
            "{name: x, node: host-b, at: tc-ingress, dev: wire0, actions: [count]}",
            "hops[1].actions: must include timestamp",
        ),
        (
            "{name: x, node: host-b, at: tc-ingress, dev: wire0,"
            " actions: [timestamp, {record: [len, latency]}]}",
            "hops[1].actions[1].record[1]: field 'latency' is per packet already",
        ),
        (
            "{name: x, node: host-b, at: tc-ingress, dev: wire0, actions: [timestamp, {record: [ttl, ttl]}]}",
            "hops[1].actions[1].record[1]: field 'ttl' is listed twice",
        ),
        (
            "{name: x, node: host-b, at: tc-ingress, dev: wire0,"
            " actions: [timestamp, {record: [len, ttl, tos, mark, cpu]}]}",
            "hops[1].actions[1]: record: must list 1 to 4 fields, got 5",
        ),
        (
            "{name: x, node: host-b, at: tc-ingress, dev: wire0, actions: [timestamp, {record: []}]}",
            "hops[1].actions[1]: record: must list 1 to 4 field names",
        ),
        (
            "{name: x, node: host-b, at: xdp, dev: wire0, actions: [timestamp, {record: [len, mark]}]}",
            "hops[1].actions[1].record[1]: field 'mark' is not available at xdp hops;",
        ),
        (
            "{name: x, node: host-b, at: tc-ingress, dev: wire0, actions: {histogram: len}}",
            "hops[1].actions: must be a list of actions",
        ),
        (
            "{name: x, node: host-b, at: tc-ingress, dev: wire0, actions: [timestamp, {histogram: [len]}]}",
            "hops[1].actions[1]: histogram: must name one field",
        ),
        (
            "{name: x, node: host-b, at: tc-ingress, dev: wire0, actions: [timestamp, {count: {per: cpu}}]}",
            "hops[1].actions[1]: count takes only 'by'",
        ),
        (
            "{name: x, node: host-b, at: tc-ingress, dev: wire0,"
            " actions: [timestamp, {count: , histogram: len}]}",
            "hops[1].actions[1]: one action per item",
        ),
    ],
)
def test_bad_actions_name_their_field(hop: str, expected: str) -> None:
    errors = _errors(_spec(hop))
    assert any(error.startswith(expected) for error in errors), errors
    assert len(errors) == 1, errors  # one problem, said once


def test_an_agent_that_reports_no_fields_is_refused_by_field() -> None:
    agents = example_registrations()
    old = make_registration("host-b", {"": ["wire0"]})
    del old.capabilities.action_fields[:]
    agents["host-b"] = old
    errors = _errors(
        _spec("{name: x, node: host-b, at: tc-ingress, dev: wire0, actions: [timestamp, {histogram: len}]}"),
        agents,
    )
    assert errors == [
        "hops[1].actions[1]: node host-b's agent cannot read field 'len'; it reports: none (an older agent)"
        " (line 5)"
    ]


def test_the_example_spec_with_actions_is_valid() -> None:
    text = (Path(__file__).resolve().parents[2] / "examples" / "udp-actions.yaml").read_text()
    spec = load_spec(text.replace("htdemo-", ""), example_registrations())  # the demo's c1, c2: these agents
    assert [len(hop.actions) for hop in spec.hops] == [0, 3, 0, 3, 2]
    assert list(spec.hops[4].actions[1].fields) == ["len", "ttl"]


def test_a_node_whose_kernel_lacks_a_field_is_refused_with_its_reason() -> None:
    agents = example_registrations()
    old = make_registration("host-b", {"": ["wire0"]})
    fields = old.capabilities.action_fields
    kept = [number for number in fields if number != counters_pb2.FIELD_DROP_REASON]
    del fields[:]
    fields.extend(kept)
    old.capabilities.unavailable_fields["drop_reason"] = (
        "skb:kfree_skb has no reason argument before Linux 5.17"
    )
    agents["host-b"] = old
    errors = _errors(
        _spec(
            "{name: x, node: host-b, at: 'tracepoint:skb:kfree_skb',"
            " actions: [timestamp, {count: {by: drop_reason}}]}"
        ),
        agents,
    )
    assert errors == [
        "hops[1].actions[1]: node host-b cannot give field 'drop_reason':"
        " skb:kfree_skb has no reason argument before Linux 5.17 (line 5)"
    ]
