"""hoptrace installed as Kubernetes users install it, on the lab's real cluster: the images the compose tier
builds (`docker save` into the node's containerd: no registry), the certificate Secrets, `helm install` of
deploy/helm/hoptrace with the cluster's admin kubeconfig and the node's containerd socket as the agent's CRI
socket. Every pod of the release becomes Ready; the namespace needs Pod Security "privileged" (the agent; the
dispatcher's BTF hostPath) and nothing more (the others pass "restricted"); `hoptrace agents`, through the
dispatcher's ClusterIP from the node, shows the node and its pods by name; a UDP flow from a client pod to a
server pod, traced by a spec that names the pods (`netns: pod:NS/NAME`), is reported datagram for datagram
(the client's own count of what it sent), and so are a UDP flow and a TCP connection to a ClusterIP Service
through kube-proxy's DNAT (every datagram or segment nftables counted leaving the client pod);
`hoptrace discover` of the UDP one finds the pods' eth0 and the node's veth ends between them, through the
DNAT, and its spec traces every datagram; `helm uninstall` takes the agent's hooks out of the pods and
leaves nothing of it pinned in bpffs.

There is no cluster DNS in the lab: the release's Services get fixed ClusterIPs of the Service range's static
band, the components reach each other there, and the dispatcher's and collector's certificates name them.

Needs `make k8s-tools`, `make helm` and the Docker engine with the compose tier's images (`make
compose-images`); `make test-k8s` builds them all.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import secrets
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from hoptrace.common.certs import create_bundle
from hoptrace.common.grpcutil import CA_ENV, CERT_ENV, DISPATCHER_ENV, KEY_ENV, TOKEN_FILE_ENV
from hoptrace.lab.compose import IMAGES, DockerEngine, bpf_ids_alive, bpf_ids_held_by, build_images
from hoptrace.lab.kubernetes import BPFFS, ECHO_IMAGE, ECHO_PORT, NODE_NAME, KubernetesLab, node_pins
from hoptrace.lab.waiting import WaitTimeout, wait_until

pytestmark = pytest.mark.kernel  # the release's agent loads and attaches BPF on this kernel

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "deploy" / "helm" / "hoptrace"
NAMESPACE = "hoptrace"
APPS = "hoptrace-shop"  # the traced pods' namespace
# Fixed ClusterIPs in the static band of the lab's Service range (198.19.128.0/20): no cluster DNS here.
ADDRESSES = {
    "dispatcher": "198.19.128.10",
    "collector": "198.19.128.11",
    "influxdb": "198.19.128.12",
    "web": "198.19.128.13",
}
COMPONENTS = ("agent", "dispatcher", "collector", "influxdb", "web")
DATAGRAMS = 400
TRACE = "pod-to-pod"


@dataclass
class Release:
    """The lab cluster with hoptrace installed by helm, and what a client of its dispatcher needs."""

    cluster: KubernetesLab
    certs: Path
    timings: dict[str, float] = field(default_factory=dict)

    def hoptrace(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """The `hoptrace` CLI in the node's namespace, against the dispatcher's ClusterIP, as the admin."""
        env = {key: value for key, value in os.environ.items() if not key.startswith("HOPTRACE_")}
        env.update(
            {
                DISPATCHER_ENV: f"{ADDRESSES['dispatcher']}:7070",
                CA_ENV: str(self.certs / "ca.pem"),
                CERT_ENV: str(self.certs / "admin.pem"),
                KEY_ENV: str(self.certs / "admin.key"),
                TOKEN_FILE_ENV: str(self.certs / "admin.token"),
            }
        )
        result = self.cluster.run_on_node([sys.executable, "-m", "hoptrace.cli.main", *args], env=env)
        if check:
            assert result.returncode == 0, f"hoptrace {' '.join(args)}: {result.stderr}"
        return result

    def pods(self, namespace: str = NAMESPACE) -> list[dict[str, Any]]:
        """The namespace's pods as the API has them."""
        return json.loads(self.cluster.kubectl("-n", namespace, "get", "pods", "-o", "json"))["items"]


def lab_values(cri_socket: str) -> dict[str, Any]:
    """The chart's values on the lab: the compose tier's local images, never pulled; the node's containerd
    (`cri_socket`) as the agent's CRI socket; fixed ClusterIPs as the components' addresses; InfluxDB 1.8
    (the local image, no setup, its data path and user); no persistent volumes (the lab has no storage
    provisioner)."""

    def image(name: str) -> dict[str, str]:
        return {"repository": f"hoptrace/{name}", "tag": "local"}

    return {
        "images": {
            "agent": image("agent"),
            "python": image("python"),
            "dispatcher": image("dispatcher"),
            "influxdb": image("influxd"),
            "pullPolicy": "Never",
        },
        "secrets": {"agentCerts": "hoptrace-agent-certs"},
        "agent": {"criSocket": cri_socket},
        "dispatcher": {
            "host": ADDRESSES["dispatcher"],
            "service": {"clusterIP": ADDRESSES["dispatcher"]},
            "persistence": {"enabled": False},
        },
        "collector": {"host": ADDRESSES["collector"], "service": {"clusterIP": ADDRESSES["collector"]}},
        "web": {"service": {"clusterIP": ADDRESSES["web"]}},
        "influxdb": {
            "url": f"http://{ADDRESSES['influxdb']}:8086",
            "service": {"clusterIP": ADDRESSES["influxdb"]},
            "setup": False,
            "dataPath": "/var/lib/influxdb",
            "runAsUser": 10001,
            "persistence": {"enabled": False},
        },
    }


def create_secrets(cluster: KubernetesLab, certs: Path) -> None:
    """The namespace (Pod Security "privileged") and the Secrets the chart mounts: the control plane's
    certificates and tokens, the agents' apart (neither holds the CA's key), InfluxDB's, the web UI's."""
    from werkzeug.security import generate_password_hash

    create_bundle(certs, hosts=[ADDRESSES["dispatcher"], ADDRESSES["collector"]], agents=[NODE_NAME])
    (certs / "web-users").write_text(f"admin:{generate_password_hash(secrets.token_urlsafe(12))}\n")
    (certs / "web-secret-key").write_text(secrets.token_hex(32))
    cluster.apply(
        {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {"name": NAMESPACE, "labels": {"pod-security.kubernetes.io/enforce": "privileged"}},
        }
    )
    control = [
        "ca.pem",
        *(f"{name}.{kind}" for name in ("dispatcher", "collector", "web") for kind in ("pem", "key")),
        "tokens",
        "collector.token",
        "web.token",
    ]
    agent = ["ca.pem", f"agent-{NODE_NAME}.pem", f"agent-{NODE_NAME}.key"]
    for name, files in (("hoptrace-certs", control), ("hoptrace-agent-certs", agent)):
        cluster.kubectl(
            "-n", NAMESPACE, "create", "secret", "generic", name, *(f"--from-file={certs / f}" for f in files)
        )
    cluster.kubectl(
        *("-n", NAMESPACE, "create", "secret", "generic", "hoptrace-influxdb"),
        f"--from-literal=token={secrets.token_hex(16)}",
        f"--from-literal=admin-password={secrets.token_hex(16)}",
    )
    cluster.kubectl(
        *("-n", NAMESPACE, "create", "secret", "generic", "hoptrace-web"),
        f"--from-file=users={certs / 'web-users'}",
        f"--from-file=secret-key={certs / 'web-secret-key'}",
    )


@pytest.fixture(scope="module")
def release(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Release]:
    """The cluster up, hoptrace's images in its containerd, the Secrets, `helm install`, every pod Ready;
    the cluster removed afterwards (stop() raises what it could not remove)."""
    started = time.monotonic()
    work = tmp_path_factory.mktemp("helm")
    engine = DockerEngine().ensure()
    cluster = KubernetesLab(docker_images=IMAGES)
    run = Release(cluster, work / "certs")
    try:
        try:
            run.timings["images (build or cache)"] = build_images()
            step = time.monotonic()
            cluster.start()
            run.timings["cluster start, images into containerd"] = time.monotonic() - step
            run.timings["of which the images"] = cluster.timings["docker images"]
        finally:
            engine.stop()
        create_secrets(cluster, run.certs)
        values = work / "values.yaml"
        values.write_text(yaml.safe_dump(lab_values(cluster.cri_socket)))
        step = time.monotonic()
        cluster.helm(
            *("install", "hoptrace", str(CHART), "-n", NAMESPACE, "-f", str(values)),
            *("--wait", "--timeout", "120s"),
        )
        # helm's --wait counts a DaemonSet of one node with maxUnavailable 1 as ready with none: every pod.
        cluster.kubectl("-n", NAMESPACE, "wait", "--for=condition=Ready", "pods", "--all", "--timeout=120s")
        run.timings["helm install, every pod Ready"] = time.monotonic() - step
        yield run
    except Exception as error:
        raise AssertionError(f"{error}\n{release_state(cluster)}\n{cluster.logs()}") from None
    finally:
        step = time.monotonic()
        cluster.stop()
        run.timings["cluster stop"] = time.monotonic() - step
        run.timings["whole module"] = time.monotonic() - started
        print("\nk8s helm timings: " + ", ".join(f"{k} {v:.1f} s" for k, v in run.timings.items()))


def release_state(cluster: KubernetesLab) -> str:
    """The release's pods and the namespace's events, for a failed setup's message."""
    if cluster.dir is None:
        return ""
    pods = cluster.kubectl_run(["get", "pods", "-A", "-o", "wide"], check=False)
    events = cluster.kubectl_run(["-n", NAMESPACE, "get", "events", "--sort-by=.lastTimestamp"], check=False)
    return f"--- pods ---\n{pods.stdout}{pods.stderr}--- events ---\n{events.stdout[-4000:]}{events.stderr}"


def test_every_pod_of_the_release_is_ready_with_the_local_images(release: Release) -> None:
    pods = {pod["metadata"]["labels"]["app.kubernetes.io/component"]: pod for pod in release.pods()}
    assert set(pods) == set(COMPONENTS), sorted(pods)
    for component, pod in pods.items():
        ready = {c["type"]: c["status"] for c in pod["status"]["conditions"]}["Ready"]
        assert ready == "True", component
        (status,) = pod["status"]["containerStatuses"]
        assert status["ready"] and status["restartCount"] == 0, (component, status)
        assert status["image"].startswith("docker.io/hoptrace/") and status["image"].endswith(":local")
    agent = pods["agent"]["spec"]
    assert agent["hostNetwork"] and agent["hostPID"] and agent["nodeName"] == NODE_NAME
    assert agent["containers"][0]["securityContext"]["privileged"] is False
    assert f"--cri-socket={release.cluster.cri_socket}" in agent["containers"][0]["args"]
    services = json.loads(release.cluster.kubectl("-n", NAMESPACE, "get", "services", "-o", "json"))["items"]
    assert {
        s["metadata"]["name"].removeprefix("hoptrace-"): s["spec"]["clusterIP"] for s in services
    } == ADDRESSES


def test_the_namespace_needs_privileged_and_only_the_agent_and_dispatcher_need_it(release: Release) -> None:
    """The API server's own PodSecurity check (a server-side dry run of the namespace's label): under
    "baseline" and "restricted" only the agent (host namespaces, capabilities, hostPath) and the
    dispatcher (its read-only BTF hostPath) would be refused; the collector, InfluxDB and the web UI pass
    "restricted"."""
    pods = {
        pod["metadata"]["name"]: pod["metadata"]["labels"]["app.kubernetes.io/component"]
        for pod in release.pods()
    }
    for level in ("baseline", "restricted"):
        result = release.cluster.kubectl_run(
            [
                *("label", "--dry-run=server", "--overwrite", "namespace", NAMESPACE),
                f"pod-security.kubernetes.io/enforce={level}",
            ]
        )
        assert f'violate the new PodSecurity enforce level "{level}:latest"' in result.stderr, result.stderr
        violations = dict(re.findall(r"^Warning: (\S+): (.+)$", result.stderr, re.M))
        refused = {pods[name] for name in violations if name in pods}
        assert refused == {"agent", "dispatcher"}, (level, violations)
        dispatcher = next(v for name, v in violations.items() if pods.get(name) == "dispatcher")
        assert "hostPath volumes" in dispatcher or "restricted volume types" in dispatcher, dispatcher


def agent_json(release: Release) -> dict[str, Any]:
    """The node's agent as `hoptrace agents --json` shows it."""
    agents = json.loads(release.hoptrace("agents", "--json").stdout)
    (agent,) = [a for a in agents if a["node"] == NODE_NAME]
    return agent


def test_hoptrace_agents_shows_the_node_and_its_pods_by_name(release: Release) -> None:
    """Through the dispatcher's ClusterIP: the node's agent is connected, streams to the collector, names
    the pods through the node's containerd (the release's own among them)."""

    def connected() -> dict[str, Any] | None:
        agent = agent_json(release)
        pods = {alias for ns in agent["namespaces"] for alias in ns["aliases"] if alias.startswith("pod:")}
        # the transport is null until the agent's first status after it connected
        transport = agent["transport"] or {}
        ready = agent["connected"] and transport.get("state") == "up" and len(pods) >= len(COMPONENTS)
        return agent if ready else None

    agent = wait_until(connected, f"the agent of {NODE_NAME} connected, naming the release's pods", 60)
    runtime = agent["container_runtime"]
    assert runtime["endpoint"] == release.cluster.cri_socket and not runtime["error"], runtime
    assert runtime["version"].startswith("containerd 1.6"), runtime
    assert agent["transport"]["destination"] == f"{ADDRESSES['collector']}:7071"
    aliases = {alias for ns in agent["namespaces"] for alias in ns["aliases"]}
    names = [pod["metadata"]["name"] for pod in release.pods()]
    # the hostNetwork agent is in the node's namespace; every other pod in one of its own
    assert {f"pod:{NAMESPACE}/{name}" for name in names if "-agent-" not in name} <= aliases, aliases
    shown = release.hoptrace("agents", "--wide").stdout
    assert re.search(rf"^{NODE_NAME}\s+yes\b", shown, re.M), shown
    for name in names:
        assert f"[pod {NAMESPACE}/{name}]" in shown, (name, shown)


# ---- traced flows between pods ---------------------------------------------------------------------------


@dataclass
class Shop:
    """Two pods of the echo image: `client` sends, `server` echoes; their addresses."""

    client_ip: str
    server_ip: str


@pytest.fixture(scope="module")
def shop(release: Release) -> Shop:
    """The client and server pods Ready in their own namespace."""
    cluster = release.cluster
    cluster.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": APPS}})
    # A bare pod is refused until the controller manager made its namespace's default service account.
    wait_until(
        lambda: cluster.kubectl_run(["-n", APPS, "get", "serviceaccount", "default"], check=False).returncode
        == 0,
        "the namespace's default service account",
        60,
    )

    def pod(name: str) -> dict[str, Any]:
        container = {
            "name": "echo",
            "image": ECHO_IMAGE,
            "imagePullPolicy": "Never",
            "args": [f"--port={ECHO_PORT}"],
            "readinessProbe": {"tcpSocket": {"port": ECHO_PORT}, "periodSeconds": 1},
        }
        metadata = {"name": name, "namespace": APPS, "labels": {"app": name}}
        return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": {"containers": [container]}}

    cluster.apply([pod("client"), pod("server")])
    cluster.kubectl("-n", APPS, "wait", "--for=condition=Ready", "pod/client", "pod/server", "--timeout=120s")
    ips = {p["metadata"]["name"]: p["status"]["podIP"] for p in release.pods(APPS)}

    def named() -> bool:  # the agent's inventory comes with its heartbeats (2 s)
        aliases = {alias for ns in agent_json(release)["namespaces"] for alias in ns["aliases"]}
        return {f"pod:{APPS}/client", f"pod:{APPS}/server"} <= aliases

    wait_until(named, "the agent naming the client and server pods", 30, 0.5)
    return Shop(client_ip=ips["client"], server_ip=ips["server"])


def send_udp(release: Release, destination: str, count: int, gap: str = "1ms") -> int:
    """`count` datagrams from the client pod to `destination` (HOST:PORT), `gap` apart; the number the
    client sent."""
    out = release.cluster.kubectl(
        *("-n", APPS, "exec", "client", "--", "/echo"),
        *(f"--udp-send={destination}", f"--count={count}", f"--gap={gap}"),
    )
    result = json.loads(out)
    assert result["echoed"] == result["sent"], result  # the server answered each: the path is whole
    return int(result["sent"])


def wait_report(release: Release, trace: str, packets: int, timeout_s: float = 60.0) -> dict[str, Any]:
    """`hoptrace report --json` once every segment counts `packets` (join window, per-second windows,
    InfluxDB export); the last report seen when the time is up."""
    report: dict[str, Any] = {}

    def counted() -> dict[str, Any] | None:
        nonlocal report
        result = release.hoptrace("report", trace, "--since", "30m", "--json", check=False)
        report = json.loads(result.stdout) if result.returncode == 0 else {}
        counts = [s.get("count", 0) for s in [*report.get("segments", []), report.get("end_to_end", {})]]
        return report if report.get("complete", 0) >= packets and min(counts) >= packets else None

    try:
        return wait_until(counted, f"the report of {trace} counting {packets} packets", timeout_s, 1.0)
    except WaitTimeout:
        return report  # the test says what it lacks


def pod_spec(name: str, destination: str, sender: str, receiver: str) -> dict[str, Any]:
    """A spec of the UDP flow to `destination` from pod `sender`'s eth0 to pod `receiver`'s, both named."""
    return {
        "name": name,
        "filter": {"protocol": "udp", "dst": destination, "dst_port": ECHO_PORT},
        "sample": 1,
        "hops": [
            {"node": NODE_NAME, "at": "tc-egress", "dev": "eth0", "netns": f"pod:{APPS}/{sender}"},
            {"node": NODE_NAME, "at": "tc-ingress", "dev": "eth0", "netns": f"pod:{APPS}/{receiver}"},
        ],
    }


def test_pod_to_pod_udp_is_traced_datagram_for_datagram(release: Release, shop: Shop, tmp_path: Path) -> None:
    """`hoptrace trace apply` of a spec naming the two pods; the client sends; `hoptrace report` counts
    exactly what the client sent in the one segment, under hop names and pods the user knows."""
    spec = tmp_path / "pod-to-pod.yaml"
    spec.write_text(yaml.safe_dump(pod_spec(TRACE, shop.server_ip, "client", "server")))
    release.hoptrace("trace", "apply", "-f", str(spec))

    def active() -> bool:
        listed = release.hoptrace("trace", "ls").stdout
        return bool(re.search(rf"^{TRACE}\s.*1/1 nodes active", listed, re.M))

    wait_until(active, f"{TRACE} active on the node", 30)
    started = time.monotonic()
    sent = send_udp(release, f"{shop.server_ip}:{ECHO_PORT}", DATAGRAMS)
    assert sent == DATAGRAMS
    report = wait_report(release, TRACE, sent)
    release.timings["pod -> pod: send to full report"] = time.monotonic() - started
    assert report.get("complete") == sent, report
    (segment,) = report["segments"]
    assert (segment["from"], segment["to"], segment["count"]) == ("client-eth0-out", "server-eth0-in", sent)
    assert report["end_to_end"]["count"] == sent and 0 < segment["p50_ns"] < 10_000_000, segment
    shown = release.hoptrace("report", TRACE, "--since", "30m").stdout
    assert f"trace {TRACE}: {sent} packets, {sent} complete" in shown, shown
    for pod in ("client", "server"):
        assert re.search(rf"^{pod}-eth0-(out|in)\s.*pod {APPS}/{pod}\b", shown, re.M), shown
    # The agent's clock rounds reach the collector's time service (UDP) through its ClusterIP: the
    # collector's estimate of the node's clock is in the store.
    wait_until(lambda: agent_json(release)["clock"]["measured"], "the node's clock measured", 30, 1.0)


# ---- pod -> ClusterIP Service -> pod, through kube-proxy's DNAT ------------------------------------------
SERVICE_PORT = 8080  # the Service's port; kube-proxy translates it to the server pod's ECHO_PORT
SERVICE_TRACE = "pod-to-service"


@dataclass(frozen=True)
class Service:
    """The server pod behind a ClusterIP Service: its address and port, as the client sends to them."""

    cluster_ip: str
    port: int

    @property
    def destination(self) -> str:
        return f"{self.cluster_ip}:{self.port}"


@pytest.fixture(scope="module")
def service(release: Release, shop: Shop) -> Service:
    """A ClusterIP Service of the server pod (UDP and TCP SERVICE_PORT -> ECHO_PORT), once kube-proxy
    translates it: a datagram and a TCP message from the client come back."""
    cluster = release.cluster
    ports = [
        {"name": protocol.lower(), "protocol": protocol, "port": SERVICE_PORT, "targetPort": ECHO_PORT}
        for protocol in ("UDP", "TCP")
    ]
    metadata = {"name": "server", "namespace": APPS}
    cluster.apply(
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": metadata,
            "spec": {"selector": {"app": "server"}, "ports": ports},
        }
    )
    data = json.loads(cluster.kubectl("-n", APPS, "get", "service", "server", "-o", "json"))
    found = Service(data["spec"]["clusterIP"], SERVICE_PORT)

    def translated() -> bool:  # kube-proxy has written the Service's rules: both come back
        for send, echoed in (("--udp-send", 1), ("--tcp-send", 64)):
            result = cluster.kubectl_run(
                ["-n", APPS, "exec", "client", "--", "/echo", f"{send}={found.destination}", "--count=1"],
                check=False,
            )
            if result.returncode != 0 or json.loads(result.stdout)["echoed"] != echoed:
                return False
        return True

    wait_until(translated, f"kube-proxy translating {found.destination}", 60, 1.0)
    return found


MESSAGES = 100  # TCP writes to the Service, each its own segment


def send_tcp(release: Release, destination: str, count: int, size: int = 100, gap: str = "5ms") -> int:
    """`count` writes of `size` bytes over one TCP connection from the client pod to `destination`
    (HOST:PORT), `gap` apart; the number of writes. The server echoed every byte: the path is whole."""
    out = release.cluster.kubectl(
        *("-n", APPS, "exec", "client", "--", "/echo"),
        *(f"--tcp-send={destination}", f"--count={count}", f"--size={size}", f"--gap={gap}"),
    )
    result = json.loads(out)
    assert result["echoed"] == result["bytes"] == count * size, result
    return int(result["writes"])


def pod_netns(pod_ip: str) -> str:
    """The name of the pod namespace (containerd's /run/netns/cni-*) whose eth0 holds `pod_ip`."""
    for netns in sorted(Path("/run/netns").glob("cni-*")):
        ip = ["ip", "-n", netns.name, "-j"]
        addrs = json.loads(subprocess.run([*ip, "addr", "show", "eth0"], capture_output=True).stdout or "[]")
        if any(a.get("local") == pod_ip for link in addrs for a in link.get("addr_info", [])):
            return netns.name
    raise AssertionError(f"no pod namespace holds {pod_ip}")


COUNTER_TABLE = "hoptrace-test-count"


@contextmanager
def counted_to(netns: str, protocol: str, service: Service) -> Iterator[Callable[[], int]]:
    """An nftables counter in `netns` (the client pod's) of every packet of `protocol` it sends to the
    Service's address and port, before kube-proxy's DNAT on the node rewrites them (TCP: SYN, data, ACKs
    and FIN alike, as the tagger tags them all); yields a reader of its count; the table goes afterwards."""
    nft = ["ip", "netns", "exec", netns, "nft"]
    rule = f"ip daddr {service.cluster_ip} {protocol} dport {service.port} counter"
    chain = f"chain out {{\n type filter hook output priority 0; {rule}\n }}"
    added = subprocess.run(
        [*nft, "-f", "-"],
        input=f"table ip {COUNTER_TABLE} {{\n {chain}\n}}\n",
        text=True,
        capture_output=True,
    )
    assert added.returncode == 0, added.stderr

    def packets() -> int:
        listing = subprocess.run(
            [*nft, "-j", "list", "table", "ip", COUNTER_TABLE], capture_output=True, text=True, check=True
        ).stdout
        (counter,) = [
            i["rule"]["expr"][-1]["counter"] for i in json.loads(listing)["nftables"] if "rule" in i
        ]
        return int(counter["packets"])

    try:
        yield packets
    finally:
        subprocess.run([*nft, "delete", "table", "ip", COUNTER_TABLE], check=True, capture_output=True)


@pytest.mark.parametrize("protocol", ["udp", "tcp"])
def test_pod_to_cluster_ip_is_traced_through_kube_proxys_dnat(
    release: Release, shop: Shop, service: Service, protocol: str, tmp_path: Path
) -> None:
    """A spec whose filter names a ClusterIP and the Service's port, as the client sends them: kube-proxy's
    DNAT rewrites both to the server pod's address and port on the node, and the server's hop still takes
    every packet, by its ID (its record flagged FOLLOWED). UDP: the datagrams, tagged at the client's hop;
    TCP: every segment of the connection client -> server (SYN, data, ACKs, FIN), tagged by sock_ops for
    the client pod's namespace. The report counts exactly what nftables counted leaving the client pod for
    the ClusterIP (for UDP also what the client sent), and names the DNAT between the two hops."""
    trace = SERVICE_TRACE if protocol == "udp" else f"{SERVICE_TRACE}-tcp"
    cluster_ip, destination = service.cluster_ip, service.destination
    spec = pod_spec(trace, cluster_ip, "client", "server")
    spec["filter"].update(protocol=protocol, dst_port=SERVICE_PORT)
    spec["hops"] = [
        dict(hop, name=name) for hop, name in zip(spec["hops"], ("client-out", "server-in"), strict=True)
    ]
    spec_file = tmp_path / f"{trace}.yaml"
    spec_file.write_text(yaml.safe_dump(spec))
    release.hoptrace("trace", "apply", "-f", str(spec_file))
    wait_until(
        lambda: re.search(rf"^{trace}\s.*1/1 nodes active", release.hoptrace("trace", "ls").stdout, re.M),
        f"{trace} active on the node",
        30,
    )
    started = time.monotonic()
    with counted_to(pod_netns(shop.client_ip), protocol, service) as packets:
        if protocol == "udp":
            assert send_udp(release, destination, DATAGRAMS) == DATAGRAMS == packets()
        else:
            assert send_tcp(release, destination, MESSAGES) == MESSAGES
        sent = packets()
    # TCP: at least the SYN and the handshake's ACK, a segment per write, the FIN and the server's FIN's ACK
    assert sent >= (DATAGRAMS if protocol == "udp" else MESSAGES + 4), sent
    report = wait_report(release, trace, sent)
    release.timings[f"pod -> Service ({protocol}, {sent} packets): send to full report"] = (
        time.monotonic() - started
    )
    assert report.get("complete") == report.get("packets") == sent, report
    (segment,) = report["segments"]
    assert (segment["from"], segment["to"], segment["count"]) == ("client-out", "server-in", sent), segment
    assert segment["loss_count"] == segment["incomplete"] == 0, segment
    # The report names the translation: the packets whose ID is 1 modulo 64 describe their addresses at both
    # hops, the ClusterIP and Service port at the client's, the server pod's at the server's.
    described = (sent + 63) // 64
    dnat = {
        "from": "client-out",
        "to": "server-in",
        "kind": "dnat",
        "before": destination,
        "after": f"{shop.server_ip}:{ECHO_PORT}",
        "packets": described,
    }

    def translation_reported() -> bool:
        data = json.loads(release.hoptrace("report", trace, "--since", "30m", "--json").stdout)
        return data["translations"] == [dnat]

    wait_until(translation_reported, f"the report naming kube-proxy's DNAT of {described} packets", 30)
    if protocol == "tcp":  # the discovery that follows traces UDP beside pod-to-service alone
        release.hoptrace("trace", "rm", trace)


DISCOVERED_TRACE = "discovered-service"


def host_veth(release: Release, pod_ip: str) -> str:
    """The node's end of the veth pair whose pod end (eth0) holds `pod_ip`, as the kernel has it: the pod's
    namespace (containerd's /run/netns/cni-*) found by its address, its eth0's peer ifindex in the node's."""
    show = ["ip", "-n", pod_netns(pod_ip), "-j", "link", "show", "eth0"]
    (eth0,) = json.loads(subprocess.run(show, capture_output=True, check=True).stdout)
    links = json.loads(release.cluster.run_on_node(["ip", "-j", "link", "show"]).stdout)
    (peer,) = [link["ifname"] for link in links if link["ifindex"] == eth0["link_index"]]
    return peer


def test_discover_finds_the_pods_through_the_service_and_its_path_traces_every_datagram(
    release: Release, shop: Shop, service: Service, tmp_path: Path
) -> None:
    """`hoptrace discover` of client -> ClusterIP:port while the client sends, with pod-to-service (a trace
    of the same flow, whose tagger runs first) still applied: the path goes on after kube-proxy's DNAT by
    the packets' IDs, to the server pod's eth0: the client pod's eth0, the node's veth ends of the client
    and of the server (br_netfilter DNATs the frame on the bridge port and bridges it on: no crossing of
    the bridge itself), the server pod's eth0, the DNAT in the step between the veths. The discovered spec
    then replaces pod-to-service and its report counts every datagram the client sent, at every hop."""
    node = f"{NODE_NAME}-"
    client_veth, server_veth = host_veth(release, shop.client_ip), host_veth(release, shop.server_ip)
    expected = [
        (f"{node}client-eth0-out", f"pod:{APPS}/client", "eth0", "tc-egress"),
        (f"{node}{client_veth}-in", "", client_veth, "tc-ingress"),
        (f"{node}{server_veth}-out", "", server_veth, "tc-egress"),
        (f"{node}server-eth0-in", f"pod:{APPS}/server", "eth0", "tc-ingress"),
    ]
    started = time.monotonic()
    sending = threading.Thread(target=send_udp, args=(release, service.destination, 4000), daemon=True)
    sending.start()
    try:
        result = release.hoptrace(
            *("discover", "--protocol", "udp", "--src", shop.client_ip, "--dst", service.cluster_ip),
            *("--dst-port", str(service.port), "--duration", "3s", "--packets", "100", "--json"),
        )
    finally:
        sending.join(60)
    release.timings["discover through the Service"] = time.monotonic() - started
    data = json.loads(result.stdout)
    assert data["packets"] >= 100, data
    [path] = data["paths"]
    assert path["share"] == 1.0
    assert [(h["name"], h["netns"], h["dev"], h["at"]) for h in path["hops"]] == expected, path["hops"]
    translated = [(s["from"], s["to"]) for s in data["segments"] if s["translated"]]
    assert translated == [(expected[1][0], expected[2][0])], data["segments"]
    assert (
        f"{expected[1][0]} -> {expected[2][0]}" in result.stderr and "addresses translated" in result.stderr
    )

    # The discovered spec replaces the hand-written one (two traces of one flow: the first tagger wins).
    release.hoptrace("trace", "rm", SERVICE_TRACE)
    spec = dict(data["spec"], name=DISCOVERED_TRACE)
    spec_file = tmp_path / "discovered.yaml"
    spec_file.write_text(yaml.safe_dump(spec))
    release.hoptrace("trace", "apply", "-f", str(spec_file))
    wait_until(
        lambda: re.search(
            rf"^{DISCOVERED_TRACE}\s.*1/1 nodes active", release.hoptrace("trace", "ls").stdout, re.M
        ),
        f"{DISCOVERED_TRACE} active on the node",
        30,
    )
    started = time.monotonic()
    sent = send_udp(release, service.destination, DATAGRAMS)
    report = wait_report(release, DISCOVERED_TRACE, sent)
    release.timings["discovered path: send to full report"] = time.monotonic() - started
    assert report.get("complete") == report.get("packets") == sent, report
    names = [hop[0] for hop in expected]
    assert [(s["from"], s["to"], s["count"]) for s in report["segments"]] == [
        (a, b, sent) for a, b in itertools.pairwise(names)
    ], report["segments"]


def test_uninstall_takes_the_agents_hooks_out_of_the_pods(release: Release, shop: Shop) -> None:
    """`helm uninstall`: the release's pods go, and with the agent every BPF link and program it held (the
    trace's tc hooks in the pods' namespaces): nothing of it stays in the kernel. Nor in bpffs: the agent
    unpins its traces when it stops, and the chart's post-delete Job removes the signed-command state the
    agent keeps there across its restarts."""
    links, programs = bpf_ids_held_by(agent_pid(release))
    assert len(links) >= 2 and programs, "the trace's two tc hooks, held by the agent before uninstall"
    state = Path(BPFFS, "hoptrace", f"commands-{NODE_NAME}")
    assert state in node_pins(), "the agent's signed-command state, written when it took the traces"
    started = time.monotonic()
    release.cluster.helm("uninstall", "hoptrace", "-n", NAMESPACE, "--wait", "--timeout", "120s")
    release.timings["helm uninstall"] = time.monotonic() - started
    wait_until(lambda: not release.pods(), "the release's pods gone", 60)
    try:
        wait_until(lambda: not node_pins(), "nothing of the node's agent pinned in bpffs", 30)
    except WaitTimeout:
        raise AssertionError(f"left in bpffs after helm uninstall: {node_pins()}") from None

    def released() -> bool:
        alive_links, alive_programs = bpf_ids_alive()
        return not (links & alive_links) and not (programs & alive_programs)

    wait_until(released, "the agent's BPF links and programs gone from the kernel", 30)


def agent_pid(release: Release) -> int:
    """The agent container's process, in this host's PID namespace (containerd's task list)."""
    (pod,) = [p for p in release.pods() if p["metadata"]["labels"]["app.kubernetes.io/component"] == "agent"]
    container = pod["status"]["containerStatuses"][0]["containerID"].removeprefix("containerd://")
    tasks = [line.split() for line in release.cluster.ctr("tasks", "list").splitlines()[1:]]
    (pid,) = [int(task[1]) for task in tasks if task[0] == container]
    return pid
