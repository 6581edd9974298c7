"""``hoptrace trace apply|validate|ls|get|rm``: traces through the dispatcher's API."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from hoptrace.cli.api import CliError, client_of
from hoptrace.cli.table import table
from hoptrace.results.format import timestamp_text
from hoptrace.results.trace_view import node_states, status_nodes, status_text
from hoptrace.spec import SpecError, load_spec, spec_to_json, spec_to_yaml
from hoptrace.spec.spec import MAX_SPEC_BYTES
from hoptrace.v1 import api_pb2, trace_pb2


def read_spec_file(path: str) -> bytes:
    """The spec file's bytes ('-' = stdin), at most MAX_SPEC_BYTES: one byte more is read to refuse a
    longer file (or an endless one, /dev/zero) by its name and the limit. load_spec decodes them and says
    so when they are not text."""
    shown = "stdin" if path == "-" else path
    try:
        if path == "-":
            data = sys.stdin.buffer.read(MAX_SPEC_BYTES + 1)
        else:
            with open(path, "rb") as file:
                data = file.read(MAX_SPEC_BYTES + 1)
    except OSError as error:
        raise CliError(f"cannot read {shown}: {error.strerror or error}") from None
    if len(data) > MAX_SPEC_BYTES:
        raise CliError(f"{shown}: more than {MAX_SPEC_BYTES} bytes: a trace spec is at most {MAX_SPEC_BYTES}")
    return data


def load_spec_file(path: str) -> trace_pb2.TraceSpec:
    """The spec in `path` ('-' = stdin), checked; CliError with every problem found."""
    text = read_spec_file(path)
    try:
        return load_spec(text)
    except SpecError as error:
        shown = "stdin" if path == "-" else path
        raise CliError(f"invalid trace spec ({shown}):\n{error}") from None


def node_summary(trace: api_pb2.Trace) -> str:
    """`3/4 nodes active`, with each inactive node's reason (hoptrace.results.trace_view)."""
    return status_text(trace)


def status_node(trace: api_pb2.Trace, index: int) -> str:
    """The node name of trace.nodes[index] (nodes are in the spec's path order)."""
    nodes = status_nodes(trace)
    return nodes[index] if index < len(nodes) else "?"


def run_trace_apply(args: argparse.Namespace) -> int:
    """hoptrace trace apply -f SPEC."""
    trace = client_of(args).apply(load_spec_file(args.file))
    nodes = ", ".join(status_node(trace, index) for index in range(len(trace.nodes)))
    print(f"trace {trace.spec.name} applied: generation {trace.generation} on {nodes}")
    for state in node_states(trace):
        if state["not_kept"]:
            print(f"{state['node']}: not kept across an agent restart: {'; '.join(state['not_kept'])}")
    return 0


def run_trace_validate(args: argparse.Namespace) -> int:
    """hoptrace trace validate -f SPEC: the schema locally, then the agents through the dispatcher."""
    spec = load_spec_file(args.file)
    if not args.offline:
        errors = client_of(args).validate(spec)
        if errors:
            lines = "\n".join(f"{error.field}: {error.reason}" for error in errors)
            raise CliError(f"invalid trace spec ({args.file}), checked against the agents:\n{lines}")
    where = "schema only" if args.offline else "schema and agents"
    print(f"trace spec {spec.name} is valid ({where})")
    return 0


def run_trace_ls(args: argparse.Namespace) -> int:
    """hoptrace trace ls."""
    rows = [["NAME", "GENERATION", "HOPS", "NODES", "APPLIED", "STATUS"]]
    for trace in client_of(args).traces():
        nodes = ",".join(dict.fromkeys(hop.node for hop in trace.spec.hops))
        rows.append(
            [
                trace.spec.name,
                str(trace.generation),
                str(len(trace.spec.hops)),
                nodes,
                timestamp_text(trace.applied_at),
                node_summary(trace),  # last: it names what is wrong, at any length
            ]
        )
    print(table(rows) if len(rows) > 1 else "no traces")
    return 0


def run_trace_get(args: argparse.Namespace) -> int:
    """hoptrace trace get NAME [-o yaml|json]: the applied spec, re-appliable as is."""
    trace = client_of(args).trace(args.name)
    if args.output == "json":
        print(spec_to_json(trace.spec))
        return 0
    print(f"# generation {trace.generation}, applied {timestamp_text(trace.applied_at)}")
    for state in node_states(trace):
        detail = f": {'; '.join(state['problems'])}" if state["problems"] else ""
        print(f"# node {state['node']}: {'active' if state['active'] else 'not active'}{detail}")
    sys.stdout.write(spec_to_yaml(trace.spec))
    return 0


def run_trace_rm(args: argparse.Namespace) -> int:
    """hoptrace trace rm NAME."""
    client_of(args).delete(args.name)
    print(f"trace {args.name} removed")
    return 0


def add_parser(subparsers: Any, client: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Register ``trace`` and its actions on a subparsers object (cli/main.py)."""
    trace = subparsers.add_parser(
        "trace", help="apply, list, show, remove traces", description="Manage traces."
    )
    actions = trace.add_subparsers(dest="trace_command", metavar="ACTION", required=True)
    apply = actions.add_parser(
        "apply", parents=[client], help="create or update a trace", description="Create or update a trace."
    )
    apply.add_argument(
        "-f", "--file", required=True, metavar="SPEC", help="spec file, YAML or JSON ('-' = stdin)"
    )
    apply.set_defaults(func=run_trace_apply)
    validate = actions.add_parser(
        "validate",
        parents=[client],
        help="check a spec without applying it",
        description="Check a spec: the schema, then the registered agents (nodes, namespaces, devices).",
    )
    validate.add_argument("-f", "--file", required=True, metavar="SPEC", help="spec file ('-' = stdin)")
    validate.add_argument("--offline", action="store_true", help="check the schema only, no dispatcher")
    validate.set_defaults(func=run_trace_validate)
    ls = actions.add_parser("ls", parents=[client], help="list traces", description="List traces.")
    ls.set_defaults(func=run_trace_ls)
    get = actions.add_parser(
        "get", parents=[client], help="print a trace's spec", description="Print an applied trace's spec."
    )
    get.add_argument("name", help="trace name")
    get.add_argument("-o", "--output", choices=("yaml", "json"), default="yaml", help="format (default yaml)")
    get.set_defaults(func=run_trace_get)
    rm = actions.add_parser(
        "rm", parents=[client], help="remove a trace everywhere", description="Detach a trace on every node."
    )
    rm.add_argument("name", help="trace name")
    rm.set_defaults(func=run_trace_rm)
    return trace
