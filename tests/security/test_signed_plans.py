"""Signed plans and presets: the real dispatcher signs what it sends, the real agent loads only
what a dispatcher certificate of its CA signed for it. A plan changed after signing (in transit), one signed
by another identity or another CA, or an unsigned one is refused with the node and the reason, shown to the
user, counted in the agent's /metrics, and nothing is attached (asked of the kernel, not of the agent)."""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import json_format
from security_helpers import DaemonAgent, start_daemon_agent, tls_args

from hoptrace.common.certs import CertBundle
from hoptrace.common.grpcutil import CA_ENV, CERT_ENV, KEY_ENV, TOKEN_ENV, api_channel
from hoptrace.dispatcher.compile import BpfCompiler
from hoptrace.dispatcher.server import DispatcherServer
from hoptrace.dispatcher.signing import PLAN_TYPE, MessageSigner
from hoptrace.lab.bpfstate import bpf_fds, bpftool_json, tcx_programs
from hoptrace.lab.localcluster import AGENT_BINARY, HOPTRACE, REPO, free_port
from hoptrace.v1 import agent_pb2, api_pb2, api_pb2_grpc, trace_pb2

NS = f"hts-sign-{os.getpid()}"
DEV, PEER = "sgn0", "sgn1"
NODE = "sec-a"
GENERIC_OBJECT = REPO / "kernel-patch" / "build" / "hoptrace.bpf.o"


@pytest.fixture(scope="module")
def netns() -> Iterator[str]:
    """A namespace of the test's own with a veth pair (sgn0, sgn1) for the hops; no traffic leaves it."""
    subprocess.run(["ip", "netns", "add", NS], check=True)
    try:
        subprocess.run(["ip", "-n", NS, "link", "add", DEV, "type", "veth", "peer", "name", PEER], check=True)
        for dev in (DEV, PEER):
            subprocess.run(["ip", "-n", NS, "link", "set", dev, "up"], check=True)
        yield NS
    finally:
        subprocess.run(["ip", "netns", "del", NS], check=False)


@pytest.fixture(scope="module")
def compiler(tmp_path_factory: pytest.TempPathFactory) -> BpfCompiler:
    """The dispatcher's real compiler, its cache shared by the dispatchers of this module."""
    return BpfCompiler(cache_dir=tmp_path_factory.mktemp("bpf-cache"))


def tcx_attached() -> dict[str, list[int]]:
    """The programs tcx has on each device of the namespace, both directions: the kernel's word."""
    found: dict[str, list[int]] = {}
    for link in json.loads(subprocess.check_output(["ip", "-j", "-n", NS, "link", "show"])):
        for direction, ids in tcx_programs(f"/run/netns/{NS}", int(link["ifindex"])).items():
            if ids:
                found[f"{link['ifname']}/{direction}"] = ids
    return found


def program_names(ids: list[int]) -> list[str]:
    """The names of BPF programs by ID."""
    names = {p["id"]: p.get("name", "") for p in bpftool_json("prog", "show") or []}
    return [names.get(i, "?") for i in ids]


def spec(name: str) -> trace_pb2.TraceSpec:
    """One tc-egress hop on sgn0 in the test's namespace."""
    return trace_pb2.TraceSpec(
        name=name,
        filter=trace_pb2.Filter(protocol="udp", dst_port=9),
        hops=[trace_pb2.HopSpec(name="sgn-out", node=NODE, at="tc-egress", dev=DEV, netns=NS)],
    )


def metric(address: str, series: str) -> float:
    """One series of the agent's /metrics."""
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=5) as response:
        for line in response.read().decode().splitlines():
            if line.startswith(series + " "):
                return float(line.split()[-1])
    raise AssertionError(f"no series {series} on {address}/metrics")


class InTransit(MessageSigner):
    """The dispatcher's real signer, whose signed plans an attacker on the way changes (`edit`)."""

    def __init__(self, signer: MessageSigner, edit: Callable[[agent_pb2.TracePlan], None]) -> None:
        super().__init__()
        self.__dict__.update(signer.__dict__)
        self.edit = edit

    def command(self, node: str, **action: Any) -> agent_pb2.DispatcherMessage:
        """Signed as usual, then the plan changed (removals and presets pass unchanged)."""
        message = super().command(node, **action)
        if action.get("apply") is not None:
            command = agent_pb2.Command.FromString(message.signed.payload)
            self.edit(command.apply)
            message.signed.payload = command.SerializeToString()
        return message


def flip_last_object_byte(plan: agent_pb2.TracePlan) -> None:
    """One bit of the compiled object."""
    plan.object = plan.object[:-1] + bytes([plan.object[-1] ^ 1])


def move_to_peer(plan: agent_pb2.TracePlan) -> None:
    """The attach plan: the hop on the other device."""
    plan.hops[0].dev = PEER


@contextmanager
def dispatcher_with(
    certs: CertBundle, compiler: BpfCompiler, workdir: Path, signer: object | None
) -> Iterator[tuple[api_pb2_grpc.HoptraceStub, DaemonAgent, str, str]]:
    """A real dispatcher (mTLS, tokens) signing with `signer` (None: its own certificate), the real agent of
    NODE connected to it; yields the API, the agent, its /metrics address and the dispatcher's address."""
    dispatcher = DispatcherServer(
        "127.0.0.1:0",
        tempfile.mkdtemp(prefix="hoptrace-sign-dispatcher-"),
        compiler=compiler,
        tls=certs.files("dispatcher"),
        tokens_file=certs.tokens,
        signer=signer,  # type: ignore[arg-type]
    ).start()
    metrics = f"127.0.0.1:{free_port()}"
    agent = start_daemon_agent(
        workdir, NODE, dispatcher.address, "127.0.0.1:1", tls_args(certs.agent(NODE)), metrics
    )
    admin = certs.files("admin")
    channel = api_channel(
        dispatcher.address, ca=admin.ca, cert=admin.cert, key=admin.key, token=certs.token("admin")
    )
    stub = api_pb2_grpc.HoptraceStub(channel)
    try:
        deadline = time.monotonic() + 20
        while not any(a.connected for a in stub.ListAgents(api_pb2.ListAgentsRequest(), timeout=5).agents):
            assert time.monotonic() < deadline, f"agent never connected:\n{agent.log()[-3000:]}"
            assert agent.process.poll() is None, f"agent exited:\n{agent.log()[-3000:]}"
            time.sleep(0.2)
        yield stub, agent, metrics, dispatcher.address
    finally:
        agent.stop()
        channel.close()
        dispatcher.stop()


def cli_apply(
    certs: CertBundle, dispatcher: str, workdir: Path, name: str
) -> subprocess.CompletedProcess[str]:
    """`hoptrace trace apply -f SPEC` as the admin: what a user runs and sees."""
    spec_file = workdir / f"{name}.json"
    spec_file.write_text(json_format.MessageToJson(spec(name), preserving_proto_field_name=True))
    admin = certs.files("admin")
    env = {
        **os.environ,
        CA_ENV: str(admin.ca),
        CERT_ENV: str(admin.cert),
        KEY_ENV: str(admin.key),
        TOKEN_ENV: certs.token("admin"),
    }
    return subprocess.run(
        [*HOPTRACE, "--dispatcher", dispatcher, "trace", "apply", "-f", str(spec_file)],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )


def test_signed_plan_is_attached(certs: CertBundle, compiler, netns, workdir):
    """The dispatcher signs with its own certificate: the trace applies, the kernel shows hop_tc on sgn0's
    egress, nothing is counted as refused; deleting the trace detaches it."""
    with dispatcher_with(certs, compiler, workdir, None) as (stub, agent, metrics, _):
        trace = stub.ApplyTrace(api_pb2.ApplyTraceRequest(spec=spec("signed")), timeout=60)
        assert [status.active for status in trace.nodes] == [True], trace
        attached = tcx_attached()
        assert list(attached) == [f"{DEV}/egress"], attached
        assert program_names(attached[f"{DEV}/egress"]) == ["hop_tc"]
        assert bpf_fds(agent.process.pid)["link"], "the agent holds no link"
        for reason in (
            "unsigned",
            "node",
            "certificate",
            "revoked",
            "role",
            "signature",
            "payload",
            "expired",
            "replayed",
        ):
            series = f'hoptrace_agent_signature_refusals_total{{type="plan",reason="{reason}"}}'
            assert metric(metrics, series) == 0, reason
        stub.DeleteTrace(api_pb2.DeleteTraceRequest(name="signed"), timeout=30)
        assert tcx_attached() == {}


@pytest.mark.parametrize(
    ("case", "reason", "message"),
    [
        (
            "object byte changed in transit",
            "signature",
            'signature by "dispatcher" does not match the command\'s bytes',
        ),
        (
            "attach device changed in transit",
            "signature",
            'signature by "dispatcher" does not match the command\'s bytes',
        ),
        (
            "signed by an agent's certificate",
            "role",
            'signer certificate "sec-b" has role [agent], not dispatcher',
        ),
        (
            "signed by the collector's certificate",
            "role",
            'signer certificate "collector" has role [collector]',
        ),
        (
            "dispatcher certificate of another CA",
            "certificate",
            'signer certificate "dispatcher" is not one of the trusted CA',
        ),
        (
            "unsigned",
            "unsigned",
            "not signed: this agent trusts a CA and takes only plans signed by a dispatcher",
        ),
    ],
)
def test_plan_refused_and_nothing_attached(
    certs: CertBundle, foreign: CertBundle, compiler, netns, workdir, case, reason, message
):
    """ApplyTrace fails naming the node and the reason, the CLI prints the same without a traceback, the
    trace is not applied, the kernel has nothing on either device, the agent holds no program, and the
    refusal is counted under its reason."""
    own = MessageSigner.from_files(certs.files("dispatcher").cert, certs.files("dispatcher").key)
    signer = {
        "object byte changed in transit": InTransit(own, flip_last_object_byte),
        "attach device changed in transit": InTransit(own, move_to_peer),
        "signed by an agent's certificate": MessageSigner.from_files(
            certs.agent("sec-b").cert, certs.agent("sec-b").key
        ),
        "signed by the collector's certificate": MessageSigner.from_files(
            certs.files("collector").cert, certs.files("collector").key
        ),
        "dispatcher certificate of another CA": MessageSigner.from_files(
            foreign.files("dispatcher").cert, foreign.files("dispatcher").key
        ),
        "unsigned": MessageSigner(),
    }[case]
    with dispatcher_with(certs, compiler, workdir, signer) as (stub, agent, metrics, address):
        with pytest.raises(grpc.RpcError) as refused:
            stub.ApplyTrace(api_pb2.ApplyTraceRequest(spec=spec("refused")), timeout=60)
        assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        details = refused.value.details()
        assert f"node {NODE}: plan refused, nothing attached: {message}" in details, details
        assert "removed from every node (nothing applied)" in details
        assert stub.ListTraces(api_pb2.ListTracesRequest(), timeout=5).traces == []
        assert tcx_attached() == {}
        assert bpf_fds(agent.process.pid) == {"link": set(), "prog": set()}

        result = cli_apply(certs, address, workdir, "refused-cli")
        assert result.returncode == 1, result.stdout + result.stderr
        assert f"node {NODE}: plan refused, nothing attached: {message}" in result.stderr, result.stderr
        assert "Traceback" not in result.stderr
        assert tcx_attached() == {}

        series = f'hoptrace_agent_signature_refusals_total{{type="plan",reason="{reason}"}}'
        assert metric(metrics, series) == 2  # the API's apply and the CLI's
        assert "refused a plan: nothing attached" in agent.log()


def test_preset_signed_by_another_identity_is_refused(certs: CertBundle, compiler, netns, workdir):
    """RunPreset through a dispatcher that signs with the collector's certificate: the user gets the node and
    the reason, the agent runs nothing (no program loaded) and counts it."""
    signer = MessageSigner.from_files(certs.files("collector").cert, certs.files("collector").key)
    with dispatcher_with(certs, compiler, workdir, signer) as (stub, agent, metrics, _):
        request = api_pb2.RunPresetRequest(node=NODE, preset="mace", args={"container": NS, "duration": "1s"})
        with pytest.raises(grpc.RpcError) as refused:
            stub.RunPreset(request, timeout=60)
        assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert refused.value.details() == (
            f'node {NODE}: mace failed: preset refused, nothing run: signer certificate "collector" has role '
            "[collector], not dispatcher: only the dispatcher signs plans and presets"
        )
        assert bpf_fds(agent.process.pid) == {"link": set(), "prog": set()}
        assert metric(metrics, 'hoptrace_agent_signature_refusals_total{type="preset",reason="role"}') == 1


def standalone_plan(obj: bytes) -> agent_pb2.TracePlan:
    """The generic object (bytes, not a path) on sgn0's egress."""
    plan = agent_pb2.TracePlan(trace="standalone", generation=1, object=obj, sample=1)
    plan.hops.add(
        hop_index=0, name="sgn-out", kind=trace_pb2.ATTACH_KIND_TC_EGRESS, program="hop_tc", dev=DEV
    )
    plan.hops[0].netns = NS
    return plan


def run_agent(plan_file: Path, *args: str) -> subprocess.Popen[str]:
    """`hoptrace-agent run --plan FILE --node NODE --out -` with `args`."""
    argv = [str(AGENT_BINARY), "run", "--plan", str(plan_file), "--node", NODE, "--out", "-"]
    return subprocess.Popen(
        [*argv, "--metrics-listen", "", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def test_standalone_signed_plan_file(certs: CertBundle, netns, tmp_path):
    """`run --plan` takes a plan file signed with the dispatcher's certificate (`hoptrace plan sign`, checked
    against --ca) and attaches it; one signed by an agent's certificate, or a bare plan without
    --allow-unsigned-plan, is refused with the reason and nothing attached."""
    plan = standalone_plan(GENERIC_OBJECT.read_bytes())
    payload = plan.SerializeToString()

    def write(name: str, signer: MessageSigner) -> Path:
        path = tmp_path / name
        path.write_text(json_format.MessageToJson(signer.sign(PLAN_TYPE, NODE, payload)))
        return path

    # `hoptrace plan sign` embeds the object a plan names and signs the whole for one node.
    by_path = agent_pb2.TracePlan()
    by_path.CopyFrom(plan)
    by_path.ClearField("object")
    by_path.object_path = str(GENERIC_OBJECT)
    (tmp_path / "plan.json").write_text(json_format.MessageToJson(by_path))
    dispatcher = certs.files("dispatcher")
    signed = tmp_path / "signed.json"
    subprocess.run(
        [*HOPTRACE, "plan", "sign", str(tmp_path / "plan.json"), "--node", NODE, "--out", str(signed)]
        + ["--signer-cert", str(dispatcher.cert), "--signer-key", str(dispatcher.key)],
        check=True,
        timeout=60,
    )
    message = json_format.Parse(signed.read_text(), agent_pb2.SignedMessage())
    assert agent_pb2.TracePlan.FromString(message.payload) == plan
    agent = run_agent(signed, "--ca", str(certs.ca))
    try:
        assert agent.stdout is not None
        status = json.loads(agent.stdout.readline())
        assert status["type"] == "status" and status.get("active"), status
        attached = tcx_attached()
        assert list(attached) == [f"{DEV}/egress"] and program_names(attached[f"{DEV}/egress"]) == ["hop_tc"]
    finally:
        agent.terminate()
        agent.communicate(timeout=20)
    assert tcx_attached() == {}

    by_agent = write("by-agent.json", MessageSigner.from_files(certs.agent(NODE).cert, certs.agent(NODE).key))
    bare = tmp_path / "bare.json"
    bare.write_text(json_format.MessageToJson(plan))
    for path, args, reason in [
        (
            by_agent,
            ["--ca", str(certs.ca)],
            'refused, nothing attached: signer certificate "sec-a" has role [agent]',
        ),
        (signed, [], "is signed: pass --ca"),
        (bare, ["--ca", str(certs.ca)], "is not signed: sign it"),
    ]:
        agent = run_agent(path, *args)
        out, err = agent.communicate(timeout=30)
        assert agent.returncode == 1, out + err
        assert reason in err, err
        assert tcx_attached() == {}
