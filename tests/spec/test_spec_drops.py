"""drops: true: the spec option, its checks against the nodes' kernels, and the drop hops the plans get."""

from __future__ import annotations

import pytest
from spec_fixtures import CONTRACT_SPEC, DROP_REASONS, example_registrations

from hoptrace.dispatcher.compile import KFREE_TRACEPOINT_PROGRAM, build_plans
from hoptrace.spec import SpecError, check_spec, load_spec, spec_to_yaml, validate_spec
from hoptrace.v1 import counters_pb2, trace_pb2

pytestmark = pytest.mark.unit

DROPS_SPEC = CONTRACT_SPEC + "drops: true\n"


def test_drops_round_trips_and_is_typed() -> None:
    spec = load_spec(DROPS_SPEC)
    assert spec.drops and not spec.drop_hops  # resolved against the agents only
    assert "drops: true" in spec_to_yaml(spec)
    assert load_spec(spec_to_yaml(spec)) == spec
    assert not load_spec(CONTRACT_SPEC).drops and "drops" not in spec_to_yaml(load_spec(CONTRACT_SPEC))
    with pytest.raises(SpecError, match=r"drops: must be true or false, got a string 'yes'"):
        load_spec(CONTRACT_SPEC + "drops: 'yes'\n")


def test_drop_hops_follow_the_path_one_per_node_and_namespace() -> None:
    checked = check_spec(load_spec(DROPS_SPEC), example_registrations())
    drops = [(d.hop_index, d.node, d.netns, d.name) for d in checked.spec.drop_hops]
    assert drops == [
        (5, "host-a", "c1", "drops@host-a/c1"),
        (6, "host-a", "", "drops@host-a"),
        (7, "host-b", "", "drops@host-b"),
        (8, "host-b", "c2", "drops@host-b/c2"),
    ]
    assert all(dict(d.reasons) == DROP_REASONS for d in checked.spec.drop_hops)
    plans = build_plans(checked, generation=1, origin=3)
    for node, plan in plans.items():
        kfree = [hop for hop in plan.hops if hop.program == KFREE_TRACEPOINT_PROGRAM]
        assert [(hop.hop_index, hop.netns) for hop in kfree] == [
            (d.hop_index, d.netns) for d in checked.spec.drop_hops if d.node == node
        ]
        for hop in kfree:
            assert (hop.kind, hop.tracepoint_group, hop.tracepoint_event, hop.dev) == (
                trace_pb2.ATTACH_KIND_TRACEPOINT,
                "skb",
                "kfree_skb",
                "",
            )
            assert list(hop.actions.record) == [
                counters_pb2.FIELD_DROP_REASON,
                counters_pb2.FIELD_DROP_FUNCTION,
            ]
    # the stored spec (checked again without agents, at a restart) keeps its resolved names
    assert check_spec(checked.spec).spec.drop_hops == checked.spec.drop_hops


def test_a_node_before_5_17_is_refused_naming_the_minimum_kernel() -> None:
    agents = example_registrations()
    old = agents["host-b"]
    old.kernel_release = "5.10.0-32-amd64"
    old.capabilities.action_fields.remove(counters_pb2.FIELD_DROP_REASON)
    old.capabilities.unavailable_fields["drop_reason"] = (
        "skb:kfree_skb has no reason argument before Linux 5.17"
    )
    old.capabilities.drop_reasons.clear()
    errors = [str(error) for error in validate_spec(load_spec(DROPS_SPEC), agents)]
    assert errors == [
        "drops: node host-b (kernel 5.10.0-32-amd64) cannot say why packets drop: skb:kfree_skb has no reason"
        " argument before Linux 5.17; drops needs Linux 5.17 or later on every node of the path"
    ]
    assert validate_spec(load_spec(CONTRACT_SPEC), agents) == []  # without drops the node is fine


def test_drops_need_a_path() -> None:
    events_only = (
        "name: evs\nevents:\n  - {name: rx, node: host-a, tracepoint: irq:softirq_entry}\ndrops: true\n"
    )
    with pytest.raises(SpecError, match=r"drops: needs hops"):
        load_spec(events_only)
