"""The reference path: c1 -> c2 through every layer of the two-host VXLAN topology (container veth, bridge,
VXLAN, the wire, and back up on host-b). One definition gives the demo's spec, the system tests' and the
benchmarks' specs, and the standalone agents' plans (compiled by the dispatcher's own code), so the
three can never describe different paths."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from google.protobuf import json_format

from hoptrace.dispatcher.compile import TCP_TAGGER_PROGRAM, standalone_plans
from hoptrace.lab.processes import REPO_ROOT
from hoptrace.lab.topology import TwoHostTopology
from hoptrace.spec import CheckedSpec, check_spec, parse_attach_point, spec_from_data
from hoptrace.v1 import trace_pb2

BPF_OBJECT = REPO_ROOT / "kernel-patch" / "build" / "hoptrace.bpf.o"
SOCKPERF_PORT = 11111


# The reference path's two tracepoint hops: c1's packets entering host-a, c2's leaving host-b.
TRACEPOINTS = ("tracepoint:net:netif_receive_skb", "tracepoint:net:net_dev_xmit")


def vxlan_path_spec(
    topo: TwoHostTopology,
    name: str,
    protocol: str = "udp",
    port: int = SOCKPERF_PORT,
    sample: int = 1,
    tc_only: bool = False,
) -> trace_pb2.TraceSpec:
    """The spec of a c1 -> c2 flow through every layer of the VXLAN topology, in path order. `tc_only`: the
    two tracepoint hops at their devices' tc instead (a system-wide tracepoint runs for every packet of
    the machine, a device's tc for that device's)."""
    receive, transmit = ("tc-ingress", "tc-egress") if tc_only else TRACEPOINTS
    hops = [
        ("a-c1-eth0-out", "host-a", "tc-egress", "eth0", topo.c1),
        ("a-veth-in", "host-a", receive, "veth-c1", ""),
        ("a-vxlan-out", "host-a", "tc-egress", "vxlan0", ""),
        ("a-wire-out", "host-a", "tc-egress", "wire0", ""),
        ("b-wire-in", "host-b", "tc-ingress", "wire0", ""),
        ("b-vxlan-in", "host-b", "tc-ingress", "vxlan0", ""),
        ("b-veth-out", "host-b", transmit, "veth-c2", ""),
        ("b-c2-eth0-in", "host-b", "tc-ingress", "eth0", topo.c2),
    ]
    return trace_pb2.TraceSpec(
        name=name,
        filter=trace_pb2.Filter(protocol=protocol, src=topo.addr("c1"), dst=topo.addr("c2"), dst_port=port),
        sample=sample,
        hops=[
            trace_pb2.HopSpec(name=n, node=node, at=at, dev=dev, netns=ns) for n, node, at, dev, ns in hops
        ],
    )


def spec_plans(spec: dict[str, Any] | trace_pb2.TraceSpec) -> dict[str, dict[str, Any]]:
    """Each node's standalone plan (protojson) of a spec, validated and compiled as the dispatcher does,
    with the generic object."""
    if isinstance(spec, dict):
        spec = spec_from_data(spec)
    return standalone_plans(check_spec(spec), BPF_OBJECT)


def unchecked_plans(
    spec: trace_pb2.TraceSpec, object_path: str | Path = BPF_OBJECT
) -> dict[str, dict[str, Any]]:
    """Each node's standalone plan (protojson) of a spec that breaks the user's rules on purpose (benchmarks
    name their traces freely, the agent only echoes the name; a load generator's ingress hop records IDs it
    did not write): its hops' attach points parsed by the spec language's own parser, nothing else checked."""
    typed = CheckedSpec(spec, tuple(parse_attach_point(hop.at) for hop in spec.hops))
    return standalone_plans(typed, object_path)


def path_plans(
    topo: TwoHostTopology,
    trace: str,
    filter_: dict[str, Any],
    sample: int = 1,
    tag_udp: bool = True,
    tcp_tagging: bool = False,
    tc_only: bool = False,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The TracePlans (protojson) of host-a's and host-b's agents for the whole c1 -> c2 VXLAN path, as the
    dispatcher compiles them, with UDP and TCP tagging set as asked (`tc_only`: `vxlan_path_spec`'s)."""
    spec = vxlan_path_spec(topo, trace, sample=sample, tc_only=tc_only)
    spec.filter.Clear()
    json_format.ParseDict(filter_, spec.filter)
    plans = unchecked_plans(spec)
    plan_a, plan_b = plans["host-a"], plans["host-b"]
    set_c1_tagging(topo, plan_a, tag_udp, tcp_tagging)
    return plan_a, plan_b


def set_c1_tagging(topo: TwoHostTopology, plan: dict[str, Any], tag_udp: bool, tcp_tagging: bool) -> None:
    """Tag UDP at the plan's first hop and TCP by sock_ops in c1's namespace, each as asked."""
    plan["hops"][0]["tagUdp"] = tag_udp
    if tcp_tagging:
        plan["tcpTagging"] = {"netns": topo.c1, "program": TCP_TAGGER_PROGRAM}
    else:
        plan.pop("tcpTagging", None)
