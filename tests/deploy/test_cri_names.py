"""Pods by the names users know on a node without Docker: the real agent asks a real containerd (Debian's
1.6, its CRI v1 plugin, run privately by `hoptrace.lab.containerd`) through `--cri-socket`, reports each pod
sandbox and container in the network namespace containerd made for the pod, and a spec that says `netns:
pod:NAMESPACE/NAME` validates, attaches its tc hops in those namespaces and traces real packets between two
pods; an unknown pod is refused naming the pods the node has.

The pods (`hoptrace-shop/web-0` with container `app`, `hoptrace-shop/db-0`) sit on the lab's CNI bridge
`htcripy0` in 198.18.241.0/24 (no gateway, no route out); the traffic runs in their namespaces (nsenter: the
pause image has no Python). The Docker variant of this test is test_container_names.py, whose traffic
scripts and report wait this one uses."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator

import grpc
import pytest
from test_container_names import RECEIVER, SENDER, _wait_report

from hoptrace.lab.containerd import CriPod, PrivateContainerd
from hoptrace.lab.cri_agent import cri_cluster, pod_address, wait_pods
from hoptrace.lab.localcluster import LocalCluster
from hoptrace.lab.waiting import wait_until
from hoptrace.v1 import api_pb2, trace_pb2

pytestmark = pytest.mark.kernel  # the agent attaches tc hops in the pods' namespaces

NS = "hoptrace-shop"
WEB, DB = f"{NS}/web-0", f"{NS}/db-0"
NODE = "cri-node"
PORT = 11112
PACKETS = 200
SANDBOX_IMAGE = "localhost/hoptrace-pause:lab"  # crilab.Image


@pytest.fixture(scope="module")
def containerd() -> Iterator[PrivateContainerd]:
    """The private containerd with web-0 (container app) and db-0."""
    with PrivateContainerd(pods=[f"{WEB}/app", DB], bridge="htcripy0", subnet="198.18.241.0/24") as lab:
        yield lab


@pytest.fixture(scope="module")
def cluster(influxd, containerd) -> Iterator[LocalCluster]:
    """Dispatcher, collector and one agent in the root namespace asking only the CRI runtime."""
    with cri_cluster(influxd.url, NODE, containerd.socket) as cluster:
        yield cluster


def test_the_agent_names_each_pod_and_container_in_the_netns_containerd_made(cluster, containerd) -> None:
    registration = wait_pods(cluster, NODE, [WEB, DB])
    runtime = registration.runtime
    assert runtime.endpoint == containerd.socket and not runtime.error, runtime
    assert runtime.version.startswith("containerd 1."), runtime
    by_name = {w.container_name: (ns, w) for ns in registration.namespaces for w in ns.workloads}
    web, db = containerd.made[WEB], containerd.made[DB]
    expected = {
        f"k8s_POD_web-0_{NS}_{web.uid}_0": (web, web.id),
        "app": (web, web.containers["app"]),
        f"k8s_POD_db-0_{NS}_{db.uid}_0": (db, db.id),
    }
    for name, (pod, container_id) in expected.items():
        assert name in by_name, f"{name} not in the inventory: {sorted(by_name)}"
        namespace, workload = by_name[name]
        assert (workload.pod_namespace, workload.pod_name) == (pod.namespace, pod.name)
        assert workload.container_id == container_id
        assert workload.image == SANDBOX_IMAGE
        # the namespace containerd made for the pod (bind-mounted at /var/run/netns/cni-UUID): the agent
        # lists it by its /run/netns name
        assert namespace.inode == os.stat(pod.netns).st_ino
        assert namespace.name == workload.netns == os.path.basename(pod.netns)
        assert {d.name for d in namespace.devices} == {"lo", "eth0"}
    assert by_name["app"][0].inode != by_name[f"k8s_POD_db-0_{NS}_{db.uid}_0"][0].inode

    agents = json.loads(cluster.hoptrace("agents", "--json").stdout)
    (agent,) = [agent for agent in agents if agent["node"] == NODE]
    aliases = {alias for ns in agent["namespaces"] for alias in ns["aliases"]}
    assert {f"pod:{WEB}", f"pod:{DB}", "container:app"} <= aliases, aliases
    assert agent["container_runtime"]["endpoint"] == containerd.socket
    shown = cluster.hoptrace("agents", "--wide").stdout
    assert f"app[pod {WEB}]" in shown, shown


def _spec(name: str, sender: str, receiver: str, dst: str) -> trace_pb2.TraceSpec:
    spec = trace_pb2.TraceSpec(name=name, filter=trace_pb2.Filter(protocol="udp", dst=dst, dst_port=PORT))
    spec.hops.add(node=NODE, at="tc-egress", dev="eth0", netns=f"pod:{sender}")
    spec.hops.add(node=NODE, at="tc-ingress", dev="eth0", netns=f"pod:{receiver}")
    return spec


def _udp_between(sender: CriPod, receiver: CriPod, dst: str, packets: int) -> int:
    """Numbered datagrams from one pod's namespace to the other's; how many distinct ones arrived."""
    rx = subprocess.Popen(
        ["nsenter", f"--net={receiver.netns}", sys.executable, "-c", RECEIVER, str(PORT), str(packets)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert rx.stdout is not None and rx.stdout.readline().strip() == "ready"
        subprocess.run(
            ["nsenter", f"--net={sender.netns}", sys.executable, "-c", SENDER, dst, str(PORT), str(packets)],
            check=True,
            timeout=60,
        )
        out, _ = rx.communicate(timeout=30)
        return int(out.strip())
    finally:
        if rx.poll() is None:
            rx.kill()
            rx.wait()


def test_a_spec_naming_pods_attaches_in_their_namespaces_and_traces_packets(cluster, containerd) -> None:
    wait_pods(cluster, NODE, [WEB, DB])
    web, db = containerd.made[WEB], containerd.made[DB]
    dst = pod_address(db)
    assert dst.startswith("198.18.241."), dst
    spec = _spec("cri-pods-udp", WEB, DB, dst)
    errors = cluster.api().ValidateTrace(api_pb2.ValidateTraceRequest(spec=spec)).errors
    assert not errors, errors
    trace = cluster.apply(spec)
    hops = trace.spec.hops
    assert [hop.name for hop in hops] == ["web-0-eth0-out", "db-0-eth0-in"]
    assert [hop.workload.netns for hop in hops] == [os.path.basename(web.netns), os.path.basename(db.netns)]
    assert [hop.workload.pod_name for hop in hops] == ["web-0", "db-0"]

    def attached() -> list[api_pb2.HopStatus] | None:
        status = cluster.api().GetTrace(api_pb2.GetTraceRequest(name="cri-pods-udp"))
        statuses = [hop for node in status.nodes for hop in node.hops]
        return statuses if len(statuses) == 2 and all(hop.attached for hop in statuses) else None

    statuses = wait_until(attached, "both pod hops attached on the agent", timeout_s=20)
    assert [hop.error for hop in statuses] == ["", ""]

    assert _udp_between(web, db, dst, PACKETS) == PACKETS
    report = _wait_report(cluster, "cri-pods-udp", PACKETS)
    assert report["complete"] == PACKETS
    (segment,) = report["segments"]
    assert (segment["from"], segment["to"], segment["count"]) == ("web-0-eth0-out", "db-0-eth0-in", PACKETS)
    assert segment["p50_ns"] > 0
    cluster.api().DeleteTrace(api_pb2.DeleteTraceRequest(name="cri-pods-udp"))


def test_an_unknown_pod_is_refused_naming_the_pods_the_node_has(cluster, containerd) -> None:
    wait_pods(cluster, NODE, [WEB, DB])
    with pytest.raises(grpc.RpcError) as refused:
        cluster.apply(_spec("cri-pods-bad", WEB, f"{NS}/cache-0", "198.18.241.250"))
    details = refused.value.details()
    assert f"hops[1].netns: node {NODE} reported no pod {NS}/cache-0; pods there: {DB}, {WEB}" in details, (
        details
    )
