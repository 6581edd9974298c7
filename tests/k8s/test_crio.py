"""Pods named through a real CRI-O: the agent asks CRI-O (`make crio`'s build, run privately by
`hoptrace.lab.crio`) through `--cri-socket`, and reports each pod and container by the names the kubelet gave
them, in the network namespace CRI-O's pinns pinned for the pod; a spec naming the pods attaches its tc hops
in those namespaces. CRI-O answers unlike containerd: its pods have no infra container (no pause process,
no pid; the sandbox's image only in its runtime spec's annotations).

The pods (`hoptrace-shop/web-0` with container `app`, `hoptrace-shop/db-0`) sit on the lab's CNI bridge
`htcriopy1` in 198.18.243.0/24 (no gateway, no route out). Needs `make crio`; `make test-k8s` builds it.
The containerd variant of this test is tests/deploy/test_cri_names.py.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator

import grpc
import pytest

from hoptrace.lab.cri_agent import cri_cluster, pod_address, wait_pods
from hoptrace.lab.crio import PrivateCrio, crio_version
from hoptrace.lab.localcluster import LocalCluster
from hoptrace.lab.waiting import wait_until
from hoptrace.v1 import api_pb2, trace_pb2

pytestmark = pytest.mark.kernel  # the agent attaches tc hops in the pods' namespaces

NS = "hoptrace-shop"
WEB, DB = f"{NS}/web-0", f"{NS}/db-0"
NODE = "crio-node"
SUBNET_PREFIX = "198.18.243."
SANDBOX_IMAGE = (
    "localhost/hoptrace-pause:lab"  # crilab.Image, written into CRI-O's storage by lab/crio/importimage
)


@pytest.fixture(scope="module")
def crio() -> Iterator[PrivateCrio]:
    """The private CRI-O with web-0 (container app) and db-0, in /tmp/hoptrace-crilab-* (short: conmon's
    attach sockets are named by paths under it)."""
    with PrivateCrio(pods=[f"{WEB}/app", DB], bridge="htcriopy1", subnet=f"{SUBNET_PREFIX}0/24") as lab:
        yield lab


@pytest.fixture(scope="module")
def cluster(influxd, crio) -> Iterator[LocalCluster]:
    """Dispatcher, collector and one agent in the root namespace asking only CRI-O."""
    with cri_cluster(influxd.url, NODE, crio.socket) as cluster:
        yield cluster


def test_the_agent_names_each_pod_and_container_in_the_netns_crio_pinned(cluster, crio) -> None:
    registration = wait_pods(cluster, NODE, [WEB, DB])
    runtime = registration.runtime
    assert runtime.endpoint == crio.socket and not runtime.error, runtime
    assert runtime.version == f"cri-o {crio_version().removeprefix('v')}", runtime
    web, db = crio.made[WEB], crio.made[DB]
    # pinns pins each pod's namespace under CRI-O's namespaces_dir (the lab's own directory here)
    for pod in (web, db):
        assert pod.netns.startswith(f"{crio.socket.rsplit('/', 1)[0]}/ns/netns/"), pod.netns
        assert pod_address(pod).startswith(SUBNET_PREFIX)
    by_name = {w.container_name: (ns, w) for ns in registration.namespaces for w in ns.workloads}
    expected = {
        f"k8s_POD_web-0_{NS}_{web.uid}_0": (web, web.id),
        "app": (web, web.containers["app"]),
        f"k8s_POD_db-0_{NS}_{db.uid}_0": (db, db.id),
    }
    assert set(by_name) == set(expected), sorted(by_name)
    for name, (pod, container_id) in expected.items():
        namespace, workload = by_name[name]
        assert (workload.pod_namespace, workload.pod_name) == (pod.namespace, pod.name)
        assert workload.container_id == container_id
        assert workload.image == SANDBOX_IMAGE
        # not a /run/netns entry: the agent lists the namespace by CRI-O's path
        assert namespace.inode == os.stat(pod.netns).st_ino
        assert namespace.name == workload.netns == pod.netns
        assert {d.name for d in namespace.devices} == {"lo", "eth0"}
    assert by_name["app"][0].inode != by_name[f"k8s_POD_db-0_{NS}_{db.uid}_0"][0].inode
    # the container's own cgroup, under the pod's (crilab: the kubelet's one parent per pod)
    assert by_name["app"][1].cgroup.endswith(f"/pod{web.uid}/crio-{web.containers['app']}"), by_name["app"][1]

    agents = json.loads(cluster.hoptrace("agents", "--json").stdout)
    (agent,) = [agent for agent in agents if agent["node"] == NODE]
    aliases = {alias for ns in agent["namespaces"] for alias in ns["aliases"]}
    assert {f"pod:{WEB}", f"pod:{DB}", "container:app"} <= aliases, aliases
    assert agent["container_runtime"]["endpoint"] == crio.socket


def _spec(name: str, sender: str, receiver: str) -> trace_pb2.TraceSpec:
    spec = trace_pb2.TraceSpec(
        name=name, filter=trace_pb2.Filter(protocol="udp", dst=f"{SUBNET_PREFIX}0/24", dst_port=11113)
    )
    spec.hops.add(node=NODE, at="tc-egress", dev="eth0", netns=f"pod:{sender}")
    spec.hops.add(node=NODE, at="tc-ingress", dev="eth0", netns=f"pod:{receiver}")
    return spec


def test_a_spec_naming_crio_pods_attaches_in_their_namespaces(cluster, crio) -> None:
    wait_pods(cluster, NODE, [WEB, DB])
    web, db = crio.made[WEB], crio.made[DB]
    trace = cluster.apply(_spec("crio-pods-udp", WEB, DB))
    try:
        hops = trace.spec.hops
        assert [hop.name for hop in hops] == ["web-0-eth0-out", "db-0-eth0-in"]
        assert [hop.workload.netns for hop in hops] == [web.netns, db.netns]
        assert [(hop.workload.pod_namespace, hop.workload.pod_name) for hop in hops] == [
            (NS, "web-0"),
            (NS, "db-0"),
        ]

        def attached() -> list[api_pb2.HopStatus] | None:
            status = cluster.api().GetTrace(api_pb2.GetTraceRequest(name="crio-pods-udp"))
            statuses = [hop for node in status.nodes for hop in node.hops]
            return statuses if len(statuses) == 2 and all(hop.attached for hop in statuses) else None

        statuses = wait_until(attached, "both pod hops attached on the agent", timeout_s=20)
        assert [hop.error for hop in statuses] == ["", ""]
    finally:
        cluster.api().DeleteTrace(api_pb2.DeleteTraceRequest(name="crio-pods-udp"))

    with pytest.raises(grpc.RpcError) as refused:
        cluster.apply(_spec("crio-pods-bad", WEB, f"{NS}/cache-0"))
    details = refused.value.details()
    assert f"hops[1].netns: node {NODE} reported no pod {NS}/cache-0; pods there: {DB}, {WEB}" in details, (
        details
    )
