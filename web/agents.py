"""Agents page: what each node reported (kernel, attach support, namespaces and devices), its session and
clock, and the records its tracer lost."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from flask import Blueprint, jsonify, render_template

from hoptrace.collector.report import clock_data, clock_texts
from hoptrace.common.client import ApiError
from hoptrace.v1 import api_pb2
from hoptrace.web.dispatcher import get_client

bp = Blueprint("agents", __name__, url_prefix="/agents")


def _time_text(timestamp: Any) -> tuple[str, float | None]:
    """(ISO text, age in seconds) of a protobuf Timestamp; ("-", None) when unset."""
    if not timestamp.seconds and not timestamp.nanos:
        return "-", None
    when = timestamp.ToDatetime(tzinfo=UTC)
    return when.isoformat(timespec="seconds"), (datetime.now(UTC) - when).total_seconds()


def agent_view(agent: api_pb2.Agent) -> dict[str, Any]:
    """One agent as the templates and the form's script use it."""
    registration = agent.registration
    heartbeat, age = _time_text(agent.last_heartbeat)
    capabilities = registration.capabilities
    return {
        "node": registration.node,
        "connected": agent.connected,
        "last_heartbeat": heartbeat,
        "heartbeat_age_s": age,
        "kernel": registration.kernel_release,
        "agent_version": registration.agent_version,
        "btf": capabilities.btf,
        "ring_buffer": capabilities.ring_buffer,
        "tcp_header_options": capabilities.tcp_header_options,
        "attach": [
            {"kind": kind, "supported": support.supported, "reason": support.reason}
            for kind, support in sorted(capabilities.attach.items())
        ],
        "namespaces": [
            {
                "name": namespace.name,
                "inode": namespace.inode,
                "devices": [
                    {"name": d.name, "ifindex": d.ifindex, "mtu": d.mtu, "kind": d.kind}
                    for d in namespace.devices
                ],
                "workloads": [
                    {
                        "container_name": w.container_name,
                        "container_id": w.container_id[:12],
                        "image": w.image,
                        "pod": f"{w.pod_namespace}/{w.pod_name}" if w.pod_name else "",
                    }
                    for w in namespace.workloads
                ],
                # how a spec may name this namespace besides `name` (netns: container:NAME, pod:NS/NAME)
                "aliases": sorted(
                    {f"container:{w.container_name}" for w in namespace.workloads}
                    | {f"pod:{w.pod_namespace}/{w.pod_name}" for w in namespace.workloads if w.pod_name}
                ),
            }
            for namespace in registration.namespaces
        ],
        "container_runtime": {
            "endpoint": registration.runtime.endpoint,
            "version": registration.runtime.version,
            "error": registration.runtime.error,
        },
        "running": [f"{status.trace} (generation {status.generation})" for status in registration.running],
        # as the collector measured it (ListAgents), or "unknown"; the texts are the CLI's
        "clock": clock_data(agent.clock),
        "clock_text": clock_texts(agent.clock),
        "lost_records": agent.lost_records,
    }


def agent_views() -> tuple[list[dict[str, Any]], str | None]:
    """Every agent's view, and the error text when the dispatcher could not be asked."""
    try:
        agents = get_client().agents()
    except ApiError as error:
        return [], error.message
    return sorted((agent_view(agent) for agent in agents), key=lambda view: view["node"]), None


@bp.get("/")
def index():  # noqa: ANN201 - a view
    """Every registered agent."""
    agents, error = agent_views()
    return render_template("agents.html", agents=agents, error=error), 502 if error else 200


@bp.get("/agents.json")
def agents_json():  # noqa: ANN201 - a view
    """The same data as JSON (the trace form offers each node's namespaces and devices from it)."""
    agents, error = agent_views()
    if error:
        return jsonify({"error": error}), 502
    return jsonify({"agents": agents})
