"""Containers by the names users know, with real Docker containers: the agent maps each container's network
namespace to its name, id and image (from the Docker Engine API), a spec that says `netns:
container:ht-names-a` traces real packets between two containers, and the hop names, `hoptrace report`,
`hoptrace agents` and the InfluxDB tags carry the container names; an unknown name is refused naming the
field and the containers the node has.

The engine is the compose tier's (`hoptrace.lab.compose.DockerEngine`: used as it is when one answers, else
started, and then stopped only when no other container is on it); the image is its Debian base. The
containers (`ht-names-*`) sit on a network of this test's own inside 198.18.0.0/15 and are removed
afterwards; the traffic runs in their namespaces (nsenter: the base image has no Python)."""

from __future__ import annotations

import http.cookiejar
import json
import os
import re
import secrets
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass

import grpc
import pytest

from hoptrace.lab.compose import BASE_IMAGE, DockerEngine, build_base_image, run
from hoptrace.lab.influx import BUCKET, flux
from hoptrace.lab.localcluster import LocalCluster
from hoptrace.v1 import api_pb2, trace_pb2

pytestmark = [pytest.mark.docker, pytest.mark.kernel]  # Docker's containers, traced by an agent here

NETWORK = "ht-names-net"
BRIDGE = "ht-names0"
# Inside 198.18.0.0/15, clear of dockerd's own pools (198.19.248.0/21), the compose stack's networks and
# the guest lab's 198.19.240.0/24 (lab/guests.py on another branch).
SUBNET = "198.19.236.0/24"
ADDRESSES = {"ht-names-a": "198.19.236.10", "ht-names-b": "198.19.236.11"}
NODE = "docker-host"
PORT = 11111
PACKETS = 300


@dataclass(frozen=True)
class Container:
    """A running container as `docker inspect` says it."""

    name: str
    id: str
    image: str
    pid: int

    @property
    def netns(self) -> str:
        """Its network namespace, as seen from the root PID namespace."""
        return f"/proc/{self.pid}/ns/net"


def _inspect(name: str) -> Container:
    data = json.loads(run(["docker", "inspect", name], timeout_s=60).stdout)[0]
    return Container(data["Name"].lstrip("/"), data["Id"], data["Config"]["Image"], data["State"]["Pid"])


def _remove_ours() -> None:
    for name in ADDRESSES:
        run(["docker", "rm", "-f", name], check=False, timeout_s=60)
    run(["docker", "network", "rm", NETWORK], check=False, timeout_s=60)


@pytest.fixture(scope="module")
def containers() -> Iterator[dict[str, Container]]:
    """ht-names-a and ht-names-b on NETWORK, running `sleep infinity` in the Debian base image."""
    engine = DockerEngine().ensure()
    try:
        build_base_image()
        _remove_ours()  # a killed earlier run's
        # Docker does not check an explicit --subnet against the host's routes: someone else's network on
        # it would get a second gateway address in the root namespace.
        taken = run(["ip", "-4", "route", "show", "to", "match", SUBNET], timeout_s=30).stdout.strip()
        assert not [line for line in taken.splitlines() if not line.startswith("default")], (
            f"{SUBNET} is routed in the root namespace already (another test's network?): {taken}"
        )
        run(
            [
                *["docker", "network", "create", "--driver", "bridge", "--subnet", SUBNET],
                *["-o", f"com.docker.network.bridge.name={BRIDGE}", NETWORK],
            ],
            timeout_s=60,
        )
        for name, address in ADDRESSES.items():
            run(
                [
                    *["docker", "run", "-d", "--name", name, "--network", NETWORK, "--ip", address],
                    *["--label", "org.hoptrace.test=names", BASE_IMAGE, "sleep", "infinity"],
                ],
                timeout_s=120,
            )
        yield {name: _inspect(name) for name in ADDRESSES}
    finally:
        _remove_ours()
        # Stop only an engine started here, and only when nobody else's container is on it.
        others = run(["docker", "ps", "-aq"], check=False, timeout_s=60).stdout.split()
        if engine.started_here and not others:
            engine.stop()


@pytest.fixture(scope="module")
def cluster(influxd, containers) -> Iterator[LocalCluster]:
    """Dispatcher, collector and one agent in the root namespace, which has the containers' namespaces."""
    cluster = LocalCluster(influx_url=influxd.url)
    try:
        cluster.start_dispatcher()
        cluster.start_collector("--join-window", "1")
        cluster.wait_listening()
        cluster.start_agent(NODE, "")
        cluster.wait_agents([NODE])
        yield cluster
    finally:
        cluster.stop()


def _agent(cluster: LocalCluster) -> api_pb2.Agent:
    agents = cluster.api().ListAgents(api_pb2.ListAgentsRequest()).agents
    return next(agent for agent in agents if agent.registration.node == NODE)


def _wait_inventory(cluster: LocalCluster, names: set[str], timeout_s: float = 20.0) -> api_pb2.Agent:
    """The agent once its inventory names every container in `names` (at registration or a heartbeat)."""
    deadline = time.monotonic() + timeout_s
    while True:
        agent = _agent(cluster)
        found = {w.container_name for ns in agent.registration.namespaces for w in ns.workloads}
        if names <= found or time.monotonic() > deadline:
            return agent
        time.sleep(0.5)


@pytest.fixture(scope="module")
def web(cluster) -> tuple[urllib.request.OpenerDirector, str]:
    """`hoptrace web` for the cluster, and a logged-in client of it."""
    password = secrets.token_hex(8)
    _, url = cluster.start_web(password)
    cluster.wait_http(f"{url}/login")
    browser = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar()))
    login_page = browser.open(f"{url}/login", timeout=30).read().decode()
    csrf = re.search(r'name="csrf_token" value="([^"]+)"', login_page).group(1)
    form = {"username": "admin", "password": password, "csrf_token": csrf}
    browser.open(f"{url}/login", urllib.parse.urlencode(form).encode(), timeout=30).read()
    return browser, url


def test_the_agent_maps_each_containers_netns_to_its_name_id_and_image(cluster, web, containers) -> None:
    agent = _wait_inventory(cluster, set(containers))
    runtime = agent.registration.runtime
    assert runtime.endpoint == "/var/run/docker.sock" and runtime.version and not runtime.error, runtime
    by_name = {w.container_name: (ns, w) for ns in agent.registration.namespaces for w in ns.workloads}
    for name, container in containers.items():
        assert name in by_name, f"{name} not in the inventory: {sorted(by_name)}"
        namespace, workload = by_name[name]
        assert workload.container_id == container.id
        assert workload.image == container.image == BASE_IMAGE
        assert namespace.inode == os.stat(container.netns).st_ino  # the container's own netns
        assert namespace.name == workload.netns == container.netns
        assert {d.name for d in namespace.devices} == {"lo", "eth0"}
        assert not workload.pod_name  # a plain container is no pod's
    # two containers, two namespaces
    assert by_name["ht-names-a"][0].inode != by_name["ht-names-b"][0].inode

    shown = cluster.hoptrace("agents", "--wide").stdout
    assert "ht-names-a" in shown and "ht-names-b" in shown, shown

    # the web UI: the agents page shows each container with its image in its namespace's row, and the
    # trace form offers container:NAME as a netns
    browser, url = web
    page = browser.open(f"{url}/agents/", timeout=60).read().decode()
    for name, container in containers.items():
        row = re.search(rf"<tr><td>{re.escape(container.netns)}</td>.*?</tr>", page, re.S)
        assert row, f"no row for {container.netns} on the agents page"
        assert f'title="{container.id[:12]} {BASE_IMAGE}">{name} <small>{BASE_IMAGE}</small>' in row.group()
    agents = json.loads(browser.open(f"{url}/agents/agents.json", timeout=60).read())["agents"]
    aliases = {a for ns in agents[0]["namespaces"] for a in ns["aliases"]}
    assert {"container:ht-names-a", "container:ht-names-b"} <= aliases


def _spec(name: str, receiver: str = "container:ht-names-b") -> trace_pb2.TraceSpec:
    spec = trace_pb2.TraceSpec(
        name=name,
        filter=trace_pb2.Filter(protocol="udp", dst=ADDRESSES["ht-names-b"], dst_port=PORT),
    )
    spec.hops.add(node=NODE, at="tc-egress", dev="eth0", netns="container:ht-names-a")
    spec.hops.add(node=NODE, at="tc-ingress", dev="eth0", netns=receiver)
    return spec


SENDER = """
import socket, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
for i in range(int(sys.argv[3])):
    s.sendto(i.to_bytes(8, "big") + bytes(56), (sys.argv[1], int(sys.argv[2])))
    time.sleep(0.002)
"""

RECEIVER = """
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(("0.0.0.0", int(sys.argv[1])))
print("ready", flush=True)
s.settimeout(3.0)
got = set()
try:
    while len(got) < int(sys.argv[2]):
        got.add(int.from_bytes(s.recv(2048)[:8], "big"))
except socket.timeout:
    pass
print(len(got), flush=True)
"""


def _udp_between(sender: Container, receiver: Container, packets: int) -> int:
    """Send `packets` numbered datagrams from one container's netns to the other's; returns how many
    distinct ones arrived."""
    nsenter = ["nsenter", f"--net={receiver.netns}", sys.executable, "-c"]
    rx = subprocess.Popen([*nsenter, RECEIVER, str(PORT), str(packets)], stdout=subprocess.PIPE, text=True)
    try:
        assert rx.stdout is not None and rx.stdout.readline().strip() == "ready"
        subprocess.run(
            [
                *["nsenter", f"--net={sender.netns}", sys.executable, "-c", SENDER],
                *[ADDRESSES[receiver.name], str(PORT), str(packets)],
            ],
            check=True,
            timeout=60,
        )
        out, _ = rx.communicate(timeout=30)
        return int(out.strip())
    finally:
        if rx.poll() is None:
            rx.kill()
            rx.wait()


def _wait_report(cluster: LocalCluster, trace: str, packets: int, timeout_s: float = 30.0) -> dict:
    """`hoptrace report --json` once it counts `packets` complete packets in every segment (join window,
    export)."""
    deadline = time.monotonic() + timeout_s
    while True:
        result = cluster.hoptrace("report", trace, "--since", "30m", "--json", check=False)
        report = json.loads(result.stdout) if result.returncode == 0 else {}
        # every segment counted too: a packet's later segment may fall into the next 1 s window
        counted = [s.get("count", 0) for s in [*report.get("segments", []), report.get("end_to_end", {})]]
        if (report.get("complete", 0) >= packets and min(counted) >= packets) or time.monotonic() > deadline:
            assert report, result.stderr
            return report
        time.sleep(1)


def test_a_spec_naming_containers_traces_real_packets_between_them(cluster, web, influxd, containers) -> None:
    _wait_inventory(cluster, set(containers))
    trace = cluster.apply(_spec("names-udp"))
    hops = trace.spec.hops
    # generated hop names carry the container names; the typed workload travels with the spec
    assert [hop.name for hop in hops] == ["ht-names-a-eth0-out", "ht-names-b-eth0-in"]
    assert [hop.workload.container_id for hop in hops] == [
        containers["ht-names-a"].id,
        containers["ht-names-b"].id,
    ]
    assert [hop.workload.netns for hop in hops] == [
        containers["ht-names-a"].netns,
        containers["ht-names-b"].netns,
    ]
    assert [hop.netns for hop in hops] == ["container:ht-names-a", "container:ht-names-b"]

    assert _udp_between(containers["ht-names-a"], containers["ht-names-b"], PACKETS) == PACKETS
    report = _wait_report(cluster, "names-udp", PACKETS)
    assert report["complete"] == PACKETS
    (segment,) = report["segments"]
    assert (segment["from"], segment["to"], segment["count"]) == (
        "ht-names-a-eth0-out",
        "ht-names-b-eth0-in",
        PACKETS,
    )
    assert segment["p50_ns"] > 0
    # the report's hops carry the containers (hop_counters windows may still be closing: wait for them)
    deadline = time.monotonic() + 20
    while True:
        report = json.loads(cluster.hoptrace("report", "names-udp", "--since", "30m", "--json").stdout)
        containers_of = {h["hop"]: h.get("container", "") for h in report["hops"]}
        if len(containers_of) == 2 or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert containers_of == {"ht-names-a-eth0-out": "ht-names-a", "ht-names-b-eth0-in": "ht-names-b"}
    text = cluster.hoptrace("report", "names-udp", "--since", "30m").stdout
    assert "container ht-names-b" in text, text
    browser, url = web
    page = browser.open(f"{url}/traces/names-udp/results", timeout=60).read().decode()
    throughput = page.split('id="throughput"', 1)[1].split("</table>", 1)[0]
    for hop, container in containers_of.items():
        assert re.search(rf"<td>{hop}</td>.*?<td>{container}</td></tr>", throughput), throughput

    # InfluxDB: the hop_counters points of each hop are tagged with its container, and count every packet
    rows = flux(
        influxd.url,
        f'from(bucket: "{BUCKET}") |> range(start: -1h) '
        '|> filter(fn: (r) => r._measurement == "hop_counters" and r.trace == "names-udp" '
        'and r._field == "packets") |> group(columns: ["hop", "container"]) |> sum()',
    )
    assert {(row["hop"], row["container"]): int(row["_value"]) for row in rows} == {
        ("ht-names-a-eth0-out", "ht-names-a"): PACKETS,
        ("ht-names-b-eth0-in", "ht-names-b"): PACKETS,
    }
    cluster.api().DeleteTrace(api_pb2.DeleteTraceRequest(name="names-udp"))


def test_an_unknown_container_is_refused_naming_the_field_and_the_known_ones(cluster, containers) -> None:
    _wait_inventory(cluster, set(containers))
    with pytest.raises(grpc.RpcError) as refused:
        cluster.apply(_spec("names-bad", receiver="container:ht-names-zz"))
    details = refused.value.details()
    assert "hops[1].netns: node docker-host reported no container 'ht-names-zz'" in details, details
    # (the compose tier's containers may share the engine: they are listed too)
    known = details.split("containers there: ", 1)[1].split("\n", 1)[0].split(", ")
    assert {"ht-names-a", "ht-names-b"} <= set(known), details
    with pytest.raises(grpc.RpcError) as refused:
        cluster.apply(_spec("names-bad", receiver="pod:shop/web-0"))
    assert "hops[1].netns: node docker-host reported no pod shop/web-0; no pods running there" in (
        refused.value.details()
    )


def test_mace_through_the_dispatcher_takes_a_container_by_name(cluster, containers) -> None:
    """`RunPreset mace` with `container: container:ht-names-a`: the dispatcher sends the agent the
    container's namespace, and MACE sees the container's UDP flow leave it and reach the host-side veth of
    ht-names-b (bridged traffic never leaves by the bridge device a route would name, so `outer` is given)."""
    _wait_inventory(cluster, set(containers))
    sender, receiver = containers["ht-names-a"], containers["ht-names-b"]
    (eth0,) = json.loads(
        run(["nsenter", f"--net={receiver.netns}", "ip", "-j", "link", "show", "eth0"], timeout_s=30).stdout
    )
    links = json.loads(run(["ip", "-j", "link", "show"], timeout_s=30).stdout)
    outer = next(link["ifname"] for link in links if link["ifindex"] == eth0["link_index"])
    flow = subprocess.Popen(
        [
            *["nsenter", f"--net={sender.netns}", sys.executable, "-c", SENDER],
            *[ADDRESSES[receiver.name], str(PORT + 1), "3000"],  # 2 ms apart: 6 s, past MACE's 2 s
        ]
    )
    try:
        request = api_pb2.RunPresetRequest(
            node=NODE,
            preset="mace",
            args={"container": "container:ht-names-a", "outer": outer, "duration": "2s"},
        )
        result = cluster.api().RunPreset(request, timeout=60)
        still_sending = flow.poll() is None
    finally:
        flow.kill()
        flow.wait()
    assert still_sending, "the flow ended before MACE did: its count would not be the whole window's"
    mace = json.loads(result.summary_json)
    assert mace["container"] == sender.netns
    # The flow is the container's only traffic and ran through MACE's whole window (how many datagrams that
    # was depends on the sender's pace on a loaded machine): MACE saw them leave and paired nearly all.
    assert mace["egress"]["count"] >= 50, mace["egress"]  # 2 s at 500 pps nominal; 195 seen under load
    assert mace["egress"]["coverage"] > 0.9, mace["egress"]


def test_a_restarted_container_is_found_in_its_new_namespace(cluster, containers) -> None:
    """A restart gives the container a new first process and namespace: the agent's next inventory says so
    (its inspect cache notices the new process) and a new apply resolves the name to it. Runs last: the
    module's `containers` is stale afterwards."""
    _wait_inventory(cluster, set(containers))
    before = containers["ht-names-b"]
    run(["docker", "restart", "-t", "0", before.name], timeout_s=120)
    after = _inspect(before.name)
    assert after.pid != before.pid and after.id == before.id
    deadline = time.monotonic() + 20
    while True:
        agent = _agent(cluster)
        netns = {w.container_name: w.netns for ns in agent.registration.namespaces for w in ns.workloads}
        if netns.get(before.name) == after.netns or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert netns.get(before.name) == after.netns, netns
    trace = cluster.apply(_spec("names-restarted"))
    assert trace.spec.hops[1].workload.netns == after.netns
    cluster.api().DeleteTrace(api_pb2.DeleteTraceRequest(name="names-restarted"))
