"""agent_view.py: one agent's dict, the same for `hoptrace agents --json` and the web's agents page."""

from __future__ import annotations

import json

import pytest

from hoptrace.results.agent_view import agent_data, clock_texts
from hoptrace.v1 import agent_pb2, api_pb2, trace_pb2

pytestmark = pytest.mark.unit


def test_an_agent_reads_as_one_json_ready_dict_with_its_namespaces_aliases() -> None:
    workload = trace_pb2.Workload(
        container_id="0123456789abcdef",
        container_name="web",
        image="nginx",
        pod_namespace="shop",
        pod_name="web-0",
    )
    device = agent_pb2.Device(name="eth0", ifindex=2, mtu=1500, kind="veth")
    namespace = agent_pb2.Namespace(name="c1", inode=4026532000, devices=[device], workloads=[workload])
    registration = agent_pb2.Register(node="host-a", kernel_release="6.18.0", agent_version="0.1.0")
    registration.namespaces.append(namespace)
    registration.capabilities.attach["fentry"].reason = "lockdown"
    agent = api_pb2.Agent(registration=registration, connected=True, lost_records=3)
    data = agent_data(agent)
    assert json.loads(json.dumps(data)) == data
    assert (data["node"], data["kernel_release"], data["connected"], data["lost_records"]) == (
        "host-a", "6.18.0", True, 3,
    )  # fmt: skip
    assert data["capabilities"]["attach"] == {"fentry": {"supported": False, "reason": "lockdown"}}
    (ns,) = data["namespaces"]
    assert (ns["name"], ns["inode"], ns["aliases"]) == ("c1", 4026532000, ["container:web", "pod:shop/web-0"])
    assert ns["devices"] == [{"name": "eth0", "ifindex": 2, "mtu": 1500, "kind": "veth"}]
    assert ns["workloads"][0]["container_name"] == "web"
    assert data["container_runtime"] == {"endpoint": "", "version": "", "error": ""}
    assert data["last_heartbeat"] == "-" and data["transport"] is None
    assert data["clock"]["measured"] is False and clock_texts(agent.clock)["offset"] == "unknown"
