"""Agents page: what each node reported (kernel, attach support, namespaces and devices), its session and
clock, and the records its tracer lost."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from flask import Blueprint, jsonify, render_template

from hoptrace.common.client import ApiError
from hoptrace.results.agent_view import agent_data, clock_texts
from hoptrace.v1 import api_pb2
from hoptrace.web.dispatcher import get_client

bp = Blueprint("agents", __name__, url_prefix="/agents")


def agent_view(agent: api_pb2.Agent) -> dict[str, Any]:
    """One agent as the templates and the form's script use it: `hoptrace agents --json`'s object
    (`agent_data`) plus `display`, the texts of its clock (the CLI's) and its heartbeat's age."""
    age = None
    if agent.last_heartbeat.seconds or agent.last_heartbeat.nanos:
        age = (datetime.now(UTC) - agent.last_heartbeat.ToDatetime(tzinfo=UTC)).total_seconds()
    return {**agent_data(agent), "display": {"clock": clock_texts(agent.clock), "heartbeat_age_s": age}}


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
