"""Hop actions in specs: each bad action or field is refused naming its spec field; good ones round-trip and
compile to typed HopActions (no user text reaches the object)."""

from __future__ import annotations

from pathlib import Path

import pytest
from dispatcher_fakes import example_registrations, make_registration

from hoptrace import kernel_abi
from hoptrace.dispatcher import actions
from hoptrace.dispatcher.compile import build_plans
from hoptrace.dispatcher.controller import status_failures
from hoptrace.dispatcher.spec import KIND_FAMILY, SpecError, load_spec, spec_to_json, spec_to_yaml
from hoptrace.v1 import agent_pb2, counters_pb2

pytestmark = pytest.mark.unit

HEAD = """\
name: acts
filter: {protocol: udp, dst_port: 5000}
hops:
  - {name: a-out, node: host-a, at: tc-egress, dev: eth0, netns: c1}
"""


def _spec(*hops: str) -> str:
    return HEAD + "".join(f"  - {hop}\n" for hop in hops)


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


def test_actions_round_trip_and_compile_to_typed_constants() -> None:
    text = _spec(
        "{name: a-wire, node: host-a, at: tc-egress, dev: wire0,"
        " actions: [timestamp, {count: {by: cpu}}, {histogram: latency}]}",
        "{name: b-in, node: host-b, at: tc-ingress, dev: wire0,"
        " actions: [timestamp, count, {histogram: len}]}",
        "{name: b-c2, node: host-b, at: tc-ingress, dev: eth0, netns: c2,"
        " actions: [timestamp, {count: , by: mark}, {record: [len, ttl]}]}",
    )
    spec = load_spec(text, example_registrations())
    assert load_spec(spec_to_yaml(spec)) == spec
    assert load_spec(spec_to_json(spec)) == spec
    plans = build_plans(spec, 1)
    a = {hop.name: hop.actions for hop in plans["host-a"].hops}
    b = {hop.name: hop.actions for hop in plans["host-b"].hops}
    # a-out precedes a latency histogram on its node: it remembers timestamps; nothing else.
    assert not a["a-out"].count and a["a-out"].histogram == 0 and a["a-out"].prev_ts
    assert a["a-wire"].count and a["a-wire"].count_by == counters_pb2.FIELD_CPU
    assert a["a-wire"].histogram == counters_pb2.FIELD_LATENCY and not a["a-wire"].prev_ts
    assert b["b-in"].count and b["b-in"].count_by == 0 and b["b-in"].histogram == counters_pb2.FIELD_LEN
    assert not b["b-in"].prev_ts  # latency is per node: host-b has no latency hop
    assert b["b-c2"].count_by == counters_pb2.FIELD_MARK
    assert list(b["b-c2"].record) == [counters_pb2.FIELD_LEN, counters_pb2.FIELD_TTL]
    assert not b["b-in"].record


def test_hops_without_actions_compile_to_no_actions() -> None:
    spec = load_spec(_spec("{name: b-in, node: host-b, at: tc-ingress, dev: wire0}"), example_registrations())
    for plan in build_plans(spec, 1).values():
        for hop in plan.hops:
            assert not hop.HasField("actions")


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
    spec = load_spec(text, example_registrations())
    assert [len(hop.actions) for hop in spec.hops] == [0, 3, 0, 3, 2]
    assert list(spec.hops[4].actions[1].fields) == ["len", "ttl"]


def test_new_fields_compile_and_drop_reason_picks_the_kfree_skb_program() -> None:
    text = _spec(
        "{name: b-in, node: host-b, at: tc-ingress, dev: wire0,"
        " actions: [timestamp, {count: {by: ttl}}, {histogram: gso_size}]}",
        "{name: b-drop, node: host-b, at: 'tracepoint:skb:kfree_skb',"
        " actions: [timestamp, {count: {by: drop_reason}}]}",
        "{name: b-free, node: host-b, at: 'tracepoint:skb:kfree_skb', actions: [timestamp, count]}",
        "{name: b-app, node: host-b, at: cgroup-egress, cgroup: app,"
        " actions: [timestamp, {count: {by: pid}}]}",
    )
    plans = build_plans(load_spec(text, example_registrations()), 1)
    hops = {hop.name: hop for hop in plans["host-b"].hops}
    assert hops["b-in"].actions.count_by == counters_pb2.FIELD_TTL
    assert hops["b-in"].actions.histogram == counters_pb2.FIELD_GSO_SIZE
    assert hops["b-drop"].program == "hop_tp_btf_kfree"
    assert hops["b-drop"].actions.count_by == counters_pb2.FIELD_DROP_REASON
    # Without the reason, kfree_skb keeps the generic program: it loads on kernels before 5.17 too.
    assert hops["b-free"].program == "hop_tp_btf"
    assert hops["b-app"].actions.count_by == counters_pb2.FIELD_PID


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


def test_actions_the_verifier_refused_are_named_by_their_spec_fields() -> None:
    """An agent reports which of a hop's actions its kernel's verifier refused (HopStatus.refused_actions, as
    agent/internal/loader's TestRefusedActionIsNamed gets from a real refusal): the apply's failure names
    `hops[i].actions[j]`, and a refused prev_ts names the later latency histogram it serves."""
    spec = load_spec(
        _spec(
            "{name: a-wire, node: host-a, at: tc-egress, dev: wire0,"
            " actions: [timestamp, {count: {by: cpu}}, {histogram: latency}, {record: [len]}]}",
        ),
        example_registrations(),
    )
    reason = "hop a-wire: the kernel's verifier refuses its histogram action (the hop loads without): ..."
    status = agent_pb2.TraceStatus(
        trace="acts",
        generation=1,
        hops=[
            agent_pb2.HopStatus(
                hop_index=0,
                name="a-out",
                attached=False,
                error="hop a-out: refused",
                refused_actions=agent_pb2.HopActions(prev_ts=True),
            ),
            agent_pb2.HopStatus(
                hop_index=1,
                name="a-wire",
                attached=False,
                error=reason,
                refused_actions=agent_pb2.HopActions(
                    histogram=counters_pb2.FIELD_LATENCY, record=[counters_pb2.FIELD_LEN]
                ),
            ),
        ],
    )
    failures = status_failures("host-a", status, None, spec)
    assert failures == [
        "hops[1].actions[2]: hop a-out on node host-a: refused",
        "hops[1].actions[2], hops[1].actions[3]: hop a-wire on node host-a: the kernel's verifier refuses its"
        " histogram action (the hop loads without): ...",
    ]
    # Without refused actions (any other failure), the hop's own field, as before.
    status.hops[1].ClearField("refused_actions")
    assert status_failures("host-a", status, None, spec)[1].startswith("hop a-wire (hops[1]) on node host-a:")
