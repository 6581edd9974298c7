"""The agent's program allowlist: an object whose program calls a forbidden helper is refused before
anything is loaded, with an error naming the program and the helper, in the standalone agent and through the
dispatcher (as if the dispatcher's compiler had been subverted)."""

from __future__ import annotations

import json
import subprocess
import tempfile

import grpc
import pytest
from security_helpers import build_evil_object, start_daemon_agent, tls_args

from hoptrace.common.certs import CertBundle
from hoptrace.common.grpcutil import api_channel
from hoptrace.dispatcher.server import DispatcherServer
from hoptrace.lab.localcluster import AGENT_BINARY
from hoptrace.v1 import api_pb2, api_pb2_grpc, trace_pb2


def plan_for(obj) -> dict:
    """A one-hop plan (tc-egress on lo) running `obj`."""
    return {
        "trace": "evil",
        "generation": "1",
        "objectPath": str(obj),
        "hops": [
            {
                "hopIndex": 0,
                "name": "lo-out",
                "kind": "ATTACH_KIND_TC_EGRESS",
                "program": "hop_tc",
                "dev": "lo",
            }
        ],
    }


@pytest.mark.parametrize(
    ("helper", "verdict", "reason"),
    [
        ("bpf_probe_write_user", 0, "calls bpf_probe_write_user"),
        ("bpf_send_signal", 0, "calls bpf_send_signal"),
        ("bpf_override_return", 0, "calls bpf_override_return"),
        # TC_ACT_SHOT and bpf_clone_redirect took a namespace to 100 % loss
        ("bpf_clone_redirect", 0, "calls bpf_clone_redirect"),
        ("bpf_redirect", 0, "calls bpf_redirect"),
        ("", 2, "returns 2, which is not TC_ACT_OK or TC_ACT_UNSPEC"),
    ],
)
def test_standalone_agent_refuses_what_hoptrace_programs_never_do(helper, verdict, reason, tmp_path):
    """`hoptrace-agent run --plan` prints a failed status naming program and reason, and exits non-zero."""
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(plan_for(build_evil_object(tmp_path, helper, verdict))))
    result = subprocess.run(
        [str(AGENT_BINARY), "run", "--plan", str(plan), "--allow-unsigned-plan", "--out", "-"]
        + ["--metrics-listen", ""],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1, result.stdout + result.stderr
    statuses = [json.loads(line) for line in result.stdout.splitlines() if '"type":"status"' in line]
    assert len(statuses) == 1, result.stdout
    assert statuses[0]["error"] == f"program hop_tc {reason} (not allowed)"
    assert not statuses[0].get("active")
    assert f"program hop_tc {reason} (not allowed)" in result.stderr
    # Nothing was loaded: no program of that name exists.
    progs = subprocess.run(["bpftool", "-j", "prog", "show"], capture_output=True, text=True, check=True)
    assert not any(
        p.get("name") == "hop_tc" and p.get("type") == "sched_cls" for p in json.loads(progs.stdout)
    )


class SubvertedCompiler:
    """Stands in for the dispatcher's BpfCompiler and hands out an object calling a forbidden helper."""

    def __init__(self, obj: bytes) -> None:
        self.obj = obj

    def warm_up(self) -> None:
        """Nothing to prepare."""

    def compile_plans(self, plans, parallel: int = 4) -> None:
        """Every plan gets the evil object."""
        for plan in plans.values():
            plan.object = self.obj


def test_agent_refuses_forbidden_helper_pushed_by_dispatcher(certs: CertBundle, tmp_path):
    """Through mTLS, the dispatcher and the agent's session: ApplyTrace fails with the agent's refusal and
    the trace is not applied."""
    obj = build_evil_object(tmp_path, "bpf_probe_write_user").read_bytes()
    dispatcher = DispatcherServer(
        "127.0.0.1:0",
        tempfile.mkdtemp(prefix="hoptrace-evil-dispatcher-"),
        compiler=SubvertedCompiler(obj),  # type: ignore[arg-type]
        tls=certs.files("dispatcher"),
        tokens_file=certs.tokens,
    ).start()
    agent = start_daemon_agent(
        tmp_path, "sec-a", dispatcher.address, "127.0.0.1:1", tls_args(certs.agent("sec-a"))
    )
    admin = certs.files("admin")
    stub = api_pb2_grpc.HoptraceStub(
        api_channel(
            dispatcher.address, ca=admin.ca, cert=admin.cert, key=admin.key, token=certs.token("admin")
        )
    )
    try:
        agent.wait_log("dispatcher", timeout_s=5)  # started
        for _ in range(100):
            if any(a.connected for a in stub.ListAgents(api_pb2.ListAgentsRequest(), timeout=5).agents):
                break
            agent.wait_log("", timeout_s=0.1)
        spec = trace_pb2.TraceSpec(
            name="evil",
            filter=trace_pb2.Filter(protocol="udp"),
            hops=[trace_pb2.HopSpec(name="lo-out", node="sec-a", at="tc-egress", dev="lo")],
        )
        with pytest.raises(grpc.RpcError) as refused:
            stub.ApplyTrace(api_pb2.ApplyTraceRequest(spec=spec), timeout=30)
        assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "program hop_tc calls bpf_probe_write_user (not allowed)" in refused.value.details()
        assert stub.ListTraces(api_pb2.ListTracesRequest(), timeout=5).traces == []
    finally:
        agent.stop()
        dispatcher.stop()
