"""``drops: true``: why a trace's lost packets were lost.

A trace that asks for it gets, on each node of its path and in each namespace its hops there attach in, a
``skb:kfree_skb`` hop (the kernel freeing a packet it dropped, with ``enum skb_drop_reason``) that records the
trace's packets (those carrying its ID) with the reason. Their hop indexes follow the path's, so the collector
tells their records from the path's and ties each to the segment where its packet went missing
(`hoptrace.collector.join`).

The reason's values differ between kernels; its names come from the BTF of the node that recorded it
(`Capabilities.drop_reasons`, which each agent reports at registration). Validation against the agents
resolves them once into the spec's output-only `drop_hops` (as `netns: container:NAME` is resolved into
`HopSpec.workload`): the stored spec carries them to the plans and, through WatchSpecs, to the collector,
which writes names, never numbers.
"""

from __future__ import annotations

from collections.abc import Mapping

from hoptrace import kernel_abi
from hoptrace.spec.attach import attach_refusal
from hoptrace.spec.workloads import attach_netns
from hoptrace.v1 import agent_pb2, counters_pb2, trace_pb2

DROP_REASON_FIELD = "drop_reason"
# skb:kfree_skb's location, which the agent names (kallsyms): the function that freed the packet.
DROP_FUNCTION_FIELD = "drop_function"
# skb:kfree_skb's reason argument: "net: skb: introduce kfree_skb_reason()" (5.17).
MIN_KERNEL = "5.17"
# Names of enum skb_drop_reason that are no drop: kfree_skb of a packet that was used (6.0+ fires
# skb:consume_skb for it instead; earlier kernels may not).
NOT_DROPS = frozenset({"NOT_DROPPED_YET", "CONSUMED"})


def drop_places(spec: trace_pb2.TraceSpec) -> list[tuple[str, str, str]]:
    """(node, netns, hop name) of each drop hop of `spec`: every node and namespace its hops attach in, in
    the order of their first hop there (a tracepoint hop sees its own namespace only)."""
    places: list[tuple[str, str, str]] = []
    seen: set[tuple[str, str]] = set()
    for hop in spec.hops:
        netns = attach_netns(hop)
        if not hop.node or (hop.node, netns) in seen:
            continue
        seen.add((hop.node, netns))
        label = (
            hop.workload.container_name if hop.HasField("workload") else netns.strip("/").replace("/", "-")
        )
        places.append((hop.node, netns, f"drops@{hop.node}/{label}" if label else f"drops@{hop.node}"))
    return places


def drop_hops(
    spec: trace_pb2.TraceSpec, agents: Mapping[str, agent_pb2.Register] | None = None
) -> list[trace_pb2.DropHop]:
    """The drop hops of a spec with ``drops: true`` (none without), hop indexes after its path's, each
    with its node kernel's reason names when `agents` has the node's registration."""
    if not spec.drops:
        return []
    out = []
    for position, (node, netns, name) in enumerate(drop_places(spec)):
        reasons = agents[node].capabilities.drop_reasons if agents and node in agents else {}
        out.append(
            trace_pb2.DropHop(
                node=node, hop_index=len(spec.hops) + position, netns=netns, name=name, reasons=reasons
            )
        )
    return out


def resolve_drop_hops(
    spec: trace_pb2.TraceSpec, agents: Mapping[str, agent_pb2.Register]
) -> trace_pb2.TraceSpec:
    """A copy of `spec` whose output-only `drop_hops` are its drop hops with the reason names of the agents'
    kernels (none unless ``drops: true``; what a user gave there is replaced)."""
    resolved = trace_pb2.TraceSpec()
    resolved.CopyFrom(spec)
    del resolved.drop_hops[:]
    resolved.drop_hops.extend(drop_hops(resolved, agents))
    return resolved


def validate_drops(spec: trace_pb2.TraceSpec) -> list[tuple[str, str]]:
    """(field, reason) problems of ``drops`` that need no agent: a path to add the hops to, and room for
    them in a trace's hop indexes."""
    if not spec.drops:
        return []
    if not spec.hops:
        return [("drops", "needs hops: the drop hops go on the nodes and namespaces of the path")]
    total = len(spec.hops) + len(drop_places(spec))
    if total > kernel_abi.MAX_HOPS:
        return [
            (
                "drops",
                f"the path's {len(spec.hops)} hops and their {total - len(spec.hops)} drop hops (one per "
                f"node and namespace) exceed the {kernel_abi.MAX_HOPS} hops of a trace",
            )
        ]
    return []


def validate_drops_against_agents(
    spec: trace_pb2.TraceSpec, agents: Mapping[str, agent_pb2.Register]
) -> list[tuple[str, str]]:
    """(field, reason) problems of ``drops: true`` on the path's nodes: each must attach tracepoints and
    give skb:kfree_skb's reason (Linux 5.17+), and name its reasons."""
    if not spec.drops:
        return []
    errors: list[tuple[str, str]] = []
    for node in dict.fromkeys(node for node, _, _ in drop_places(spec)):
        registration = agents.get(node)
        if registration is None:
            continue  # the hop's own node error says it
        kernel = f" (kernel {registration.kernel_release})" if registration.kernel_release else ""
        refusal = attach_refusal(registration, "tp_btf")
        capabilities = registration.capabilities
        reported = counters_pb2.FIELD_DROP_REASON in capabilities.action_fields
        if refusal:
            why = f"it cannot attach tracepoints: {refusal}"
        elif not reported:
            why = capabilities.unavailable_fields.get(DROP_REASON_FIELD) or "its agent reads no drop_reason"
        elif not capabilities.drop_reasons:
            why = "its agent reports no names of its kernel's drop reasons (an older agent)"
        else:
            continue
        errors.append(
            (
                "drops",
                f"node {node}{kernel} cannot say why packets drop: {why}; drops needs Linux {MIN_KERNEL} "
                "or later on every node of the path",
            )
        )
    return errors
