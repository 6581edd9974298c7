"""Presets: run MACE (the latency a container adds to its packets) or Iron (network softirq CPU per container,
caused vs charged) on one node through the dispatcher's `RunPreset`, and show the summary as a table.

The checks are the dispatcher's own: a field error it names (``args.container``) is shown next to the field
it belongs to. The request blocks for the preset's duration, so the form offers short durations.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import grpc
from flask import Blueprint, render_template, request

from hoptrace.common.client import ApiError
from hoptrace.common.durations import parse_duration
from hoptrace.v1 import api_pb2
from hoptrace.web.agents import agent_views
from hoptrace.web.dispatcher import get_client

bp = Blueprint("presets", __name__, url_prefix="/presets")

PRESETS = ("mace", "iron")
MACE_PATHS = ("inner-dev", "max-dev", "syscalls")
# Form inputs -> RunPreset args (the agent's flags without dashes), per preset.
FORM_ARGS = {
    "mace": {"container": "container", "path": "path", "peer": "peer", "duration": "duration"},
    "iron": {"duration": "duration"},
}


@dataclass
class PresetForm:
    """The preset form's values as typed."""

    node: str = ""
    preset: str = "mace"
    container: str = ""
    path: str = "inner-dev"
    peer: str = ""
    duration: str = "5"

    @classmethod
    def from_request(cls) -> PresetForm:
        """The posted form."""
        form = request.form
        return cls(**{name: form.get(name, "").strip() for name in cls.__dataclass_fields__})

    def request(self) -> api_pb2.RunPresetRequest:
        """The RunPreset request: empty inputs are left out, a bare number of seconds gets its unit."""
        args = {}
        for field, arg in FORM_ARGS.get(self.preset, {}).items():
            value = getattr(self, field)
            if field == "duration" and value.replace(".", "", 1).isdigit():
                value += "s"
            if value:
                args[arg] = value
        return api_pb2.RunPresetRequest(node=self.node, preset=self.preset, args=args)


def duration_s(text: str) -> float:
    """Seconds of a duration as the form takes it ("5", "5s", "500ms"); 10 when unreadable."""
    try:
        return parse_duration(text) if text else 10.0
    except ValueError:
        return 10.0


def field_of(message: str) -> str:
    """The form input an INVALID_ARGUMENT message is about ("args.container: ..." -> "container")."""
    head = message.split(":", 1)[0].strip()
    return head.removeprefix("args.") if head else ""


def mace_rows(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """MACE's two directions as table rows."""
    return [{"direction": name, **summary.get(name, {})} for name in ("egress", "ingress")]


def iron_rows(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """Iron's containers, the most CPU first."""
    rows = summary.get("per_container") or []
    return sorted(rows, key=lambda c: -(c.get("charged_ns", 0) + c.get("caused_ns", 0)))


@bp.route("/", methods=["GET", "POST"])
def index():  # noqa: ANN201 - a view
    """The form; on POST, run the preset and show its summary."""
    agents, agent_error = agent_views()
    form = PresetForm()
    if request.method == "GET":
        connected = [a["node"] for a in agents if a["connected"]]
        form.node = request.args.get("node") or (connected[0] if connected else "")
        return render_template("presets.html", form=form, agents=agents, agent_error=agent_error, **_empty())
    form = PresetForm.from_request()
    field_errors: dict[str, list[str]] = {}
    error = None
    summary = None
    try:
        result = get_client().run_preset(form.request(), duration_s(form.duration))
        summary = json.loads(result.summary_json)
    except ApiError as failure:
        if failure.code == grpc.StatusCode.INVALID_ARGUMENT:
            for problem in failure.message.split("; "):
                field_errors.setdefault(field_of(problem), []).append(problem)
        error = failure.message
    status = 200
    if error:
        status = 400 if field_errors else 502
    return (
        render_template(
            "presets.html",
            form=form,
            agents=agents,
            agent_error=agent_error,
            error=error,
            field_errors=field_errors,
            summary=summary,
            mace=mace_rows(summary) if summary and form.preset == "mace" else [],
            iron=iron_rows(summary) if summary and form.preset == "iron" else [],
        ),
        status,
    )


def _empty() -> dict[str, Any]:
    return {"error": None, "field_errors": {}, "summary": None, "mace": [], "iron": []}
