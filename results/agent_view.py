"""The one view of an agent (`ListAgents`, `GetAgent`): the dict `hoptrace agents --json` prints and the web's
agents page shows, and the texts of its clock. Registration parts (capabilities, namespaces, running traces,
container runtime) keep the API's field names; each namespace also lists the `aliases` a spec may name it by
(`netns: container:NAME` or `pod:NAMESPACE/NAME`).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from google.protobuf import json_format
from google.protobuf.message import Message

from hoptrace.results.format import format_ns, timestamp_text
from hoptrace.v1 import agent_pb2, api_pb2


def _fields(message: Message) -> dict[str, Any]:
    return json_format.MessageToDict(
        message, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )


def namespace_data(namespace: agent_pb2.Namespace) -> dict[str, Any]:
    """A node's namespace: name, inode, devices, workloads, and the names a spec may give it instead."""
    data = _fields(namespace)
    data["inode"] = namespace.inode
    data["aliases"] = sorted(
        {f"container:{w.container_name}" for w in namespace.workloads}
        | {f"pod:{w.pod_namespace}/{w.pod_name}" for w in namespace.workloads if w.pod_name}
    )
    return data


def agent_data(agent: api_pb2.Agent) -> dict[str, Any]:
    """One agent, JSON-ready: what it registered, its session, transport and clock."""
    registration = agent.registration
    return {
        "node": registration.node,
        "connected": agent.connected,
        "last_heartbeat": timestamp_text(agent.last_heartbeat),
        "kernel_release": registration.kernel_release,
        "agent_version": registration.agent_version,
        "capabilities": _fields(registration.capabilities),
        "namespaces": [namespace_data(namespace) for namespace in registration.namespaces],
        "running": [_fields(status) for status in registration.running],
        # where the namespaces' workloads (containers, pods) come from: endpoint, version, error
        "container_runtime": _fields(registration.runtime),
        "lost_records": agent.lost_records,
        "clock": clock_data(agent.clock),
        "transport": transport_data(agent),
    }


def transport_data(agent: api_pb2.Agent) -> dict[str, Any] | None:
    """The agent's record transport from its last heartbeat (None before one): where records go, whether
    the far end (collector or brokers) takes them, and what waits on the node or was given up."""
    if not agent.HasField("transport"):
        return None
    transport = agent.transport
    return {
        "kind": transport.kind or None,
        "destination": transport.destination,
        "topic": transport.topic,
        "partitions": transport.partitions,
        "connected": transport.connected,
        "state": transport_state(transport),
        "buffered_records": transport.buffered_records,
        "buffered_bytes": transport.buffered_bytes,
        "buffer_capacity_bytes": transport.buffer_capacity_bytes,
        "dropped_records": transport.dropped_records,
    }


def transport_state(transport: agent_pb2.TransportStatus) -> str:
    """One word a user reads: up, down, or why Kafka is not usable yet."""
    if not transport.kind:
        return "-"
    if transport.connected:
        return "up"
    if transport.kind == "kafka" and transport.partitions == 0:
        return "down (topic not read)"  # brokers away or topic missing: records wait in the queue
    return "down"


def clock_data(clock: api_pb2.NodeClockStatus) -> dict[str, Any]:
    """A node's clock status, JSON-ready (`hoptrace agents --json`, the agents page): the numbers and when
    they were measured, or `measured` false and nulls when the collector has not measured the node; its last
    clock jump (`jump_ns`, `allowed_ns`, `at`) or None."""
    last_jump = (
        {
            "jump_ns": clock.last_jump.jump_ns,
            "allowed_ns": clock.last_jump.allowed_ns,
            "at": clock.last_jump.at.ToDatetime(tzinfo=UTC).isoformat(timespec="seconds"),
        }
        if clock.HasField("last_jump")
        else None
    )
    if not clock.measured:
        return {
            "measured": False,
            "offset_ns": None,
            "bound_ns": None,
            "drift_ppm": None,
            "delay_ns": None,
            "measured_at": None,
            "last_jump": last_jump,
        }
    return {
        "measured": True,
        "offset_ns": clock.offset_ns,
        "bound_ns": clock.bound_ns,
        "drift_ppm": clock.drift_ppm,
        "delay_ns": clock.delay_ns,
        "measured_at": clock.measured_at.ToDatetime(tzinfo=UTC).isoformat(timespec="seconds"),
        "last_jump": last_jump,
    }


def clock_texts(clock: api_pb2.NodeClockStatus, now: datetime | None = None) -> dict[str, str]:
    """A node's clock status as a reader sees it: offset "-231ns", bound "±85ns", drift "1.50 ppm",
    measured "2026-01-02T03:04:05+00:00 (4 s ago)"; "unknown" (and "-") when it was not measured; jump
    "-5.00ms at 2026-01-02T03:04:05+00:00 (40 s ago)", "-" when the collector saw none."""
    now = now or datetime.now(UTC)
    jump = "-"
    if clock.HasField("last_jump"):
        jumped = clock.last_jump.at.ToDatetime(tzinfo=UTC)
        jump = (
            f"{format_ns(clock.last_jump.jump_ns)} at {jumped.isoformat(timespec='seconds')}"
            f" ({max(0.0, (now - jumped).total_seconds()):.0f} s ago)"
        )
    if not clock.measured:
        return {"offset": "unknown", "bound": "-", "drift": "-", "measured": "-", "jump": jump}
    at = clock.measured_at.ToDatetime(tzinfo=UTC)
    age = max(0.0, (now - at).total_seconds())
    return {
        "offset": format_ns(clock.offset_ns),
        "bound": f"±{format_ns(clock.bound_ns)}",
        "drift": f"{clock.drift_ppm:.2f} ppm",
        "measured": f"{at.isoformat(timespec='seconds')} ({age:.0f} s ago)",
        "jump": jump,
    }


def clock_jump_note(node: str, clock: api_pb2.NodeClockStatus, now: datetime | None = None) -> str | None:
    """ "host-b clock jumped by -5.00ms at ... (40 s ago), beyond the ±25.0us its bounds allow: cross-node
    segments at host-b are suspect around then" for a node whose clock the collector saw jump; else None."""
    if not clock.HasField("last_jump"):
        return None
    return (
        f"{node} clock jumped by {clock_texts(clock, now)['jump']}, beyond the "
        f"±{format_ns(clock.last_jump.allowed_ns)} its bounds allow: cross-node segments at {node} are "
        "suspect around then (hoptrace report names them)"
    )
