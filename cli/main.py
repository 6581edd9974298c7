"""`hoptrace`: run the dispatcher or the collector, and manage traces through the dispatcher's API.

Exit status: 0 success, 1 a failed request or invalid spec (details on stderr), 2 bad usage.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from google.protobuf import json_format

from hoptrace.cli.api import CliError, api_call
from hoptrace.common.client import APPLY_TIMEOUT_S
from hoptrace.common.durations import parse_duration
from hoptrace.common.grpcutil import (
    CA_ENV,
    CERT_ENV,
    DISPATCHER_ENV,
    INFLUX_TOKEN_ENV,
    KEY_ENV,
    ROLES,
    TOKEN_ENV,
    TOKEN_FILE_ENV,
    add_secret_argument,
    add_server_tls_arguments,
    add_token,
    secret_from,
    server_tls_from_args,
)
from hoptrace.common.timeouts import scaled
from hoptrace.common.version import API_VERSION, package_version
from hoptrace.results.agent_view import agent_data, clock_texts, transport_state
from hoptrace.results.format import timestamp_text
from hoptrace.results.packets_view import packets_from_proto, render_packets_text
from hoptrace.results.report_view import render_text, report_from_proto
from hoptrace.spec import SpecError, load_spec, spec_to_json, spec_to_yaml
from hoptrace.v1 import agent_pb2, api_pb2, trace_pb2

DEFAULT_DISPATCHER = "127.0.0.1:7070"


# ---- helpers -------------------------------------------------------------------------------------------


def _read_spec_text(path: str) -> bytes:
    """The spec file's bytes (load_spec decodes them and says so when they are not text)."""
    if path == "-":
        return sys.stdin.buffer.read()
    try:
        return Path(path).read_bytes()
    except OSError as error:
        raise CliError(f"cannot read {path}: {error.strerror}") from None


def _load_spec_file(path: str):
    text = _read_spec_text(path)
    try:
        return load_spec(text)
    except SpecError as error:
        shown = "stdin" if path == "-" else path
        raise CliError(f"invalid trace spec ({shown}):\n{error}") from None


def _table(rows: list[list[str]]) -> str:
    """Rows (the first is the header) as left-aligned columns."""
    widths = [max(len(row[column]) for row in rows) for column in range(len(rows[0]))]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() for row in rows
    )


def since_duration(text: str) -> timedelta:
    """`--since`: a duration such as 30s, 10m, 1h30m, 2d (hoptrace.common.durations)."""
    try:
        return timedelta(seconds=parse_duration(text))
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


# ---- trace commands ------------------------------------------------------------------------------------


def _node_summary(trace: api_pb2.Trace) -> str:
    healthy = sum(1 for status in trace.nodes if status.active and not status.error)
    return f"{healthy}/{len(trace.nodes)} nodes active"


def cmd_trace_apply(args: argparse.Namespace) -> int:
    """hoptrace trace apply -f SPEC."""
    spec = _load_spec_file(args.file)
    trace = api_call(args, "ApplyTrace", api_pb2.ApplyTraceRequest(spec=spec), timeout=APPLY_TIMEOUT_S)
    nodes = ", ".join(status_node(trace, index) for index in range(len(trace.nodes)))
    print(f"trace {trace.spec.name} applied: generation {trace.generation} on {nodes}")
    return 0


def status_node(trace: api_pb2.Trace, index: int) -> str:
    """The node name of trace.nodes[index] (nodes are in the spec's path order)."""
    nodes = list(dict.fromkeys(hop.node for hop in trace.spec.hops))
    return nodes[index] if index < len(nodes) else "?"


def cmd_trace_validate(args: argparse.Namespace) -> int:
    """hoptrace trace validate -f SPEC: the schema locally, then the agents through the dispatcher."""
    spec = _load_spec_file(args.file)
    if not args.offline:
        response = api_call(args, "ValidateTrace", api_pb2.ValidateTraceRequest(spec=spec))
        if response.errors:
            lines = "\n".join(f"{error.field}: {error.reason}" for error in response.errors)
            raise CliError(f"invalid trace spec ({args.file}), checked against the agents:\n{lines}")
    where = "schema only" if args.offline else "schema and agents"
    print(f"trace spec {spec.name} is valid ({where})")
    return 0


def cmd_trace_ls(args: argparse.Namespace) -> int:
    """hoptrace trace ls."""
    response = api_call(args, "ListTraces", api_pb2.ListTracesRequest())
    rows = [["NAME", "GENERATION", "HOPS", "NODES", "STATUS", "APPLIED"]]
    for trace in response.traces:
        nodes = ",".join(dict.fromkeys(hop.node for hop in trace.spec.hops))
        rows.append(
            [
                trace.spec.name,
                str(trace.generation),
                str(len(trace.spec.hops)),
                nodes,
                _node_summary(trace),
                timestamp_text(trace.applied_at),
            ]
        )
    if len(rows) == 1:
        print("no traces")
    else:
        print(_table(rows))
    return 0


def cmd_trace_get(args: argparse.Namespace) -> int:
    """hoptrace trace get NAME [-o yaml|json]: the applied spec, re-appliable as is."""
    trace = api_call(args, "GetTrace", api_pb2.GetTraceRequest(name=args.name))
    if args.output == "json":
        print(spec_to_json(trace.spec))
        return 0
    print(f"# generation {trace.generation}, applied {timestamp_text(trace.applied_at)}")
    for index, status in enumerate(trace.nodes):
        state = "active" if status.active and not status.error else "not active"
        problems = [status.error] if status.error else []
        problems += [hop.error for hop in status.hops if hop.error]
        detail = f": {'; '.join(problems)}" if problems else ""
        print(f"# node {status_node(trace, index)}: {state}{detail}")
    sys.stdout.write(spec_to_yaml(trace.spec))
    return 0


def cmd_trace_rm(args: argparse.Namespace) -> int:
    """hoptrace trace rm NAME."""
    api_call(args, "DeleteTrace", api_pb2.DeleteTraceRequest(name=args.name), timeout=APPLY_TIMEOUT_S)
    print(f"trace {args.name} removed")
    return 0


# ---- agents, report ------------------------------------------------------------------------------------


def workload_text(workload: trace_pb2.Workload) -> str:
    """A container as `hoptrace agents` lists it: its name, its pod in brackets when it is a pod's."""
    if workload.pod_name:
        return f"{workload.container_name}[pod {workload.pod_namespace}/{workload.pod_name}]"
    return workload.container_name


def cmd_agents(args: argparse.Namespace) -> int:
    """hoptrace agents [--json]."""
    response = api_call(args, "ListAgents", api_pb2.ListAgentsRequest())
    if args.json:
        print(json.dumps([agent_data(agent) for agent in response.agents], indent=2))
        return 0
    if not response.agents:
        print("no agents registered")
        return 0
    rows = [
        [
            *["NODE", "CONNECTED", "KERNEL", "AGENT", "LAST HEARTBEAT", "CLOCK OFFSET", "BOUND", "DRIFT"],
            *["CLOCK MEASURED", "TRANSPORT", "PEER", "BUFFERED", "DROPPED"],
            *["NAMESPACES", "CONTAINERS", "UNSUPPORTED"],
        ]
    ]
    for agent in response.agents:
        clock = clock_texts(agent.clock)
        registration = agent.registration
        namespaces = ",".join(namespace.name or "(own)" for namespace in registration.namespaces)
        containers = ",".join(
            workload_text(workload)
            for namespace in registration.namespaces
            for workload in namespace.workloads
        )
        if registration.runtime.error:
            containers = f"({registration.runtime.error})"
        unsupported = ",".join(
            sorted(
                kind for kind, support in registration.capabilities.attach.items() if not support.supported
            )
        )
        rows.append(
            [
                registration.node,
                "yes" if agent.connected else "no",
                registration.kernel_release or "-",
                registration.agent_version or "-",
                timestamp_text(agent.last_heartbeat),
                clock["offset"],
                clock["bound"],
                clock["drift"],
                clock["measured"],
                *_transport_cells(agent),
                namespaces or "-",
                containers or "-",
                unsupported or "-",
            ]
        )
    print(_table(rows))
    return 0


def _transport_cells(agent: api_pb2.Agent) -> list[str]:
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


def cmd_report(args: argparse.Namespace) -> int:
    """hoptrace report NAME [--since DURATION] [--json]."""
    request = api_pb2.GetReportRequest(trace=args.name)
    if args.since is not None:
        request.start.FromDatetime(datetime.now(UTC) - args.since)
    report = report_from_proto(api_call(args, "GetReport", request, timeout=APPLY_TIMEOUT_S))
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    sys.stdout.write(render_text(report))
    return 0


def packet_id_argument(text: str) -> int:
    """--id: a packet ID as shown (0x07000123) or in decimal; 32-bit, never 0."""
    try:
        value = int(text, 0)
    except ValueError:
        value = 0
    if not 0 < value < 1 << 32:
        raise argparse.ArgumentTypeError(f"{text!r} is not a packet ID (e.g. 0x07000123)")
    return value


def slowest_argument(text: str) -> int:
    """--slowest: how many packets, 1 to 50."""
    if not text.isdigit() or not 1 <= int(text) <= 50:
        raise argparse.ArgumentTypeError(f"{text!r}: a number of packets from 1 to 50")
    return int(text)


def cmd_packets(args: argparse.Namespace) -> int:
    """hoptrace packets NAME [--since D] [--slowest N | --id ID] [--json]: per-packet waterfalls."""
    request = api_pb2.GetPacketsRequest(trace=args.name, packet_id=args.id or 0, slowest=args.slowest)
    if args.since is not None:
        request.start.FromDatetime(datetime.now(UTC) - args.since)
    packets = packets_from_proto(api_call(args, "GetPackets", request, timeout=APPLY_TIMEOUT_S))
    if args.json:
        print(json.dumps(packets, indent=2))
        return 0
    if not packets:
        print(
            f"packet 0x{args.id:08x} was not seen" if args.id else f"no packet of {args.name} went end to end"
        )
        return 0
    sys.stdout.write(render_packets_text(packets))
    return 0


def cmd_version(args: argparse.Namespace) -> int:
    """hoptrace version [--json]: this package and its API; the dispatcher's and the agents' versions when
    the dispatcher answers (exit 0 either way: the local part is always known)."""
    data: dict[str, Any] = {
        "hoptrace": package_version(),
        "api": API_VERSION,
        "dispatcher": {"address": args.dispatcher, "version": None, "api": None, "error": None},
        "agents": {},
    }
    try:
        version = api_call(args, "GetVersion", api_pb2.GetVersionRequest(), timeout=10)
        data["dispatcher"].update(version=version.dispatcher, api=version.api)
        agents = api_call(args, "ListAgents", api_pb2.ListAgentsRequest(), timeout=10).agents
        data["agents"] = {agent.registration.node: agent.registration.agent_version for agent in agents}
    except CliError as error:
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


# ---- servers -------------------------------------------------------------------------------------------


def _setup_logging(level: str) -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )


def cmd_dispatcher(args: argparse.Namespace) -> int:
    """hoptrace dispatcher: serve the user API and the agent sessions until SIGINT/SIGTERM."""
    from hoptrace.dispatcher.server import DispatcherServer

    _setup_logging(args.log_level)
    try:
        tls = server_tls_from_args(args)
    except ValueError as error:
        raise CliError(f"dispatcher: {error}") from None
    if tls is not None and not args.tokens:
        raise CliError("dispatcher: TLS needs --tokens FILE for the user API (`hoptrace certs` writes one)")
    report_provider = window_provider = clock_provider = packets_provider = None
    if args.influx_url:
        from hoptrace.dispatcher.reports import (
            influx_clock_provider,
            influx_packets_provider,
            influx_report_provider,
            influx_window_provider,
        )

        influx = (
            args.influx_url,
            args.influx_bucket,
            args.influx_org,
            secret_from(args, "influx-token", INFLUX_TOKEN_ENV),
        )
        report_provider = influx_report_provider(*influx)
        window_provider = influx_window_provider(*influx)
        clock_provider = influx_clock_provider(*influx)
        packets_provider = influx_packets_provider(*influx)
    try:
        server = DispatcherServer(
            args.listen,
            args.state_dir,
            report_provider=report_provider,
            window_provider=window_provider,
            clock_provider=clock_provider,
            packets_provider=packets_provider,
            ack_timeout=args.ack_timeout,
            tls=tls,
            tokens_file=args.tokens,
        ).start()
    except (OSError, RuntimeError, ValueError) as error:
        raise CliError(f"dispatcher: {error}") from None

    def stop(signum: int, frame: object) -> None:
        logging.getLogger("hoptrace.dispatcher").info("signal %d: stopping", signum)
        server.stop(grace=1.0)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    server.wait_for_termination()
    return 0


def cmd_web(args: argparse.Namespace) -> int:
    """hoptrace web: serve the web UI (hoptrace.web) until SIGINT/SIGTERM."""
    from hoptrace.web.cli import run

    return run(args)


def _collector_module():
    """hoptrace.collector.main, or None when it is not installed (it is built in parallel)."""
    try:
        from hoptrace.collector import main as collector_main
    except ImportError:
        return None
    if not hasattr(collector_main, "add_arguments") or not hasattr(collector_main, "run"):
        return None
    return collector_main


def _add_collector_parser(subparsers, command: str | None) -> None:
    parser = subparsers.add_parser(
        "collector",
        help="run the collector (record ingest, InfluxDB export)",
        description="Run the collector: receive agents' records, join and aggregate them, write InfluxDB.",
    )
    module = _collector_module() if command == "collector" else None
    if module is not None:
        module.add_arguments(parser)
        parser.set_defaults(func=lambda args: module.run(args) or 0)
        return
    # The contract's flags, for --help and when the collector package is missing.
    parser.add_argument("--listen", default="127.0.0.1:7071", help="gRPC address for agents (HOST:PORT)")
    parser.add_argument("--influx-url", required=command == "collector", help="InfluxDB URL")
    parser.add_argument("--influx-bucket", required=command == "collector", help="InfluxDB bucket (db/rp)")
    parser.add_argument("--influx-org", default="-", help="InfluxDB organization")
    add_secret_argument(parser, "influx-token", INFLUX_TOKEN_ENV, "the InfluxDB token (1.8: USER:PASSWORD)")

    def unavailable(args: argparse.Namespace) -> int:
        raise CliError("the collector is not installed (hoptrace.collector.main is missing)")

    parser.set_defaults(func=unavailable)


# ---- security -----------------------------------------------------------------------------------------


def cmd_certs(args: argparse.Namespace) -> int:
    """hoptrace certs --out DIR [--hosts H ...] [--agent NODE ...]: CA, certificates, tokens."""
    from hoptrace.common.certs import DEFAULT_CLIENTS, create_bundle

    try:
        clients = args.client or DEFAULT_CLIENTS
        bundle = create_bundle(args.out, hosts=args.hosts, agents=args.agent, clients=clients)
    except (OSError, ValueError) as error:
        raise CliError(f"certs: {error}") from None
    agents = ", ".join(f"agent-{node}" for node in bundle.agents) or "none (add --agent NODE)"
    clients = ", ".join(bundle.clients)
    print(f"certificates in {bundle.out}: ca, dispatcher, collector, {clients}; agents: {agents}")
    print(f"dispatcher tokens file: {bundle.tokens} (tokens in {bundle.out}/NAME.token)")
    return 0


def cmd_token_create(args: argparse.Namespace) -> int:
    """hoptrace token create NAME --tokens FILE: append the token's hash, print the token once."""
    try:
        token = add_token(args.tokens, args.name, args.role)
    except (OSError, ValueError) as error:
        raise CliError(f"token: {error}") from None
    print(token)
    print(
        f"token {args.name} ({args.role}) added to {args.tokens}; keep it in a file for --token-file, "
        f"or in ${TOKEN_ENV}",
        file=sys.stderr,
    )
    return 0


def cmd_plan_sign(args: argparse.Namespace) -> int:
    """hoptrace plan sign PLAN --node N --signer-cert C --signer-key K --out FILE: a signed plan file for
    ``hoptrace-agent run --plan FILE --ca CA`` (docs/security.md, "Signed plans and presets")."""
    from hoptrace.dispatcher.signing import PLAN_TYPE, MessageSigner

    plan_path = Path(args.plan)
    try:
        plan = json_format.Parse(plan_path.read_text(), agent_pb2.TracePlan())
        if plan.object_path:
            # The signature must cover the object, not its name: embed the file (relative to the plan, as
            # the agent reads it).
            plan.object = (plan_path.parent / plan.object_path).read_bytes()
            plan.ClearField("object_path")
        if not plan.object:
            raise ValueError("the plan has no object (object or objectPath)")
        signer = MessageSigner.from_files(args.signer_cert, args.signer_key)
        signed = signer.sign(PLAN_TYPE, args.node, plan.SerializeToString())
        Path(args.out).write_text(json_format.MessageToJson(signed) + "\n")
    except (OSError, ValueError, json_format.ParseError) as error:
        raise CliError(f"plan sign {plan_path}: {error}") from None
    print(f"plan {plan.trace!r} for node {args.node} signed by {signer.subject}: {args.out}")
    return 0


class _SecretOnCommandLine(argparse.Action):
    """Refuses a secret given as a flag's value: every local user can read /proc/PID/cmdline."""

    def __call__(self, parser: argparse.ArgumentParser, *_: Any) -> None:
        parser.error(
            f"{self.option_strings[0]} is not taken on the command line (anyone on the host can read it): "
            f"use --token-file FILE or ${TOKEN_ENV}"
        )


def _add_client_security_arguments(parser: argparse.ArgumentParser, *, top_level: bool) -> None:
    """--token/--ca/--cert/--key/--insecure of the user API clients; after the subcommand they override."""

    def default(env: str) -> str | None:
        return (os.environ.get(env) or None) if top_level else argparse.SUPPRESS

    # --token used to take the token itself; say why it does not any more (and never read it as a file).
    parser.add_argument("--token", action=_SecretOnCommandLine, help=argparse.SUPPRESS)
    parser.add_argument(
        "--token-file",
        metavar="FILE",
        default=default(TOKEN_FILE_ENV),
        help=f"file holding the user API token (or put the token in ${TOKEN_ENV}; never on the command line)",
    )
    parser.add_argument("--ca", default=default(CA_ENV), metavar="PEM", help=f"CA certificate (${CA_ENV})")
    parser.add_argument("--cert", default=default(CERT_ENV), metavar="PEM", help=f"client cert (${CERT_ENV})")
    parser.add_argument("--key", default=default(KEY_ENV), metavar="PEM", help=f"client key (${KEY_ENV})")
    parser.add_argument(
        "--insecure",
        action="store_true",
        default=False if top_level else argparse.SUPPRESS,
        help="plaintext, for a dispatcher started with --insecure",
    )


def _add_security_commands(subparsers) -> None:
    certs = subparsers.add_parser(
        "certs",
        help="create a CA, component certificates and tokens",
        description="Create (or extend: an existing CA in DIR is reused) the mTLS certificates and tokens.",
    )
    certs.add_argument("--out", required=True, metavar="DIR", help="where to write them")
    certs.add_argument(
        "--hosts", nargs="*", default=[], metavar="HOST", help="names/IPs of the dispatcher and collector"
    )
    certs.add_argument(
        "--agent", action="append", default=[], metavar="NODE", help="an agent certificate for NODE (repeat)"
    )
    certs.add_argument(
        "--client",
        action="append",
        default=None,
        metavar="NAME",
        help="a user API client certificate (repeat; default admin and web)",
    )
    certs.set_defaults(func=cmd_certs)

    token = subparsers.add_parser("token", help="manage user API tokens", description="User API tokens.")
    token_commands = token.add_subparsers(dest="token_command", metavar="ACTION", required=True)
    create = token_commands.add_parser(
        "create", help="create a token", description="Create a token: its hash goes to FILE, it is printed."
    )
    create.add_argument("name", help="token name (who uses it)")
    create.add_argument("--tokens", required=True, metavar="FILE", help="the dispatcher's --tokens file")
    create.add_argument(
        "--role",
        choices=ROLES,
        default="viewer",
        help="viewer: read (agents, traces, reports); operator: also apply, delete, run presets; admin: all",
    )
    create.set_defaults(func=cmd_token_create)

    plan = subparsers.add_parser(
        "plan", help="standalone plan files", description="Plan files for hoptrace-agent run --plan."
    )
    plan_commands = plan.add_subparsers(dest="plan_command", metavar="ACTION", required=True)
    sign = plan_commands.add_parser(
        "sign",
        help="sign a plan file for one node",
        description="Sign a TracePlan (protojson) for NODE with a dispatcher certificate; its object file "
        "is embedded. The agent runs it with --ca instead of --allow-unsigned-plan.",
    )
    sign.add_argument("plan", help="the TracePlan file (protojson)")
    sign.add_argument("--node", required=True, help="the node whose agent runs it (its --node)")
    sign.add_argument("--signer-cert", required=True, metavar="PEM", help="a dispatcher certificate")
    sign.add_argument("--signer-key", required=True, metavar="PEM", help="its private key")
    sign.add_argument("--out", required=True, metavar="FILE", help="where to write the signed plan")
    sign.set_defaults(func=cmd_plan_sign)


# ---- parser --------------------------------------------------------------------------------------------


def _command_of(argv: Sequence[str]) -> str | None:
    """The subcommand in argv (skipping the client options' values), without parsing everything."""
    skip = False
    for argument in argv:
        if skip:
            skip = False
        elif argument in ("--dispatcher", "--token-file", "--ca", "--cert", "--key"):
            skip = True
        elif not argument.startswith("-"):
            return argument
    return None


def build_parser(argv: Sequence[str] = ()) -> argparse.ArgumentParser:
    """The `hoptrace` argument parser (argv decides whether the collector's own flags are loaded)."""
    default_dispatcher = os.environ.get(DISPATCHER_ENV) or DEFAULT_DISPATCHER
    parser = argparse.ArgumentParser(
        prog="hoptrace", description="hoptrace: per-hop latency of the same packets across layers and hosts."
    )
    parser.add_argument(
        "--dispatcher",
        default=default_dispatcher,
        metavar="ADDR",
        help=f"dispatcher address (default ${DISPATCHER_ENV} or {DEFAULT_DISPATCHER})",
    )
    _add_client_security_arguments(parser, top_level=True)
    # Client commands accept --dispatcher after the subcommand too; SUPPRESS keeps the top-level value.
    client = argparse.ArgumentParser(add_help=False)
    client.add_argument("--dispatcher", default=argparse.SUPPRESS, metavar="ADDR", help="dispatcher address")
    _add_client_security_arguments(client, top_level=False)
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    dispatcher = subparsers.add_parser(
        "dispatcher", help="run the dispatcher", description="Serve the user API and the agent sessions."
    )
    dispatcher.add_argument("--listen", default=DEFAULT_DISPATCHER, help="gRPC address (HOST:PORT)")
    dispatcher.add_argument(
        "--state-dir", default="/var/lib/hoptrace/dispatcher", help="where applied specs are kept"
    )
    dispatcher.add_argument("--influx-url", help="collector's InfluxDB, for reports (unset: no GetReport)")
    dispatcher.add_argument("--influx-bucket", default="hoptrace/autogen", help="InfluxDB bucket (db/rp)")
    dispatcher.add_argument("--influx-org", default="-", help="InfluxDB organization")
    add_secret_argument(
        dispatcher, "influx-token", INFLUX_TOKEN_ENV, "the InfluxDB token (1.8: USER:PASSWORD)"
    )
    dispatcher.add_argument(
        "--ack-timeout",
        type=float,
        default=scaled(5.0),
        help="seconds to wait for each agent's status on apply (5, times HOPTRACE_TIMEOUT_SCALE)",
    )
    dispatcher.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING, ERROR")
    dispatcher.add_argument(
        "--tokens", metavar="FILE", help="user API tokens, NAME:ROLE:SHA256HEX lines (required with TLS)"
    )
    add_server_tls_arguments(dispatcher)
    dispatcher.set_defaults(func=cmd_dispatcher)
    _add_security_commands(subparsers)

    _add_collector_parser(subparsers, _command_of(argv))

    from hoptrace.web.cli import add_arguments as add_web_arguments

    web = subparsers.add_parser(
        "web", parents=[client], help="serve the web UI", description="Serve the web UI."
    )
    add_web_arguments(web)
    web.set_defaults(func=cmd_web)

    trace = subparsers.add_parser(
        "trace", help="apply, list, show, remove traces", description="Manage traces."
    )
    trace_commands = trace.add_subparsers(dest="trace_command", metavar="ACTION", required=True)
    apply = trace_commands.add_parser(
        "apply", parents=[client], help="create or update a trace", description="Create or update a trace."
    )
    apply.add_argument(
        "-f", "--file", required=True, metavar="SPEC", help="spec file, YAML or JSON ('-' = stdin)"
    )
    apply.set_defaults(func=cmd_trace_apply)
    validate = trace_commands.add_parser(
        "validate",
        parents=[client],
        help="check a spec without applying it",
        description="Check a spec: the schema, then the registered agents (nodes, namespaces, devices).",
    )
    validate.add_argument("-f", "--file", required=True, metavar="SPEC", help="spec file ('-' = stdin)")
    validate.add_argument("--offline", action="store_true", help="check the schema only, no dispatcher")
    validate.set_defaults(func=cmd_trace_validate)
    ls = trace_commands.add_parser("ls", parents=[client], help="list traces", description="List traces.")
    ls.set_defaults(func=cmd_trace_ls)
    get = trace_commands.add_parser(
        "get", parents=[client], help="print a trace's spec", description="Print an applied trace's spec."
    )
    get.add_argument("name", help="trace name")
    get.add_argument("-o", "--output", choices=("yaml", "json"), default="yaml", help="format (default yaml)")
    get.set_defaults(func=cmd_trace_get)
    rm = trace_commands.add_parser(
        "rm", parents=[client], help="remove a trace everywhere", description="Detach a trace on every node."
    )
    rm.add_argument("name", help="trace name")
    rm.set_defaults(func=cmd_trace_rm)

    agents = subparsers.add_parser(
        "agents", parents=[client], help="list registered agents", description="List the registered agents."
    )
    agents.add_argument("--json", action="store_true", help="print JSON")
    agents.set_defaults(func=cmd_agents)

    report = subparsers.add_parser(
        "report",
        parents=[client],
        help="per-hop latency decomposition of a trace",
        description="Per-segment latency (count, mean, p50/p90/p99, max, incomplete) in path order.",
    )
    report.add_argument("name", help="trace name")
    report.add_argument("--since", type=since_duration, help="time range ending now, e.g. 30s, 10m, 1h")
    report.add_argument("--json", action="store_true", help="print one JSON object")
    report.set_defaults(func=cmd_report)

    packets = subparsers.add_parser(
        "packets",
        parents=[client],
        help="per-packet waterfalls: the slowest packets or one by ID",
        description="Each packet's passage, segment by segment: the slowest end to end (default 10), or one "
        "packet by its ID.",
    )
    packets.add_argument("name", help="trace name")
    packets.add_argument("--since", type=since_duration, help="time range ending now (default 1h)")
    which = packets.add_mutually_exclusive_group()
    which.add_argument(
        "--slowest", type=slowest_argument, default=10, metavar="N", help="the N slowest (at most 50)"
    )
    which.add_argument("--id", type=packet_id_argument, metavar="ID", help="one packet, e.g. 0x07000123")
    packets.add_argument("--json", action="store_true", help="print JSON")
    packets.set_defaults(func=cmd_packets)

    version = subparsers.add_parser(
        "version",
        parents=[client],
        help="versions: this client, its API, the dispatcher and the agents",
        description="Print this hoptrace's version and API; with a dispatcher that answers, its version and "
        "each registered agent's.",
    )
    version.add_argument("--json", action="store_true", help="print JSON")
    version.set_defaults(func=cmd_version)

    # Presets (ready-made traces on this node): cli/mace.py, cli/iron.py.
    from hoptrace.cli import discover, iron, mace

    mace.add_parser(subparsers)
    iron.add_parser(subparsers)
    discover.add_parser(subparsers, client)

    completion = subparsers.add_parser(
        "completion",
        help="shell completion script: bash, zsh or tcsh",
        description="Print a completion script for SHELL, e.g. `hoptrace completion bash > "
        "/etc/bash_completion.d/hoptrace`, or `source <(hoptrace completion bash)` in a running shell.",
    )
    completion.add_argument("shell", choices=("bash", "zsh", "tcsh"))
    completion.set_defaults(func=cmd_completion)
    return parser


def cmd_completion(args: argparse.Namespace) -> int:
    """hoptrace completion SHELL: the script, generated from this very parser (every command and flag, the
    collector's included), so it cannot drift from the CLI."""
    import shtab

    print(shtab.complete(build_parser(["collector"]), shell=args.shell, root_prefix="hoptrace"))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `hoptrace` console script."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser(argv).parse_args(argv)
    func: Callable[[argparse.Namespace], int] = args.func
    try:
        return func(args)
    except CliError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader left (`hoptrace report --json | head`): stop quietly, as other Unix tools do.
        # Point stdout at /dev/null so the interpreter's own flush at exit raises nothing either.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


if __name__ == "__main__":
    sys.exit(main())
