"""Trace specs: load YAML or JSON, convert to `TraceSpec`, and validate with field-precise errors.

The YAML/JSON form is a contract (see spec/README.md). Every error names the field it is about with a
path such as ``hops[2].dev`` or ``filter.src`` so a user can find it; YAML errors also carry the line.
"""

from __future__ import annotations

import difflib
import ipaddress
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import yaml

from hoptrace import kernel_abi
from hoptrace.spec import actions as hop_actions
from hoptrace.spec import drops as drop_hops
from hoptrace.spec import events as event_probes
from hoptrace.spec import workloads
from hoptrace.spec.attach import AT_FORMS, AttachPoint, at_spelling, attach_refusal, parse_attach_point
from hoptrace.v1 import agent_pb2, trace_pb2

NAME_PATTERN = re.compile(r"^[a-z0-9]([a-z0-9-]*[a-z0-9])?$")
NAME_MAX_LEN = 63
HOP_NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
# Linux interface names: at most IFNAMSIZ - 1 = 15 bytes, no '/', no whitespace, not "." or "..".
DEVICE_NAME_PATTERN = re.compile(r"^[^/\s:]{1,15}$")
PROTOCOLS = ("udp", "tcp")
# socket-read hops read one protocol's receive path: the filter must name it.
SOCKET_READ_PROTOCOLS = ("udp", "tcp")
MAX_SAMPLE = 2**32 - 1
MAX_HOPS = kernel_abi.MAX_HOPS
# A spec is a few hundred bytes; these bound what a hostile one can cost before it is refused.
MAX_SPEC_BYTES = 1 << 20
MAX_NESTING = 16  # mappings and lists inside each other (a spec needs 3)
MAX_REPORTED_ERRORS = 30  # in a message; SpecError.errors keeps them all

TOP_LEVEL_KEYS = ("name", "filter", "sample", "hops", "events", "drops")
FILTER_KEYS = ("protocol", "src", "dst", "src_port", "dst_port")
HOP_KEYS = ("name", "node", "at", "dev", "netns", "cgroup", "actions")
# The hop keys whose values are strings.
HOP_STRING_KEYS = HOP_KEYS[:-1]


@dataclass(frozen=True)
class FieldError:
    """One problem in a spec: `field` is a path into it (``hops[2].dev``), `reason` says what is wrong."""

    field: str
    reason: str

    def __str__(self) -> str:
        return f"{self.field}: {self.reason}" if self.field else self.reason


class SpecError(ValueError):
    """A spec that cannot be used; `errors` holds every problem found, in spec order."""

    def __init__(self, errors: Sequence[FieldError]) -> None:
        self.errors = list(errors)
        super().__init__(str(self))

    def __str__(self) -> str:
        return format_errors(self.errors)


def format_errors(errors: Sequence[FieldError]) -> str:
    """One line per error, at most MAX_REPORTED_ERRORS of them (messages travel in gRPC trailers)."""
    lines = [str(error) for error in errors[:MAX_REPORTED_ERRORS]]
    if len(errors) > MAX_REPORTED_ERRORS:
        lines.append(f"... and {len(errors) - MAX_REPORTED_ERRORS} more problems")
    return "\n".join(lines)


def udp_tagging_enabled(spec: trace_pb2.TraceSpec) -> bool:
    """UDP packets get IDs at the first hop when the filter is UDP or names no protocol."""
    return spec.filter.protocol in ("", "udp")


def tcp_tagging_enabled(spec: trace_pb2.TraceSpec) -> bool:
    """TCP segments get IDs from sock_ops on the sender when the filter is TCP or names no protocol."""
    return spec.filter.protocol in ("", "tcp")


# ---- loading -------------------------------------------------------------------------------------------


class _LineIndex:
    """Field path -> 1-based line of a YAML document, for error messages."""

    def __init__(self) -> None:
        self.lines: dict[str, int] = {}

    def line_of(self, field: str) -> int | None:
        """The line of `field`, or of its nearest parent that has one."""
        while field:
            if field in self.lines:
                return self.lines[field]
            field = re.sub(r"(\.[^.\[]+|\[\d+\])$", "", field) if re.search(r"[.\[]", field) else ""
        return None


def _index_yaml_nodes(node: yaml.Node, path: str, index: _LineIndex, errors: list[FieldError]) -> None:
    if path:
        index.lines.setdefault(path, node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        seen: set[str] = set()
        for key_node, value_node in node.value:
            key = key_node.value if isinstance(key_node, yaml.ScalarNode) else "?"
            child = f"{path}.{key}" if path else key
            if key in seen:
                errors.append(
                    FieldError(child, f"duplicate key {key!r} (line {key_node.start_mark.line + 1})")
                )
            seen.add(key)
            index.lines.setdefault(child, key_node.start_mark.line + 1)
            _index_yaml_nodes(value_node, child, index, errors)
    elif isinstance(node, yaml.SequenceNode):
        for position, item in enumerate(node.value):
            _index_yaml_nodes(item, f"{path}[{position}]", index, errors)


def _check_yaml_shape(text: str) -> None:
    """Refuse, in one pass over the parser's events and before anything is built, what a spec never needs
    and a hostile document uses: aliases (whose expansion is exponential) and deep nesting."""
    depth = 0
    for event in yaml.parse(text, Loader=yaml.SafeLoader):
        if isinstance(event, yaml.AliasEvent):
            line = event.start_mark.line + 1
            reason = f"line {line}: YAML aliases (*{event.anchor}) are not allowed"
            raise SpecError([FieldError("spec", reason)])
        if isinstance(event, yaml.CollectionStartEvent):
            depth += 1
            if depth > MAX_NESTING:
                line = event.start_mark.line + 1
                raise SpecError(
                    [FieldError("spec", f"line {line}: nested more than {MAX_NESTING} levels deep")]
                )
        elif isinstance(event, yaml.CollectionEndEvent):
            depth -= 1


def parse_document(text: str | bytes) -> tuple[Any, _LineIndex]:
    """Parse YAML or JSON (JSON when the text starts with '{'); raises SpecError naming line and column."""
    if len(text) > MAX_SPEC_BYTES:
        raise SpecError([FieldError("spec", f"{len(text)} bytes: a spec is at most {MAX_SPEC_BYTES} bytes")])
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as error:
            raise SpecError([FieldError("spec", f"not UTF-8 text: {error}")]) from None
    if "\x00" in text:
        raise SpecError([FieldError("spec", "not text: it contains NUL bytes")])
    index = _LineIndex()
    if text.lstrip().startswith("{"):
        try:
            return json.loads(text), index
        except RecursionError:
            raise SpecError([FieldError("spec", f"nested more than {MAX_NESTING} levels deep")]) from None
        except json.JSONDecodeError as error:
            raise SpecError(
                [
                    FieldError(
                        "spec", f"invalid JSON at line {error.lineno}, column {error.colno}: {error.msg}"
                    )
                ]
            ) from None
    try:
        _check_yaml_shape(text)
        root = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.MarkedYAMLError as error:
        mark = error.problem_mark or error.context_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = " ".join(part for part in (error.context, error.problem) if part)
        raise SpecError([FieldError("spec", f"invalid YAML at {where}{problem}")]) from None
    except yaml.YAMLError as error:
        raise SpecError([FieldError("spec", f"invalid YAML: {error}")]) from None
    duplicate_errors: list[FieldError] = []
    if root is not None:
        _index_yaml_nodes(root, "", index, duplicate_errors)
    if duplicate_errors:
        raise SpecError(duplicate_errors)
    return data, index


def _type_name(value: Any) -> str:
    if value is None:
        return "null"
    return {dict: "a mapping", list: "a list", str: "a string", bool: "a boolean", int: "an integer"}.get(
        type(value), type(value).__name__
    )


class _Converter:
    """Builds a TraceSpec from a parsed document, collecting structural errors instead of stopping at one."""

    def __init__(self) -> None:
        self.errors: list[FieldError] = []

    def error(self, field: str, reason: str) -> None:
        self.errors.append(FieldError(field, reason))

    def check_keys(self, mapping: Mapping[str, Any], allowed: Sequence[str], prefix: str) -> None:
        for key in mapping:
            if key in allowed:
                continue
            field = f"{prefix}.{key}" if prefix else str(key)
            suggestion = difflib.get_close_matches(str(key), allowed, n=1)
            hint = f" (did you mean {suggestion[0]!r}?)" if suggestion else f"; expected {', '.join(allowed)}"
            self.error(field, f"unknown key {key!r}{hint}")

    def string(self, mapping: Mapping[str, Any], key: str, field: str) -> str:
        value = mapping.get(key)
        if value is None:
            return ""
        if not isinstance(value, str):
            self.error(field, f"must be a string, got {_type_name(value)} {value!r} (quote it)")
            return ""
        return value

    def integer(self, mapping: Mapping[str, Any], key: str, field: str, low: int, high: int) -> int | None:
        value = mapping.get(key)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            self.error(field, f"must be an integer, got {_type_name(value)} {value!r}")
            return None
        if not low <= value <= high:
            self.error(field, f"{value} is out of range {low}..{high}")
            return None
        return value

    def convert(self, data: Any) -> trace_pb2.TraceSpec:
        spec = trace_pb2.TraceSpec()
        if not isinstance(data, dict):
            self.error("spec", f"must be a mapping with name, filter, sample, hops; got {_type_name(data)}")
            return spec
        self.check_keys(data, TOP_LEVEL_KEYS, "")
        spec.name = self.string(data, "name", "name")
        self.convert_filter(data.get("filter"), spec.filter)
        sample = data.get("sample")
        spec.sample = 1  # the default, explicit so that every loaded spec compares equal to its round trip
        if sample is not None:
            if isinstance(sample, bool) or not isinstance(sample, int):
                self.error("sample", f"must be an integer >= 1 (trace 1 packet in N), got {sample!r}")
            elif sample < 1:
                self.error("sample", f"must be >= 1 (trace 1 packet in N), got {sample}")
            elif sample > MAX_SAMPLE:
                self.error("sample", f"must be <= {MAX_SAMPLE}, got {sample}")
            else:
                spec.sample = sample
        hops = data.get("hops")
        if hops is None:
            if "hops" not in data and not data.get("events"):  # a spec of event probes alone has no path
                self.error("hops", "required: the points the packets pass, in path order")
        elif not isinstance(hops, list):
            self.error("hops", f"must be a list of hops, got {_type_name(hops)}")
        elif len(hops) > MAX_HOPS:
            self.error("hops", f"a path has at most {MAX_HOPS} hops, got {len(hops)}")
        else:
            for position, hop in enumerate(hops):
                self.convert_hop(hop, f"hops[{position}]", spec.hops.add())
        for where, reason in event_probes.convert_events(data.get("events"), spec):
            self.error(where, reason)
        drops = data.get("drops")
        if drops is not None and not isinstance(drops, bool):
            self.error("drops", f"must be true or false, got {_type_name(drops)} {drops!r}")
        elif drops:
            spec.drops = True
        return spec

    def convert_filter(self, value: Any, target: trace_pb2.Filter) -> None:
        if value is None:
            return
        if not isinstance(value, dict):
            self.error("filter", f"must be a mapping ({', '.join(FILTER_KEYS)}), got {_type_name(value)}")
            return
        self.check_keys(value, FILTER_KEYS, "filter")
        target.protocol = self.string(value, "protocol", "filter.protocol")
        target.src = self.string(value, "src", "filter.src")
        target.dst = self.string(value, "dst", "filter.dst")
        for key in ("src_port", "dst_port"):
            port = self.integer(value, key, f"filter.{key}", 0, 65535)
            if port is not None:
                setattr(target, key, port)

    def convert_hop(self, value: Any, field: str, target: trace_pb2.HopSpec) -> None:
        if not isinstance(value, dict):
            self.error(field, f"must be a mapping ({', '.join(HOP_KEYS)}), got {_type_name(value)}")
            return
        self.check_keys(value, HOP_KEYS, field)
        for key in HOP_STRING_KEYS:
            setattr(target, key, self.string(value, key, f"{field}.{key}"))
        for where, reason in hop_actions.convert_actions(value.get("actions"), f"{field}.actions", target):
            self.error(where, reason)


def spec_from_data(data: Any) -> trace_pb2.TraceSpec:
    """Convert a parsed YAML/JSON document to a TraceSpec (structure and types only; see validate_spec)."""
    converter = _Converter()
    spec = converter.convert(data)
    if converter.errors:
        raise SpecError(converter.errors)
    return spec


def _field_order(error: FieldError) -> tuple[int, int]:
    """Sort key putting errors in spec order: name, filter, sample, hops (by index)."""
    head = re.match(r"[a-z_]+", error.field)
    top = TOP_LEVEL_KEYS.index(head.group()) if head and head.group() in TOP_LEVEL_KEYS else -1
    hop = re.match(r"(?:hops|events)\[(\d+)\]", error.field)
    return top, int(hop.group(1)) if hop else -1


def _is_within(field: str, parent: str) -> bool:
    return field == parent or field.startswith(parent + ".") or field.startswith(parent + "[")


def _convert_and_validate(data: Any, agents: Mapping[str, agent_pb2.Register] | None) -> trace_pb2.TraceSpec:
    """Structural and semantic errors together, in spec order; a field with a structural error gets no
    further (semantic) error, e.g. `hops: {}` is "must be a list", not also "must list at least one hop"."""
    converter = _Converter()
    spec = converter.convert(data)
    errors = list(converter.errors)
    if not any(error.field == "spec" for error in errors):
        broken = [error.field for error in errors]
        errors += [
            error
            for error in validate_spec(spec, agents)
            if not any(_is_within(error.field, field) for field in broken)
        ]
    if errors:
        raise SpecError(sorted(errors, key=_field_order))
    return spec


def _with_lines(errors: Sequence[FieldError], index: _LineIndex) -> list[FieldError]:
    located = []
    for error in errors:
        line = index.line_of(error.field) if error.field != "spec" else None
        located.append(FieldError(error.field, f"{error.reason} (line {line})") if line else error)
    return located


def load_spec(
    text: str | bytes, agents: Mapping[str, agent_pb2.Register] | None = None
) -> trace_pb2.TraceSpec:
    """Parse a YAML or JSON spec and validate it (against `agents` when given); raises SpecError."""
    data, index = parse_document(text)
    try:
        return _convert_and_validate(data, agents)
    except SpecError as error:
        raise SpecError(_with_lines(error.errors, index)) from None


# ---- writing -------------------------------------------------------------------------------------------


def spec_to_data(spec: trace_pb2.TraceSpec) -> dict[str, Any]:
    """The spec as the contract's mapping (fields in contract order, empty fields left out)."""
    data: dict[str, Any] = {"name": spec.name}
    filter_data = {key: getattr(spec.filter, key) for key in FILTER_KEYS if getattr(spec.filter, key)}
    if filter_data:
        data["filter"] = filter_data
    data["sample"] = spec.sample or 1
    data["hops"] = []
    for hop in spec.hops:
        hop_data: dict[str, Any] = {key: getattr(hop, key) for key in HOP_STRING_KEYS if getattr(hop, key)}
        if hop.actions:
            hop_data["actions"] = [hop_actions.action_to_data(action) for action in hop.actions]
        data["hops"].append(hop_data)
    if spec.events:
        data["events"] = [event_probes.event_to_data(event) for event in spec.events]
    if spec.drops:
        data["drops"] = True
    return data


def spec_to_yaml(spec: trace_pb2.TraceSpec) -> str:
    """The spec in the contract's YAML form; load_spec(spec_to_yaml(s)) == s."""
    return yaml.safe_dump(spec_to_data(spec), sort_keys=False, default_flow_style=False, width=110)


def spec_to_json(spec: trace_pb2.TraceSpec, indent: int | None = 2) -> str:
    """The spec in the contract's JSON form; load_spec(spec_to_json(s)) == s."""
    return json.dumps(spec_to_data(spec), indent=indent)


# ---- validation ----------------------------------------------------------------------------------------


def _parse_network(value: str, field: str, errors: list[FieldError]) -> ipaddress.IPv4Network | None:
    try:
        network = ipaddress.ip_network(value, strict=False)
    except ValueError:
        errors.append(FieldError(field, f"{value!r} is not an IPv4/IPv6 address or CIDR"))
        return None
    if "/" in value and network.network_address != ipaddress.ip_interface(value).ip:
        errors.append(FieldError(field, f"{value!r} has host bits set; did you mean {network}?"))
        return None
    return network


def validate_filter(spec: trace_pb2.TraceSpec, errors: list[FieldError]) -> None:
    """Append the problems of `spec.filter` to `errors` (protocol, addresses of one family, ports)."""
    flt = spec.filter
    if flt.protocol and flt.protocol not in PROTOCOLS:
        errors.append(FieldError("filter.protocol", f"{flt.protocol!r} is not udp or tcp (absent = both)"))
    src = _parse_network(flt.src, "filter.src", errors) if flt.src else None
    dst = _parse_network(flt.dst, "filter.dst", errors) if flt.dst else None
    if src is not None and dst is not None and src.version != dst.version:
        errors.append(
            FieldError("filter.dst", f"IPv{dst.version} but filter.src is IPv{src.version}: use one family")
        )
    for key in ("src_port", "dst_port"):
        if getattr(flt, key) > 65535:
            errors.append(FieldError(f"filter.{key}", f"{getattr(flt, key)} is out of range 0..65535"))


def _validate_hop(hop: trace_pb2.HopSpec, field: str, errors: list[FieldError]) -> AttachPoint | None:
    if not hop.name:
        if not workloads.is_workload_netns(hop.netns):  # else generated once the workload is found
            errors.append(FieldError(f"{field}.name", "required"))
    elif not HOP_NAME_PATTERN.match(hop.name) or len(hop.name) > NAME_MAX_LEN:
        errors.append(
            FieldError(
                f"{field}.name",
                f"{hop.name!r}: letters, digits, '.', '_', '-', starting with a letter or digit, "
                f"at most {NAME_MAX_LEN} characters",
            )
        )
    if not hop.node:
        errors.append(FieldError(f"{field}.node", "required: the node whose agent runs this hop"))
    point = None
    if not hop.at:
        errors.append(FieldError(f"{field}.at", f"required: one of {AT_FORMS}"))
    else:
        try:
            point = parse_attach_point(hop.at)
        except ValueError as error:
            errors.append(FieldError(f"{field}.at", str(error)))
    if hop.dev and (not DEVICE_NAME_PATTERN.match(hop.dev) or hop.dev in (".", "..")):
        errors.append(
            FieldError(f"{field}.dev", f"{hop.dev!r} is not a device name (1-15 characters, no '/')")
        )
    if workloads.is_workload_netns(hop.netns):
        try:
            workloads.parse_workload_netns(hop.netns)
        except ValueError as error:
            errors.append(FieldError(f"{field}.netns", str(error)))
    elif hop.netns and not hop.netns.startswith("/") and "/" in hop.netns:
        errors.append(
            FieldError(f"{field}.netns", f"{hop.netns!r}: a name under /run/netns or an absolute path")
        )
    if hop.cgroup and ".." in hop.cgroup.split("/"):
        errors.append(FieldError(f"{field}.cgroup", f"{hop.cgroup!r}: '..' is not allowed"))
    errors.extend(
        FieldError(where, reason)
        for where, reason in hop_actions.validate_actions(hop, point.kind if point else None, field, point)
    )
    if point is None:
        return None
    if point.kind in ("tc", "xdp") and not hop.dev:
        errors.append(FieldError(f"{field}.dev", f"required for {hop.at} hops: the device to attach to"))
    if point.kind == "cgroup_skb":
        if not hop.cgroup:
            errors.append(
                FieldError(f"{field}.cgroup", f"required for {hop.at} hops: a cgroup v2 path to attach to")
            )
        if hop.dev:
            errors.append(FieldError(f"{field}.dev", f"not used by {hop.at} hops (they attach to a cgroup)"))
    elif hop.cgroup:
        errors.append(FieldError(f"{field}.cgroup", "only cgroup-ingress/cgroup-egress hops take a cgroup"))
    if point.kind == "uprobe" and hop.dev:
        errors.append(
            FieldError(f"{field}.dev", f"not used by {hop.at} hops: they see an application's function")
        )
    if point.kind == "socket_read" and hop.dev:
        errors.append(
            FieldError(
                f"{field}.dev",
                f"not used by {hop.at} hops: they see the reads of applications in the hop's netns, "
                "whatever device the packets came in on",
            )
        )
    return point


def _validate_tagging(spec: trace_pb2.TraceSpec, first: AttachPoint, errors: list[FieldError]) -> None:
    hop = spec.hops[0]
    if udp_tagging_enabled(spec) and not (first.kind == "tc" and first.is_egress):
        protocol = "udp" if spec.filter.protocol == "udp" else "absent (udp and tcp)"
        errors.append(
            FieldError(
                "hops[0].at",
                f"filter.protocol is {protocol}: UDP packets get their ID at the first hop, which must be "
                f"tc-egress on the sending node (cgroup_skb cannot grow packets); got {hop.at!r}"
                + ("; set filter.protocol: tcp to trace TCP only" if not spec.filter.protocol else ""),
            )
        )
    elif tcp_tagging_enabled(spec) and first.is_receive_side:
        errors.append(
            FieldError(
                "hops[0].at",
                f"TCP segments get their ID from the sending sockets in the first hop's node and netns, so "
                f"the first hop must see packets leaving the sender; {hop.at!r} only sees received packets",
            )
        )


def _namespace_by_name(registration: agent_pb2.Register, netns: str) -> agent_pb2.Namespace | None:
    for namespace in registration.namespaces:
        if namespace.name == netns:
            return namespace
    return None


def _validate_against_agents(
    spec: trace_pb2.TraceSpec,
    points: list[AttachPoint | None],
    agents: Mapping[str, agent_pb2.Register],
    errors: list[FieldError],
) -> None:
    known = ", ".join(sorted(agents)) or "none"
    for position, (hop, point) in enumerate(zip(spec.hops, points, strict=True)):
        field = f"hops[{position}]"
        if not hop.node:
            continue
        registration = agents.get(hop.node)
        if registration is None:
            errors.append(
                FieldError(f"{field}.node", f"node {hop.node!r} is not registered (registered: {known})")
            )
            continue
        if point is not None:
            refusal = attach_refusal(registration, point.kind)
            if refusal:
                errors.append(FieldError(f"{field}.at", f"{hop.at} on node {hop.node}: {refusal}"))
        already = {error.field for error in errors}  # an action refused for its kind needs no second word
        errors.extend(
            FieldError(where, reason)
            for where, reason in hop_actions.validate_against_agent(hop, field, registration)
            if where not in already
        )
        if workloads.is_workload_netns(hop.netns):
            try:
                ref = workloads.parse_workload_netns(hop.netns)
            except ValueError:
                continue  # said by _validate_hop
            if not hop.HasField("workload"):
                errors.append(
                    FieldError(
                        f"{field}.netns",
                        f"node {hop.node} reported no {ref}; {workloads.known_workloads(registration, ref)}",
                    )
                )
                continue
        netns_name = workloads.attach_netns(hop)
        namespace = _namespace_by_name(registration, netns_name)
        if namespace is None:
            if netns_name.startswith("/"):
                continue  # a path (/proc/PID/ns/net) is resolved by the agent at attach time
            reported = ", ".join(repr(ns.name) if ns.name else "'' (own)" for ns in registration.namespaces)
            wanted = f"netns {hop.netns!r}" if hop.netns else "its own namespace ('')"
            errors.append(
                FieldError(
                    f"{field}.netns",
                    f"node {hop.node} did not report {wanted}; it reported: {reported or 'none'}",
                )
            )
            continue
        if hop.dev and point is not None and point.kind != "cgroup_skb":
            devices = [device.name for device in namespace.devices]
            if hop.dev not in devices:
                netns = f"netns {hop.netns!r}" if hop.netns else "its own namespace"
                if hop.HasField("workload"):
                    netns = f"the netns of {workloads.workload_label(hop.workload)}"
                errors.append(
                    FieldError(
                        f"{field}.dev",
                        f"no device {hop.dev!r} in {netns} on node {hop.node}; "
                        f"devices there: {', '.join(devices) or 'none'}",
                    )
                )
    if spec.hops and tcp_tagging_enabled(spec) and spec.hops[0].node in agents:
        refusal = attach_refusal(agents[spec.hops[0].node], "sock_ops")
        if refusal:
            errors.append(
                FieldError(
                    "hops[0].node", f"TCP tagging needs sock_ops on node {spec.hops[0].node}: {refusal}"
                )
            )


@dataclass(frozen=True)
class CheckedSpec:
    """A spec that passed validation, with what validation parsed: `points[i]` is the attach point of
    `spec.hops[i]`. Compilers read these typed hops and never parse `at` again.

    Checked against agents, `spec` is the copy whose container:/pod: hops carry the workload their node
    reports (`HopSpec.workload`) and a generated name when they had none: what apply stores and compiles.
    """

    spec: trace_pb2.TraceSpec
    points: tuple[AttachPoint, ...]


def validate_spec(
    spec: trace_pb2.TraceSpec, agents: Mapping[str, agent_pb2.Register] | None = None
) -> list[FieldError]:
    """Every problem in `spec`, in spec order; checked against the agents' registrations when given (a
    container:/pod: netns is then resolved against their inventories first: `workloads.resolve_workloads`)."""
    return _validate(spec, agents)[1]


def check_spec(
    spec: trace_pb2.TraceSpec, agents: Mapping[str, agent_pb2.Register] | None = None
) -> CheckedSpec:
    """The spec with its hops' parsed attach points (resolved against `agents` when given); raises SpecError
    with every problem validate_spec finds."""
    checked, errors, points = _validate(spec, agents)
    if errors:
        raise SpecError(errors)
    typed = tuple(point for point in points if point is not None)
    assert len(typed) == len(checked.hops), "a hop without an attach point passed validation"
    return CheckedSpec(checked, typed)


def _validate(
    spec: trace_pb2.TraceSpec, agents: Mapping[str, agent_pb2.Register] | None
) -> tuple[trace_pb2.TraceSpec, list[FieldError], list[AttachPoint | None]]:
    """(the spec as checked, its problems, each hop's attach point or None where `at` did not parse)."""
    errors: list[FieldError] = []
    points: list[AttachPoint | None] = []
    if agents is not None:
        spec = workloads.resolve_workloads(spec, agents)
        spec = drop_hops.resolve_drop_hops(spec, agents)
    if not spec.name:
        errors.append(FieldError("name", "required: the trace's name, [a-z0-9-]+"))
    elif not NAME_PATTERN.match(spec.name) or len(spec.name) > NAME_MAX_LEN:
        errors.append(
            FieldError(
                "name",
                f"{spec.name!r} must match [a-z0-9-]+ (not starting or ending with '-'), "
                f"at most {NAME_MAX_LEN} characters",
            )
        )
    validate_filter(spec, errors)
    if not spec.hops and not spec.events:
        errors.append(FieldError("hops", "must list at least one hop"))
        return spec, errors, points
    if len(spec.hops) > MAX_HOPS:
        errors.append(FieldError("hops", f"a path has at most {MAX_HOPS} hops, got {len(spec.hops)}"))
        return spec, errors, points
    first_use: dict[str, int] = {}
    for position, hop in enumerate(spec.hops):
        field = f"hops[{position}]"
        points.append(_validate_hop(hop, field, errors))
        if hop.name:
            if hop.name in first_use:
                errors.append(
                    FieldError(
                        f"{field}.name", f"duplicate hop name {hop.name!r} (also hops[{first_use[hop.name]}])"
                    )
                )
            else:
                first_use[hop.name] = position
    if points and points[0] is not None:
        _validate_tagging(spec, points[0], errors)
    errors.extend(FieldError(where, reason) for where, reason in event_probes.validate_events(spec))
    errors.extend(FieldError(where, reason) for where, reason in drop_hops.validate_drops(spec))
    read_nodes = {
        hop.node
        for hop, point in zip(spec.hops, points, strict=True)
        if point and point.kind == "socket_read"
    }
    for position, (hop, point) in enumerate(zip(spec.hops, points, strict=True)):
        if point is not None and point.kind == "uprobe" and hop.node not in read_nodes:
            errors.append(
                FieldError(
                    f"hops[{position}].at",
                    f"a {at_spelling(point.attach)} hop records the packet its thread read last at a "
                    f"socket-read hop: add a socket-read hop on node {hop.node or '?'} to the path",
                )
            )
    for position, point in enumerate(points):
        if (
            point is not None
            and point.kind == "socket_read"
            and spec.filter.protocol not in SOCKET_READ_PROTOCOLS
        ):
            errors.append(
                FieldError(
                    f"hops[{position}].at",
                    "socket-read follows one protocol's receive call: set filter.protocol to udp or tcp "
                    f"(got {spec.filter.protocol or 'none, meaning both'})",
                )
            )
    if agents is not None:
        _validate_against_agents(spec, points, agents, errors)
        errors.extend(
            FieldError(where, reason) for where, reason in event_probes.validate_against_agents(spec, agents)
        )
        errors.extend(
            FieldError(where, reason)
            for where, reason in drop_hops.validate_drops_against_agents(spec, agents)
        )
    return spec, errors, points
