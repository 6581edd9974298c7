"""Specs -> typed plans: hop actions become HopActions, events EventAttach messages, workload hops attach in
their resolved namespace (no user text reaches an object); and what the agents report back is named by
the spec's fields again."""

from __future__ import annotations

from pathlib import Path

import pytest
from spec_fixtures import (
    ACTION_HOPS,
    ACTIONS_HEAD,
    EVENTS_HEAD,
    WORKLOAD_SPEC,
    example_registrations,
    guest_registrations,
    registrations_with_workloads,
    with_items,
)

from hoptrace import kernel_abi
from hoptrace.dispatcher.compile import BpfCompiler, build_plans, elf_sections, programs_for_plan
from hoptrace.dispatcher.controller import DispatcherError, _free_origin, status_failures
from hoptrace.dispatcher.presets import agent_args, validate_preset_request
from hoptrace.dispatcher.state import StateStore, StoredTrace, now
from hoptrace.spec import check_spec, load_spec, spec_to_json, spec_to_yaml
from hoptrace.spec.workloads import resolve_workloads
from hoptrace.v1 import agent_pb2, counters_pb2, trace_pb2

pytestmark = pytest.mark.unit


def _hops(*hops: str) -> str:
    return with_items(ACTIONS_HEAD, *hops)


def _events(*events: str) -> str:
    return with_items(EVENTS_HEAD, *events)


# ---- hop actions ---------------------------------------------------------------------------------------


def test_actions_compile_to_typed_constants() -> None:
    text = _hops(*ACTION_HOPS)
    plans = build_plans(check_spec(load_spec(text), example_registrations()), 1)
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
    spec = load_spec(_hops("{name: b-in, node: host-b, at: tc-ingress, dev: wire0}"))
    for plan in build_plans(check_spec(spec, example_registrations()), 1).values():
        for hop in plan.hops:
            assert not hop.HasField("actions")


def test_new_fields_compile_and_drop_reason_picks_the_kfree_skb_program() -> None:
    text = _hops(
        "{name: b-in, node: host-b, at: tc-ingress, dev: wire0,"
        " actions: [timestamp, {count: {by: ttl}}, {histogram: gso_size}]}",
        "{name: b-drop, node: host-b, at: 'tracepoint:skb:kfree_skb',"
        " actions: [timestamp, {count: {by: drop_reason}}]}",
        "{name: b-free, node: host-b, at: 'tracepoint:skb:kfree_skb', actions: [timestamp, count]}",
        "{name: b-app, node: host-b, at: cgroup-egress, cgroup: app,"
        " actions: [timestamp, {count: {by: pid}}]}",
    )
    plans = build_plans(check_spec(load_spec(text), example_registrations()), 1)
    hops = {hop.name: hop for hop in plans["host-b"].hops}
    assert hops["b-in"].actions.count_by == counters_pb2.FIELD_TTL
    assert hops["b-in"].actions.histogram == counters_pb2.FIELD_GSO_SIZE
    assert hops["b-drop"].program == "hop_tp_btf_kfree"
    assert hops["b-drop"].actions.count_by == counters_pb2.FIELD_DROP_REASON
    # Without the reason, kfree_skb keeps the generic program: it loads on kernels before 5.17 too.
    assert hops["b-free"].program == "hop_tp_btf"
    assert hops["b-app"].actions.count_by == counters_pb2.FIELD_PID


def test_actions_the_verifier_refused_are_named_by_their_spec_fields() -> None:
    """An agent reports which of a hop's actions its kernel's verifier refused (HopStatus.refused_actions, as
    agent/internal/loader's TestRefusedActionIsNamed gets from a real refusal): the apply's failure names
    `hops[i].actions[j]`, and a refused prev_ts names the later latency histogram it serves."""
    spec = load_spec(
        _hops(
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


# ---- events --------------------------------------------------------------------------------------------


def test_events_become_typed_plans() -> None:
    text = _events(
        "{name: rx, node: host-a, tracepoint: 'irq:softirq_entry', where: 'vec == 3', "
        "actions: [{count: {by: cpu}}]}",
        "{name: xmit, node: host-b, tracepoint: 'net:net_dev_xmit', where: 'len > 100 and rc == 0', "
        "actions: [{count: {by: len}}, {histogram: len}]}",
        "{name: plain, node: host-b, tracepoint: 'sched:sched_switch'}",
    )
    plans = build_plans(check_spec(load_spec(text), example_registrations()), 3)
    rx = plans["host-a"].events[0]
    assert (rx.event_index, rx.tracepoint_group, rx.tracepoint_event, rx.program) == (
        0,
        "irq",
        "softirq_entry",
        "event_tp",
    )
    assert (rx.count, rx.count_by, rx.count_by_arg, rx.histogram_arg) == (
        True,
        counters_pb2.EVENT_KEY_CPU,
        "",
        "",
    )
    assert [(t.arg, t.op, list(t.values)) for t in rx.where] == [("vec", counters_pb2.EVENT_OP_EQ, [3])]
    xmit, plain = plans["host-b"].events
    assert (xmit.event_index, xmit.count_by, xmit.count_by_arg, xmit.histogram_arg) == (
        1,
        counters_pb2.EVENT_KEY_ARG,
        "len",
        "len",
    )
    # No actions: a plain count.
    assert (plain.event_index, plain.count, plain.count_by, list(plain.where)) == (
        2,
        True,
        counters_pb2.EVENT_KEY_TOTAL,
        [],
    )
    # host-b runs no hop: its object holds the event program alone.
    assert programs_for_plan(plans["host-b"]) == ("event_tp",)
    assert "event_tp" in programs_for_plan(plans["host-a"])


def test_event_program_compiles_alone(tmp_path) -> None:
    elf = BpfCompiler(cache_dir=tmp_path).compile_programs(("event_tp",))
    assert "tracepoint" in elf_sections(elf)


def test_the_wakeup_example_pairs_its_events_in_the_plan() -> None:
    """examples/events-wakeup.yaml: the wake-up marks by pid, the run measures since it by next_pid (the
    index of the marking event), the receive sizes are recorded; and it round-trips."""
    text = (Path(__file__).resolve().parents[2] / "examples" / "events-wakeup.yaml").read_text()
    spec = load_spec(text.replace("host-b", "host-a"), example_registrations())
    assert load_spec(spec_to_yaml(spec)) == spec and load_spec(spec_to_json(spec)) == spec
    attaches = {e.name: e for e in build_plans(check_spec(spec), 1)["host-a"].events}
    wakeup, run, sizes = attaches["wakeup"], attaches["run"], attaches["receive-sizes"]
    assert (wakeup.mark_arg, wakeup.latency_arg, wakeup.count_by) == ("pid", "", counters_pb2.EVENT_KEY_CPU)
    assert (run.mark_arg, run.latency_arg, run.latency_since, run.histogram_arg) == ("", "next_pid", 0, "")
    assert list(sizes.record_args) == ["ret"] and not sizes.count


def test_kernel_function_events_become_typed_plans() -> None:
    text = _events(
        "{name: rx, node: host-a, kprobe: net_rx_action, actions: [{count: {by: cpu}}]}",
        "{name: rcv, node: host-a, fentry: ip_rcv, where: 'pid == 1', actions: [count, {record: [arg1]}]}",
    )
    spec = load_spec(text, guest_registrations())
    assert load_spec(spec_to_yaml(spec)) == spec and load_spec(spec_to_json(spec)) == spec
    plan = build_plans(check_spec(spec), 1)["host-a"]
    rx, rcv = plan.events
    assert (rx.kind, rx.function, rx.program, rx.tracepoint_group) == (
        trace_pb2.ATTACH_KIND_KPROBE, "net_rx_action", "event_kprobe", ""
    )  # fmt: skip
    assert (rcv.kind, rcv.function, rcv.program, list(rcv.record_args)) == (
        trace_pb2.ATTACH_KIND_FENTRY, "ip_rcv", "event_fentry", ["arg1"]
    )  # fmt: skip
    assert {"event_fentry", "event_kprobe"} <= set(programs_for_plan(plan))


def test_function_event_programs_compile_alone(tmp_path) -> None:
    elf = BpfCompiler(cache_dir=tmp_path).compile_programs(("event_kprobe", "event_fentry"))
    sections = elf_sections(elf)
    assert "kprobe/netif_receive_skb" in sections and "fentry/netif_receive_skb" in sections, sections


# ---- workloads -----------------------------------------------------------------------------------------


def test_the_plan_attaches_in_the_resolved_workload_namespace() -> None:
    agents = registrations_with_workloads()
    checked = check_spec(load_spec(WORKLOAD_SPEC), agents)
    assert checked.spec == resolve_workloads(load_spec(WORKLOAD_SPEC), agents)
    # The plan attaches in the resolved namespace; what the user wrote stays in the spec.
    hops = build_plans(checked, generation=1)["host-a"].hops
    assert [hop.netns for hop in hops] == ["c1", "", "/proc/4242/ns/net"]
    assert [hop.name for hop in hops] == ["ht-names-a-eth0-out", "a-wire-out", "web-0-eth0-in"]


def test_mace_takes_a_container_or_pod_and_sends_the_agent_its_namespace() -> None:
    agents = registrations_with_workloads()
    host_a = agents["host-a"]
    for container, netns in (("container:ht-names-a", "c1"), ("pod:shop/web-0", "/proc/4242/ns/net")):
        assert validate_preset_request("host-a", "mace", {"container": container}, host_a) == []
        assert agent_args("mace", {"container": container}, "host-a", host_a)["container"] == netns
    (error,) = validate_preset_request("host-a", "mace", {"container": "container:nope"}, host_a)
    assert error.field == "args.container"
    assert error.reason.startswith("node host-a reported no container 'nope'; containers there: ht-names-a")


def test_a_restarted_dispatcher_keeps_what_apply_resolved(tmp_path) -> None:
    """The state file keeps the user's spec and, beside it, the workloads apply resolved: the plans a
    restarted dispatcher pushes attach in the same namespaces."""
    agents = registrations_with_workloads()
    resolved = check_spec(load_spec(WORKLOAD_SPEC), agents).spec
    StateStore(tmp_path).save(StoredTrace(spec=resolved, generation=3, applied_at=now()))
    (loaded,) = StateStore(tmp_path).load()
    assert loaded.spec == resolved
    assert [hop.netns for hop in build_plans(check_spec(loaded.spec), generation=3)["host-a"].hops] == [
        "c1",
        "",
        "/proc/4242/ns/net",
    ]


def test_each_trace_has_its_own_id_origin_in_every_plan_and_across_restarts(tmp_path) -> None:
    """Hops follow a trace's packets through address translations by the ID's origin: every plan of a trace
    carries the trace's origin, two traces never share one, and the state keeps it."""
    agents = registrations_with_workloads()
    resolved = check_spec(load_spec(WORKLOAD_SPEC), agents).spec
    assert {plan.id_origin for plan in build_plans(check_spec(resolved), 1, origin=5).values()} == {5}
    assert {plan.id_origin for plan in build_plans(check_spec(resolved), 1).values()} == {0}  # standalone
    StateStore(tmp_path).save(StoredTrace(spec=resolved, generation=3, applied_at=now(), origin=5))
    (loaded,) = StateStore(tmp_path).load()
    assert loaded.origin == 5
    assert _free_origin({1, 2, 4}, "t") == 3
    with pytest.raises(DispatcherError, match="239 traces are applied.*hoptrace trace rm NAME"):
        _free_origin(set(range(1, kernel_abi.TRACE_ORIGINS + 1)), "t")
