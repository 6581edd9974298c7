"""A real one-node Kubernetes cluster (hoptrace.lab.kubernetes): a Deployment of the lab's echo image runs, a
ClusterIP Service selects its pod, and bytes sent from the node to the Service's ClusterIP come back exactly
(TCP and UDP), through the rules kube-proxy wrote. Then the cluster goes and leaves nothing behind.

Needs `make k8s-tools` (docs/kubernetes-lab.md); `make test-k8s` builds it and runs these.
"""

from __future__ import annotations

import ipaddress
import json
import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from hoptrace.lab.kubernetes import (
    ECHO_IMAGE,
    ECHO_PORT,
    KUBELET_SYSCTLS,
    NODE_NETNS,
    POD_SUBNET,
    SERVICE_RANGE,
    KubernetesLab,
)
from hoptrace.lab.waiting import wait_until

NAMESPACE = "hoptrace-echo"
LABELS = {"app": "echo"}


def echo_objects() -> list[dict[str, object]]:
    """A namespace, a one-replica Deployment of the echo image, a ClusterIP Service in front of it, and a
    client pod of the same image (whose --relay mode connects to the Service)."""
    ports = [
        {"name": f"{proto.lower()}-echo", "protocol": proto, "port": ECHO_PORT} for proto in ("TCP", "UDP")
    ]
    container = {
        "name": "echo",
        "image": ECHO_IMAGE,
        "imagePullPolicy": "Never",  # no registry is reachable: the lab imported it
        "args": [f"--port={ECHO_PORT}"],
        "ports": [{"containerPort": ECHO_PORT, "protocol": p["protocol"]} for p in ports],
        "readinessProbe": {"tcpSocket": {"port": ECHO_PORT}, "periodSeconds": 1},
    }
    return [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}},
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "echo", "namespace": NAMESPACE},
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": LABELS},
                "template": {"metadata": {"labels": LABELS}, "spec": {"containers": [container]}},
            },
        },
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "client", "namespace": NAMESPACE, "labels": {"app": "client"}},
            "spec": {"containers": [{**container, "name": "client"}]},
        },
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "echo", "namespace": NAMESPACE},
            "spec": {"type": "ClusterIP", "selector": LABELS, "ports": ports},
        },
    ]


@pytest.fixture(scope="module")
def cluster() -> Iterator[KubernetesLab]:
    """The cluster, up with its node Ready; removed after the module (stop() raises what it could not)."""
    lab = KubernetesLab().start()
    try:
        yield lab
    finally:
        lab.stop()


@pytest.fixture(scope="module")
def echo_service(cluster: KubernetesLab) -> dict[str, str]:
    """The echo Deployment rolled out and its Service's endpoint ready: the pod's and the Service's IPs."""
    namespace, *workloads = echo_objects()
    cluster.apply(namespace)
    # A bare pod is refused until the controller manager made its namespace's default service account.
    wait_until(
        lambda: cluster.kubectl_run(
            ["-n", NAMESPACE, "get", "serviceaccount", "default"], check=False
        ).returncode
        == 0,
        "the namespace's default service account",
        60,
    )
    cluster.apply(workloads)
    try:
        cluster.kubectl("-n", NAMESPACE, "rollout", "status", "deployment/echo", "--timeout=180s")
        cluster.kubectl("-n", NAMESPACE, "wait", "--for=condition=Ready", "pod/client", "--timeout=180s")
    except Exception as err:
        raise AssertionError(f"{err}\n{cluster.logs()}") from None

    def ready_endpoint() -> str:
        slices = json.loads(
            cluster.kubectl(
                "-n",
                NAMESPACE,
                "get",
                "endpointslices",
                "-l",
                "kubernetes.io/service-name=echo",
                "-o",
                "json",
            )
        )
        for item in slices["items"]:
            for endpoint in item.get("endpoints") or []:
                if endpoint.get("conditions", {}).get("ready"):
                    return str(endpoint["addresses"][0])
        return ""

    endpoint = wait_until(ready_endpoint, "the echo Service's ready endpoint", 60)
    pods = json.loads(cluster.kubectl("-n", NAMESPACE, "get", "pods", "-l", "app=echo", "-o", "json"))[
        "items"
    ]
    service = json.loads(cluster.kubectl("-n", NAMESPACE, "get", "service", "echo", "-o", "json"))
    client = json.loads(cluster.kubectl("-n", NAMESPACE, "get", "pod", "client", "-o", "json"))
    assert len(pods) == 1, [p["metadata"]["name"] for p in pods]
    # A ready endpoint is not yet a rule: kube-proxy rejects a Service's traffic until its next sync writes
    # the DNAT to the pod (both protocols, one iptables-restore).
    destination = f"--to-destination {endpoint}:{ECHO_PORT}"
    wait_until(
        lambda: cluster.node_iptables_nat().count(destination) == 2,
        "kube-proxy's DNAT rules to the echo pod",
        60,
    )
    return {
        "phase": pods[0]["status"]["phase"],
        "pod_ip": pods[0]["status"]["podIP"],
        "endpoint": endpoint,
        "cluster_ip": service["spec"]["clusterIP"],
        "node": pods[0]["spec"]["nodeName"],
        "client_ip": client["status"]["podIP"],
    }


def test_node_runs_every_component(cluster: KubernetesLab) -> None:
    """The node is Ready and reports the pinned version; the control plane's own objects exist."""
    node = json.loads(cluster.kubectl("get", "node", "-o", "json"))["items"]
    assert len(node) == 1
    assert node[0]["status"]["nodeInfo"]["kubeletVersion"] == cluster.version
    assert node[0]["status"]["nodeInfo"]["containerRuntimeVersion"].startswith("containerd://1.6")
    kubernetes = json.loads(cluster.kubectl("get", "service", "kubernetes", "-o", "json"))
    assert kubernetes["spec"]["clusterIP"] == str(ipaddress.ip_network(SERVICE_RANGE)[1])
    # kube-proxy's Service rules, in the node's namespace only.
    assert "KUBE-SERVICES" in cluster.node_iptables_nat()


def test_pod_runs_behind_cluster_ip(echo_service: dict[str, str]) -> None:
    """The echo pod is Running with an address of the pod subnet; the Service has a ClusterIP of the
    Service range and the pod as its one ready endpoint."""
    assert echo_service["phase"] == "Running"
    assert ipaddress.ip_address(echo_service["pod_ip"]) in ipaddress.ip_network(POD_SUBNET)
    assert ipaddress.ip_address(echo_service["cluster_ip"]) in ipaddress.ip_network(SERVICE_RANGE)
    assert echo_service["endpoint"] == echo_service["pod_ip"]


def test_tcp_through_cluster_ip_comes_back_byte_for_byte(
    cluster: KubernetesLab, echo_service: dict[str, str]
) -> None:
    """256 KiB of random bytes over one TCP connection to the ClusterIP come back identical."""
    sent = os.urandom(256 * 1024)
    with cluster.node_socket(socket.AF_INET, socket.SOCK_STREAM) as conn:
        conn.settimeout(20)
        conn.connect((echo_service["cluster_ip"], ECHO_PORT))
        conn.sendall(sent)
        conn.shutdown(socket.SHUT_WR)
        received = bytearray()
        while chunk := conn.recv(65536):
            received += chunk
    assert len(received) == len(sent)
    assert bytes(received) == sent


def test_udp_through_cluster_ip_comes_back_byte_for_byte(
    cluster: KubernetesLab, echo_service: dict[str, str]
) -> None:
    """200 datagrams of distinct random payloads to the ClusterIP: each comes back as it was sent."""
    with cluster.node_socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.settimeout(5)
        sock.connect((echo_service["cluster_ip"], ECHO_PORT))
        for i in range(200):
            payload = i.to_bytes(4, "big") + os.urandom(508)
            sock.send(payload)
            assert sock.recv(2048) == payload, f"datagram {i}"


def test_pod_to_cluster_ip_to_pod_comes_back_byte_for_byte(
    cluster: KubernetesLab, echo_service: dict[str, str]
) -> None:
    """A client pod's TCP connection to the ClusterIP carries 256 KiB to the echo pod and back identical:
    pod -> ClusterIP -> pod through kube-proxy's DNAT in the node's namespace (the bytes travel through
    `kubectl exec -i`, so the API server -> kubelet -> containerd stream path works too)."""
    assert ipaddress.ip_address(echo_service["client_ip"]) in ipaddress.ip_network(POD_SUBNET)
    assert echo_service["client_ip"] != echo_service["pod_ip"]
    sent = os.urandom(256 * 1024)
    relay = ["/echo", f"--relay={echo_service['cluster_ip']}:{ECHO_PORT}"]
    received = cluster.exec_in_pod(NAMESPACE, "client", relay, sent)
    assert len(received) == len(sent)
    assert received == sent


def test_stop_leaves_nothing(cluster: KubernetesLab, echo_service: dict[str, str]) -> None:
    """After stop(): no process, namespace, directory, mount, container cgroup or log link of the cluster
    is left, and the kernel settings the kubelet changed are back (the fixture's stop() has nothing to do)."""
    before_dir = cluster.dir
    assert before_dir is not None
    sysctls = cluster.sysctls_before()
    containers = cluster.ctr("containers", "list", "--quiet").split()
    assert len(containers) >= 4, containers  # the echo and client pods' sandboxes and containers
    cluster.stop()
    assert not Path(f"/run/netns/{NODE_NETNS}").exists()
    assert not before_dir.exists()
    assert str(before_dir) not in Path("/proc/self/mountinfo").read_text()
    left = [pid for pid in os.listdir("/proc") if pid.isdigit() and str(before_dir) in _cmdline(pid)]
    assert not left, left
    assert {k: Path("/proc/sys", k).read_text().strip() for k in KUBELET_SYSCTLS} == sysctls
    cgroups = [str(p) for p in Path("/sys/fs/cgroup").glob("*/*/*") if p.name in containers]
    assert not cgroups, cgroups
    logs = Path("/var/log/containers")
    assert not logs.is_dir() or not [p for p in logs.iterdir() if NAMESPACE in p.name]


def _cmdline(pid: str) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""
