"""Signed commands cannot be played again, outlived, left unsigned or forged; and the audit trail names who
applied and removed a trace. One real dispatcher (mutual TLS, tokens) and the real agent; what an attacker
inside the agent's session would send is put on that very session (the dispatcher's own queue toward the
agent), so only the agent's checks stand in the way. Each refusal is checked where it matters: the kernel's
tcx programs on the namespace's devices, the agent's /metrics counter, the agent's answer."""

from __future__ import annotations

import json
import os
import re
import subprocess
import tempfile
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import grpc
import pytest
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from security_helpers import DaemonAgent, start_daemon_agent, tls_args
from werkzeug.security import generate_password_hash

from hoptrace.common.certs import CertBundle
from hoptrace.common.grpcutil import CA_ENV, CERT_ENV, KEY_ENV, TOKEN_ENV, api_channel
from hoptrace.dispatcher.compile import BpfCompiler
from hoptrace.dispatcher.server import DispatcherServer
from hoptrace.dispatcher.signing import COMMAND_TYPE, MessageSigner, signed_bytes
from hoptrace.lab.bpfstate import AGENT_PIN_ROOT, remove_agent_state, tcx_programs
from hoptrace.lab.localcluster import HOPTRACE, free_port
from hoptrace.lab.waiting import wait_until
from hoptrace.spec import spec_to_yaml
from hoptrace.v1 import agent_pb2, api_pb2, api_pb2_grpc, trace_pb2
from hoptrace.web import create_app

NS = f"hts-replay-{os.getpid()}"
DEV, PEER = "rpl0", "rpl1"
NODE = "sec-a"
# Where the agent (default --pin-dir) keeps the sequences of the signed commands it took.
COMMAND_STATE = AGENT_PIN_ROOT / f"commands-{NODE}"


class Recording(MessageSigner):
    """The dispatcher's real signer, keeping every command it signed (what someone on the session could
    have copied)."""

    def __init__(self, signer: MessageSigner) -> None:
        super().__init__()
        self.__dict__.update(signer.__dict__)
        self.sent: list[tuple[str, agent_pb2.DispatcherMessage]] = []

    def command(self, node: str, **action: Any) -> agent_pb2.DispatcherMessage:
        """Signed as usual, and kept."""
        message = super().command(node, **action)
        self.sent.append((node, message))
        return message

    def last(self, kind: str, trace: str) -> agent_pb2.DispatcherMessage:
        """The last command of `kind` ("apply", "remove") for trace `trace`."""
        for _, message in reversed(self.sent):
            command = agent_pb2.Command.FromString(message.signed.payload)
            if command.WhichOneof("action") == kind and getattr(command, kind).trace == trace:
                return message
        raise AssertionError(f"no {kind} of {trace} was signed")


@dataclass
class Cluster:
    """The dispatcher, its signer, the agent of NODE and the API as admin."""

    dispatcher: DispatcherServer
    signer: Recording
    agent: DaemonAgent
    metrics: str
    api: api_pb2_grpc.HoptraceStub
    state_dir: Path

    def inject(self, message: agent_pb2.DispatcherMessage) -> None:
        """Put `message` on the agent's session, as someone inside it could."""
        connection = self.dispatcher.registry.connection(NODE)
        assert connection is not None and connection.send(message)

    def refusals(self, kind: str, reason: str) -> float:
        """The agent's counter of refused `kind` commands for `reason`."""
        series = f'hoptrace_agent_signature_refusals_total{{type="{kind}",reason="{reason}"}}'
        with urllib.request.urlopen(f"http://{self.metrics}/metrics", timeout=5) as response:
            for line in response.read().decode().splitlines():
                if line.startswith(series + " "):
                    return float(line.split()[-1])
        raise AssertionError(f"no series {series}")

    def wait_refused(self, kind: str, reason: str, count: float) -> None:
        """Until the agent has counted `count` refusals of `kind` for `reason`."""
        wait_until(
            lambda: self.refusals(kind, reason) >= count,
            f"the agent to count {count:g} {kind} refusal(s) for {reason}",
            15,
        )
        assert self.refusals(kind, reason) == count


def spec(name: str, dev: str = DEV) -> trace_pb2.TraceSpec:
    """One tc-egress hop in the test's namespace."""
    return trace_pb2.TraceSpec(
        name=name,
        filter=trace_pb2.Filter(protocol="udp", dst_port=9),
        hops=[trace_pb2.HopSpec(name=f"{name}-out", node=NODE, at="tc-egress", dev=dev, netns=NS)],
    )


def attached() -> dict[str, int]:
    """How many programs tcx holds on each device of the namespace, by device/direction: the kernel's
    word, not the agent's."""
    found = {}
    for index, dev in ((_ifindex(DEV), DEV), (_ifindex(PEER), PEER)):
        for direction, ids in tcx_programs(f"/run/netns/{NS}", index).items():
            if ids:
                found[f"{dev}/{direction}"] = len(ids)
    return found


def _ifindex(dev: str) -> int:
    link = json.loads(subprocess.check_output(["ip", "-j", "-n", NS, "link", "show", dev]))
    return int(link[0]["ifindex"])


@pytest.fixture(scope="module")
def cluster(certs: CertBundle, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """A namespace with a veth pair; a dispatcher signing with its own certificate (recorded); the agent."""
    subprocess.run(["ip", "netns", "add", NS], check=True)
    workdir = tmp_path_factory.mktemp("replay")
    dispatcher = None
    agent = None
    cluster = None
    try:
        subprocess.run(["ip", "-n", NS, "link", "add", DEV, "type", "veth", "peer", "name", PEER], check=True)
        for dev in (DEV, PEER):
            subprocess.run(["ip", "-n", NS, "link", "set", dev, "up"], check=True)
        files = certs.files("dispatcher")
        signer = Recording(MessageSigner.from_files(files.cert, files.key))
        state_dir = Path(tempfile.mkdtemp(prefix="hoptrace-replay-dispatcher-", dir=workdir))
        dispatcher = DispatcherServer(
            "127.0.0.1:0",
            state_dir,
            compiler=BpfCompiler(cache_dir=workdir / "bpf-cache"),
            tls=files,
            tokens_file=certs.tokens,
            signer=signer,
        ).start()
        metrics = f"127.0.0.1:{free_port()}"
        agent = start_daemon_agent(
            workdir, NODE, dispatcher.address, "", tls_args(certs.agent(NODE)), metrics, default_pins=True
        )
        admin = certs.files("admin")
        channel = api_channel(
            dispatcher.address, ca=admin.ca, cert=admin.cert, key=admin.key, token=certs.token("admin")
        )
        api = api_pb2_grpc.HoptraceStub(channel)
        wait_until(
            lambda: any(a.connected for a in api.ListAgents(api_pb2.ListAgentsRequest(), timeout=5).agents),
            "the agent's session",
            20,
        )
        cluster = Cluster(dispatcher, signer, agent, metrics, api, state_dir)
        yield cluster
        channel.close()
    finally:
        if cluster is not None:
            agent = cluster.agent  # restarted by a test
        if agent is not None:
            agent.stop()
        # The sequences the agents of NODE took, kept beside their pins for the next agent.
        remove_agent_state(NODE)
        if dispatcher is not None:
            dispatcher.stop()
        subprocess.run(["ip", "netns", "del", NS], check=False)


def test_replayed_plan_is_refused_and_counted(cluster: Cluster):
    """A trace applied and deleted: its signed plan, played again on the agent's session, is refused as
    replayed (counted; the agent says so in its answer and its log) and the kernel holds nothing."""
    cluster.api.ApplyTrace(api_pb2.ApplyTraceRequest(spec=spec("replayed")), timeout=60)
    assert attached() == {f"{DEV}/egress": 1}
    plan = cluster.signer.last("apply", "replayed")
    cluster.api.DeleteTrace(api_pb2.DeleteTraceRequest(name="replayed"), timeout=30)
    assert attached() == {}

    cluster.inject(plan)
    cluster.wait_refused("plan", "replayed", 1)
    assert attached() == {}
    log = cluster.agent.wait_log("refused a plan: nothing attached")
    assert "replayed plan command: sequence" in log and 'for trace \\"replayed\\"' in log, log[-2000:]


def test_replay_refused_after_agent_restart(cluster: Cluster, certs: CertBundle):
    """A trace applied and deleted; the agent stops (SIGTERM: nothing of the trace left pinned) and starts
    again, remembering nothing in memory: the trace's plan, played to the new agent, is refused as replayed
    (counted, nothing attached), since the agent kept the sequence it took beside its pins (root's alone)."""
    cluster.api.ApplyTrace(api_pb2.ApplyTraceRequest(spec=spec("restarted")), timeout=60)
    assert attached() == {f"{DEV}/egress": 1}
    plan = cluster.signer.last("apply", "restarted")
    cluster.api.DeleteTrace(api_pb2.DeleteTraceRequest(name="restarted"), timeout=30)
    assert attached() == {}
    assert os.stat(COMMAND_STATE).st_mode & 0o777 == 0o600

    before = cluster.dispatcher.registry.connection(NODE)
    cluster.agent.stop()
    assert cluster.agent.process.returncode == 0, cluster.agent.log()[-2000:]
    cluster.agent = start_daemon_agent(
        cluster.agent.log_path.parent, NODE, cluster.dispatcher.address, "", tls_args(certs.agent(NODE)),
        cluster.metrics, default_pins=True,
    )  # fmt: skip
    wait_until(
        lambda: cluster.dispatcher.registry.connection(NODE) not in (None, before),
        "the restarted agent's session",
        20,
    )
    assert cluster.refusals("plan", "replayed") == 0  # a new process: its counters start at 0

    cluster.inject(plan)
    cluster.wait_refused("plan", "replayed", 1)
    assert attached() == {}
    log = cluster.agent.wait_log("refused a plan: nothing attached")
    assert "replayed plan command: sequence" in log and 'for trace \\"restarted\\"' in log, log[-2000:]


def test_expired_plan_is_refused(cluster: Cluster):
    """A plan the dispatcher signed an hour ago (its expiry a minute later) is refused as expired."""
    plan = agent_pb2.Command.FromString(cluster.signer.last("apply", "replayed").signed.payload).apply
    plan.trace, plan.generation = "expired", 10**9  # never taken: only the expiry refuses it
    old = cluster.signer.command(NODE, apply=plan, signed_at=datetime.now(UTC) - timedelta(hours=1))
    cluster.inject(old)
    cluster.wait_refused("plan", "expired", 1)
    assert attached() == {}
    assert "signed command expired at" in cluster.agent.log()


def test_unsigned_and_forged_removals_are_refused(cluster: Cluster, foreign: CertBundle):
    """While a trace runs, an unsigned RemoveTrace and one whose signature is forged (the dispatcher's
    certificate, another CA's dispatcher key) are refused and counted; the trace stays attached until the
    dispatcher's own signed removal."""
    cluster.api.ApplyTrace(api_pb2.ApplyTraceRequest(spec=spec("kept", dev=PEER)), timeout=60)
    assert attached() == {f"{PEER}/egress": 1}
    generation = cluster.dispatcher.controller.generation_of("kept")

    cluster.inject(
        agent_pb2.DispatcherMessage(remove=agent_pb2.RemoveTrace(trace="kept", generation=generation))
    )
    cluster.wait_refused("remove", "unsigned", 1)
    assert attached() == {f"{PEER}/egress": 1}

    forged = cluster.signer.command(NODE, remove=agent_pb2.RemoveTrace(trace="kept", generation=generation))
    key = serialization.load_pem_private_key(foreign.files("dispatcher").key.read_bytes(), password=None)
    assert isinstance(key, ec.EllipticCurvePrivateKey)
    forged.signed.signature = key.sign(
        signed_bytes(COMMAND_TYPE, NODE, forged.signed.payload), ec.ECDSA(hashes.SHA256())
    )
    cluster.inject(forged)
    cluster.wait_refused("remove", "signature", 1)
    assert attached() == {f"{PEER}/egress": 1}
    log = cluster.agent.wait_log("refused a removal: nothing detached")
    assert 'signature by \\"dispatcher\\" does not match the command\'s bytes' in log, log[-2000:]

    cluster.api.DeleteTrace(api_pb2.DeleteTraceRequest(name="kept"), timeout=30)
    assert attached() == {}
    assert cluster.refusals("remove", "replayed") == 0  # the dispatcher's own removals all passed


def test_audit_names_who_applied_and_removed(cluster: Cluster, certs: CertBundle):
    """Alice applies a trace through the web UI (the web's certificate and operator token), the admin removes
    it with the API: ListAudit, `hoptrace audit` (table and --json) and the web's audit page name each caller
    (token, role, certificate, the web's user), the trace, its generation and the outcome; a refused apply is
    there as failed; the trail outlives the dispatcher (a new one on the same state directory serves it)."""
    web = certs.files("web")
    app = create_app(
        {
            "TESTING": True,
            "SECRET_KEY": "test-secret",
            "USERS": {"alice": generate_password_hash("alice-password")},
            "DISPATCHER": cluster.dispatcher.address,
            "DISPATCHER_CHANNEL_FACTORY": lambda: api_channel(
                cluster.dispatcher.address, ca=web.ca, cert=web.cert, key=web.key, token=certs.token("web")
            ),
        }
    )
    browser = app.test_client()

    def csrf(path: str) -> str:
        match = re.search(r'name="csrf_token" value="([^"]+)"', browser.get(path).text)
        assert match, path
        return match.group(1)

    login = {"username": "alice", "password": "alice-password", "csrf_token": csrf("/login")}
    assert browser.post("/login", data=login).status_code == 302
    form = {"spec": spec_to_yaml(spec("audited")), "action": "apply", "csrf_token": csrf("/traces/yaml")}
    applied = browser.post("/traces/yaml", data=form)
    assert applied.status_code == 302, applied.text
    generation = cluster.dispatcher.controller.generation_of("audited")
    assert generation > 0
    cluster.api.DeleteTrace(api_pb2.DeleteTraceRequest(name="audited"), timeout=30)
    with pytest.raises(grpc.RpcError) as refused:  # a device the node does not have
        cluster.api.ApplyTrace(api_pb2.ApplyTraceRequest(spec=spec("audited", dev="nosuch0")), timeout=30)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT

    entries = cluster.api.ListAudit(api_pb2.ListAuditRequest(trace="audited"), timeout=5).entries
    seen = [
        (
            e.action,
            e.token,
            e.token_role,
            e.certificate,
            e.certificate_role,
            e.on_behalf_of,
            e.generation,
            e.outcome,
        )
        for e in entries
    ]
    assert seen[:2] == [
        ("apply", "web", "operator", "web", "client", "alice", generation, "ok"),
        ("delete", "admin", "admin", "admin", "client", "", generation, "ok"),
    ], seen
    assert seen[2][:2] == ("apply", "admin") and seen[2][-1] == "failed", seen
    assert entries[2].error.startswith("invalid trace spec:") and "nosuch0" in entries[2].error
    assert all(e.peer.startswith("ipv4:127.0.0.1:") and e.at.seconds for e in entries)

    admin = certs.files("admin")
    env = {
        **os.environ,
        CA_ENV: str(admin.ca),
        CERT_ENV: str(admin.cert),
        KEY_ENV: str(admin.key),
        TOKEN_ENV: certs.token("admin"),
    }
    cli = [*HOPTRACE, "--dispatcher", cluster.dispatcher.address, "audit", "--trace", "audited"]
    table = subprocess.run(cli, capture_output=True, text=True, timeout=60, env=env, check=True).stdout
    lines = table.splitlines()
    assert lines[0].split() == [
        "TIME",
        "ACTION",
        "WHO",
        "ROLE",
        "CERTIFICATE",
        "TRACE",
        "GENERATION",
        "OUTCOME",
    ]
    assert "apply" in lines[1] and "alice via web" in lines[1] and "operator" in lines[1], table
    assert f"audited  {generation}" in lines[1] and lines[1].rstrip().endswith("ok"), table
    assert "delete" in lines[2] and "admin (client)" in lines[2] and lines[2].rstrip().endswith("ok"), table
    assert lines[3].rstrip().endswith("failed: invalid trace spec:"), table
    as_json = json.loads(
        subprocess.run(
            [*cli, "--json"], capture_output=True, text=True, timeout=60, env=env, check=True
        ).stdout
    )
    assert [(e["action"], e["who"], e["outcome"]) for e in as_json] == [
        ("apply", "alice via web", "ok"),
        ("delete", "admin", "ok"),
        ("apply", "admin", "failed"),
    ]

    page = browser.get("/audit/?trace=audited")
    assert page.status_code == 200, page.text
    rows = re.findall(r'<tr data-action="(\w+)" data-outcome="(\w+)">(.*?)</tr>', page.text, re.DOTALL)
    assert [(action, outcome) for action, outcome, _ in rows] == [
        ("apply", "failed"),
        ("delete", "ok"),
        ("apply", "ok"),
    ], page.text  # newest first
    assert "alice via web" in rows[2][2] and "operator" in rows[2][2] and f">{generation}<" in rows[2][2]

    # The trail is in the state directory: another dispatcher started on it serves the same entries.
    again = DispatcherServer(
        "127.0.0.1:0", cluster.state_dir, compiler=cluster.dispatcher.compiler, tls=certs.files("dispatcher"),
        tokens_file=certs.tokens,
    ).start()  # fmt: skip
    try:
        with api_channel(
            again.address, ca=admin.ca, cert=admin.cert, key=admin.key, token=certs.token("admin")
        ) as channel:
            reread = api_pb2_grpc.HoptraceStub(channel).ListAudit(api_pb2.ListAuditRequest(), timeout=5)
        assert [e for e in reread.entries if e.trace == "audited"] == list(entries)
    finally:
        again.stop()
