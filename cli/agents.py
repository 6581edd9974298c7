"""``hoptrace agents`` (the registered agents: kernel, clock, transport, namespaces, workloads) and
``hoptrace version`` (this client's, the dispatcher's and the agents' versions)."""

from __future__ import annotations

import argparse
import json
from datetime import UTC, datetime
from typing import Any

from hoptrace.cli.api import CliError, client_of
from hoptrace.cli.table import table
from hoptrace.common.version import API_VERSION, package_version
from hoptrace.results.agent_view import agent_data, clock_jump_note, clock_texts, transport_state
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


# `hoptrace agents` fits a terminal of this many columns; --wide lists everything.
WIDTH = 100
SUMMARY_HEADER = ["NODE", "CONNECTED", "KERNEL", "CLOCK", "TRANSPORT", "NETNS", "CONTAINERS"]
WIDE_HEADER = [
    *["NODE", "CONNECTED", "KERNEL", "AGENT", "LAST HEARTBEAT", "CLOCK OFFSET", "BOUND", "DRIFT"],
    *["CLOCK MEASURED", "CLOCK JUMP", "TRANSPORT", "PEER", "BUFFERED", "DROPPED"],
    *["NAMESPACES", "CONTAINERS", "UNSUPPORTED"],
]


def age_text(at: Any, now: datetime) -> str:
    """How long ago a timestamp was: "3s ago", "5m ago"; "-" when unset."""
    if not at.seconds and not at.nanos:
        return "-"
    seconds = max(0, int((now - at.ToDatetime(tzinfo=UTC)).total_seconds()))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit} ago"
    return f"{seconds}s ago"


def containers_of(agent: api_pb2.Agent) -> list[str]:
    """The agent's containers as `hoptrace agents` names them, or its runtime's error."""
    registration = agent.registration
    if registration.runtime.error:
        return [f"({registration.runtime.error})"]
    return [workload_text(w) for namespace in registration.namespaces for w in namespace.workloads]


def summary_row(agent: api_pb2.Agent, now: datetime) -> list[str]:
    """One agent's row of `hoptrace agents`: namespaces and containers counted (listed by --wide)."""
    clock = clock_texts(agent.clock, now)
    registration = agent.registration
    transport = "-"
    if agent.HasField("transport") and agent.transport.kind:
        kind, state, buffered, dropped = transport_cells(agent)
        transport = f"{kind} {state}"
        transport += f", {buffered} buffered" if buffered != "0" else ""
        transport += f", {dropped} dropped" if dropped != "0" else ""
    containers = containers_of(agent)
    return [
        registration.node,
        f"{'yes' if agent.connected else 'no'}, {age_text(agent.last_heartbeat, now)}",
        registration.kernel_release or "-",
        clock["offset"] if clock["bound"] == "-" else f"{clock['offset']} {clock['bound']}",
        transport,
        str(len(registration.namespaces)),
        "-" if registration.runtime.error else str(len(containers)),
    ]


def names_within(names: list[str], width: int) -> str:
    """`names` joined, as many as fit in `width` columns, the rest counted: "a, b, +3 more (--wide)"."""
    shown: list[str] = []
    for position, name in enumerate(names):
        rest = len(names) - position - 1
        tail = f", +{rest} more (--wide)" if rest else ""
        if len(", ".join([*shown, name]) + tail) > width:
            break
        shown.append(name)
    if len(shown) == len(names):
        return ", ".join(shown)
    return ", ".join([*shown, f"+{len(names) - len(shown)} more (--wide)"])


def summary_table(agents: list[api_pb2.Agent], now: datetime | None = None) -> str:
    """`hoptrace agents`: one line per agent, then each agent's containers named as far as one line of
    WIDTH columns holds them (--wide: every namespace, container and unsupported attach kind)."""
    now = now or datetime.now(UTC)
    lines = table([SUMMARY_HEADER, *(summary_row(agent, now) for agent in agents)]).splitlines()
    for agent in agents:
        containers = containers_of(agent)
        if containers:
            label = f"{agent.registration.node} containers: "
            lines.append(label + names_within(containers, WIDTH - len(label)))
    for agent in agents:
        note = clock_jump_note(agent.registration.node, agent.clock, now)
        if note:
            lines.append(f"note: {note}")
    return "\n".join(lines)


def agent_row(agent: api_pb2.Agent) -> list[str]:
    """One agent's row of `hoptrace agents --wide`."""
    clock = clock_texts(agent.clock)
    registration = agent.registration
    namespaces = ",".join(namespace.name or "(own)" for namespace in registration.namespaces)
    containers = ",".join(containers_of(agent))
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
        clock["jump"],
        *transport_cells(agent),
        namespaces or "-",
        containers or "-",
        unsupported or "-",
    ]


def run_agents(args: argparse.Namespace) -> int:
    """hoptrace agents [--wide | --json]."""
    agents = client_of(args).agents()
    if args.json:
        print(json.dumps([agent_data(agent) for agent in agents], indent=2))
        return 0
    if not agents:
        print("no agents registered")
        return 0
    if args.wide:
        print(table([WIDE_HEADER, *(agent_row(agent) for agent in agents)]))
    else:
        print(summary_table(agents))
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
    output = agents.add_mutually_exclusive_group()
    output.add_argument(
        "--wide", action="store_true", help="every namespace, container and unsupported attach kind"
    )
    output.add_argument("--json", action="store_true", help="print JSON")
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
