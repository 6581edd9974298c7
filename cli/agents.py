"""``hoptrace agents`` (the registered agents: kernel, clock, transport, namespaces, workloads) and
``hoptrace version`` (this client's, the dispatcher's and the agents' versions)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from hoptrace.cli.api import CliError, client_of
from hoptrace.cli.table import table
from hoptrace.common.version import API_VERSION, package_version
from hoptrace.results.agent_view import agent_data, clock_texts, transport_state
from hoptrace.results.format import timestamp_text
from hoptrace.v1 import api_pb2, trace_pb2

# `hoptrace version` says what it knows at once when no dispatcher answers.
VERSION_TIMEOUT_S = 10.0


def workload_text(workload: trace_pb2.Workload) -> str:
    """A container as `hoptrace agents` lists it: its name, its pod in brackets when it is a pod's."""
    if workload.pod_name:
        return f"{workload.container_name}[pod {workload.pod_namespace}/{workload.pod_name}]"
    return workload.container_name


def transport_cells(agent: api_pb2.Agent) -> list[str]:
    """TRANSPORT, PEER, BUFFERED, DROPPED cells of `hoptrace agents`."""
    if not agent.HasField("transport"):
        return ["-", "-", "-", "-"]
    transport = agent.transport
    kind = transport.kind or "-"
    if transport.kind == "kafka":
        kind = f"kafka:{transport.topic}/{transport.partitions}p"
    return [
        kind,
        transport_state(transport),
        str(transport.buffered_records),
        str(transport.dropped_records),
    ]


def agent_row(agent: api_pb2.Agent) -> list[str]:
    """One agent's row of `hoptrace agents`."""
    clock = clock_texts(agent.clock)
    registration = agent.registration
    namespaces = ",".join(namespace.name or "(own)" for namespace in registration.namespaces)
    containers = ",".join(
        workload_text(workload) for namespace in registration.namespaces for workload in namespace.workloads
    )
    if registration.runtime.error:
        containers = f"({registration.runtime.error})"
    unsupported = ",".join(
        sorted(kind for kind, support in registration.capabilities.attach.items() if not support.supported)
    )
    return [
        registration.node,
        "yes" if agent.connected else "no",
        registration.kernel_release or "-",
        registration.agent_version or "-",
        timestamp_text(agent.last_heartbeat),
        clock["offset"],
        clock["bound"],
        clock["drift"],
        clock["measured"],
        *transport_cells(agent),
        namespaces or "-",
        containers or "-",
        unsupported or "-",
    ]


def run_agents(args: argparse.Namespace) -> int:
    """hoptrace agents [--json]."""
    agents = client_of(args).agents()
    if args.json:
        print(json.dumps([agent_data(agent) for agent in agents], indent=2))
        return 0
    if not agents:
        print("no agents registered")
        return 0
    header = [
        *["NODE", "CONNECTED", "KERNEL", "AGENT", "LAST HEARTBEAT", "CLOCK OFFSET", "BOUND", "DRIFT"],
        *["CLOCK MEASURED", "TRANSPORT", "PEER", "BUFFERED", "DROPPED"],
        *["NAMESPACES", "CONTAINERS", "UNSUPPORTED"],
    ]
    print(table([header, *(agent_row(agent) for agent in agents)]))
    return 0


def run_version(args: argparse.Namespace) -> int:
    """hoptrace version [--json]: this package and its API; the dispatcher's and the agents' versions when
    the dispatcher answers (exit 0 either way: the local part is always known)."""
    data: dict[str, Any] = {
        "hoptrace": package_version(),
        "api": API_VERSION,
        "dispatcher": {"address": args.dispatcher, "version": None, "api": None, "error": None},
        "agents": {},
    }
    try:
        client = client_of(args)
        version = client.version(timeout=VERSION_TIMEOUT_S)
        data["dispatcher"].update(version=version.dispatcher, api=version.api)
        agents = client.agents(timeout=VERSION_TIMEOUT_S)
        data["agents"] = {agent.registration.node: agent.registration.agent_version for agent in agents}
    except CliError as error:  # an ApiError too
        data["dispatcher"]["error"] = str(error)
    if args.json:
        print(json.dumps(data, indent=2))
        return 0
    print(f"hoptrace {data['hoptrace']} (API {data['api']})")
    dispatcher = data["dispatcher"]
    if dispatcher["error"]:
        print(f"dispatcher {args.dispatcher}: not reached: {dispatcher['error']}")
        return 0
    mismatch = "" if dispatcher["api"] == API_VERSION else f" - not this client's API {API_VERSION}"
    print(
        f"dispatcher {args.dispatcher}: hoptrace {dispatcher['version']} (API {dispatcher['api']}){mismatch}"
    )
    for node, agent_version in sorted(data["agents"].items()):
        print(f"agent {node}: {agent_version or 'unknown'}")
    return 0


def add_parser(subparsers: Any, client: argparse.ArgumentParser) -> None:
    """Register ``agents`` and ``version`` on a subparsers object (cli/main.py)."""
    agents = subparsers.add_parser(
        "agents", parents=[client], help="list registered agents", description="List the registered agents."
    )
    agents.add_argument("--json", action="store_true", help="print JSON")
    agents.set_defaults(func=run_agents)

    version = subparsers.add_parser(
        "version",
        parents=[client],
        help="versions: this client, its API, the dispatcher and the agents",
        description="Print this hoptrace's version and API; with a dispatcher that answers, its version and "
        "each registered agent's.",
    )
    version.add_argument("--json", action="store_true", help="print JSON")
    version.set_defaults(func=run_version)
