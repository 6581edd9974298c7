"""Hops named by the workloads users know: ``netns: container:NAME`` and ``netns: pod:NAMESPACE/NAME``.

Agents report, per network namespace, the Docker containers whose processes run there and the Kubernetes
pods they belong to (`Namespace.workloads`). Checked against the agents (`check_spec`, at every apply), a
hop's workload netns is resolved against its node's latest inventory into the typed `HopSpec.workload`: the
plan attaches in `workload.netns`, the collector tags points with `workload.container_name` and `pod_*`, and
nothing downstream parses `netns` again. A container that restarts gets a new namespace: apply the spec
again to follow it.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Mapping
from dataclasses import dataclass

from hoptrace.spec.attach import AttachPoint, parse_attach_point
from hoptrace.v1 import agent_pb2, trace_pb2

CONTAINER_PREFIX = "container:"
POD_PREFIX = "pod:"
# Docker container names ([a-zA-Z0-9][a-zA-Z0-9_.-]*) or ids; Kubernetes namespace and pod names (DNS labels
# and subdomains).
_CONTAINER = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
_POD = re.compile(r"^([a-z0-9]([a-z0-9-]*[a-z0-9])?)/([a-z0-9]([a-z0-9.-]*[a-z0-9])?)$")
SHORT_ID_LEN = 12  # what `docker ps` shows


@dataclass(frozen=True)
class WorkloadRef:
    """A parsed workload netns: a container (name or id) or a pod."""

    container: str = ""
    pod_namespace: str = ""
    pod_name: str = ""

    def __str__(self) -> str:
        if self.container:
            return f"container {self.container!r}"
        return f"pod {self.pod_namespace}/{self.pod_name}"


def is_workload_netns(netns: str) -> bool:
    """Whether a hop's netns names a workload rather than a namespace."""
    return netns.startswith((CONTAINER_PREFIX, POD_PREFIX))


def parse_workload_netns(netns: str) -> WorkloadRef:
    """The workload a netns value names; ValueError with the form expected."""
    if netns.startswith(CONTAINER_PREFIX):
        name = netns.removeprefix(CONTAINER_PREFIX)
        if not _CONTAINER.match(name):
            raise ValueError(
                f"{netns!r}: container:NAME takes a Docker container name or id ([A-Za-z0-9][A-Za-z0-9_.-]*)"
            )
        return WorkloadRef(container=name)
    name = netns.removeprefix(POD_PREFIX)
    match = _POD.match(name)
    if not match:
        raise ValueError(f"{netns!r}: pod:NAMESPACE/NAME takes a Kubernetes namespace and pod name")
    return WorkloadRef(pod_namespace=match.group(1), pod_name=match.group(3))


def _matches(ref: WorkloadRef, workload: trace_pb2.Workload) -> bool:
    if ref.container:
        if ref.container == workload.container_name:
            return True
        # An id: the full one, or a prefix as long as the one `docker ps` prints, or longer.
        return len(ref.container) >= SHORT_ID_LEN and workload.container_id.startswith(ref.container)
    return (ref.pod_namespace, ref.pod_name) == (workload.pod_namespace, workload.pod_name)


def find_workload(registration: agent_pb2.Register, ref: WorkloadRef) -> trace_pb2.Workload | None:
    """The first workload of the node's inventory that `ref` names, with its netns set, or None."""
    for namespace in registration.namespaces:
        for workload in namespace.workloads:
            if _matches(ref, workload):
                found = trace_pb2.Workload()
                found.CopyFrom(workload)
                found.netns = namespace.name
                return found
    return None


def known_workloads(registration: agent_pb2.Register, ref: WorkloadRef) -> str:
    """What the node reported of the kind `ref` asks for, for an error message."""
    if ref.container:
        names = sorted({w.container_name for ns in registration.namespaces for w in ns.workloads})
        kind = "containers"
    else:
        names = sorted(
            {
                f"{w.pod_namespace}/{w.pod_name}"
                for ns in registration.namespaces
                for w in ns.workloads
                if w.pod_name
            }
        )
        kind = "pods"
    if names:
        return f"{kind} there: {', '.join(names)}"
    runtime = registration.runtime
    if runtime.error:
        return f"no {kind} known there: its container runtime could not be asked ({runtime.error})"
    if not runtime.endpoint:
        return f"no {kind} known there: its agent found no container runtime"
    return f"no {kind} running there"


def workload_label(workload: trace_pb2.Workload) -> str:
    """How reports name a hop's workload: the pod when it is one's, else the container."""
    if workload.pod_name:
        return f"pod {workload.pod_namespace}/{workload.pod_name} (container {workload.container_name})"
    return f"container {workload.container_name}"


_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def generated_hop_name(hop: trace_pb2.HopSpec, workload: trace_pb2.Workload, taken: set[str]) -> str:
    """A hop name for a hop given only by its workload: `<pod or container>-<dev>-<out|in>` (or the attach
    point for a hop without a device), unique among `taken`."""
    who = workload.pod_name or workload.container_name
    point: AttachPoint | None = None
    with contextlib.suppress(ValueError):  # validation names a bad `at`; this name is then never used
        point = parse_attach_point(hop.at)
    where = hop.dev or (point.target if point and point.target else hop.at)
    # tc and cgroup hops say which way they see packets; other kinds are named by their target or kind alone.
    direction = ""
    if point is not None and point.kind in ("tc", "cgroup_skb"):
        direction = "out" if point.is_egress else "in"
    base = "-".join(part for part in (who, where, direction) if part)
    base = _UNSAFE.sub("-", base).strip("-._")[:60] or "hop"
    name, n = base, 2
    while name in taken:
        name = f"{base}-{n}"
        n += 1
    return name


def resolve_workloads(
    spec: trace_pb2.TraceSpec, agents: Mapping[str, agent_pb2.Register]
) -> trace_pb2.TraceSpec:
    """A copy of `spec` whose workload-netns hops carry the workload their node reports (`HopSpec.workload`)
    and a generated name when they had none. A hop whose workload is not found is left without one, for
    `validate_spec` to name; a `workload` given by the user is dropped (it is output only)."""
    resolved = trace_pb2.TraceSpec()
    resolved.CopyFrom(spec)
    taken = {hop.name for hop in resolved.hops if hop.name}
    for hop in resolved.hops:
        hop.ClearField("workload")
        registration = agents.get(hop.node)
        if not is_workload_netns(hop.netns) or registration is None:
            continue
        try:
            ref = parse_workload_netns(hop.netns)
        except ValueError:
            continue
        workload = find_workload(registration, ref)
        if workload is None:
            continue
        hop.workload.CopyFrom(workload)
        if not hop.name:
            hop.name = generated_hop_name(hop, workload, taken)
            taken.add(hop.name)
    return resolved


def attach_netns(hop: trace_pb2.HopSpec) -> str:
    """The namespace a validated hop attaches in: its resolved workload's, else its netns."""
    return hop.workload.netns if hop.HasField("workload") else hop.netns
