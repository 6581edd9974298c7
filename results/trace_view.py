"""`Trace` (an applied trace with each node's status) as every client shows it: `hoptrace trace ls`, the web's
trace list and detail pages. A node is active when its agent runs the trace with every hop and event attached:
a hop whose device or netns went away after the apply is reported by the agent (its status says why), and the
node counts as not active, named with the reason ("0/1 nodes active: host-a: hop a-veth-in: device veth-c1 is
gone from netns c1")."""

from __future__ import annotations

from typing import Any

from hoptrace.v1 import api_pb2


def status_nodes(trace: api_pb2.Trace) -> list[str]:
    """The node of each of trace.nodes (the dispatcher lists them as the spec's nodes: hops' nodes in path
    order, each once, then the events')."""
    nodes = [*(hop.node for hop in trace.spec.hops), *(event.node for event in trace.spec.events)]
    return list(dict.fromkeys(nodes))


def node_problems(node: str, status: Any) -> list[str]:
    """What keeps one node's TraceStatus from being active, each in a few words naming the hop or event."""
    problems = []
    if status.error:
        prefix = f"node {node}: "
        problems.append(status.error[len(prefix) :] if status.error.startswith(prefix) else status.error)
    for hop in status.hops:
        if not hop.attached:
            problems.append(hop.error or f"hop {hop.name}: not attached")
    for event in status.events:
        if not event.attached:
            problems.append(f"event {event.name}: {event.error or 'not attached'}")
    if not problems and not status.active:
        problems.append("trace not active")
    return problems


def node_not_kept(status: Any) -> list[str]:
    """What of one node's trace would not outlive its agent, each naming the part and the reason (the
    agent's `not_kept`: pinning was asked for but this kernel or bpffs could not keep it); [] when a
    restarted or upgraded agent takes all of it over."""
    hops = [f"hop {hop.name}: {hop.not_kept}" for hop in status.hops if hop.not_kept]
    return hops + node_not_kept_beside_hops(status)


def node_not_kept_beside_hops(status: Any) -> list[str]:
    """node_not_kept's items that are no hop's: the trace's own (TCP tagger, state) and its events'."""
    items = [f"trace: {status.not_kept}"] if status.not_kept else []
    return items + [f"event {event.name}: {event.not_kept}" for event in status.events if event.not_kept]


def node_states(trace: api_pb2.Trace) -> list[dict[str, Any]]:
    """Each node of the trace: its name, whether it is active, its problems, what would not outlive its
    agent, its generation and hops."""
    names = status_nodes(trace)
    states = []
    for index, status in enumerate(trace.nodes):
        node = names[index] if index < len(names) else "?"
        problems = node_problems(node, status)
        states.append(
            {
                "node": node,
                "active": not problems,
                "generation": status.generation,
                "problems": problems,
                "not_kept": node_not_kept(status),
                "not_kept_beside_hops": node_not_kept_beside_hops(status),
                "hops": [
                    {
                        "index": hop.hop_index,
                        "name": hop.name,
                        "attached": hop.attached,
                        "error": hop.error,
                        "not_kept": hop.not_kept,
                    }
                    for hop in status.hops
                ],
            }
        )
    return states


def status_text(trace: api_pb2.Trace) -> str:
    """`2/2 nodes active`, or with each inactive node's problems: `0/1 nodes active: host-a: hop a-veth-in:
    device veth-c1 is gone from netns c1`."""
    states = node_states(trace)
    active = sum(1 for state in states if state["active"])
    text = f"{active}/{len(states)} nodes active"
    problems = [f"{state['node']}: {'; '.join(state['problems'])}" for state in states if not state["active"]]
    return f"{text}: {'; '.join(problems)}" if problems else text
