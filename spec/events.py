"""Event probes (``events:`` beside ``hops:``): their spec forms and their checks. The dispatcher turns each
validated event into the typed `EventAttach` its node's agent loads as constants of the one event program
(`hoptrace.dispatcher.compile.event_attach`, kernel-patch/include/event.bpf.h).

The user's ``where:`` text is parsed here, once, into `EventTerm` messages (argument name, `EventOp`
number, integer values); nothing the user wrote reaches C. Which arguments a tracepoint has, and their
offsets, sizes and signedness, are the node's kernel's: its agent reads them from tracefs at apply time and
refuses an argument the tracepoint lacks (naming ``events[i].where[j]``), and the apply is all-or-nothing.

Spec form::

    events:
      - name: net-rx-softirqs
        node: host-a
        tracepoint: irq:softirq_entry
        where: "vec == 3"                 # or: vec in [2, 3] and ..., or a list of terms:
        # a string argument (a device's name, a task's comm) compares with a quoted text:
        # where: 'name == "eth0" and len > 1000' (== or !=, up to 15 bytes)
        # where: [{arg: vec, op: "==", value: 3}, {arg: len, op: in, values: [1, 2]}]
        actions: [{count: {by: cpu}}]     # count (by: cpu | ARG), histogram: ARG, record: [ARGS];
                                          # default [count]
      # Event-to-event latency: the time from one event to a later one whose key argument has the same
      # value (a task's wake-up to its run), as a log2 histogram in ns on the later event:
      - {name: wakeup, node: host-a, tracepoint: sched:sched_wakeup, key: pid}
      - {name: wakeup-to-run, node: host-a, tracepoint: sched:sched_switch, key: next_pid,
         actions: [{histogram: latency, since: wakeup}]}

The marking event remembers its time per key value in an LRU map of its node (one per trace,
HOPTRACE_EVENT_MARKS entries); the later event takes the entry out, so each mark gives at most one latency,
and a later event that finds none counts `latency_missed`. ``record: [ARGS]`` keeps each argument's count,
sum, min, max and last value in the kernel: an event has no packet to carry values with, and one point
per event would cost what one point per packet does.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from hoptrace import kernel_abi
from hoptrace.spec import actions as hop_actions
from hoptrace.spec.attach import attach_refusal
from hoptrace.v1 import agent_pb2, trace_pb2

EVENT_KEYS = ("name", "node", "tracepoint", "kprobe", "fentry", "where", "actions", "key")
# Kernel-function events (kprobe: FUNCTION, fentry: FUNCTION) and their arguments.
FUNCTION_SOURCES = ("kprobe", "fentry")
FUNCTION_ARGS = (*(f"arg{i}" for i in range(kernel_abi.EVENT_FUNCTION_ARGS)), "pid")
MAX_EVENTS = 64
MAX_NAME_LEN = 63  # as trace and hop names
# Operators as users write them -> enum hoptrace_event_op (kernel_abi.EVENT_OPS) names.
OPERATORS: dict[str, str] = {"==": "eq", "!=": "ne", "<": "lt", ">": "gt", "&": "bit", "in": "in"}
OP_NUMBERS: dict[str, int] = {name: number for number, name in enumerate(kernel_abi.EVENT_OPS) if number}
OP_SPELLING: dict[int, str] = {OP_NUMBERS[name]: text for text, name in OPERATORS.items()}
EVENT_ACTIONS = ("count", "histogram", "record")
LATENCY = "latency"  # histogram: latency with since: an event's time since another's
CPU_KEY = "cpu"

_NAME = re.compile(r"^[a-z0-9]([a-z0-9-]*[a-z0-9])?$")
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_TRACEPOINT = re.compile(r"^([A-Za-z0-9_]+):([A-Za-z0-9_]+)$")
_FUNCTION = re.compile(r"^[A-Za-z_][A-Za-z0-9_.]*$")  # a kernel symbol, e.g. net_rx_action, tcp_v4_rcv.cold
_TERM = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*(==|!=|<|>|&|\bin\b)\s*(.*?)\s*$")
_AND = re.compile(r"\s+and\s+")
_OR = re.compile(r"\s+or\s+")
_QUOTE_CHARS = re.compile(r"[\"']")
_QUOTED = re.compile(r"""^(["'])(.*)\1$""")
_TEXT = re.compile(r"""^[^\s"'\\]+$""")  # a device's or a task's name: no spaces, quotes, backslashes
_INT64_MIN, _UINT64_MAX = -(1 << 63), (1 << 64) - 1

EventError = tuple[str, str]  # (field path, reason)


def _to_int64(value: int) -> int:
    """A value as the proto's int64: two's complement above 2^63 - 1 (the kernel compares 64-bit words)."""
    return value - (1 << 64) if value >= 1 << 63 else value


def _integer(value: Any) -> int | None:
    """An integer from YAML (int) or text (decimal, 0x hex, negative); None when it is not one."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        try:
            return int(value.strip(), 0)
        except ValueError:
            return None
    return None


def _quoted_text(raw: Any) -> str | None:
    """The text of a quoted string value (``"eth0"`` or ``'eth0'``), None when raw is not one."""
    if not isinstance(raw, str):
        return None
    match = _QUOTED.match(raw.strip())
    return match.group(2) if match else None


def text_problem(text: str) -> str | None:
    """Why `text` cannot be compared with a string argument, None when it can."""
    if not text:
        return "the text must not be empty"
    if len(text.encode()) > kernel_abi.EVENT_TEXT_MAX:
        return f"text {text!r} is longer than {kernel_abi.EVENT_TEXT_MAX} bytes"
    if not _TEXT.match(text):
        return f"text {text!r} must not hold spaces, quotes or backslashes"
    return None


def _values(op: str, raw: Any, text: str) -> tuple[list[int], str | None]:
    """The integer values of one term and a problem, if any."""
    if op == "in":
        if isinstance(raw, str):
            inner = raw.strip()
            if not (inner.startswith("[") and inner.endswith("]")):
                return [], f"'in' takes a list such as [1, 3], got {inner!r} in {text!r}"
            items: list[Any] = [item for item in inner[1:-1].split(",") if item.strip()]
        elif isinstance(raw, list):
            items = raw
        else:
            return [], f"'in' takes a list of integers, got {raw!r}"
        if not 1 <= len(items) <= kernel_abi.EVENT_IN_VALUES:
            return [], f"'in' takes 1 to {kernel_abi.EVENT_IN_VALUES} values, got {len(items)}"
    else:
        items = [raw]
    out = []
    for item in items:
        number = _integer(item)
        if number is None:
            text_too = "" if op == "in" else ' nor a "quoted" text'
            return [], f"{item!r} is not an integer (decimal or 0x hex){text_too} in {text!r}"
        if not _INT64_MIN <= number <= _UINT64_MAX:
            return [], f"{number} does not fit in 64 bits"
        out.append(_to_int64(number))
    return out, None


def _term(
    arg: Any, op: Any, raw: Any, text: str, bare_text: bool = False
) -> tuple[trace_pb2.EventTerm | None, str | None]:
    """One term; a string value is a text when quoted, or with `bare_text` (a list item's value:) when
    it is no integer."""
    if not isinstance(arg, str) or not _IDENTIFIER.match(arg):
        return None, f"argument must be a name such as vec, got {arg!r}"
    if op not in OPERATORS:
        return None, f"unknown operator {op!r} in {text!r}; operators: {', '.join(OPERATORS)}"
    quoted = _quoted_text(raw)
    if quoted is None and bare_text and isinstance(raw, str) and _integer(raw) is None:
        quoted = raw
    if quoted is not None:
        if op not in ("==", "!="):
            return None, f"a text compares with == or != only, got {op!r} in {text!r}"
        problem = text_problem(quoted)
        if problem:
            return None, problem
        return trace_pb2.EventTerm(arg=arg, op=OP_NUMBERS[OPERATORS[op]], text=quoted), None
    values, problem = _values(op, raw, text)
    if problem:
        return None, problem
    return trace_pb2.EventTerm(arg=arg, op=OP_NUMBERS[OPERATORS[op]], values=values), None


def parse_where(text: str) -> tuple[list[trace_pb2.EventTerm], str | None]:
    """Parse the short form ``"vec == 3 and len > 100"`` into typed terms; (terms, problem)."""
    terms = []
    if not text.strip():
        return [], "must not be empty (leave where out to count every hit)"
    for part in _AND.split(text.strip()):
        if _OR.search(part) and not _QUOTE_CHARS.search(part):  # a text holds no space: its own error
            return [], _or_problem(text.strip())
        match = _TERM.match(part)
        if match is None:
            bad = re.match(r"^\s*[A-Za-z_][A-Za-z0-9_]*\s*([^\sA-Za-z0-9_\[\-]+)", part)
            if bad:
                operators = ", ".join(OPERATORS)
                return [], f"unknown operator {bad.group(1)!r} in {part.strip()!r}; operators: {operators}"
            return [], f"cannot read term {part.strip()!r}: want ARG OP VALUE, e.g. vec == 3"
        term, problem = _term(match.group(1), match.group(2), match.group(3), part.strip())
        if problem:
            return [], problem
        assert term is not None
        terms.append(term)
    return terms, None


def _or_problem(text: str) -> str:
    """Why a where: with `or` cannot be read, and what to write: one argument's values in a list."""
    said = f"only 'and' joins terms, got 'or' in {text!r}"
    alternatives = [_TERM.match(part) for part in _OR.split(text)]
    if len(_AND.split(text)) == 1 and all(match and match.group(2) == "==" for match in alternatives):
        args = {match.group(1) for match in alternatives if match}
        values = [match.group(3) for match in alternatives if match]
        if len(args) == 1 and len(values) <= kernel_abi.EVENT_IN_VALUES:
            return f"{said}: for one of several values write {args.pop()} in [{', '.join(values)}]"
    return f"{said}: write one event per alternative, or ARG in [A, B] for one argument's values"


def where_text(terms: Sequence[trace_pb2.EventTerm]) -> str:
    """The short form of typed terms (the inverse of parse_where)."""
    parts = []
    for term in terms:
        op = OP_SPELLING.get(term.op, "?")
        if term.text:
            parts.append(f'{term.arg} {op} "{term.text}"')
            continue
        values = [v + (1 << 64) if v < 0 and op == "&" else v for v in term.values]
        value = f"[{', '.join(str(v) for v in values)}]" if op == "in" else str(values[0] if values else "")
        parts.append(f"{term.arg} {op} {value}")
    return " and ".join(parts)


def _convert_where(value: Any, field: str, target: trace_pb2.EventSpec) -> list[EventError]:
    if value is None:
        return []
    if isinstance(value, str):
        terms, problem = parse_where(value)
        if problem:
            return [(field, problem)]
        target.where.extend(terms)
        return []
    if not isinstance(value, list):
        return [(field, f"must be a string such as 'vec == 3' or a list of terms, got {value!r}")]
    errors: list[EventError] = []
    for position, item in enumerate(value):
        where = f"{field}[{position}]"
        if isinstance(item, str):
            terms, problem = parse_where(item)
            if problem:
                errors.append((where, problem))
            elif len(terms) != 1:
                errors.append((where, f"one term per list item, got {len(terms)}"))
            else:
                target.where.extend(terms)
            continue
        if not isinstance(item, dict):
            errors.append((where, f"must be a term such as {{arg: vec, op: '==', value: 3}}, got {item!r}"))
            continue
        unknown = [key for key in item if key not in ("arg", "op", "value", "values")]
        if unknown:
            errors.append(
                (where, f"unknown keys {', '.join(map(repr, unknown))}; expected arg, op, value(s)")
            )
            continue
        op = item.get("op")
        raw = item.get("values") if op == "in" else item.get("value")
        if raw is None:
            errors.append((where, "needs " + ("values: [..]" if op == "in" else "value")))
            continue
        term, problem = _term(item.get("arg"), op, raw, f"{item.get('arg')} {op} {raw}", bare_text=True)
        if problem:
            errors.append((where, problem))
        else:
            assert term is not None
            target.where.append(term)
    return errors


def convert_event(value: Any, field: str, target: trace_pb2.EventSpec) -> list[EventError]:
    """Fill `target` from one ``events`` item; returns the structural problems."""
    if not isinstance(value, dict):
        return [(field, f"must be a mapping ({', '.join(EVENT_KEYS)}), got {value!r}")]
    errors: list[EventError] = []
    for key in value:
        if key not in EVENT_KEYS:
            errors.append((f"{field}.{key}", f"unknown key {key!r}; expected {', '.join(EVENT_KEYS)}"))
    for key in ("name", "node", "tracepoint", "kprobe", "fentry", "key"):
        item = value.get(key)
        if item is None:
            continue
        if not isinstance(item, str):
            errors.append((f"{field}.{key}", f"must be a string, got {item!r}"))
        else:
            setattr(target, key, item)
    errors += _convert_where(value.get("where"), f"{field}.where", target)
    errors += hop_actions.convert_actions(value.get("actions"), f"{field}.actions", target)
    return errors


def convert_events(value: Any, spec: trace_pb2.TraceSpec) -> list[EventError]:
    """Fill `spec.events` from the spec's ``events`` value; returns the structural problems."""
    if value is None:
        return []
    if not isinstance(value, list):
        return [("events", f"must be a list of event probes, got {value!r}")]
    errors: list[EventError] = []
    for position, item in enumerate(value):
        errors += convert_event(item, f"events[{position}]", spec.events.add())
    return errors


def event_to_data(event: trace_pb2.EventSpec) -> dict[str, Any]:
    """One event in the spec's canonical form (the inverse of convert_event)."""
    data: dict[str, Any] = {
        key: getattr(event, key)
        for key in ("name", "node", "tracepoint", "kprobe", "fentry", "key")
        if getattr(event, key)
    }
    if event.where:
        data["where"] = where_text(event.where)
    if event.actions:
        data["actions"] = [hop_actions.action_to_data(action) for action in event.actions]
    return data


def validate_event(event: trace_pb2.EventSpec, field: str) -> list[EventError]:
    """Problems of one event that need no agent: names, the tracepoint's spelling, terms and actions."""
    errors: list[EventError] = []
    if not event.name:
        errors.append((f"{field}.name", "required: the event's name, [a-z0-9-]+"))
    elif not _NAME.match(event.name) or len(event.name) > MAX_NAME_LEN:
        errors.append(
            (f"{field}.name", f"{event.name!r} must match [a-z0-9-]+, at most {MAX_NAME_LEN} characters")
        )
    if not event.node:
        errors.append((f"{field}.node", "required: the node whose kernel runs this probe"))
    sources = [key for key in ("tracepoint", "kprobe", "fentry") if getattr(event, key)]
    if not sources:
        errors.append(
            (
                f"{field}.tracepoint",
                "required: GROUP:EVENT, e.g. irq:softirq_entry (or kprobe: FUNCTION, fentry: FUNCTION)",
            )
        )
    elif len(sources) > 1:
        errors.append(
            (f"{field}.{sources[1]}", f"an event has one of tracepoint, kprobe, fentry; got {sources}")
        )
    function = function_source(event)
    if function is not None:
        kind, name = function
        if not _FUNCTION.match(name):
            errors.append((f"{field}.{kind}", f"{name!r} is no kernel function name, e.g. net_rx_action"))
        for where, arg in _named_args(event, field):
            if arg not in FUNCTION_ARGS:
                errors.append(
                    (where, f"{kind} events' arguments are {', '.join(FUNCTION_ARGS)}; got {arg!r}")
                )
    elif event.tracepoint and not _TRACEPOINT.match(event.tracepoint):
        errors.append(
            (f"{field}.tracepoint", f"{event.tracepoint!r} must be GROUP:EVENT, e.g. irq:softirq_entry")
        )
    if len(event.where) > kernel_abi.EVENT_TERMS:
        errors.append((f"{field}.where", f"at most {kernel_abi.EVENT_TERMS} terms, got {len(event.where)}"))
    for position, term in enumerate(event.where):
        if term.op not in OP_SPELLING:
            errors.append((f"{field}.where[{position}]", f"unknown operator number {term.op}"))
        elif term.text:
            problem = text_problem(term.text)
            if term.op not in (OP_NUMBERS["eq"], OP_NUMBERS["ne"]):
                problem = "a text compares with == or != only"
            elif term.values:
                problem = "a term has a text or values, not both"
            elif function is not None:
                kind = function[0]
                problem = f"{kind} events' arguments are integers; a text compares with a tracepoint's string"
            if problem:
                errors.append((f"{field}.where[{position}]", problem))
        elif len(term.values) != 1 and term.op != OP_NUMBERS["in"]:
            errors.append((f"{field}.where[{position}]", f"takes one value, got {len(term.values)}"))
        elif not 1 <= len(term.values) <= kernel_abi.EVENT_IN_VALUES:
            errors.append(
                (f"{field}.where[{position}]", f"'in' takes 1 to {kernel_abi.EVENT_IN_VALUES} values")
            )
    seen: dict[str, int] = {}
    for position, action in enumerate(event.actions):
        where = f"{field}.actions[{position}]"
        if action.kind not in EVENT_ACTIONS:
            errors.append(
                (
                    where,
                    f"{action.kind!r} is no event action (events have no packet); expected"
                    f" {', '.join(EVENT_ACTIONS)}",
                )
            )
            continue
        if action.kind in seen:
            errors.append(
                (where, f"an event has one {action.kind} action (also {field}.actions[{seen[action.kind]}])")
            )
            continue
        seen[action.kind] = position
        if action.kind == "record":
            args = list(action.fields)
            if not 1 <= len(args) <= kernel_abi.VALUES_MAX:
                errors.append(
                    (where, f"record: lists 1 to {kernel_abi.VALUES_MAX} arguments, got {len(args)}")
                )
            for i, name in enumerate(args):
                if not _IDENTIFIER.match(name) or name == CPU_KEY:
                    errors.append((where, f"{name!r} is no argument name of a tracepoint"))
                elif name in args[:i]:
                    errors.append((where, f"record: lists {name!r} twice"))
            continue
        name = action.by if action.kind == "count" else action.field
        if name and not _IDENTIFIER.match(name):
            errors.append((where, f"{name!r} is no argument name (nor cpu)"))
        if action.kind == "histogram" and name == CPU_KEY:
            errors.append((where, "histogram: takes an argument of the tracepoint, not cpu"))
        if action.since and name != LATENCY:
            errors.append((where, f"since: goes with histogram: {LATENCY} (the time since that event)"))
        elif action.since and not event.key:
            errors.append(
                (
                    f"{field}.key",
                    f"histogram: {LATENCY} since {action.since!r} needs key: the argument that"
                    " names what both events are about (e.g. next_pid)",
                )
            )
    if event.key and not _IDENTIFIER.match(event.key):
        errors.append((f"{field}.key", f"{event.key!r} is no argument name"))
    return errors


def function_source(event: trace_pb2.EventSpec) -> tuple[str, str] | None:
    """("kprobe" or "fentry", the function) of a kernel-function event; None for a tracepoint's."""
    for kind in FUNCTION_SOURCES:
        if getattr(event, kind):
            return kind, getattr(event, kind)
    return None


def _named_args(event: trace_pb2.EventSpec, field: str) -> list[tuple[str, str]]:
    """(spec field, argument name) of every argument an event names: where terms, actions, key."""
    named = [(f"{field}.where[{i}]", term.arg) for i, term in enumerate(event.where)]
    for i, action in enumerate(event.actions):
        where = f"{field}.actions[{i}]"
        if action.kind == "count" and action.by and action.by != CPU_KEY:
            named.append((where, action.by))
        elif action.kind == "histogram" and not action.since:
            named.append((where, action.field))
        elif action.kind == "record":
            named.extend((where, name) for name in action.fields)
    if event.key:
        named.append((f"{field}.key", event.key))
    return named


def latency_since(event: trace_pb2.EventSpec) -> str:
    """The event an event's latency histogram is measured from ("" = none)."""
    return next((a.since for a in event.actions if a.kind == "histogram" and a.since), "")


def validate_events(spec: trace_pb2.TraceSpec) -> list[EventError]:
    """Problems of the spec's events that need no agent, names unique among them; at most MAX_EVENTS (the
    one check of YAML and API specs alike: an agent attaches each event's program, and the 65th fails)."""
    if len(spec.events) > MAX_EVENTS:
        return [("events", f"a trace has at most {MAX_EVENTS} events, got {len(spec.events)}")]
    errors: list[EventError] = []
    first_use: dict[str, int] = {}
    for position, event in enumerate(spec.events):
        field = f"events[{position}]"
        errors += validate_event(event, field)
        if event.name in first_use:
            errors.append(
                (
                    f"{field}.name",
                    f"duplicate event name {event.name!r} (also events[{first_use[event.name]}])",
                )
            )
        elif event.name:
            first_use[event.name] = position
    for position, event in enumerate(spec.events):
        since = latency_since(event)
        if not since:
            continue
        where = f"events[{position}].actions"
        marking = next((other for other in spec.events if other.name == since), None)
        if marking is None:
            names = ", ".join(other.name for other in spec.events if other.name != event.name) or "none"
            errors.append((where, f"since: {since!r} is no event of this trace (events: {names})"))
        elif marking.name == event.name:
            errors.append((where, "since: names the event itself; name the earlier event"))
        elif marking.node != event.node:
            errors.append(
                (
                    where,
                    f"since: {since!r} runs on node {marking.node}, this event on {event.node}: a latency"
                    " pairs events of one node's clock",
                )
            )
        elif not marking.key:
            index = list(spec.events).index(marking)
            errors.append(
                (
                    f"events[{index}].key",
                    f"event {since!r} is the start of events[{position}]'s latency: it"
                    " needs key: the argument its time is remembered by (e.g. pid)",
                )
            )
    return errors


def validate_against_agents(
    spec: trace_pb2.TraceSpec, agents: Mapping[str, agent_pb2.Register]
) -> list[EventError]:
    """Events on nodes that are not registered, and kernel-function events on a node whose kernel refuses
    kprobes or fentry (the reason it reported). Tracepoints, functions and arguments are the node's
    kernel's: its agent checks them at apply time."""
    known = ", ".join(sorted(agents)) or "none"
    errors: list[EventError] = []
    for position, event in enumerate(spec.events):
        if not event.node:
            continue
        registration = agents.get(event.node)
        if registration is None:
            errors.append(
                (f"events[{position}].node", f"node {event.node!r} is not registered (registered: {known})")
            )
            continue
        function = function_source(event)
        why = attach_refusal(registration, function[0]) if function else None
        if function and why:
            errors.append(
                (f"events[{position}].{function[0]}", f"node {event.node} cannot attach {function[0]}: {why}")
            )
    return errors
