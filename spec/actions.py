"""Hop actions (``actions:`` on a hop): their spec forms and their checks. The dispatcher turns them into the
typed `HopActions` the agent loads as constants (`hoptrace.dispatcher.compile.hop_actions`).

The field catalogue is kernel-patch/include/hoptrace.h's ``enum hoptrace_field`` (``kernel_abi.FIELDS``,
``trace_pb2``'s ``Field``); this module says which attach kinds can give each field. Nothing the user wrote
reaches C: a spec's field names become ``Field`` numbers, set as the hop program's ``act_*`` constants.

Spec forms (in a hop's ``actions`` list)::

    - timestamp                 # the record joined across nodes (always on in this version)
    - count                     # matched packets, one total
    - count: {by: cpu}          # ... keyed by a field (also `- {count: , by: cpu}`)
    - histogram: latency        # log2 buckets of a field
    - record: [len, ttl]        # these fields' values of every traced packet, with its record
    - capture: 96               # the first 96 bytes of every traced packet, with its record
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hoptrace import kernel_abi
from hoptrace.spec.attach import AttachPoint
from hoptrace.v1 import agent_pb2, counters_pb2, trace_pb2

ACTION_KINDS = ("timestamp", "count", "histogram", "record", "capture")
# Fields one record action carries (struct hoptrace_values in hoptrace.h).
RECORD_FIELDS_MAX = kernel_abi.VALUES_MAX
# Bytes one capture action keeps of each traced packet (struct hoptrace_capture in hoptrace.h).
CAPTURE_MAX = kernel_abi.CAPTURE_MAX
# The catalogue's names, without "none" (value 0).
FIELDS: tuple[str, ...] = tuple(kernel_abi.FIELDS[1:])
FIELD_NUMBERS: dict[str, int] = {name: number for number, name in enumerate(kernel_abi.FIELDS) if number}

# Program families (hoptrace.spec.attach.KIND_FAMILY) whose hop programs see an sk_buff.
SKB_FAMILIES = frozenset({"tc", "cgroup_skb", "tp_btf", "fentry", "fexit", "kprobe", "kretprobe"})
ALL_FAMILIES = SKB_FAMILIES | {"xdp"}
# Families whose programs find a packet read by the application (socket-read; uprobe: the packet its
# thread read last) with the reading task current: no headers there, but the task and the socket.
READ_FAMILIES = frozenset({"socket_read", "uprobe"})
# Families whose ctx is a socket's packet with bpf_skb_cgroup_id (tracepoints and kprobes have no
# helper for it).
SOCKET_SKB_FAMILIES = frozenset({"tc", "cgroup_skb"})
# Which program families can give each field (tests check every catalogue field is here). Header fields
# come from the parser every hop runs; sk_buff fields need an sk_buff (an XDP frame has none).
FIELD_AVAILABILITY: dict[str, frozenset[str]] = {
    "cpu": ALL_FAMILIES | READ_FAMILIES,
    "len": ALL_FAMILIES | READ_FAMILIES,
    "ifindex": ALL_FAMILIES,
    "mark": SKB_FAMILIES,
    "priority": SKB_FAMILIES,
    "latency": ALL_FAMILIES | READ_FAMILIES,
    "netns": SKB_FAMILIES,
    "cgroup": SOCKET_SKB_FAMILIES,
    "queue_mapping": SKB_FAMILIES,
    "gso_segs": SKB_FAMILIES,
    "gso_size": SKB_FAMILIES,
    "tos": ALL_FAMILIES,
    "ttl": ALL_FAMILIES,
    "ip_id": ALL_FAMILIES,
    "tcp_flags": ALL_FAMILIES,
    "tcp_window": ALL_FAMILIES,
    "tcp_seq": ALL_FAMILIES,
    "tcp_ack": ALL_FAMILIES,
    # Narrowed by FIELD_POINTS below: cgroup-egress, not -ingress.
    "pid": READ_FAMILIES | {"cgroup_skb"},
    # Narrowed by FIELD_POINTS below: the skb:kfree_skb tracepoint only.
    "drop_reason": frozenset({"tp_btf"}),
    # Only drops: true's hops record it (DROPS_ONLY): the agent names the function, the report shows it.
    "drop_function": frozenset({"tp_btf"}),
    "rmem": frozenset({"socket_read"}),
    "backlog": frozenset({"socket_read"}),
    "comm": READ_FAMILIES,
}
# Fields that need more than their family: (test of the parsed attach point, where they are available, why).
# pid: only the sending task runs a cgroup-egress program (sendmsg -> ip_output); at ingress the
# packet is handled in softirq and the current task is whoever was interrupted.
FIELD_POINTS: dict[str, tuple[Callable[[AttachPoint], bool], str]] = {
    "pid": (
        lambda point: point.kind in READ_FAMILIES
        or (point.kind == "cgroup_skb" and point.direction == "egress"),
        "cgroup-egress hops (where the sending task runs the program),"
        " socket-read and uprobe hops (the reader)",
    ),
    "drop_reason": (
        lambda point: point.kind == "tp_btf" and (point.group, point.target) == ("skb", "kfree_skb"),
        "tracepoint:skb:kfree_skb hops (its reason argument)",
    ),
    "drop_function": (
        lambda point: point.kind == "tp_btf" and (point.group, point.target) == ("skb", "kfree_skb"),
        "tracepoint:skb:kfree_skb hops (its location argument)",
    ),
}
# A count is keyed by a discrete value; latency is a duration, only for histograms. A record needs no
# latency either: the joined records' timestamps are each packet's latency already.
HISTOGRAM_ONLY = frozenset({"latency"})
# A name, not a number: a key to count by only (no log2 buckets, no sum).
COUNT_ONLY = frozenset({"comm"})
# Fields no action of a spec takes: drops: true's hops record the function that freed a lost packet, which
# the agent names (never the kernel's address) and the report's drops show.
DROPS_ONLY = frozenset({"drop_function"})
# Families whose hops read the packet's bytes, where the capture action copies them from: not socket-read
# and uprobe, which find a packet parsed earlier by its ID.
CAPTURE_FAMILIES = ALL_FAMILIES
# How a family is named in messages ("tracepoint hops", not "tp_btf hops").
FAMILY_NAMES = {"tp_btf": "tracepoint", "cgroup_skb": "cgroup", "socket_read": "socket-read"}

ActionError = tuple[str, str]  # (field path, reason)


def field_available(name: str, family: str, point: AttachPoint | None = None) -> bool:
    """Can a hop of this program family (and, when given, this attach point) give field `name`?"""
    if family not in FIELD_AVAILABILITY.get(name, frozenset()):
        return False
    narrowed = FIELD_POINTS.get(name)
    return narrowed is None or point is None or narrowed[0](point)


def available_fields(family: str, point: AttachPoint | None = None) -> list[str]:
    """The catalogue's fields a hop of this program family (and attach point) can give, in catalogue
    order."""
    return [name for name in FIELDS if name not in DROPS_ONLY and field_available(name, family, point)]


def _kind_and_args(value: Any) -> tuple[str | None, dict[str, Any], str | None]:
    """(kind, arguments, structural problem) of one spec action."""
    if isinstance(value, str):
        return value, {}, None
    if not isinstance(value, dict) or not value:
        return None, {}, "must be an action name or a mapping such as {histogram: len}"
    kinds = [key for key in value if key in ACTION_KINDS]
    if len(kinds) != 1:
        others = ", ".join(repr(key) for key in value)
        return None, {}, f"one action per item ({', '.join(ACTION_KINDS)}), got keys {others}"
    kind = kinds[0]
    argument = value[kind]
    extra = {key: v for key, v in value.items() if key != kind}
    if kind == "count":
        if isinstance(argument, dict):
            extra = {**argument, **extra}
        elif argument is not None:
            return kind, {}, f"count takes {{by: FIELD}} or nothing, got {argument!r}"
        return kind, extra, None
    if kind == "histogram" and set(extra) <= {"since"}:
        return kind, {"field": argument, **extra}, None
    if extra:
        return kind, {}, f"{kind} takes no other keys, got {', '.join(repr(key) for key in extra)}"
    return kind, {"field": argument}, None


def convert_actions(
    value: Any, field: str, target: trace_pb2.HopSpec | trace_pb2.EventSpec
) -> list[ActionError]:
    """Fill `target.actions` from a hop's (or event's) ``actions`` value; returns the structural problems."""
    errors: list[ActionError] = []
    if value is None:
        return errors
    if not isinstance(value, list):
        return [(field, f"must be a list of actions ({', '.join(ACTION_KINDS)})")]
    for position, item in enumerate(value):
        where = f"{field}[{position}]"
        kind, args, problem = _kind_and_args(item)
        if problem:
            errors.append((where, problem))
            continue
        assert kind is not None
        action = target.actions.add(kind=kind)
        if kind == "count":
            unknown = [key for key in args if key != "by"]
            if unknown:
                errors.append((where, f"count takes only 'by', got {', '.join(repr(k) for k in unknown)}"))
            by = args.get("by")
            if by is not None and not isinstance(by, str):
                errors.append((where, f"count by: must be a field name, got {by!r}"))
            elif by:
                action.by = by
        elif kind == "record":
            fields = args.get("field")
            if isinstance(fields, str):
                fields = [fields]
            if not isinstance(fields, list) or not fields or not all(isinstance(f, str) for f in fields):
                errors.append(
                    (where, f"record: must list 1 to {RECORD_FIELDS_MAX} field names, got {fields!r}")
                )
            else:
                action.fields.extend(fields)
        elif kind == "capture":
            argument = args.get("field")
            if not isinstance(argument, int) or isinstance(argument, bool):
                errors.append(
                    (where, f"capture: must be a number of bytes (1 to {CAPTURE_MAX}), got {argument!r}")
                )
            elif argument < 0:
                errors.append((where, f"capture: must be 1 to {CAPTURE_MAX} bytes, got {argument}"))
            else:
                action.bytes = argument
        elif kind == "histogram":
            argument = args.get("field")
            if kind == "histogram" and not isinstance(argument, str):
                errors.append(
                    (where, f"histogram: must name one field ({', '.join(FIELDS)}), got {argument!r}")
                )
            elif isinstance(argument, str):
                action.field = argument
            since = args.get("since")
            if since is not None and not isinstance(since, str):
                errors.append((where, f"since: must name an event, got {since!r}"))
            elif since:
                action.since = since
    return errors


def action_to_data(action: trace_pb2.ActionSpec) -> Any:
    """One action in the spec's canonical form (the inverse of convert_actions)."""
    if action.kind == "count":
        return {"count": {"by": action.by}} if action.by else "count"
    if action.kind == "histogram":
        return (
            {"histogram": action.field, "since": action.since}
            if action.since
            else {"histogram": action.field}
        )
    if action.kind == "record":
        return {"record": list(action.fields)}
    if action.kind == "capture":
        return {"capture": action.bytes}
    return action.kind


def _field_problem(name: str, family: str, kind: str, point: AttachPoint | None) -> str | None:
    if name not in FIELD_NUMBERS:
        return f"unknown field {name!r}; fields: {', '.join(FIELDS)}"
    if name in DROPS_ONLY:
        return f"field {name!r} is for drops: true, whose report names where the kernel freed lost packets"
    if kind == "count" and name in HISTOGRAM_ONLY:
        return f"field {name!r} is a duration: use histogram: {name}, not count by"
    if kind != "count" and name in COUNT_ONLY:
        return f"field {name!r} is a name: use count: {{by: {name}}}"
    if kind == "record" and name in HISTOGRAM_ONLY:
        return (
            f"field {name!r} is per packet already (the joined records' timestamps): "
            f"use histogram: {name}, or the report's segments"
        )
    if not field_available(name, family, point):
        where = point_name(point) if point is not None else FAMILY_NAMES.get(family, family)
        only = f" (only at {FIELD_POINTS[name][1]})" if name in FIELD_POINTS else ""
        return (
            f"field {name!r} is not available at {where} hops{only}; available: "
            f"{', '.join(available_fields(family, point))}"
        )
    return None


def point_name(point: AttachPoint) -> str:
    """How an attach point is named in messages: ``tracepoint:net:net_dev_xmit``, ``cgroup-ingress``."""
    if point.kind == "tp_btf":
        return f"tracepoint:{point.group}:{point.target}"
    if point.kind in ("tc", "cgroup_skb"):
        return f"{FAMILY_NAMES.get(point.kind, point.kind)}-{point.direction}"
    kind = FAMILY_NAMES.get(point.kind, point.kind)
    return f"{kind}:{point.target}" if point.target else kind


def validate_actions(
    hop: trace_pb2.HopSpec, family: str | None, field: str, point: AttachPoint | None = None
) -> list[ActionError]:
    """Problems of one hop's actions; `family` is its program family (None when `at` did not parse),
    `point` its parsed attach point (narrows fields such as pid and drop_reason)."""
    errors: list[ActionError] = []
    if not hop.actions:
        return errors
    seen: dict[str, int] = {}
    for position, action in enumerate(hop.actions):
        where = f"{field}.actions[{position}]"
        if action.kind not in ACTION_KINDS:
            errors.append((where, f"unknown action {action.kind!r}; expected {', '.join(ACTION_KINDS)}"))
            continue
        if action.kind in seen:
            errors.append(
                (where, f"a hop has one {action.kind} action (also {field}.actions[{seen[action.kind]}])")
            )
            continue
        seen[action.kind] = position
        if action.since:
            errors.append(
                (where, "since: pairs two events; a hop's latency is from the previous hop of its node")
            )
        if action.kind == "record":
            errors.extend(_record_problems(action, family, point, where))
            continue
        if action.kind == "capture":
            errors.extend(_capture_problems(action, family, point, where))
            continue
        name = action.by if action.kind == "count" else action.field
        if name and family is not None:
            problem = _field_problem(name, family, action.kind, point)
            if problem:
                errors.append((where, problem))
    if "timestamp" not in seen:
        errors.append(
            (
                f"{field}.actions",
                "must include timestamp: every hop's record is joined across nodes in this version "
                "(leave actions out for [timestamp] alone)",
            )
        )
    return errors


def _record_problems(
    action: trace_pb2.ActionSpec, family: str | None, point: AttachPoint | None, where: str
) -> list[ActionError]:
    """Problems of one record action: 1 to RECORD_FIELDS_MAX fields, each once, each available here."""
    fields = list(action.fields)
    if not fields or len(fields) > RECORD_FIELDS_MAX:
        return [(where, f"record: must list 1 to {RECORD_FIELDS_MAX} fields, got {len(fields)}")]
    errors: list[ActionError] = []
    for i, name in enumerate(fields):
        if name in fields[:i]:
            errors.append((f"{where}.record[{i}]", f"field {name!r} is listed twice"))
            continue
        problem = _field_problem(name, family, "record", point) if family is not None else None
        if family is None and name not in FIELD_NUMBERS:
            problem = f"unknown field {name!r}; fields: {', '.join(FIELDS)}"
        if problem:
            errors.append((f"{where}.record[{i}]", problem))
    return errors


def _capture_problems(
    action: trace_pb2.ActionSpec, family: str | None, point: AttachPoint | None, where: str
) -> list[ActionError]:
    """Problems of one capture action: 1 to CAPTURE_MAX bytes, at a hop that reads the packet."""
    if not 1 <= action.bytes <= CAPTURE_MAX:
        return [(where, f"capture: must be 1 to {CAPTURE_MAX} bytes, got {action.bytes}")]
    if family is not None and family not in CAPTURE_FAMILIES:
        name = FAMILY_NAMES.get(family, family)
        return [
            (
                where,
                f"capture is not available at {name} hops: they find a packet parsed earlier by its ID,"
                " with no bytes of it (capture at a device or kernel hop before it)",
            )
        ]
    return []


def _action_fields(action: trace_pb2.ActionSpec) -> list[str]:
    """The catalogue fields one action reads."""
    if action.kind == "count":
        return [action.by] if action.by else []
    if action.kind == "histogram":
        return [action.field] if action.field else []
    if action.kind == "record":
        return list(action.fields)
    return []


def validate_against_agent(
    hop: trace_pb2.HopSpec, field: str, registration: agent_pb2.Register
) -> list[ActionError]:
    """Fields the hop's node did not report among the ones its agent can read."""
    reported = {
        counters_pb2.Field.Name(f).removeprefix("FIELD_").lower()
        for f in registration.capabilities.action_fields
    }
    errors: list[ActionError] = []
    for position, action in enumerate(hop.actions):
        for name in _action_fields(action):
            errors.extend(
                _agent_field_problem(hop, f"{field}.actions[{position}]", name, reported, registration)
            )
    return errors


def _agent_field_problem(
    hop: trace_pb2.HopSpec, where: str, name: str, reported: set[str], registration: agent_pb2.Register
) -> list[ActionError]:
    """A field the hop's node did not report: with its kernel's reason when the agent gave one."""
    if not name or name not in FIELD_NUMBERS or name in reported:
        return []
    why = registration.capabilities.unavailable_fields.get(name, "")
    if why:
        return [(where, f"node {hop.node} cannot give field {name!r}: {why}")]
    listed = ", ".join(sorted(reported, key=FIELDS.index)) if reported else "none (an older agent)"
    return [(where, f"node {hop.node}'s agent cannot read field {name!r}; it reports: {listed}")]
