"""socket-read, uprobe and uretprobe hops in specs: parsed, planned with their programs and typed targets,
compiled into per-node objects that carry UDP's queue pair, and every bad use refused naming its spec
field."""

from __future__ import annotations

import pytest
from spec_fixtures import example_registrations

from hoptrace.dispatcher.compile import (
    REPO_ROOT,
    SOCKET_READ_UDP_QUEUE_PROGRAMS,
    build_plans,
    generate_source,
    programs_for_plan,
)
from hoptrace.spec import SpecError, check_spec, load_spec, parse_attach_point
from hoptrace.v1 import counters_pb2, trace_pb2

pytestmark = pytest.mark.unit


def _spec(protocol: str, read_hop: str) -> str:
    protocol_line = f"protocol: {protocol}, " if protocol else ""
    return f"""\
name: reads
filter: {{{protocol_line}dst_port: 5000}}
hops:
  - {{name: a-out, node: host-a, at: tc-egress, dev: eth0, netns: c1}}
  - {{name: b-in, node: host-b, at: tc-ingress, dev: eth0, netns: c2}}
  - {read_hop}
"""


READ_HOP = "{name: b-read, node: host-b, at: socket-read, netns: c2}"


def _errors(text: str) -> list[str]:
    with pytest.raises(SpecError) as caught:
        load_spec(text, example_registrations())
    return [str(error) for error in caught.value.errors]


def test_socket_read_parses_as_a_receive_side_kind() -> None:
    point = parse_attach_point("socket-read")
    assert point.attach == trace_pb2.AttachKind.ATTACH_KIND_SOCKET_READ
    assert point.kind == "socket_read" and point.is_receive_side


@pytest.mark.parametrize(
    ("protocol", "program"), [("udp", "hop_sock_read_udp"), ("tcp", "hop_sock_read_tcp")]
)
def test_socket_read_plans_the_protocols_program(protocol: str, program: str) -> None:
    spec = load_spec(_spec(protocol, READ_HOP), example_registrations())
    plans = build_plans(check_spec(spec), generation=1)
    read = plans["host-b"].hops[1]
    assert (read.hop_index, read.name, read.kind, read.program, read.netns, read.dev) == (
        2,
        "b-read",
        trace_pb2.AttachKind.ATTACH_KIND_SOCKET_READ,
        program,
        "c2",
        "",
    )
    assert program in programs_for_plan(plans["host-b"])


def test_udp_socket_read_object_carries_the_queue_pair() -> None:
    """The agent runs the queue pair instead of hop_sock_read_udp on 6.6+ kernels: the per-node source the
    dispatcher compiles for a UDP socket-read hop defines both."""
    plans = build_plans(check_spec(load_spec(_spec("udp", READ_HOP), example_registrations())), generation=1)
    source = generate_source(programs_for_plan(plans["host-b"]), REPO_ROOT / "kernel-patch")
    library = (REPO_ROOT / "kernel-patch" / "include" / "hop.bpf.h").read_text()
    assert "HOPTRACE_PROG_SOCK_READ_UDP\n" in source
    macro = library[library.index("#define HOPTRACE_PROG_SOCK_READ_UDP ") :]
    macro = macro[: macro.index("#define", 1)]
    for program in SOCKET_READ_UDP_QUEUE_PROGRAMS:
        assert f"BPF_PROG({program}," in macro


@pytest.mark.parametrize(
    ("protocol", "hop", "field", "words"),
    [
        ("", READ_HOP, "hops[2].at", "set filter.protocol to udp or tcp"),
        (
            "udp",
            "{name: b-read, node: host-b, at: socket-read, netns: c2, dev: eth0}",
            "hops[2].dev",
            "not used",
        ),
        (
            "udp",
            "{name: b-read, node: host-b, at: socket-read:x, netns: c2}",
            "hops[2].at",
            "unknown attach point",
        ),
        (
            "udp",
            "{name: b-read, node: host-b, at: socket-read, netns: c9}",
            "hops[2].netns",
            "did not report",
        ),
        (
            "udp",
            "{name: b-read, node: host-b, at: socket-read, netns: c2,"
            " actions: [timestamp, {count: {by: ttl}}]}",
            "hops[2].actions[1]",
            "not available",
        ),
        (
            "udp",
            "{name: b-read, node: host-b, at: socket-read, netns: c2,"
            " actions: [timestamp, {record: [comm]}]}",
            "hops[2].actions[1].record[0]",
            "is a name",
        ),
    ],
)
def test_bad_socket_read_hops_name_their_field(protocol: str, hop: str, field: str, words: str) -> None:
    errors = _errors(_spec(protocol, hop))
    assert any(error.startswith(f"{field}: ") and words in error for error in errors), errors


def test_socket_read_cannot_be_the_first_hop() -> None:
    text = """\
name: reads
filter: {protocol: tcp}
hops:
  - {name: b-read, node: host-b, at: socket-read, netns: c2}
"""
    errors = _errors(text)
    assert any(error.startswith("hops[0].at: ") and "only sees received packets" in error for error in errors)


UPROBE_HOPS = (
    READ_HOP,
    "{name: b-handler, node: host-b, at: 'uprobe:/usr/local/bin/reader:handle_request', netns: c2}",
    "{name: b-handled, node: host-b, at: 'uretprobe:/usr/local/bin/reader:handle_request',"
    " netns: /proc/4242/ns/net}",
)


def _uprobe_spec(*hops: str) -> str:
    return _spec("udp", "\n  - ".join(hops))


def test_uprobe_hops_plan_binary_and_symbol() -> None:
    spec = load_spec(_uprobe_spec(*UPROBE_HOPS), example_registrations())
    handler, handled = build_plans(check_spec(spec), generation=1)["host-b"].hops[2:]
    kinds = trace_pb2.AttachKind
    assert (handler.kind, handler.program, handler.binary, handler.function, handler.netns) == (
        kinds.ATTACH_KIND_UPROBE,
        "hop_uprobe",
        "/usr/local/bin/reader",
        "handle_request",
        "c2",
    )
    assert (handled.kind, handled.program, handled.binary, handled.function, handled.netns) == (
        kinds.ATTACH_KIND_URETPROBE,
        "hop_uprobe",
        "/usr/local/bin/reader",
        "handle_request",
        "/proc/4242/ns/net",
    )


def test_reader_fields_plan_as_typed_constants() -> None:
    """The reader's task and socket fields at socket-read and uprobe hops, and the latency from the device."""
    spec = load_spec(
        _uprobe_spec(
            "{name: b-read, node: host-b, at: socket-read, netns: c2,"
            " actions: [timestamp, {count: {by: comm}}, {histogram: latency},"
            " {record: [pid, rmem, backlog, len]}]}",
            "{name: b-handler, node: host-b, at: 'uprobe:/usr/local/bin/reader:handle_request', netns: c2,"
            " actions: [timestamp, {count: {by: pid}}, {histogram: latency}]}",
        ),
        example_registrations(),
    )
    plan = build_plans(check_spec(spec), generation=1)["host-b"]
    read, handler = plan.hops[-2:]
    field = counters_pb2.Field
    assert (read.actions.count, read.actions.count_by, read.actions.histogram) == (
        True,
        field.FIELD_COMM,
        field.FIELD_LATENCY,
    )
    assert list(read.actions.record) == [
        field.FIELD_PID,
        field.FIELD_RMEM,
        field.FIELD_BACKLOG,
        field.FIELD_LEN,
    ]
    assert read.actions.prev_ts  # the handler's latency is from the read
    assert (handler.actions.count_by, handler.actions.histogram) == (field.FIELD_PID, field.FIELD_LATENCY)


@pytest.mark.parametrize(
    ("hop", "field", "words"),
    [
        (
            "{name: u, node: host-b, at: 'uprobe:/bin/x', netns: c2}",
            "hops[3].at",
            "expected uprobe:BINARY:SYMBOL",
        ),
        ("{name: u, node: host-b, at: 'uprobe:bin/x:f', netns: c2}", "hops[3].at", "absolute file path"),
        ("{name: u, node: host-b, at: 'uprobe:/a/../etc/x:f', netns: c2}", "hops[3].at", "without '..'"),
        ("{name: u, node: host-b, at: 'uretprobe:/bin/x:f(int)', netns: c2}", "hops[3].at", "not a symbol"),
        ("{name: u, node: host-b, at: 'uprobe:/bin/x:f', netns: c2, dev: eth0}", "hops[3].dev", "not used"),
        ("{name: u, node: host-a, at: 'uprobe:/bin/x:f', netns: c1}", "hops[3].at", "add a socket-read hop"),
    ],
)
def test_bad_uprobe_hops_name_their_field(hop: str, field: str, words: str) -> None:
    errors = _errors(_uprobe_spec(READ_HOP, hop))
    assert any(error.startswith(f"{field}: ") and words in error for error in errors), errors
