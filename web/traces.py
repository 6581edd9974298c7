"""Traces: list, create and edit from a form or from YAML, validate inline, apply, delete.

Every check shown is the dispatcher's own: the spec's structure through `hoptrace.spec` (the code
the CLI and the dispatcher parse specs with), everything else through `ValidateTrace` over gRPC, whose
`FieldError`s are placed next to the field they name (``hops[2].dev`` -> the dev box of the third hop row).
The YAML shown is `spec_to_yaml`, so `hoptrace trace apply -f` of it applies the same spec.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc
from flask import (
    Blueprint,
    Response,
    abort,
    flash,
    jsonify,
    redirect,
    render_template,
    request,
    stream_with_context,
    url_for,
)

from hoptrace.common.client import ApiError
from hoptrace.common.durations import parse_duration
from hoptrace.results.path_view import path_data
from hoptrace.results.trace_view import node_states, status_text
from hoptrace.spec import FieldError, SpecError, load_spec, spec_from_data, spec_to_yaml
from hoptrace.spec.actions import action_to_data
from hoptrace.spec.spec import FILTER_KEYS, HOP_STRING_KEYS
from hoptrace.v1 import api_pb2, trace_pb2
from hoptrace.web import pathgraph
from hoptrace.web.agents import agent_views
from hoptrace.web.dispatcher import get_client

# A hop row's inputs: the spec's string keys, and its actions carried as JSON in a hidden input (the form
# does not edit them yet; editing a trace keeps them).
ROW_KEYS = (*HOP_STRING_KEYS, "actions")


def _actions_json(hop: trace_pb2.HopSpec) -> str:
    return json.dumps([action_to_data(action) for action in hop.actions]) if hop.actions else ""


bp = Blueprint("traces", __name__, url_prefix="/traces")

# Offered in the `at` box; any other value (tracepoint:GROUP:EVENT, fentry:FUNCTION, ...) can be typed.
AT_CHOICES = (
    "tc-egress",
    "tc-ingress",
    "xdp",
    "cgroup-egress",
    "cgroup-ingress",
    "tracepoint:net:netif_receive_skb",
    "tracepoint:net:net_dev_xmit",
    "tracepoint:net:netif_rx",
    "tracepoint:net:napi_gro_receive_entry",
    "fentry:",
    "fexit:",
    "kprobe:",
    "kretprobe:",
)
# The capability key (Register.capabilities.attach) behind each `at` form, to mark unsupported choices.
AT_KIND = {"tc": "tcx", "xdp": "xdp", "cgroup": "cgroup_skb", "tracepoint": "tp_btf"}
_HOP_FIELD = re.compile(r"^hops\[(\d+)\](?:\.(\w+))?$")
# "Discover hops" on the form (Hoptrace.Discover): how long the page waits for the agents to look.
DEFAULT_DISCOVER_S = 3
MAX_DISCOVER_S = 30
_ROW_KEY = re.compile(r"^hops-(\d+)-(\w+)$")


@dataclass
class TraceForm:
    """The trace form's values, as typed (strings); `rows` maps each hop to its row number in the request."""

    name: str = ""
    protocol: str = ""
    src: str = ""
    dst: str = ""
    src_port: str = ""
    dst_port: str = ""
    sample: str = "1"
    hops: list[dict[str, str]] = field(default_factory=list)
    rows: list[int] = field(default_factory=list)

    @classmethod
    def from_spec(cls, spec: trace_pb2.TraceSpec) -> TraceForm:
        """The form showing an applied spec."""
        flt = spec.filter
        return cls(
            name=spec.name,
            protocol=flt.protocol,
            src=flt.src,
            dst=flt.dst,
            src_port=str(flt.src_port) if flt.src_port else "",
            dst_port=str(flt.dst_port) if flt.dst_port else "",
            sample=str(spec.sample or 1),
            hops=[
                {**{key: getattr(hop, key) for key in HOP_STRING_KEYS}, "actions": _actions_json(hop)}
                for hop in spec.hops
            ],
            rows=list(range(len(spec.hops))),
        )

    @classmethod
    def from_request(cls, form: Mapping[str, str]) -> TraceForm:
        """The form as posted: hop rows `hops-N-KEY` in row order, rows left all blank dropped."""
        values = {key: form.get(key, "").strip() for key in ("name", *FILTER_KEYS, "sample")}
        rows: dict[int, dict[str, str]] = {}
        for key, value in form.items():
            match = _ROW_KEY.match(key)
            if match and match.group(2) in ROW_KEYS:
                rows.setdefault(int(match.group(1)), {})[match.group(2)] = value.strip()
        hops, numbers = [], []
        for number in sorted(rows):
            hop = {key: rows[number].get(key, "") for key in ROW_KEYS}
            if any(hop.values()):
                hops.append(hop)
                numbers.append(number)
        return cls(**values, hops=hops, rows=numbers)

    def to_data(self) -> dict[str, Any]:
        """The spec document (as YAML would give it): numbers where the boxes hold numbers, empty left out."""

        def number(text: str) -> int | str:
            return int(text) if re.fullmatch(r"\d{1,10}", text) else text

        data: dict[str, Any] = {"name": self.name}
        flt: dict[str, Any] = {
            key: getattr(self, key) for key in ("protocol", "src", "dst") if getattr(self, key)
        }
        for key in ("src_port", "dst_port"):
            if getattr(self, key):
                flt[key] = number(getattr(self, key))
        if flt:
            data["filter"] = flt
        if self.sample:
            data["sample"] = number(self.sample)
        data["hops"] = [{key: value for key, value in hop.items() if value} for hop in self.hops]
        for hop in data["hops"]:
            if "actions" in hop:
                with contextlib.suppress(ValueError):  # left as text: the spec check says "must be a list"
                    hop["actions"] = json.loads(hop["actions"])
        return data


def input_name(field_path: str) -> str | None:
    """The form input a FieldError's path is about (``hops[2].dev`` -> ``hops-2-dev``), None for the
    spec as a whole."""
    if field_path in ("name", "sample", "discover_duration"):
        return field_path
    if field_path.startswith("filter."):
        return field_path.removeprefix("filter.")
    match = _HOP_FIELD.match(field_path)
    if match:
        return f"hops-{match.group(1)}-{match.group(2)}" if match.group(2) else f"hops-{match.group(1)}"
    return None


def errors_by_input(errors: Sequence[FieldError]) -> tuple[dict[str, list[str]], list[str]]:
    """FieldErrors placed by input name, and those about the whole spec (shown above the form)."""
    placed: dict[str, list[str]] = {}
    general: list[str] = []
    for error in errors:
        name = input_name(error.field)
        if name is None:
            general.append(str(error))
        else:
            placed.setdefault(name, []).append(error.reason)
    return placed, general


def check_form(form: TraceForm) -> tuple[trace_pb2.TraceSpec | None, list[FieldError]]:
    """The spec of `form` and the dispatcher's errors for it (structure first, then ValidateTrace)."""
    data = form.to_data()
    try:
        return spec_from_data(data), get_client().validate(spec_from_data(data))
    except SpecError as error:
        structural = error.errors
    # A box that is not a number (sample, ports) makes no spec: check the rest without it, so every other
    # field still gets the dispatcher's verdict in the same round.
    for field_error in structural:
        key = field_error.field.removeprefix("filter.")
        data.get("filter", {}).pop(key, None) if field_error.field.startswith("filter.") else data.pop(
            key, None
        )
    try:
        spec = spec_from_data(data)
    except SpecError:
        return None, structural
    broken = {field_error.field for field_error in structural}
    others = [error for error in get_client().validate(spec) if error.field not in broken]
    return None, structural + others


def trace_view(trace: api_pb2.Trace) -> dict[str, Any]:
    """One trace for the templates: its nodes' status (hoptrace.results.trace_view, as `hoptrace trace ls`
    says it) and a one-word state."""
    nodes = node_states(trace)
    active = sum(1 for node in nodes if node["active"])
    applied = (
        trace.applied_at.ToDatetime().isoformat(timespec="seconds") + "Z" if trace.applied_at.seconds else "-"
    )
    return {
        "name": trace.spec.name,
        "generation": trace.generation,
        "applied_at": applied,
        "hops": len(trace.spec.hops),
        "path": [hop.name for hop in trace.spec.hops],
        "node_names": list(dict.fromkeys(hop.node for hop in trace.spec.hops)),
        "nodes": nodes,
        "active": active,
        "status": status_text(trace),
        "state": "running"
        if nodes and active == len(nodes)
        else ("partly running" if active else "not running"),
        "protocol": trace.spec.filter.protocol or "udp+tcp",
    }


@bp.get("/")
def index():  # noqa: ANN201 - a view
    """Every applied trace with its state."""
    try:
        traces = [trace_view(trace) for trace in get_client().traces()]
    except ApiError as error:
        return render_template("traces/list.html", traces=[], error=error.message), 502
    return render_template("traces/list.html", traces=traces, error=None)


def _render_form(
    form: TraceForm,
    errors: Sequence[FieldError] = (),
    *,
    editing: str | None = None,
    message: str | None = None,
    status: int = 200,
    discovered: list[dict[str, Any]] | None = None,
    discover_duration: str = "",
    discovered_graph: str = "",
):  # noqa: ANN202
    agents, agent_error = agent_views()
    placed, general = errors_by_input(errors)
    if message:
        general = [message, *general]
    hops = form.hops + [dict.fromkeys(ROW_KEYS, "")]  # one blank row to fill in
    return (
        render_template(
            "traces/form.html",
            form=form,
            hops=hops,
            editing=editing,
            field_errors=placed,
            general_errors=general,
            agents=agents,
            agent_error=agent_error,
            at_choices=AT_CHOICES,
            discovered=discovered or [],
            discover_duration=discover_duration or str(DEFAULT_DISCOVER_S),
            discover_nodes=request.form.getlist("discover_nodes") if request.method == "POST" else [],
            discovered_graph=discovered_graph,
        ),
        status,
    )


def discover_request(
    form: TraceForm, duration: str, nodes: Sequence[str] = ()
) -> tuple[api_pb2.DiscoverRequest, list[FieldError]]:
    """The Discover request of the form's filter (hop rows are not needed) on `nodes` (none: every connected
    agent), and the boxes that hold no number where one belongs."""
    errors: list[FieldError] = []
    flt = trace_pb2.Filter(protocol=form.protocol, src=form.src, dst=form.dst)
    for key in ("src_port", "dst_port"):
        text = getattr(form, key)
        if text and not re.fullmatch(r"\d{1,5}", text):
            errors.append(FieldError(f"filter.{key}", f"{text!r} is not a port number"))
        elif text:
            setattr(flt, key, int(text))
    try:
        seconds = parse_duration(duration if not duration.replace(".", "", 1).isdigit() else duration + "s")
    except ValueError:
        seconds = -1.0
    if not 0 < seconds <= MAX_DISCOVER_S:
        errors.append(FieldError("discover_duration", f"{duration!r}: want 0 < seconds <= {MAX_DISCOVER_S}"))
        seconds = DEFAULT_DISCOVER_S
    request_ = api_pb2.DiscoverRequest(
        filter=flt, duration_ms=int(seconds * 1000), name=form.name, nodes=[n for n in nodes if n]
    )
    return request_, errors


def _dispatcher_field_errors(error: ApiError) -> list[FieldError]:
    """The FieldErrors of an INVALID_ARGUMENT answer (one "field: reason" per line)."""
    return [FieldError(*line.split(": ", 1)) for line in error.message.splitlines() if ": " in line]


def _discover_form_input() -> tuple[TraceForm, api_pb2.DiscoverRequest, str, list[FieldError]]:
    form = TraceForm.from_request(request.form)
    duration = request.form.get("discover_duration", "").strip() or str(DEFAULT_DISCOVER_S)
    request_, errors = discover_request(form, duration, request.form.getlist("discover_nodes"))
    return form, request_, duration, errors


def _discover(form: TraceForm, editing: str | None):  # noqa: ANN202
    """Run Discover on the form's filter (no script: the page waits); the most common path fills the hop
    rows, every path is shown, as a list and as the path graph."""
    _, request_, duration, errors = _discover_form_input()
    if errors:
        return _render_form(form, errors, editing=editing, status=422, discover_duration=duration)
    result = None
    try:
        for event in get_client().discover(request_):
            if event.HasField("result"):
                result = event.result
    except ApiError as error:
        if error.code == grpc.StatusCode.INVALID_ARGUMENT:
            field_errors = _dispatcher_field_errors(error)
            return _render_form(form, field_errors, editing=editing, status=422, discover_duration=duration)
        return _render_form(
            form, editing=editing, message=f"discovery failed: {error.message}", status=502,
            discover_duration=duration,
        )  # fmt: skip
    if result is None or not result.paths:
        message = (
            result.message if result is not None else "the dispatcher ended the discovery without a result"
        )
        return _render_form(form, editing=editing, message=message, status=200, discover_duration=duration)
    form.hops = [
        {**{key: getattr(hop, key) for key in HOP_STRING_KEYS}, "actions": _actions_json(hop)}
        for hop in result.spec.hops
    ]
    form.rows = list(range(len(form.hops)))
    flash(
        f"Discovered {len(result.paths)} path(s) from {result.packets} packets; the most common one fills "
        "the hops below. Apply it to trace it."
    )
    return _render_form(
        form, editing=editing, discovered=[path_data(p) for p in result.paths], discover_duration=duration,
        discovered_graph=pathgraph.render(pathgraph.from_discovery(result), applicable=True),
    )  # fmt: skip


def discovery_view(result: api_pb2.DiscoverResult) -> dict[str, Any]:
    """A Discover result as the new-trace page's script takes it: the graph (SVG and data), the message
    when nothing was seen."""
    view: dict[str, Any] = {
        "packets": result.packets,
        "nodes": list(result.nodes),
        "message": result.message,
        "name": result.spec.name,
    }
    if result.paths:
        graph = pathgraph.from_discovery(result)
        view["graph"] = graph.to_data()
        view["graph_html"] = pathgraph.render(graph, applicable=True)
    return view


@bp.post("/discover.ndjson")
def discover_stream():  # noqa: ANN201 - a view
    """Discover from the form's filter, streamed as JSON lines while the agents look: ``{"progress": ...}``
    for each of the dispatcher's progress events, then ``{"result": ...}`` (discovery_view) or
    ``{"error": ...}``. A form the request cannot be made of is refused at once (422, errors by input)."""
    form, request_, _, errors = _discover_form_input()
    if errors:
        return jsonify({"errors": _placed(form, errors), "general": []}), 422
    client = get_client()

    def events() -> Iterator[str]:
        try:
            for event in client.discover(request_):
                if event.HasField("result"):
                    line: dict[str, Any] = {"result": discovery_view(event.result)}
                else:
                    fields = ("message", "node", "packets", "nodes_pending")
                    line = {"progress": {key: getattr(event.progress, key) for key in fields}}
                yield json.dumps(line) + "\n"
        except ApiError as error:
            failure: dict[str, Any] = {"error": f"discovery failed: {error.message}"}
            if error.code == grpc.StatusCode.INVALID_ARGUMENT:
                failure["errors"] = _placed(form, _dispatcher_field_errors(error))
            yield json.dumps(failure) + "\n"

    # No buffering on the way (a proxy would otherwise hold the progress back until the end).
    return Response(
        stream_with_context(events()), mimetype="application/x-ndjson",
        headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
    )  # fmt: skip


def _handle_form(form: TraceForm, editing: str | None):  # noqa: ANN202
    """POST of the form: add/remove a row, discover the hops, validate, or validate then apply."""
    action = request.form.get("action", "validate")
    if action == "discover":
        return _discover(form, editing)
    if action == "add-hop":
        form.hops.append(dict.fromkeys(ROW_KEYS, ""))
        return _render_form(form, editing=editing)
    if action.startswith("remove-hop-"):
        number = (
            int(action.removeprefix("remove-hop-")) if action.removeprefix("remove-hop-").isdigit() else -1
        )
        if number in form.rows:
            del form.hops[form.rows.index(number)]
        return _render_form(form, editing=editing)
    try:
        spec, errors = check_form(form)
    except ApiError as error:
        return _render_form(form, editing=editing, message=error.message, status=502)
    if errors or spec is None:
        return _render_form(form, errors, editing=editing, status=422)
    if action != "apply":
        return _valid(form, editing)
    try:
        trace = get_client().apply(spec)
    except ApiError as error:
        return _render_form(form, editing=editing, message=f"apply failed: {error.message}", status=422)
    flash(f"Trace {trace.spec.name} applied (generation {trace.generation}).")
    return redirect(url_for("traces.detail", name=trace.spec.name))


def _valid(form: TraceForm, editing: str | None):  # noqa: ANN202
    flash("The dispatcher accepts this spec (schema and agents). Apply it to start tracing.")
    return _render_form(form, editing=editing)


@bp.route("/new", methods=("GET", "POST"))
def new():  # noqa: ANN201 - a view
    """A new trace from the form."""
    if request.method == "POST":
        return _handle_form(TraceForm.from_request(request.form), None)
    return _render_form(TraceForm(hops=[]))


@bp.route("/<name>/edit", methods=("GET", "POST"))
def edit(name: str):  # noqa: ANN201 - a view
    """Change an applied trace through the form (applying updates it in place)."""
    if request.method == "POST":
        return _handle_form(TraceForm.from_request(request.form), name)
    trace = _get_trace_or_404(name)
    return _render_form(TraceForm.from_spec(trace.spec), editing=name)


@bp.post("/validate.json")
def validate_json():  # noqa: ANN201 - a view
    """The dispatcher's errors for the posted form, each with the input it belongs to (inline validation
    while typing; `input` uses the row numbers of the request)."""
    form = TraceForm.from_request(request.form)
    try:
        _, errors = check_form(form)
    except ApiError as error:
        return jsonify({"errors": [], "general": [error.message]}), 502
    return jsonify({"errors": _placed(form, errors), "valid": not errors})


def _placed(form: TraceForm, errors: Sequence[FieldError]) -> list[dict[str, str | None]]:
    """Each error with the input it belongs to, by the row numbers of the request."""
    placed = []
    for error in errors:
        name = input_name(error.field)
        match = _HOP_FIELD.match(error.field)
        if match and int(match.group(1)) < len(form.rows):
            row = form.rows[int(match.group(1))]
            name = f"hops-{row}-{match.group(2)}" if match.group(2) else f"hops-{row}"
        placed.append({"field": error.field, "reason": error.reason, "input": name})
    return placed


def _get_trace_or_404(name: str) -> api_pb2.Trace:
    try:
        return get_client().trace(name)
    except ApiError as error:
        if error.code is not None and error.code.name == "NOT_FOUND":
            abort(404, description=error.message)
        abort(502, description=error.message)


@bp.get("/<name>")
def detail(name: str):  # noqa: ANN201 - a view
    """One trace: where it runs, hop by hop, and its spec as YAML."""
    trace = _get_trace_or_404(name)
    return render_template("traces/detail.html", trace=trace_view(trace), yaml_text=spec_to_yaml(trace.spec))


@bp.get("/<name>/spec.yaml")
def spec_yaml(name: str) -> Response:
    """The applied spec as YAML, exactly what `hoptrace trace apply -f` takes."""
    trace = _get_trace_or_404(name)
    return Response(
        spec_to_yaml(trace.spec),
        mimetype="text/yaml",
        headers={"Content-Disposition": f'inline; filename="{trace.spec.name}.yaml"'},
    )


@bp.route("/yaml", methods=("GET", "POST"))
def yaml_editor():  # noqa: ANN201 - a view
    """Paste (or edit) a spec as YAML or JSON; validate it, or apply it."""
    text = ""
    errors: list[str] = []
    status = 200
    if request.method == "POST":
        text = request.form.get("spec", "")
        try:
            spec = load_spec(text)  # the CLI's parser: syntax and schema errors carry their line
            errors = [str(error) for error in get_client().validate(spec)]
        except SpecError as error:
            spec, errors = None, [str(item) for item in error.errors]
        except ApiError as error:
            spec, errors = None, [error.message]
        if errors or spec is None:
            status = 422
        elif request.form.get("action") == "apply":
            try:
                trace = get_client().apply(spec)
            except ApiError as error:
                errors, status = [f"apply failed: {error.message}"], 422
            else:
                flash(f"Trace {trace.spec.name} applied (generation {trace.generation}).")
                return redirect(url_for("traces.detail", name=trace.spec.name))
        else:
            flash("The dispatcher accepts this spec (schema and agents). Apply it to start tracing.")
    elif request.args.get("from"):
        text = spec_to_yaml(_get_trace_or_404(request.args["from"]).spec)
    return render_template("traces/yaml.html", text=text, errors=errors), status


@bp.post("/<name>/delete")
def delete(name: str):  # noqa: ANN201 - a view
    """Detach a trace everywhere."""
    try:
        get_client().delete(name)
    except ApiError as error:
        flash(f"Deleting {name} failed: {error.message}", "error")
        return redirect(url_for("traces.index"))
    flash(f"Trace {name} deleted.")
    return redirect(url_for("traces.index"))
