"""Containers come and go after an agent registered: the dispatcher validates a spec against the node's
namespaces and devices as they are now, not as they were when the agent connected."""

from __future__ import annotations

import subprocess
import time

import grpc
import pytest
from system_helpers import running_cluster

from hoptrace.v1 import api_pb2, trace_pb2


def late_spec(netns: str) -> trace_pb2.TraceSpec:
    """Two hops on a device of a namespace made after the agents registered."""
    return trace_pb2.TraceSpec(
        name="late-netns",
        filter=trace_pb2.Filter(protocol="udp", dst="198.18.77.2"),
        hops=[
            trace_pb2.HopSpec(name="late-out", node="host-a", at="tc-egress", dev="late0", netns=netns),
            trace_pb2.HopSpec(name="late-in", node="host-a", at="tc-ingress", dev="late0", netns=netns),
        ],
    )


def test_a_namespace_made_after_the_agent_registered_can_be_traced(topology, influxd):
    late = f"{topology.prefix}-late"
    spec = late_spec(late)
    with running_cluster(topology, influxd.url) as cluster:
        with pytest.raises(grpc.RpcError) as refused:
            cluster.apply(spec)
        assert late in refused.value.details(), refused.value.details()

        subprocess.run(["ip", "netns", "add", late], check=True)
        try:
            veth = ["link", "add", "late0", "type", "veth", "peer", "name", "late1"]
            subprocess.run(["ip", "-n", late, *veth], check=True)
            subprocess.run(["ip", "-n", late, "link", "set", "late0", "up"], check=True)
            # The agent says what changed with its next heartbeat (every 2 s).
            deadline = time.monotonic() + 20
            while True:
                try:
                    trace = cluster.apply(spec)
                    break
                except grpc.RpcError as error:
                    if time.monotonic() > deadline:
                        raise AssertionError(f"still refused: {error.details()}") from None
                    time.sleep(0.5)
            assert trace.spec.name == "late-netns"
            agent = next(
                a
                for a in cluster.api().ListAgents(api_pb2.ListAgentsRequest()).agents
                if a.registration.node == "host-a"
            )
            devices = {(ns.name, dev.name) for ns in agent.registration.namespaces for dev in ns.devices}
            assert (late, "late0") in devices
        finally:
            subprocess.run(["ip", "netns", "del", late], check=False)
