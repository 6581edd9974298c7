"""Trace spec parsing and validation: every malformed spec names its field; valid specs round-trip."""

from __future__ import annotations

import copy
import json

import pytest
import yaml
from spec_fixtures import CONTRACT_SPEC, example_registrations

from hoptrace.spec import (
    FieldError,
    SpecError,
    check_spec,
    load_spec,
    parse_attach_point,
    spec_from_data,
    spec_to_data,
    spec_to_json,
    spec_to_yaml,
    validate_spec,
)
from hoptrace.v1 import trace_pb2

pytestmark = pytest.mark.unit  # pure code: make test-unit runs it without root


BASE = yaml.safe_load(CONTRACT_SPEC)


def _with(**changes) -> dict:
    """BASE with top-level keys replaced (None deletes)."""
    data = copy.deepcopy(BASE)
    for key, value in changes.items():
        if value is None:
            data.pop(key, None)
        else:
            data[key] = value
    return data


def _filter(**changes) -> dict:
    data = copy.deepcopy(BASE)
    for key, value in changes.items():
        if value is None:
            data["filter"].pop(key, None)
        else:
            data["filter"][key] = value
    return data


def _hop(index: int, **changes) -> dict:
    data = copy.deepcopy(BASE)
    for key, value in changes.items():
        if value is None:
            data["hops"][index].pop(key, None)
        else:
            data["hops"][index][key] = value
    return data


def _errors_of(document: object) -> list[FieldError]:
    text = document if isinstance(document, str) else yaml.safe_dump(document, sort_keys=False)
    with pytest.raises(SpecError) as caught:
        load_spec(text)
    return caught.value.errors


MALFORMED = [
    # (id, document, field the error must name, words the reason must contain)
    ("bad-yaml", "name: x\nhops: [\n  {name: a\n", "spec", "line"),
    ("tab-indent-yaml", "name: x\n\thops: []\n", "spec", "line"),
    ("bad-json", '{"name": "x", "hops": [}', "spec", "line 1"),
    ("top-level-list", "- a\n- b\n", "spec", "mapping"),
    ("top-level-scalar", "just a string\n", "spec", "mapping"),
    ("empty-document", "", "spec", "mapping"),
    ("unknown-top-key", _with(smaple=2), "smaple", "did you mean 'sample'"),
    ("unknown-filter-key", _filter(dst_prot=53), "filter.dst_prot", "dst_port"),
    ("unknown-hop-key", _hop(1, device="eth0"), "hops[1].device", "unknown key"),
    ("duplicate-key", CONTRACT_SPEC + "sample: 2\n", "sample", "duplicate key"),
    ("missing-name", _with(name=None), "name", "required"),
    ("name-uppercase", _with(name="UDP-Trace"), "name", "[a-z0-9-]+"),
    ("name-underscore", _with(name="udp_trace"), "name", "[a-z0-9-]+"),
    ("name-not-string", _with(name=123), "name", "must be a string"),
    ("filter-not-mapping", _with(filter=["udp"]), "filter", "mapping"),
    ("bad-protocol", _filter(protocol="icmp"), "filter.protocol", "udp or tcp"),
    ("bad-address", _filter(src="198.18.1.300"), "filter.src", "not an IPv4/IPv6"),
    ("bad-cidr-prefix", _filter(dst="198.18.2.0/33"), "filter.dst", "not an IPv4/IPv6"),
    ("cidr-host-bits", _filter(dst="198.18.2.2/24"), "filter.dst", "198.18.2.0/24"),
    ("family-mix", _filter(dst="fd00::2"), "filter.dst", "IPv4"),
    ("port-too-big", _filter(dst_port=70000), "filter.dst_port", "0..65535"),
    ("port-negative", _filter(src_port=-1), "filter.src_port", "0..65535"),
    ("port-string", _filter(dst_port="11111"), "filter.dst_port", "integer"),
    ("port-bool", _filter(dst_port=True), "filter.dst_port", "integer"),
    ("sample-string", _with(sample="x"), "sample", "integer"),
    ("sample-zero", _with(sample=0), "sample", ">= 1"),
    ("sample-negative", _with(sample=-5), "sample", ">= 1"),
    ("hops-mapping", _with(hops={}), "hops", "must be a list"),
    ("hops-missing", _with(hops=None), "hops", "required"),
    ("hops-empty", _with(hops=[]), "hops", "at least one hop"),
    ("hop-not-mapping", _with(hops=["a-c1-out"]), "hops[0]", "mapping"),
    ("duplicate-hop-name", _hop(3, name="a-br-in"), "hops[3].name", "duplicate hop name"),
    ("hop-missing-name", _hop(2, name=None), "hops[2].name", "required"),
    ("hop-missing-node", _hop(3, node=None), "hops[3].node", "required"),
    ("hop-missing-at", _hop(4, at=None), "hops[4].at", "required"),
    ("unknown-at", _hop(3, at="tc-sideways"), "hops[3].at", "unknown attach point"),
    ("tracepoint-bad-group", _hop(1, at="tracepoint:sched:sched_switch"), "hops[1].at", "net or skb"),
    ("tracepoint-no-event", _hop(1, at="tracepoint:net"), "hops[1].at", "tracepoint:GROUP:EVENT"),
    ("fentry-no-function", _hop(1, at="fentry:"), "hops[1].at", "fentry:FUNCTION"),
    ("kretprobe-no-function", _hop(1, at="kretprobe:"), "hops[1].at", "kretprobe:FUNCTION"),
    ("tc-without-dev", _hop(2, dev=None), "hops[2].dev", "required for tc-egress"),
    ("xdp-without-dev", _hop(3, at="xdp", dev=None), "hops[3].dev", "required for xdp"),
    ("cgroup-without-cgroup", _hop(1, at="cgroup-ingress", dev=None), "hops[1].cgroup", "required"),
    ("cgroup-on-tc-hop", _hop(2, cgroup="/sys.slice"), "hops[2].cgroup", "only cgroup-ingress"),
    ("dev-too-long", _hop(2, dev="a-very-long-device-name"), "hops[2].dev", "not a device name"),
    ("dev-not-string", _hop(2, dev=0), "hops[2].dev", "must be a string"),
    ("netns-relative-path", _hop(0, netns="run/netns/c1"), "hops[0].netns", "absolute path"),
    ("udp-first-hop-ingress", _hop(0, at="tc-ingress"), "hops[0].at", "tc-egress"),
    (
        "udp-first-hop-cgroup",
        _hop(0, at="cgroup-egress", dev=None, cgroup="/c1"),
        "hops[0].at",
        "cannot grow packets",
    ),
    (
        "both-protocols-first-hop-tracepoint",
        {**_hop(0, at="tracepoint:net:net_dev_xmit"), "filter": {"dst_port": 11111}},
        "hops[0].at",
        "set filter.protocol: tcp to trace TCP only",
    ),
]


@pytest.mark.parametrize(
    ("document", "field", "words"), [case[1:] for case in MALFORMED], ids=[case[0] for case in MALFORMED]
)
def test_malformed_spec_names_its_field(document: object, field: str, words: str) -> None:
    errors = _errors_of(document)
    matching = [error for error in errors if error.field == field]
    assert matching, f"no error names {field!r}; got {[str(e) for e in errors]}"
    assert any(words in error.reason for error in matching), [str(e) for e in matching]


def test_malformed_cases_are_many_and_distinct() -> None:
    assert len(MALFORMED) >= 25
    assert len({case[0] for case in MALFORMED}) == len(MALFORMED)


def test_yaml_error_reports_line_and_column() -> None:
    errors = _errors_of("name: x\nhops:\n  - name: a\n    node: b: c\n")
    assert errors[0].field == "spec"
    assert "line 4, column 12" in errors[0].reason


def test_field_errors_carry_the_yaml_line() -> None:
    errors = _errors_of(CONTRACT_SPEC.replace("dev: wire0}", "dev: wire0, cgroup: /x}", 1))
    (error,) = errors
    assert error.field == "hops[2].cgroup"
    assert error.reason.endswith("(line 12)")


def test_spec_error_lists_every_problem_as_field_reason_lines() -> None:
    document = _with(name="Bad_Name", sample=0)
    document["filter"]["dst_port"] = 99999
    with pytest.raises(SpecError) as caught:
        load_spec(yaml.safe_dump(document))
    lines = str(caught.value).splitlines()
    assert [line.split(":", 1)[0] for line in lines] == ["name", "filter.dst_port", "sample"]


def test_tcp_first_hop_cannot_be_receive_side() -> None:
    document = _hop(0, at="tracepoint:net:netif_receive_skb")
    document["filter"]["protocol"] = "tcp"
    errors = _errors_of(document)
    assert [error.field for error in errors] == ["hops[0].at"]
    assert "received" in errors[0].reason


def test_tcp_spec_may_start_at_a_transmit_tracepoint_or_cgroup() -> None:
    document = _hop(0, at="tracepoint:net:net_dev_xmit")
    document["filter"]["protocol"] = "tcp"
    assert load_spec(yaml.safe_dump(document)).hops[0].at == "tracepoint:net:net_dev_xmit"
    document = _hop(0, at="cgroup-egress", dev=None, cgroup="/hoptrace/c1")
    document["filter"]["protocol"] = "tcp"
    assert load_spec(json.dumps(document)).hops[0].cgroup == "/hoptrace/c1"


def test_invalid_specs_through_the_proto_path_too() -> None:
    spec = trace_pb2.TraceSpec(name="x", hops=[trace_pb2.HopSpec(name="h", node="n", at="tc-egress")])
    spec.filter.src_port = 70000  # proto uint32 allows it; the spec does not
    fields = [error.field for error in validate_spec(spec)]
    assert sorted(fields) == ["filter.src_port", "hops[0].dev"]


# ---- valid specs -----------------------------------------------------------------------------------------

VALID = [
    CONTRACT_SPEC,
    # minimal TCP, IPv6 CIDRs, sampling, every attach kind after the first hop
    """
name: tcp-v6
filter: {protocol: tcp, src: "fd00:1::/64", dst: "fd00:2::5"}
sample: 100
hops:
  - {name: out, node: host-a, at: cgroup-egress, cgroup: /hoptrace/c1, netns: c1}
  - {name: xmit, node: host-a, at: "tracepoint:net:net_dev_xmit"}
  - {name: in, node: host-b, at: xdp, dev: wire0}
  - {name: skb, node: host-b, at: "tracepoint:skb:kfree_skb"}
  - {name: f, node: host-b, at: "fentry:ip_rcv"}
  - {name: k, node: host-b, at: "kprobe:tcp_v6_rcv", netns: /proc/1/ns/net}
""",
    # no filter at all, protocol absent (both), one hop
    "name: any\nhops:\n  - {name: only, node: n1, at: tc-egress, dev: eth0}\n",
]


@pytest.mark.parametrize("text", VALID, ids=["contract", "tcp-v6-all-kinds", "minimal"])
def test_valid_specs_round_trip_yaml_proto_json(text: str) -> None:
    spec = load_spec(text)
    assert spec_to_data(spec) == {
        key: value for key, value in spec_to_data(spec_from_data(yaml.safe_load(text))).items()
    }
    from_yaml = load_spec(spec_to_yaml(spec))
    from_json = load_spec(spec_to_json(spec))
    assert from_yaml == spec
    assert from_json == spec
    assert json.loads(spec_to_json(from_yaml)) == spec_to_data(spec)


def test_contract_spec_fields() -> None:
    spec = load_spec(CONTRACT_SPEC)
    assert spec.name == "udp-a-to-b"
    assert (spec.filter.protocol, spec.filter.src, spec.filter.dst) == ("udp", "198.18.1.2", "198.18.2.2")
    assert (spec.filter.src_port, spec.filter.dst_port, spec.sample) == (0, 11111, 1)
    assert [hop.name for hop in spec.hops] == ["a-c1-out", "a-br-in", "a-wire-out", "b-wire-in", "b-c2-in"]
    assert spec.hops[0].netns == "c1" and spec.hops[1].dev == "veth-c1"
    assert spec.hops[1].at == "tracepoint:net:netif_receive_skb"


def test_json_spec_is_recognised_by_content() -> None:
    spec = load_spec(json.dumps(BASE))
    assert spec == load_spec(CONTRACT_SPEC)


@pytest.mark.parametrize(
    ("at", "kind", "direction", "target"),
    [
        ("tc-egress", "tc", "egress", ""),
        ("xdp", "xdp", "ingress", ""),
        ("cgroup-egress", "cgroup_skb", "egress", ""),
        ("tracepoint:skb:consume_skb", "tp_btf", "", "consume_skb"),
        ("fentry:ip_rcv", "fentry", "", "ip_rcv"),
        ("kprobe:dev_queue_xmit", "kprobe", "", "dev_queue_xmit"),
        ("fexit:ip_route_input_noref", "fexit", "", "ip_route_input_noref"),
        ("kretprobe:ip_route_input_noref", "kretprobe", "", "ip_route_input_noref"),
    ],
)
def test_parse_attach_point(at: str, kind: str, direction: str, target: str) -> None:
    point = parse_attach_point(at)
    assert (point.kind, point.direction, point.target) == (kind, direction, target)


def test_check_spec_hands_over_each_hops_parsed_attach_point() -> None:
    """What compilers take: the spec and, per hop in order, the attach point validation parsed."""
    spec = load_spec(CONTRACT_SPEC)
    checked = check_spec(spec)
    assert checked.spec == spec
    kinds = trace_pb2.AttachKind
    assert [(point.attach, point.group, point.target) for point in checked.points] == [
        (kinds.ATTACH_KIND_TC_EGRESS, "", ""),
        (kinds.ATTACH_KIND_TRACEPOINT, "net", "netif_receive_skb"),
        (kinds.ATTACH_KIND_TC_EGRESS, "", ""),
        (kinds.ATTACH_KIND_TC_INGRESS, "", ""),
        (kinds.ATTACH_KIND_TC_INGRESS, "", ""),
    ]
    spec.hops[1].at = "tracepoint:net"
    with pytest.raises(SpecError) as caught:
        check_spec(spec)
    assert [error.field for error in caught.value.errors] == ["hops[1].at"]


# ---- against registered agents -----------------------------------------------------------------------------


def _registry_errors(document: dict) -> list[FieldError]:
    spec = spec_from_data(document)
    return validate_spec(spec, example_registrations())


def test_contract_spec_is_valid_against_the_example_agents() -> None:
    assert _registry_errors(BASE) == []


@pytest.mark.parametrize(
    ("document", "field", "words"),
    [
        (_hop(3, node="host-z"), "hops[3].node", "host-z' is not registered (registered: host-a, host-b)"),
        (_hop(4, netns="c9"), "hops[4].netns", "did not report netns 'c9'"),
        (_hop(3, dev="wire9"), "hops[3].dev", "no device 'wire9' in its own namespace on node host-b"),
        (_hop(0, dev="eth9"), "hops[0].dev", "no device 'eth9' in netns 'c1' on node host-a"),
        (_hop(1, at="fentry:ip_rcv"), "hops[1].at", "not permitted: kernel lockdown"),
        (_hop(3, at="kprobe:ip_rcv"), "hops[3].at", "not compiled"),
        (
            _hop(1, at="fexit:ip_route_input_noref"),
            "hops[1].at",
            "fexit:ip_route_input_noref on node host-a: fexit not permitted: kernel lockdown",
        ),
        (
            _hop(3, at="kretprobe:ip_route_input_noref"),
            "hops[3].at",
            "kretprobe:ip_route_input_noref on node host-b: kretprobe not supported: kernel has no "
            "kprobe_events",
        ),
    ],
    ids=[
        "unknown-node",
        "unreported-netns",
        "no-device",
        "no-device-in-netns",
        "fentry-lockdown",
        "kprobe",
        "fexit-lockdown",
        "kretprobe",
    ],
)
def test_registry_aware_errors(document: dict, field: str, words: str) -> None:
    errors = _registry_errors(document)
    assert [error.field for error in errors] == [field], [str(e) for e in errors]
    assert words in errors[0].reason


def test_netns_path_is_left_to_the_agent() -> None:
    assert _registry_errors(_hop(4, netns="/proc/1234/ns/net", dev="anything")) == []


def test_tcp_tagging_needs_sock_ops_on_the_first_node() -> None:
    registrations = example_registrations()
    registrations["host-a"].capabilities.attach["sock_ops"].supported = False
    registrations["host-a"].capabilities.attach["sock_ops"].reason = "cgroup2 not mounted"
    errors = validate_spec(load_spec(CONTRACT_SPEC.replace("protocol: udp", "protocol: tcp")), registrations)
    assert [(error.field, error.reason) for error in errors] == [
        ("hops[0].node", "TCP tagging needs sock_ops on node host-a: cgroup2 not mounted")
    ]
    # UDP only: sock_ops is not needed
    assert validate_spec(load_spec(CONTRACT_SPEC), registrations) == []
