"""Presets run through the dispatcher: `Hoptrace.RunPreset` sends `RunPreset` down one agent's session and
waits for its `PresetResult`.

A preset (``mace``, ``iron``) is what ``hoptrace-agent mace|iron`` runs locally, once, for a bounded duration;
the agent answers with the preset's final summary as JSON. Requests are checked here first so that a bad one
names its field (``preset``, ``args.container``, ...) instead of failing on the node.
"""

from __future__ import annotations

import threading
import time
import uuid

import grpc

from hoptrace.common.durations import parse_duration
from hoptrace.dispatcher.registry import AgentRegistry
from hoptrace.dispatcher.signing import MessageSigner
from hoptrace.spec import FieldError, workloads
from hoptrace.v1 import agent_pb2

# The flags each preset takes remotely (hoptrace-agent mace|iron, without dashes). Left out on purpose:
# "object" (a file on the node to load as BPF), "influx-*" (a node's root agent would send to any URL a
# user names), "packets" (per-packet lines a summary does not carry) and "node" (the dispatcher sets it to
# the node's name). The agent refuses the local-only ones too.
PRESET_ARGS: dict[str, frozenset[str]] = {
    "mace": frozenset({"container", "path", "host-netns", "inner", "outer", "peer", "duration"}),
    "iron": frozenset({"host-netns", "duration"}),
    # Path discovery (dispatcher/discover.py): the flow as a FlowMatch in protojson, the ID origin (the
    # dispatcher's own) and the origins of overlapping traces to follow.
    "discover": frozenset({"match", "duration", "packets", "origin", "follow"}),
}
REQUIRED_ARGS: dict[str, frozenset[str]] = {
    "mace": frozenset({"container"}),
    "iron": frozenset(),
    "discover": frozenset({"match"}),
}
MACE_PATHS = ("inner-dev", "max-dev", "syscalls")
DEFAULT_DURATION_S = 10.0
MAX_DURATION_S = 3600.0
# Beyond the preset's duration: loading and attaching its programs, reading its maps, the stream both ways.
RESULT_GRACE_S = 30.0


def validate_preset_request(
    node: str, preset: str, args: dict[str, str], registration: agent_pb2.Register | None
) -> list[FieldError]:
    """The request's problems, each naming its field; `registration` is the node's (None: unknown node)."""
    errors: list[FieldError] = []
    if not node:
        errors.append(FieldError("node", "required"))
    if preset not in PRESET_ARGS:
        errors.append(FieldError("preset", f"unknown preset {preset!r}: one of {', '.join(PRESET_ARGS)}"))
        return errors
    for key in sorted(set(args) - PRESET_ARGS[preset]):
        errors.append(
            FieldError(
                f"args.{key}",
                f"{preset} does not take {key!r}: one of {', '.join(sorted(PRESET_ARGS[preset]))}",
            )
        )
    for key in sorted(REQUIRED_ARGS[preset] - {k for k, v in args.items() if v}):
        errors.append(FieldError(f"args.{key}", "required"))
    if "duration" in args:
        try:
            seconds = parse_duration(args["duration"])
        except ValueError:
            seconds = -1.0
        if not 0 < seconds <= MAX_DURATION_S:
            errors.append(
                FieldError("args.duration", f"{args['duration']!r}: want 0 < duration <= 1h, e.g. 3s")
            )
    if preset == "mace" and args.get("path", "inner-dev") not in MACE_PATHS:
        errors.append(FieldError("args.path", f"{args['path']!r}: one of {', '.join(MACE_PATHS)}"))
    container = args.get("container", "")
    if workloads.is_workload_netns(container):
        errors.extend(_workload_errors(node, container, registration))
    elif registration is not None and container and not container.isdigit() and "/" not in container:
        known = {ns.name for ns in registration.namespaces if ns.name}
        if container not in known:
            errors.append(FieldError("args.container", f"node {node} has no network namespace {container!r}"))
    return errors


def _workload_errors(node: str, container: str, registration: agent_pb2.Register | None) -> list[FieldError]:
    """Why `args.container` (container:NAME or pod:NS/NAME) does not name a workload of the node, if it
    does not."""
    try:
        ref = workloads.parse_workload_netns(container)
    except ValueError as error:
        return [FieldError("args.container", str(error))]
    if registration is not None and workloads.find_workload(registration, ref) is None:
        known = workloads.known_workloads(registration, ref)
        return [FieldError("args.container", f"node {node} reported no {ref}; {known}")]
    return []


def agent_args(
    preset: str, args: dict[str, str], node: str, registration: agent_pb2.Register | None = None
) -> dict[str, str]:
    """The args as the agent takes them: durations in Go's syntax, the node's name for the summary, and a
    container:/pod: `container` as the namespace the node reported the workload in (the agent never parses
    the workload form)."""
    out = dict(args)
    container = out.get("container", "")
    if registration is not None and workloads.is_workload_netns(container):
        workload = workloads.find_workload(registration, workloads.parse_workload_netns(container))
        if workload is not None:
            # "" (a workload in the node's own namespace) is the agent's own: /proc/1/ns/net names it
            out["container"] = workload.netns or "/proc/1/ns/net"
    seconds = parse_duration(args["duration"]) if "duration" in args else DEFAULT_DURATION_S
    out["duration"] = f"{int(round(seconds * 1000))}ms"
    out["node"] = node
    return out


class PresetError(Exception):
    """A preset request that failed; `code` is the gRPC status the API answers with."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class PresetRunner:
    """Sends RunPreset to agents and hands each PresetResult to the request waiting for it."""

    def __init__(
        self, registry: AgentRegistry, grace_s: float = RESULT_GRACE_S, signer: MessageSigner | None = None
    ) -> None:
        self.registry = registry
        self.signer = signer or MessageSigner()
        self.grace_s = grace_s
        self._lock = threading.Lock()
        self._waiting: dict[str, tuple[threading.Event, list[agent_pb2.PresetResult]]] = {}

    def run(self, node: str, preset: str, args: dict[str, str]) -> agent_pb2.PresetResult:
        """Run `preset` on `node` and return its result; raises PresetError (with the status to answer)."""
        entry = self.registry.registrations().get(node) if node else None
        errors = validate_preset_request(node, preset, args, entry)
        if errors:
            raise PresetError(grpc.StatusCode.INVALID_ARGUMENT, "; ".join(str(e) for e in errors))
        connection = self.registry.connection(node)
        if connection is None:
            raise PresetError(grpc.StatusCode.NOT_FOUND, f"node {node!r}: no agent connected")
        sent_args = agent_args(preset, args, node, entry)
        timeout = parse_duration(sent_args["duration"]) + self.grace_s
        request = agent_pb2.RunPreset(id=uuid.uuid4().hex, preset=preset, args=sent_args)
        done = threading.Event()
        box: list[agent_pb2.PresetResult] = []
        with self._lock:
            self._waiting[request.id] = (done, box)
        try:
            if not self.signer.deliver(connection, node, run_preset=request):
                raise PresetError(grpc.StatusCode.UNAVAILABLE, f"node {node}: agent disconnected")
            deadline = time.monotonic() + timeout
            while not done.wait(min(0.5, max(0.0, deadline - time.monotonic()))):
                if connection.closed:
                    raise PresetError(
                        grpc.StatusCode.UNAVAILABLE, f"node {node}: agent disconnected during {preset}"
                    )
                if time.monotonic() >= deadline:
                    raise PresetError(
                        grpc.StatusCode.DEADLINE_EXCEEDED,
                        f"node {node}: no {preset} result within {timeout:g}s",
                    )
        finally:
            with self._lock:
                self._waiting.pop(request.id, None)
        result = box[0]
        if result.error:
            raise PresetError(
                grpc.StatusCode.FAILED_PRECONDITION, f"node {node}: {preset} failed: {result.error}"
            )
        return result

    def on_result(self, node: str, result: agent_pb2.PresetResult) -> None:
        """Hand a PresetResult an agent sent to its request (dropped when nobody waits any more)."""
        with self._lock:
            waiting = self._waiting.get(result.id)
        if waiting is not None:
            waiting[1].append(result)
            waiting[0].set()
