"""The dispatcher over real gRPC: fake agents (stand-ins for the Go agent) on AgentSession, the user API, the
state directory across restarts, and the `hoptrace` CLI as a subprocess."""

from __future__ import annotations

import contextlib
import json
import os
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest
import yaml
from dispatcher_fakes import FakeAgent
from spec_fixtures import CONTRACT_SPEC

from hoptrace.collector.catalog import TraceCatalog
from hoptrace.collector.catalog_sync import follow_dispatcher
from hoptrace.dispatcher.compile import BpfCompiler, Toolchain
from hoptrace.dispatcher.server import DispatcherServer
from hoptrace.lab.waiting import wait_until
from hoptrace.spec import load_spec
from hoptrace.v1 import agent_pb2, agent_pb2_grpc, api_pb2, api_pb2_grpc, trace_pb2

HOPTRACE = Path(sys.executable).parent / "hoptrace"
FAILING_ATTACH = "attach tc-ingress on wire0: no such device"


@pytest.fixture(scope="module")
def compiler(tmp_path_factory: pytest.TempPathFactory) -> BpfCompiler:
    """One compiler (and object cache) for the module: tests here are about the protocol, not clang."""
    compiler = BpfCompiler(Toolchain.default(), cache_dir=tmp_path_factory.mktemp("bpf-cache"))
    compiler.warm_up()
    return compiler


class Cluster:
    """A dispatcher on a free port with its state directory, plus the fake agents connected to it."""

    def __init__(self, state_dir: Path, compiler: BpfCompiler, report_provider=None) -> None:
        self.state_dir = state_dir
        self.compiler = compiler
        self.report_provider = report_provider
        self.agents: list[FakeAgent] = []
        self.server: DispatcherServer | None = None
        self.channel: grpc.Channel | None = None
        self.start_server()

    def start_server(self) -> None:
        self.server = DispatcherServer(
            "127.0.0.1:0",
            self.state_dir,
            compiler=self.compiler,
            ack_timeout=3.0,
            report_provider=self.report_provider,
        ).start()
        self.channel = grpc.insecure_channel(self.server.address)
        self.api = api_pb2_grpc.HoptraceStub(self.channel)

    def stop_server(self) -> None:
        self.channel.close()
        self.server.stop(grace=0.5)

    @property
    def address(self) -> str:
        return self.server.address

    def agent(self, node: str, **options) -> FakeAgent:
        agent = FakeAgent(self.address, node, **options).start()
        self.agents.append(agent)
        self.wait_connected(node)
        return agent

    def wait_connected(self, node: str, timeout: float = 5.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            agents = self.api.ListAgents(api_pb2.ListAgentsRequest(), timeout=5).agents
            if any(agent.registration.node == node and agent.connected for agent in agents):
                return
            time.sleep(0.02)
        raise AssertionError(f"agent {node} did not connect")

    def apply(self, text: str) -> api_pb2.Trace:
        return self.api.ApplyTrace(api_pb2.ApplyTraceRequest(spec=load_spec(text)), timeout=30)

    def close(self) -> None:
        for agent in self.agents:
            agent.stop()
        self.stop_server()


@pytest.fixture
def cluster(tmp_path: Path, compiler: BpfCompiler) -> Iterator[Cluster]:
    cluster = Cluster(tmp_path / "state", compiler)
    try:
        yield cluster
    finally:
        cluster.close()


def _applies(agent: FakeAgent) -> list[agent_pb2.TracePlan]:
    return [message.apply for message in agent.received if message.WhichOneof("body") == "apply"]


def _has(kind: str, trace: str = "udp-a-to-b") -> Callable[[list[agent_pb2.DispatcherMessage]], bool]:
    def check(messages: list[agent_pb2.DispatcherMessage]) -> bool:
        return any(
            message.WhichOneof("body") == kind and getattr(message, kind).trace == trace
            for message in messages
        )

    return check


# ---- agent sessions and the API ----------------------------------------------------------------------------


def test_apply_pushes_each_node_its_plan(cluster: Cluster) -> None:
    host_a, host_b = cluster.agent("host-a"), cluster.agent("host-b")
    trace = cluster.apply(CONTRACT_SPEC)
    assert trace.generation >= 1
    assert [(status.trace, status.active) for status in trace.nodes] == [("udp-a-to-b", True)] * 2
    (plan_a,) = _applies(host_a)
    (plan_b,) = _applies(host_b)
    assert [hop.name for hop in plan_a.hops] == ["a-c1-out", "a-br-in", "a-wire-out"]
    assert [hop.hop_index for hop in plan_b.hops] == [3, 4]
    assert plan_a.hops[0].tag_udp and plan_a.generation == plan_b.generation == trace.generation
    assert plan_a.object.startswith(b"\x7fELF") and plan_b.object.startswith(b"\x7fELF")
    listed = cluster.api.ListTraces(api_pb2.ListTracesRequest(), timeout=5).traces
    assert [(item.spec.name, item.generation) for item in listed] == [("udp-a-to-b", trace.generation)]


def test_attach_failure_names_hop_and_node_and_applies_nothing(cluster: Cluster) -> None:
    host_a = cluster.agent("host-a")
    host_b = cluster.agent("host-b", fail_hops={"b-wire-in": FAILING_ATTACH})
    with pytest.raises(grpc.RpcError) as caught:
        cluster.apply(CONTRACT_SPEC)
    assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert f"hop b-wire-in (hops[3]) on node host-b: {FAILING_ATTACH}" in caught.value.details()
    assert "removed from every node" in caught.value.details()
    host_a.wait_for(_has("remove"))
    host_b.wait_for(_has("remove"))
    assert cluster.api.ListTraces(api_pb2.ListTracesRequest(), timeout=5).traces == []
    assert list((cluster.state_dir / "traces").iterdir()) == []


def test_failed_update_rolls_back_to_the_previous_spec(cluster: Cluster) -> None:
    host_a = cluster.agent("host-a")
    host_b = cluster.agent("host-b", fail_hops={"b-extra": FAILING_ATTACH})
    first = cluster.apply(CONTRACT_SPEC)
    updated = CONTRACT_SPEC + "  - {name: b-extra, node: host-b, at: tc-ingress, dev: veth-c2}\n"
    with pytest.raises(grpc.RpcError) as caught:
        cluster.apply(updated)
    assert f"hop b-extra (hops[5]) on node host-b: {FAILING_ATTACH}" in caught.value.details()
    assert "rolled back" in caught.value.details()
    current = cluster.api.GetTrace(api_pb2.GetTraceRequest(name="udp-a-to-b"), timeout=5)
    assert current.spec == first.spec
    assert current.generation > first.generation + 1  # the rollback is a newer generation agents accept
    assert all(status.active and status.generation == current.generation for status in current.nodes)
    for agent in (host_a, host_b):
        assert [plan.generation for plan in _applies(agent)][-1] == current.generation
        assert len(_applies(agent)[-1].hops) == len(_applies(agent)[0].hops)


def test_update_moves_the_trace_off_dropped_nodes(cluster: Cluster) -> None:
    host_a, host_b = cluster.agent("host-a"), cluster.agent("host-b")
    cluster.apply(CONTRACT_SPEC)
    only_a = "\n".join(line for line in CONTRACT_SPEC.splitlines() if "host-b" not in line) + "\n"
    trace = cluster.apply(only_a)
    assert len(trace.nodes) == 1
    host_b.wait_for(_has("remove"))
    assert "remove udp-a-to-b" not in host_a.kinds()


def test_delete_removes_everywhere(cluster: Cluster) -> None:
    host_a, host_b = cluster.agent("host-a"), cluster.agent("host-b")
    cluster.apply(CONTRACT_SPEC)
    cluster.api.DeleteTrace(api_pb2.DeleteTraceRequest(name="udp-a-to-b"), timeout=10)
    assert host_a.kinds()[-1] == "remove udp-a-to-b" and host_b.kinds()[-1] == "remove udp-a-to-b"
    assert cluster.api.ListTraces(api_pb2.ListTracesRequest(), timeout=5).traces == []
    assert not (cluster.state_dir / "traces" / "udp-a-to-b.yaml").exists()
    with pytest.raises(grpc.RpcError) as caught:
        cluster.api.DeleteTrace(api_pb2.DeleteTraceRequest(name="udp-a-to-b"), timeout=5)
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND


def test_spec_stream_follows_apply_and_delete_into_the_collectors_catalog(cluster: Cluster) -> None:
    """The collector's trace paths come by WatchSpecs: the applied set at once, then after every change."""
    cluster.agent("host-a"), cluster.agent("host-b")
    catalog, stop = TraceCatalog(), threading.Event()
    updates: queue.Queue[list[str]] = queue.Queue()
    stream = cluster.api.WatchSpecs(api_pb2.WatchSpecsRequest())

    def read() -> None:
        with contextlib.suppress(grpc.RpcError):  # cancelled at the end
            for message in stream:
                updates.put([spec.name for spec in message.specs])

    threading.Thread(target=read, daemon=True).start()
    follow_dispatcher(catalog, cluster.address, stop)
    try:
        assert updates.get(timeout=5) == []
        cluster.apply(CONTRACT_SPEC)
        assert updates.get(timeout=5) == ["udp-a-to-b"]
        wait_until(
            lambda: catalog.get("udp-a-to-b") is not None, "the collector's catalog has the path", 5, 0.02
        )
        assert list(catalog.get("udp-a-to-b").hop_names) == [
            hop.name for hop in load_spec(CONTRACT_SPEC).hops
        ]
        cluster.api.DeleteTrace(api_pb2.DeleteTraceRequest(name="udp-a-to-b"), timeout=10)
        assert updates.get(timeout=5) == []
        wait_until(lambda: catalog.get("udp-a-to-b") is None, "the deleted trace left the catalog", 5, 0.02)
    finally:
        stop.set()
        stream.cancel()


def test_invalid_and_unplaceable_specs_change_nothing(cluster: Cluster) -> None:
    host_a = cluster.agent("host-a")
    cluster.agent("host-b")
    bad = CONTRACT_SPEC.replace("dev: wire0}\n  - {name: b-c2-in", "dev: wire7}\n  - {name: b-c2-in")
    with pytest.raises(grpc.RpcError) as caught:
        cluster.apply(bad)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "hops[3].dev: no device 'wire7'" in caught.value.details()
    response = cluster.api.ValidateTrace(api_pb2.ValidateTraceRequest(spec=load_spec(bad)), timeout=5)
    assert [error.field for error in response.errors] == ["hops[3].dev"]
    fentry = CONTRACT_SPEC.replace('at: "tracepoint:net:netif_receive_skb"', 'at: "fentry:netif_receive_skb"')
    response = cluster.api.ValidateTrace(api_pb2.ValidateTraceRequest(spec=load_spec(fentry)), timeout=5)
    assert [(error.field, "kernel lockdown" in error.reason) for error in response.errors] == [
        ("hops[1].at", True)
    ]
    assert host_a.received == []


def test_apply_needs_every_node_connected(cluster: Cluster) -> None:
    host_a = cluster.agent("host-a")
    host_b = cluster.agent("host-b")
    host_b.stop()
    deadline = time.monotonic() + 5
    while cluster.server.registry.connection("host-b") is not None and time.monotonic() < deadline:
        time.sleep(0.02)
    with pytest.raises(grpc.RpcError) as caught:
        cluster.apply(CONTRACT_SPEC)
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "host-b" in caught.value.details()
    assert host_a.received == []
    agents = {
        agent.registration.node: agent for agent in cluster.api.ListAgents(api_pb2.ListAgentsRequest()).agents
    }
    assert agents["host-a"].connected and not agents["host-b"].connected


def test_state_survives_restart_and_agents_get_their_plans_back(cluster: Cluster) -> None:
    cluster.agent("host-a")
    cluster.agent("host-b")
    applied = cluster.apply(CONTRACT_SPEC)
    for agent in cluster.agents:
        agent.stop()
    cluster.agents.clear()
    cluster.stop_server()
    cluster.start_server()
    (reloaded,) = cluster.api.ListTraces(api_pb2.ListTracesRequest(), timeout=5).traces
    assert reloaded.spec == applied.spec and reloaded.generation == applied.generation
    # host-a restarted too (runs nothing): it gets its plan again, without a new apply
    host_a = cluster.agent("host-a")
    (plan,) = _applies(host_a.wait_for(_has("apply")) and host_a)
    assert plan.generation == applied.generation and [hop.hop_index for hop in plan.hops] == [0, 1, 2]
    assert plan.object.startswith(b"\x7fELF")
    # host-b kept running the same generation: nothing is pushed; it also runs a trace nobody wants any more
    running = [
        agent_pb2.TraceStatus(trace="udp-a-to-b", generation=applied.generation, active=True),
        agent_pb2.TraceStatus(trace="stale", generation=1, active=True),
    ]
    host_b = cluster.agent("host-b", running=running)
    host_b.wait_for(_has("remove", "stale"))
    time.sleep(0.3)
    assert host_b.kinds() == ["remove stale"]
    current = cluster.api.GetTrace(api_pb2.GetTraceRequest(name="udp-a-to-b"), timeout=5)
    assert [status.active for status in current.nodes] == [True, True]


def test_reconnect_replaces_the_older_stream(cluster: Cluster) -> None:
    first = cluster.agent("host-a")
    second = cluster.agent("host-a")
    assert first.ended.wait(5)
    assert not second.ended.is_set()
    assert len(cluster.api.ListAgents(api_pb2.ListAgentsRequest(), timeout=5).agents) == 1


def test_first_message_must_be_register(cluster: Cluster) -> None:
    stub = agent_pb2_grpc.AgentSessionStub(cluster.channel)
    heartbeat = agent_pb2.AgentMessage()
    heartbeat.heartbeat.sent_at.GetCurrentTime()
    with pytest.raises(grpc.RpcError) as caught:
        list(stub.Connect(iter([heartbeat]), timeout=5))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_agents_and_report_hook(tmp_path: Path, compiler: BpfCompiler) -> None:
    requests = []

    def report_provider(
        request: api_pb2.GetReportRequest, spec: trace_pb2.TraceSpec | None
    ) -> api_pb2.Report:
        requests.append((request.trace, [hop.name for hop in spec.hops] if spec else None))
        report = api_pb2.Report(trace=request.trace, packets=10, complete=9)
        segment = report.segments.add(to="a-br-in", count=9, mean_ns=1500.0, p50_ns=1400, max_ns=3000)
        setattr(segment, "from", "a-c1-out")  # noqa: B010 (a keyword)
        report.end_to_end.to = "b-c2-in"
        return report

    cluster = Cluster(tmp_path / "state", compiler, report_provider=report_provider)
    try:
        agent = cluster.agent("host-a")
        agent.send_heartbeat()
        got = cluster.api.GetAgent(api_pb2.GetAgentRequest(node="host-a"), timeout=5)
        assert got.connected and got.registration.capabilities.attach["fentry"].reason.endswith("lockdown")
        with pytest.raises(grpc.RpcError) as caught:
            cluster.api.GetAgent(api_pb2.GetAgentRequest(node="nope"), timeout=5)
        assert caught.value.code() == grpc.StatusCode.NOT_FOUND
        report = cluster.api.GetReport(api_pb2.GetReportRequest(trace="x"), timeout=5)
        assert report.packets == 10 and requests == [("x", None)]
        result = _hoptrace(cluster.address, "report", "x", "--since", "10m", "--json")
        assert result.returncode == 0, result.stderr
        data = json.loads(result.stdout)
        assert data["segments"] == [
            {
                "from": "a-c1-out",
                "to": "a-br-in",
                "count": 9,
                "mean_ns": 1500.0,
                "p50_ns": 1400,
                "p90_ns": 0,
                "p99_ns": 0,
                "max_ns": 3000,
                "incomplete": 0,
                "loss_count": 0,
                "loss_rate": 0.0,
                "tracer_lost": 0,
                "before_attach": 0,
                "jitter_ns": 0.0,
                "jitter_p99_ns": 0.0,
                "same_node": False,
                "below_clock_bound": False,
                "clock_bound_ns": 0,
                "drops": [],
            }
        ]
        assert data["hops"] == []
        assert (data["trace"], data["packets"], data["complete"], data["end_to_end"]["to"]) == (
            "x",
            10,
            9,
            "b-c2-in",
        )
        table = _hoptrace(cluster.address, "report", "x")
        assert table.returncode == 0, table.stderr
        assert "a-c1-out > a-br-in" in table.stdout and "1.5us" in table.stdout
    finally:
        cluster.close()


def test_report_without_provider_is_unimplemented(cluster: Cluster) -> None:
    with pytest.raises(grpc.RpcError) as caught:
        cluster.api.GetReport(api_pb2.GetReportRequest(trace="x"), timeout=5)
    assert caught.value.code() == grpc.StatusCode.UNIMPLEMENTED
    result = _hoptrace(cluster.address, "report", "x")
    assert result.returncode == 1 and "--influx-url" in result.stderr


# ---- the CLI -----------------------------------------------------------------------------------------------


def _hoptrace(dispatcher: str | None, *args: str, stdin: str | None = None, env: dict | None = None):
    # The test dispatchers are plaintext on loopback (TLS and tokens: tests/security).
    target = ["--dispatcher", dispatcher] if dispatcher else []
    command = [str(HOPTRACE), "--insecure", *target, *args]
    return subprocess.run(
        command, capture_output=True, text=True, input=stdin, timeout=60, env={**os.environ, **(env or {})}
    )


def test_cli_trace_lifecycle(cluster: Cluster, tmp_path: Path) -> None:
    cluster.agent("host-a")
    cluster.agent("host-b")
    spec_file = tmp_path / "spec.yaml"
    spec_file.write_text(CONTRACT_SPEC)

    applied = _hoptrace(None, "trace", "apply", "-f", str(spec_file), "--dispatcher", cluster.address)
    assert applied.returncode == 0, applied.stderr
    assert "trace udp-a-to-b applied: generation" in applied.stdout and "host-a, host-b" in applied.stdout

    listed = _hoptrace(None, "trace", "ls", env={"HOPTRACE_DISPATCHER": cluster.address})
    assert listed.returncode == 0, listed.stderr
    header, row = listed.stdout.splitlines()
    assert header.split()[:3] == ["NAME", "GENERATION", "HOPS"]
    assert row.split()[0] == "udp-a-to-b" and "2/2 nodes active" in row

    as_json = _hoptrace(cluster.address, "trace", "get", "udp-a-to-b", "-o", "json")
    assert as_json.returncode == 0, as_json.stderr
    assert load_spec(as_json.stdout) == load_spec(CONTRACT_SPEC)
    as_yaml = _hoptrace(cluster.address, "trace", "get", "udp-a-to-b")
    assert "# node host-b: active" in as_yaml.stdout
    assert load_spec(as_yaml.stdout) == load_spec(CONTRACT_SPEC)

    reapplied = _hoptrace(cluster.address, "trace", "apply", "-f", "-", stdin=as_json.stdout)
    assert reapplied.returncode == 0, reapplied.stderr

    agents = _hoptrace(cluster.address, "agents", "--json")
    assert agents.returncode == 0, agents.stderr
    data = json.loads(agents.stdout)
    assert [(agent["node"], agent["connected"]) for agent in data] == [("host-a", True), ("host-b", True)]
    assert (
        data[0]["namespaces"][1]["name"] == "c1"
        and data[0]["capabilities"]["attach"]["fentry"]["supported"] is False
    )
    table = _hoptrace(cluster.address, "agents")
    assert table.stdout.splitlines()[0].split()[:2] == ["NODE", "CONNECTED"], table.stdout
    wide = _hoptrace(cluster.address, "agents", "--wide")  # every unsupported attach kind named
    assert "fentry,fexit,kprobe,kretprobe" in wide.stdout, wide.stdout

    removed = _hoptrace(cluster.address, "trace", "rm", "udp-a-to-b")
    assert removed.returncode == 0 and "removed" in removed.stdout
    again = _hoptrace(cluster.address, "trace", "rm", "udp-a-to-b")
    assert again.returncode == 1 and "no trace named 'udp-a-to-b'" in again.stderr
    assert _hoptrace(cluster.address, "trace", "ls").stdout.strip() == "no traces"


def test_cli_spec_errors_print_field_reason_lines(cluster: Cluster, tmp_path: Path) -> None:
    cluster.agent("host-a")
    cluster.agent("host-b")
    local = tmp_path / "local.yaml"
    document = yaml.safe_load(CONTRACT_SPEC)
    document["sample"] = 0
    del document["hops"][2]["dev"]
    local.write_text(yaml.safe_dump(document, sort_keys=False))
    result = _hoptrace(cluster.address, "trace", "apply", "-f", str(local))
    assert result.returncode == 1 and result.stdout == ""
    assert "\nsample: must be >= 1" in result.stderr
    assert "\nhops[2].dev: required for tc-egress hops" in result.stderr

    remote = tmp_path / "remote.yaml"
    remote.write_text(CONTRACT_SPEC.replace("netns: c2}", "netns: c9}"))
    for command in ("apply", "validate"):
        result = _hoptrace(cluster.address, "trace", command, "-f", str(remote))
        assert result.returncode == 1
        assert "\nhops[4].netns: node host-b did not report netns 'c9'" in result.stderr
    offline = _hoptrace(None, "trace", "validate", "--offline", "-f", str(remote))
    assert offline.returncode == 0 and "valid" in offline.stdout

    failing = _hoptrace(cluster.address, "trace", "apply", "-f", str(tmp_path / "missing.yaml"))
    assert failing.returncode == 1 and "cannot read" in failing.stderr

    binary = tmp_path / "binary.yaml"  # not UTF-8: a field error, never a UnicodeDecodeError traceback
    binary.write_bytes(bytes(range(256)))
    result = _hoptrace(cluster.address, "trace", "apply", "-f", str(binary))
    assert result.returncode == 1 and "spec: not UTF-8 text" in result.stderr
    assert "Traceback" not in result.stderr


def test_cli_reports_attach_failures(tmp_path: Path, compiler: BpfCompiler) -> None:
    cluster = Cluster(tmp_path / "state", compiler)
    try:
        cluster.agent("host-a")
        cluster.agent(
            "host-b", fail_hops={"b-c2-in": "attach tc-ingress on eth0 in netns c2: no such device"}
        )
        spec_file = tmp_path / "spec.yaml"
        spec_file.write_text(CONTRACT_SPEC)
        result = _hoptrace(cluster.address, "trace", "apply", "-f", str(spec_file))
        assert result.returncode == 1
        assert "hop b-c2-in (hops[4]) on node host-b: attach tc-ingress on eth0 in netns c2" in result.stderr
    finally:
        cluster.close()


def test_cli_unreachable_dispatcher_and_help() -> None:
    result = _hoptrace("127.0.0.1:1", "trace", "ls")
    assert result.returncode == 1 and "cannot reach the dispatcher at 127.0.0.1:1" in result.stderr
    for command in (
        [],
        ["dispatcher"],
        ["collector"],
        ["trace"],
        ["trace", "apply"],
        ["trace", "ls"],
        ["trace", "get"],
        ["trace", "rm"],
        ["trace", "validate"],
        ["agents"],
        ["report"],
        ["version"],
        ["packets"],
    ):
        shown = _hoptrace(None, *command, "--help")
        assert shown.returncode == 0 and "usage: hoptrace" in shown.stdout, (command, shown.stderr)
    usage = _hoptrace(None, "trace", "apply")
    assert usage.returncode == 2 and "-f/--file" in usage.stderr
    bad_since = _hoptrace(None, "report", "x", "--since", "ten minutes")
    assert bad_since.returncode == 2 and "is not a duration" in bad_since.stderr


def test_cli_dispatcher_command_serves_and_persists(tmp_path: Path) -> None:
    state_dir, cache_dir = tmp_path / "state", tmp_path / "bpf-cache"
    process = subprocess.Popen(
        [str(HOPTRACE), "dispatcher", "--insecure", "--listen", "127.0.0.1:0", "--state-dir", str(state_dir)]
        + ["--bpf-cache-dir", str(cache_dir)],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = ""
        deadline = time.monotonic() + 20
        while "dispatcher listening on" not in line and time.monotonic() < deadline:
            line = process.stderr.readline()
        assert "dispatcher listening on" in line, line
        address = line.split("dispatcher listening on ")[1].split()[0]
        result = _hoptrace(address, "agents")
        assert result.returncode == 0 and "no agents registered" in result.stdout
        # The compiler prepares its precompiled header at start, in the cache directory it was given.
        wait_until(lambda: list(cache_dir.glob("*.pch")), "the precompiled header in --bpf-cache-dir", 60)
    finally:
        process.terminate()
        assert process.wait(timeout=10) == 0
    assert (state_dir / "traces").is_dir()
    assert not (state_dir / "cache").exists()
