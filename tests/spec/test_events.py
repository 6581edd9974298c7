"""Event probes in specs (``events:``): the short where: form and the structured one parse to the same typed
terms, and every bad input is refused naming its spec field (tests/dispatcher/test_dispatcher_plans.py: the
typed EventAttach messages of the plans)."""

from __future__ import annotations

import pytest
from spec_fixtures import EVENTS_HEAD, example_registrations, guest_registrations, with_items

from hoptrace import kernel_abi
from hoptrace.spec import SpecError, events, load_spec, spec_to_json, spec_to_yaml, validate_spec
from hoptrace.v1 import counters_pb2, trace_pb2

pytestmark = pytest.mark.unit


EQ, NE, LT, GT, BIT, IN = (
    counters_pb2.EVENT_OP_EQ,
    counters_pb2.EVENT_OP_NE,
    counters_pb2.EVENT_OP_LT,
    counters_pb2.EVENT_OP_GT,
    counters_pb2.EVENT_OP_BIT,
    counters_pb2.EVENT_OP_IN,
)


def _spec(*items: str) -> str:
    return with_items(EVENTS_HEAD, *items)


def _errors(text: str) -> list[str]:
    with pytest.raises(SpecError) as caught:
        load_spec(text, example_registrations())
    return [str(error) for error in caught.value.errors]


def _terms(where: str) -> list[tuple[str, int, list[int]]]:
    terms, problem = events.parse_where(where)
    assert problem is None, problem
    return [(t.arg, t.op, list(t.values)) for t in terms]


def test_operators_are_the_generated_catalogue() -> None:
    assert set(events.OP_NUMBERS) == set(kernel_abi.EVENT_OPS[1:])
    for name, number in events.OP_NUMBERS.items():
        assert counters_pb2.EventOp.Name(number) == f"EVENT_OP_{name.upper()}"
    assert len(events.OPERATORS) == len(kernel_abi.EVENT_OPS) - 1


@pytest.mark.parametrize(
    ("where", "terms"),
    [
        ("vec == 3", [("vec", EQ, [3])]),
        ("vec != 3", [("vec", NE, [3])]),
        ("len < 100 and len > -5", [("len", LT, [100]), ("len", GT, [-5])]),
        ("flags & 0x4", [("flags", BIT, [4])]),
        ("vec in [1, 3,7]", [("vec", IN, [1, 3, 7])]),
        ("  a==1   and b in [0x10]", [("a", EQ, [1]), ("b", IN, [16])]),
        # above 2^63 - 1: two's complement in the proto's int64, the same 64-bit word in the kernel
        ("mask & 0xffffffffffffffff", [("mask", BIT, [-1])]),
    ],
)
def test_short_where_parses_to_typed_terms(where: str, terms: list[tuple[str, int, list[int]]]) -> None:
    assert _terms(where) == terms


@pytest.mark.parametrize(
    ("where", "words"),
    [
        ("vec => 3", "unknown operator '=>'"),
        ("vec = 3", "unknown operator '='"),
        ("vec == three", "'three' is not an integer"),
        ("vec in 3", "'in' takes a list such as [1, 3]"),
        ("vec in [1,2,3,4,5,6,7,8,9]", "'in' takes 1 to 8 values, got 9"),
        ("== 3", "cannot read term '== 3'"),
        (
            "vec == 3 or vec == 4",
            "only 'and' joins terms, got 'or' in 'vec == 3 or vec == 4': for one of several values write"
            " vec in [3, 4]",
        ),
        (
            "vec == 3 or len > 4",
            "only 'and' joins terms, got 'or' in 'vec == 3 or len > 4': write one event per",
        ),
        ("", "must not be empty"),
        ("vec == 18446744073709551616", "does not fit in 64 bits"),
    ],
)
def test_bad_short_where_names_the_field(where: str, words: str) -> None:
    errors = _errors(_spec(f"{{name: e, node: host-a, tracepoint: 'irq:softirq_entry', where: {where!r}}}"))
    assert len(errors) == 1 and errors[0].startswith("events[0].where: ") and words in errors[0], errors


def test_string_arguments_compare_with_quoted_text() -> None:
    """`name == "wire0"` (either quotes) is a text term, and prints back as written; a list item's bare
    string value is a text too."""
    terms, problem = events.parse_where("len == 1203 and name != 'wire0' and dev == \"eth0.100\"")
    assert problem is None, problem
    assert [(t.arg, t.op, list(t.values), t.text) for t in terms] == [
        ("len", EQ, [1203], ""),
        ("name", NE, [], "wire0"),
        ("dev", EQ, [], "eth0.100"),
    ]
    assert events.where_text(terms) == 'len == 1203 and name != "wire0" and dev == "eth0.100"'
    short = load_spec(
        _spec("{name: e, node: host-a, tracepoint: 'net:net_dev_xmit', where: 'name == \"lo\"'}")
    )
    listed = load_spec(
        _spec(
            "{name: e, node: host-a, tracepoint: 'net:net_dev_xmit', "
            "where: [{arg: name, op: '==', value: lo}]}"
        )
    )
    assert short.events == listed.events and short.events[0].where[0].text == "lo"
    # The spec's own text form survives a round trip.
    assert load_spec(spec_to_yaml(short)).events == short.events


@pytest.mark.parametrize(
    ("where", "words"),
    [
        ('name < "wire0"', "a text compares with == or != only"),
        ('name in ["a"]', "'\"a\"' is not an integer (decimal or 0x hex) in"),
        ('name == "sixteen-chars-ab"', "longer than 15 bytes"),
        ('name == ""', "must not be empty"),
        ("name == wire0", 'is not an integer (decimal or 0x hex) nor a "quoted" text'),
        ('name == "a b"', "must not hold spaces, quotes or backslashes"),
    ],
)
def test_bad_text_terms_name_the_field(where: str, words: str) -> None:
    errors = _errors(_spec(f"{{name: e, node: host-a, tracepoint: 'net:net_dev_xmit', where: {where!r}}}"))
    assert len(errors) == 1 and errors[0].startswith("events[0].where: ") and words in errors[0], errors


def test_kernel_function_events_take_no_text() -> None:
    errors = _errors(
        _spec("{name: e, node: host-a, kprobe: net_rx_action, where: [{arg: arg0, op: '==', value: eth0}]}")
    )
    words = "events[0].where[0]: kprobe events' arguments are integers; a text compares with a tracepoint's"
    assert any(error.startswith(words) for error in errors), errors


def test_structured_where_equals_the_short_form() -> None:
    short = load_spec(
        _spec("{name: e, node: host-a, tracepoint: 'net:net_dev_xmit', where: 'len in [1, 2] and rc != 0'}")
    )
    listed = load_spec(
        _spec(
            "{name: e, node: host-a, tracepoint: 'net:net_dev_xmit', "
            "where: [{arg: len, op: in, values: [1, 2]}, 'rc != 0']}"
        )
    )
    assert short.events == listed.events
    assert [(t.arg, t.op, list(t.values)) for t in short.events[0].where] == [
        ("len", IN, [1, 2]),
        ("rc", NE, [0]),
    ]


@pytest.mark.parametrize(
    ("event", "field", "words"),
    [
        ("{node: host-a, tracepoint: 'irq:softirq_entry'}", "events[0].name", "required"),
        ("{name: e, tracepoint: 'irq:softirq_entry'}", "events[0].node", "required"),
        ("{name: e, node: host-a}", "events[0].tracepoint", "required"),
        ("{name: e, node: host-a, tracepoint: softirq_entry}", "events[0].tracepoint", "must be GROUP:EVENT"),
        ("{name: e, node: host-a, tracepoint: 'irq:a/b'}", "events[0].tracepoint", "must be GROUP:EVENT"),
        ("{name: e, node: host-z, tracepoint: 'irq:softirq_entry'}", "events[0].node", "not registered"),
        (
            "{name: e, node: host-a, tracepoint: 'irq:x', actions: [timestamp]}",
            "events[0].actions[0]",
            "no event action",
        ),
        (
            "{name: e, node: host-a, tracepoint: 'irq:x', actions: [{histogram: cpu}]}",
            "events[0].actions[0]",
            "not cpu",
        ),
        (
            "{name: e, node: host-a, tracepoint: 'irq:x', actions: [{count: {by: 'a b'}}]}",
            "events[0].actions[0]",
            "no argument name",
        ),
        (
            "{name: e, node: host-a, tracepoint: 'irq:x', actions: [count, count]}",
            "events[0].actions[1]",
            "one count",
        ),
        (
            "{name: e, node: host-a, tracepoint: 'irq:x', where: [{arg: v, op: '~', value: 1}]}",
            "events[0].where[0]",
            "unknown operator '~'",
        ),
        (
            "{name: e, node: host-a, tracepoint: 'irq:x', where: [{arg: v, op: '=='}]}",
            "events[0].where[0]",
            "needs value",
        ),
        (
            "{name: e, node: host-a, tracepoint: 'irq:x', "
            "where: 'a == 1 and b == 2 and c == 3 and d == 4 and e == 5'}",
            "events[0].where",
            "at most 4 terms",
        ),
        ("{name: e, node: host-a, tracepoint: 'irq:x', wher: 'a == 1'}", "events[0].wher", "unknown key"),
    ],
)
def test_bad_events_name_the_field(event: str, field: str, words: str) -> None:
    errors = _errors(_spec(event))
    assert any(e.startswith(f"{field}: ") and words in e for e in errors), errors


def test_duplicate_event_names_are_refused() -> None:
    errors = _errors(
        _spec("{name: e, node: host-a, tracepoint: 'irq:x'}", "{name: e, node: host-a, tracepoint: 'irq:y'}")
    )
    assert errors == ["events[1].name: duplicate event name 'e' (also events[0]) (line 7)"], errors


def test_events_round_trip() -> None:
    text = _spec(
        "{name: rx, node: host-a, tracepoint: 'irq:softirq_entry', where: 'vec == 3', "
        "actions: [{count: {by: cpu}}]}",
        "{name: xmit, node: host-b, tracepoint: 'net:net_dev_xmit', where: 'len > 100 and rc == 0', "
        "actions: [{count: {by: len}}, {histogram: len}]}",
        "{name: plain, node: host-b, tracepoint: 'sched:sched_switch'}",
    )
    spec = load_spec(text, example_registrations())
    assert load_spec(spec_to_yaml(spec)) == spec == load_spec(spec_to_json(spec))


def test_api_spec_with_a_bad_operator_number_is_refused() -> None:
    """The API takes a TraceSpec message: its typed terms are checked as the parsed ones are."""
    spec = load_spec(_spec("{name: e, node: host-a, tracepoint: 'irq:softirq_entry'}"))
    spec.events[0].where.append(trace_pb2.EventTerm(arg="vec", op=42, values=[3]))
    spec.events[0].where.append(trace_pb2.EventTerm(arg="vec", op=EQ, values=[3, 4]))
    errors = [str(error) for error in validate_spec(spec, example_registrations())]
    assert errors == [
        "events[0].where[0]: unknown operator number 42",
        "events[0].where[1]: takes one value, got 2",
    ], errors


def test_the_event_limit_holds_for_api_specs_as_for_yaml() -> None:
    """An API client sends a TraceSpec message, never YAML: 100 events must be refused by the same
    validation (they passed it, and the apply failed on the node at its 65th attach)."""
    limit = events.MAX_EVENTS
    spec = load_spec(_spec("{name: e0, node: host-a, tracepoint: 'irq:softirq_entry'}"))
    for position in range(1, 100):
        spec.events.add().CopyFrom(spec.events[0])
        spec.events[-1].name = f"e{position}"
    errors = [str(error) for error in validate_spec(spec, example_registrations())]
    assert errors == [f"events: a trace has at most {limit} events, got 100"], errors
    del spec.events[limit:]
    assert validate_spec(spec, example_registrations()) == []
    yaml_errors = _errors(
        _spec(*(f"{{name: e{i}, node: host-a, tracepoint: 'irq:softirq_entry'}}" for i in range(100)))
    )
    assert [error.split(" (line")[0] for error in yaml_errors] == errors, yaml_errors


@pytest.mark.parametrize(
    ("events", "field", "words"),
    [
        (["{name: e, node: host-a, tracepoint: 'irq:x', actions: [{record: []}]}"], "events[0].actions[0]",
         "record: must list 1 to 4"),
        (["{name: e, node: host-a, tracepoint: 'irq:x', actions: [{record: [a, b, c, d, e]}]}"],
         "events[0].actions[0]", "got 5"),
        (["{name: e, node: host-a, tracepoint: 'irq:x', actions: [{record: [vec, vec]}]}"],
         "events[0].actions[0]", "lists 'vec' twice"),
        (["{name: e, node: host-a, tracepoint: 'irq:x', actions: [{record: [cpu]}]}"],
         "events[0].actions[0]", "no argument name"),
        (["{name: e, node: host-a, tracepoint: 'irq:x', key: pid, actions: [{histogram: len, since: e}]}"],
         "events[0].actions[0]", "since: goes with histogram: latency"),
        (["{name: e, node: host-a, tracepoint: 'irq:x', key: pid,"
          " actions: [{histogram: latency, since: f}]}"],
         "events[0].actions", "'f' is no event of this trace"),
        (["{name: e, node: host-a, tracepoint: 'irq:x', key: pid,"
          " actions: [{histogram: latency, since: e}]}"],
         "events[0].actions", "names the event itself"),
        (["{name: s, node: host-a, tracepoint: 'irq:y', key: pid}",
          "{name: e, node: host-a, tracepoint: 'irq:x', actions: [{histogram: latency, since: s}]}"],
         "events[1].key", "needs key"),
        (["{name: s, node: host-a, tracepoint: 'irq:y'}",
          "{name: e, node: host-a, tracepoint: 'irq:x', key: pid,"
          " actions: [{histogram: latency, since: s}]}"],
         "events[0].key", "is the start of events[1]'s latency"),
        (["{name: s, node: host-b, tracepoint: 'irq:y', key: pid}",
          "{name: e, node: host-a, tracepoint: 'irq:x', key: pid,"
          " actions: [{histogram: latency, since: s}]}"],
         "events[1].actions", "pairs events of one node's clock"),
        (["{name: s, node: host-a, tracepoint: 'irq:y', key: 'p id'}"], "events[0].key", "no argument name"),
        (["{name: e, node: host-a, tracepoint: 'irq:x', actions: [{histogram: latency, since: [s]}]}"],
         "events[0].actions[0]", "since: must name an event"),
    ],
)  # fmt: skip
def test_bad_records_and_latencies_name_the_field(events: list[str], field: str, words: str) -> None:
    errors = _errors(_spec(*events))
    assert any(e.startswith(f"{field}: ") and words in e for e in errors), errors


def test_since_on_a_hop_is_refused() -> None:
    text = EVENTS_HEAD.replace(
        "netns: c1}", "netns: c1, actions: [timestamp, {histogram: latency, since: x}]}"
    )
    errors = _errors(text.replace("events:\n", ""))
    assert any(e.startswith("hops[0].actions[1]: since: pairs two events") for e in errors), errors


@pytest.mark.parametrize(
    ("event", "field", "words"),
    [
        ("{name: e, node: host-a, kprobe: 'net rx'}", "events[0].kprobe", "no kernel function name"),
        ("{name: e, node: host-a, tracepoint: 'irq:x', kprobe: f}", "events[0].kprobe", "one of tracepoint"),
        ("{name: e, node: host-a, kprobe: f, where: 'vec == 3'}", "events[0].where[0]", "arg0, arg1"),
        (
            "{name: e, node: host-a, fentry: f, actions: [{histogram: arg5}]}",
            "events[0].actions[0]",
            "got 'arg5'",
        ),
        ("{name: e, node: host-a}", "events[0].tracepoint", "or kprobe: FUNCTION"),
    ],
)
def test_bad_kernel_function_events_name_the_field(event: str, field: str, words: str) -> None:
    with pytest.raises(SpecError) as caught:
        load_spec(_spec(event), guest_registrations())
    errors = [str(error) for error in caught.value.errors]
    assert any(e.startswith(f"{field}: ") and words in e for e in errors), errors


def test_a_node_that_refuses_kprobes_or_fentry_is_named_at_validation() -> None:
    """This machine's kind of node (no kprobe_events, lockdown): refused before anything is sent."""
    errors = _errors(
        _spec("{name: a, node: host-a, kprobe: net_rx_action}", "{name: b, node: host-b, fentry: ip_rcv}")
    )
    assert (
        "events[0].kprobe: node host-a cannot attach kprobe: kprobes not compiled into this kernel"
        in " ".join(errors)
    ), errors
    assert any(
        e.startswith("events[1].fentry: node host-b cannot attach fentry: fentry not permitted")
        for e in errors
    )
