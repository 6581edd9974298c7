"""`netns: container:NAME` and `netns: pod:NAMESPACE/NAME`: resolved against the node's inventory at apply
time into the typed `HopSpec.workload`, which the plan attaches in; bad names get the field and what is
known there."""

from __future__ import annotations

import pytest
from dispatcher_fakes import example_registrations

from hoptrace.dispatcher.compile import build_plans
from hoptrace.dispatcher.presets import agent_args, validate_preset_request
from hoptrace.dispatcher.spec import load_spec, spec_to_yaml, validate_spec
from hoptrace.dispatcher.workloads import resolve_workloads
from hoptrace.v1 import agent_pb2, trace_pb2

POD_UID = "0d5b2a53-6f0c-4e9e-9d38-1c2b3a4d5e6f"


def registrations_with_workloads() -> dict[str, agent_pb2.Register]:
    """host-a runs Docker containers ht-names-a (in /run/netns c1, adopted by inode) and a pod's two
    containers in a namespace with no /run/netns name; host-b runs no runtime."""
    registrations = example_registrations()
    host_a = registrations["host-a"]
    host_a.runtime.endpoint, host_a.runtime.version = "/var/run/docker.sock", "20.10.24"
    c1 = next(ns for ns in host_a.namespaces if ns.name == "c1")
    c1.workloads.add(container_id="a" * 64, container_name="ht-names-a", image="hoptrace/debian:bookworm")
    pod_ns = host_a.namespaces.add(name="/proc/4242/ns/net", inode=4026532999)
    pod_ns.devices.add(name="eth0", ifindex=3, mtu=1450, kind="veth")
    for name, image in (("k8s_POD_web-0", "pause:3.9"), ("k8s_app_web-0", "nginx:1.25")):
        pod_ns.workloads.add(
            container_id=name.encode().hex().ljust(64, "0"),
            container_name=name,
            image=image,
            pod_namespace="shop",
            pod_name="web-0",
            cgroup=f"/kubepods/burstable/pod{POD_UID}/x",
        )
    return registrations


SPEC = """\
name: names
filter: {protocol: udp, dst: 198.18.2.2}
hops:
  - {node: host-a, at: tc-egress, dev: eth0, netns: "container:ht-names-a"}
  - {name: a-wire-out, node: host-a, at: tc-egress, dev: wire0}
  - {node: host-a, at: tc-ingress, dev: eth0, netns: "pod:shop/web-0"}
"""


def test_container_and_pod_hops_resolve_to_their_namespaces_and_get_names() -> None:
    agents = registrations_with_workloads()
    spec = load_spec(SPEC, agents)
    assert validate_spec(spec, agents) == []
    resolved = resolve_workloads(spec, agents)
    first, _, third = resolved.hops
    assert (first.name, first.workload.container_name, first.workload.netns) == (
        "ht-names-a-eth0-out",
        "ht-names-a",
        "c1",
    )
    assert first.workload.image == "hoptrace/debian:bookworm"
    assert (third.name, third.workload.pod_namespace, third.workload.pod_name, third.workload.netns) == (
        "web-0-eth0-in",
        "shop",
        "web-0",
        "/proc/4242/ns/net",
    )
    # The plan attaches in the resolved namespace; what the user wrote stays in the spec.
    hops = build_plans(resolved, generation=1)["host-a"].hops
    assert [hop.netns for hop in hops] == ["c1", "", "/proc/4242/ns/net"]
    assert [hop.name for hop in hops] == ["ht-names-a-eth0-out", "a-wire-out", "web-0-eth0-in"]
    assert "netns: container:ht-names-a" in spec_to_yaml(resolved)


def test_a_container_is_found_by_its_id_prefix_and_a_users_workload_is_replaced() -> None:
    agents = registrations_with_workloads()
    spec = trace_pb2.TraceSpec(name="by-id", filter=trace_pb2.Filter(protocol="udp"))
    spec.hops.add(name="x", node="host-a", at="tc-egress", dev="eth0", netns="container:" + "a" * 12)
    spec.hops.add(name="y", node="host-a", at="tc-egress", dev="wire0")
    spec.hops[1].workload.netns = "/proc/1/ns/net"  # output only: dropped
    resolved = resolve_workloads(spec, agents)
    assert resolved.hops[0].workload.container_name == "ht-names-a"
    assert not resolved.hops[1].HasField("workload")


@pytest.mark.parametrize(
    ("netns", "node", "words"),
    [
        (
            "container:ht-names-zz",
            "host-a",
            "node host-a reported no container 'ht-names-zz'; containers there: "
            "ht-names-a, k8s_POD_web-0, k8s_app_web-0",
        ),
        ("pod:shop/web-9", "host-a", "node host-a reported no pod shop/web-9; pods there: shop/web-0"),
        (
            "container:ht-names-a",
            "host-b",
            "node host-b reported no container 'ht-names-a'; no containers known there: "
            "its agent found no container runtime",
        ),
        ("pod:shop", "host-a", "'pod:shop': pod:NAMESPACE/NAME takes a Kubernetes namespace and pod name"),
        ("container:", "host-a", "container:NAME takes a Docker container name or id"),
        ("container:a" * 1 + "/b", "host-a", "container:NAME takes a Docker container name or id"),
    ],
    ids=["unknown-container", "unknown-pod", "no-runtime", "pod-without-name", "empty", "slash"],
)
def test_bad_workload_names_name_the_field_and_what_is_known(netns: str, node: str, words: str) -> None:
    agents = registrations_with_workloads()
    spec = trace_pb2.TraceSpec(name="bad", filter=trace_pb2.Filter(protocol="udp"))
    spec.hops.add(name="h0", node=node, at="tc-egress", dev="eth0", netns=netns)
    errors = validate_spec(spec, agents)
    assert [error.field for error in errors] == ["hops[0].netns"], [str(e) for e in errors]
    assert words in errors[0].reason, errors[0].reason


def test_a_runtime_the_agent_could_not_ask_is_said() -> None:
    agents = registrations_with_workloads()
    agents["host-b"].runtime.endpoint = "/var/run/docker.sock"
    agents["host-b"].runtime.error = "permission denied on /var/run/docker.sock: run the agent as root"
    spec = trace_pb2.TraceSpec(name="bad", filter=trace_pb2.Filter(protocol="udp"))
    spec.hops.add(name="h0", node="host-b", at="tc-egress", dev="eth0", netns="container:web")
    (error,) = validate_spec(spec, agents)
    assert error.field == "hops[0].netns"
    assert "could not be asked (permission denied on /var/run/docker.sock" in error.reason


def test_an_unnamed_hop_without_a_workload_still_needs_a_name() -> None:
    agents = registrations_with_workloads()
    spec = trace_pb2.TraceSpec(name="bad", filter=trace_pb2.Filter(protocol="udp"))
    spec.hops.add(node="host-a", at="tc-egress", dev="eth0", netns="c1")
    assert [error.field for error in validate_spec(spec, agents)] == ["hops[0].name"]


def test_mace_takes_a_container_or_pod_and_sends_the_agent_its_namespace() -> None:
    agents = registrations_with_workloads()
    host_a = agents["host-a"]
    for container, netns in (("container:ht-names-a", "c1"), ("pod:shop/web-0", "/proc/4242/ns/net")):
        assert validate_preset_request("host-a", "mace", {"container": container}, host_a) == []
        assert agent_args("mace", {"container": container}, "host-a", host_a)["container"] == netns
    (error,) = validate_preset_request("host-a", "mace", {"container": "container:nope"}, host_a)
    assert error.field == "args.container"
    assert error.reason.startswith("node host-a reported no container 'nope'; containers there: ht-names-a")


def test_a_restarted_dispatcher_keeps_what_apply_resolved(tmp_path) -> None:
    """The state file keeps the user's spec and, beside it, the workloads apply resolved: the plans a
    restarted dispatcher pushes attach in the same namespaces."""
    from hoptrace.dispatcher.state import StateStore, StoredTrace, now

    agents = registrations_with_workloads()
    resolved = resolve_workloads(load_spec(SPEC, agents), agents)
    StateStore(tmp_path).save(StoredTrace(spec=resolved, generation=3, applied_at=now()))
    (loaded,) = StateStore(tmp_path).load()
    assert loaded.spec == resolved
    assert [hop.netns for hop in build_plans(loaded.spec, generation=3)["host-a"].hops] == [
        "c1",
        "",
        "/proc/4242/ns/net",
    ]
