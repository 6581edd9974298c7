"""hoptrace beside a private CRI runtime (containerd: `hoptrace.lab.containerd`, CRI-O: `hoptrace.lab.crio`):
a cluster whose one agent, in the root namespace, names workloads through that runtime's CRI socket alone, and
what the CRI tests ask of it."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

from hoptrace.lab.containerd import CriPod
from hoptrace.lab.localcluster import LocalCluster
from hoptrace.lab.waiting import wait_until
from hoptrace.v1 import agent_pb2, api_pb2


@contextmanager
def cri_cluster(influx_url: str, node: str, cri_socket: str) -> Iterator[LocalCluster]:
    """Dispatcher, collector and one agent (node `node`, the root namespace) asking only `cri_socket`."""
    with LocalCluster(influx_url=influx_url) as cluster:
        cluster.start_dispatcher()
        cluster.start_collector("--join-window", "1")
        cluster.wait_listening()
        cluster.start_agent(node, "", "--cri-socket", cri_socket, "--docker-socket", "")
        cluster.wait_agents([node])
        yield cluster


def registration(cluster: LocalCluster, node: str) -> agent_pb2.Register:
    """The node's latest registration, as the dispatcher holds it."""
    agents = cluster.api().ListAgents(api_pb2.ListAgentsRequest()).agents
    return next(agent for agent in agents if agent.registration.node == node).registration


def wait_pods(cluster: LocalCluster, node: str, pods: Iterable[str]) -> agent_pb2.Register:
    """The node's registration once it names every pod of `pods` ("NAMESPACE/NAME"), at registration or at
    a heartbeat."""
    wanted = set(pods)

    def named() -> agent_pb2.Register | None:
        found = registration(cluster, node)
        seen = {f"{w.pod_namespace}/{w.pod_name}" for ns in found.namespaces for w in ns.workloads}
        return found if wanted <= seen else None

    return wait_until(named, f"the agent's inventory naming {', '.join(sorted(wanted))}", timeout_s=20)


def pod_address(pod: CriPod) -> str:
    """The pod's IPv4 address on its eth0."""
    out = subprocess.run(
        ["nsenter", f"--net={pod.netns}", "ip", "-j", "-4", "addr", "show", "eth0"],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    ).stdout
    (link,) = json.loads(out)
    return link["addr_info"][0]["local"]
