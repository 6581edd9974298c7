"""`netns: container:NAME` and `netns: pod:NAMESPACE/NAME`: resolved against the node's inventory into the
typed `HopSpec.workload` (tests/dispatcher/test_dispatcher_plans.py: the plan attaches there); bad names get
the field and what is known there."""

from __future__ import annotations

import pytest
from spec_fixtures import WORKLOAD_SPEC, registrations_with_workloads

from hoptrace.spec import load_spec, spec_to_yaml, validate_spec
from hoptrace.spec.workloads import resolve_workloads
from hoptrace.v1 import trace_pb2


def test_container_and_pod_hops_resolve_to_their_namespaces_and_get_names() -> None:
    agents = registrations_with_workloads()
    spec = load_spec(WORKLOAD_SPEC, agents)
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
