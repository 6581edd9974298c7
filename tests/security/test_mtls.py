"""Mutual TLS: only agents with a certificate of the cluster's CA, for their own node, get in; agents only
take plans from the real dispatcher. Real processes (dispatcher, collector, hoptrace-agent), real TLS."""

from __future__ import annotations

import tempfile

import grpc
import pytest
from security_helpers import never, register_as, start_daemon_agent, stream_as, tls_args

from hoptrace.common.certs import CertBundle
from hoptrace.common.grpcutil import TLSFiles
from hoptrace.dispatcher.server import DispatcherServer
from hoptrace.lab.localcluster import LocalCluster
from hoptrace.v1 import api_pb2


def connected_nodes(cluster: LocalCluster) -> set[str]:
    """Nodes the dispatcher has registered and connected now."""
    agents = cluster.api().ListAgents(api_pb2.ListAgentsRequest(), timeout=5).agents
    return {agent.registration.node for agent in agents if agent.connected}


def test_agent_with_its_own_certificate_registers(servers: LocalCluster, certs: CertBundle, workdir):
    """The control: a correct certificate gets the node registered (so the refusals below mean something)."""
    agent = start_daemon_agent(
        workdir, "sec-b", servers.dispatcher_addr, servers.collector_addr, tls_args(certs.agent("sec-b"))
    )
    try:
        assert not never(lambda: "sec-b" in connected_nodes(servers), 15), agent.log()
        assert "will refuse" not in agent.log()
    finally:
        agent.stop()


@pytest.mark.parametrize(
    ("case", "expected_log"),
    [
        # The server drops the connection in the handshake: gRPC-Go sees no HTTP/2 preface.
        ("certificate of another CA", "error reading server preface"),
        ("certificate of another node", "cannot speak for node 'sec-a'"),
        ("plaintext (--insecure)", "dispatcher session ended"),
    ],
)
def test_dispatcher_refuses_agent_without_valid_certificate(
    servers: LocalCluster, certs: CertBundle, foreign: CertBundle, workdir, case: str, expected_log: str
):
    """The real agent, started as node sec-a with a bad identity, never registers; its log says why."""
    args = {
        "certificate of another CA": tls_args(foreign.agent("sec-a"), ca=certs.ca),
        "certificate of another node": tls_args(certs.agent("sec-b")),
        "plaintext (--insecure)": ["--insecure"],
    }[case]
    agent = start_daemon_agent(workdir, "sec-a", servers.dispatcher_addr, servers.collector_addr, args)
    try:
        log = agent.wait_log(expected_log)
        assert never(lambda: "sec-a" in connected_nodes(servers), 4), f"{case}: sec-a registered"
        if case != "plaintext (--insecure)":
            assert "will refuse this agent's certificate" in log  # the agent's early warning
        if case != "certificate of another node":  # (a session refused by name sends no records)
            agent.wait_log("collector stream ended")  # the collector refuses the connection as well
        assert agent.process.poll() is None, "the agent keeps retrying (the operator may fix its files)"
    finally:
        agent.stop()


@pytest.mark.parametrize("service", ["dispatcher", "collector"])
def test_servers_refuse_every_bad_identity(
    servers: LocalCluster, certs: CertBundle, foreign: CertBundle, service
):
    """AgentSession and StreamRecords, over real TLS from this process: only sec-a's own certificate may
    speak for sec-a; no certificate, another CA, plaintext, another node and a non-agent role are refused."""
    address = servers.dispatcher_addr if service == "dispatcher" else servers.collector_addr
    call = register_as if service == "dispatcher" else stream_as
    ca = certs.ca

    assert call(address, "sec-a", ca, certs.agent("sec-a")) == (grpc.StatusCode.OK, "")

    code, details = call(address, "sec-a", ca, None)  # TLS, but no client certificate
    assert code == grpc.StatusCode.UNAVAILABLE, details
    code, details = call(address, "sec-a", ca, foreign.agent("sec-a"))  # another CA
    assert code == grpc.StatusCode.UNAVAILABLE, details
    code, details = call(address, "sec-a", None, None)  # plaintext
    assert code == grpc.StatusCode.UNAVAILABLE, details
    code, details = call(address, "sec-a", ca, certs.agent("sec-b"))  # another node's certificate
    assert (code, details) == (
        grpc.StatusCode.PERMISSION_DENIED,
        "the certificate of node 'sec-b' cannot speak for node 'sec-a'",
    )
    code, details = call(address, "admin", ca, certs.files("admin"))  # a user's certificate
    assert code == grpc.StatusCode.PERMISSION_DENIED
    assert details == "certificate 'admin' has role 'client', not an agent certificate"


@pytest.mark.parametrize(
    ("impostor", "expected_log"),
    [
        ("dispatcher certificate of another CA", "certificate signed by unknown authority"),
        (
            "the collector's certificate",
            "has role [collector], not dispatcher",
        ),
    ],
)
def test_agent_takes_plans_only_from_the_real_dispatcher(
    certs: CertBundle, foreign: CertBundle, workdir, impostor: str, expected_log: str
):
    """A server that is not the cluster's dispatcher never gets the agent's session (so it cannot push plans),
    even with a certificate of the same CA issued to another component."""
    server_tls = {
        "dispatcher certificate of another CA": foreign.files("dispatcher"),
        "the collector's certificate": certs.files("collector"),
    }[impostor]
    fake = DispatcherServer(
        "127.0.0.1:0",
        tempfile.mkdtemp(prefix="hoptrace-fake-dispatcher-"),
        tls=TLSFiles(certs.ca, server_tls.cert, server_tls.key),  # trusts our agents
        tokens_file=certs.tokens,
    ).start()
    agent = start_daemon_agent(workdir, "sec-a", fake.address, "127.0.0.1:1", tls_args(certs.agent("sec-a")))
    try:
        agent.wait_log(expected_log)
        assert fake.registry.agents() == [], f"the agent registered with {impostor}"
    finally:
        agent.stop()
        fake.stop()
