"""Certificate revocation: `hoptrace revoke` adds certificates to the CA's CRL, and the servers started with
`--crl` refuse them from then on, without a restart: the dispatcher (a `hoptrace dispatcher` process) refuses
the admin's calls with the reason, ends the revoked agent's open session and refuses it again; the
collector's receiver refuses a revoked agent's records. Certificates not on the list keep working."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from security_helpers import start_daemon_agent, stream_as, tls_args

from hoptrace.collector.receiver import CollectorReceiver, ReceiverConfig, start_receiver
from hoptrace.common.certs import CertBundle, create_bundle
from hoptrace.common.grpcutil import CA_ENV, CERT_ENV, KEY_ENV, TOKEN_ENV, TLSFiles, api_channel
from hoptrace.lab.localcluster import HOPTRACE, free_port
from hoptrace.lab.waiting import wait_until
from hoptrace.v1 import api_pb2, api_pb2_grpc


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> CertBundle:
    """A CA of this module's own (its CRL is changed here), agents sec-a and sec-b."""
    return create_bundle(tmp_path_factory.mktemp("revocation-certs"), agents=["sec-a", "sec-b"])


@pytest.fixture
def dispatcher(pki: CertBundle, tmp_path: Path) -> Iterator[str]:
    """`hoptrace dispatcher --crl ca.crl` (mutual TLS, tokens); yields its address."""
    address = f"127.0.0.1:{free_port()}"
    files = pki.files("dispatcher")
    argv = [*HOPTRACE, "dispatcher", "--listen", address, "--state-dir", str(tmp_path / "state")]
    argv += ["--ca", str(files.ca), "--cert", str(files.cert), "--key", str(files.key), "--crl", str(pki.crl)]
    with open(tmp_path / "dispatcher.log", "wb") as log:
        process = subprocess.Popen([*argv, "--tokens", str(pki.tokens)], stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_until(lambda: _answers(pki, address, "web") or process.poll() is not None, "the dispatcher", 30)
        assert process.poll() is None, (tmp_path / "dispatcher.log").read_text()
        yield address
    finally:
        process.terminate()
        process.wait(15)


def _api(pki: CertBundle, address: str, name: str) -> tuple[grpc.Channel, api_pb2_grpc.HoptraceStub]:
    files = pki.files(name)
    channel = api_channel(address, ca=files.ca, cert=files.cert, key=files.key, token=pki.token(name))
    return channel, api_pb2_grpc.HoptraceStub(channel)


def _answers(pki: CertBundle, address: str, name: str) -> bool:
    channel, api = _api(pki, address, name)
    with channel:
        try:
            api.GetVersion(api_pb2.GetVersionRequest(), timeout=2)
            return True
        except grpc.RpcError:
            return False


def _refusal(pki: CertBundle, address: str, name: str) -> tuple[grpc.StatusCode, str] | None:
    """How the dispatcher answers `name`'s ListAgents: None when it answers."""
    channel, api = _api(pki, address, name)
    with channel:
        try:
            api.ListAgents(api_pb2.ListAgentsRequest(), timeout=5)
            return None
        except grpc.RpcError as error:
            return error.code(), error.details() or ""


def _connected(pki: CertBundle, address: str) -> set[str]:
    channel, api = _api(pki, address, "web")
    with channel:
        return {
            a.registration.node
            for a in api.ListAgents(api_pb2.ListAgentsRequest(), timeout=5).agents
            if a.connected
        }


def _cli(pki: CertBundle, address: str, *args: str) -> subprocess.CompletedProcess[str]:
    admin = pki.files("admin")
    env = {**os.environ, CA_ENV: str(admin.ca), CERT_ENV: str(admin.cert), KEY_ENV: str(admin.key)}
    env[TOKEN_ENV] = pki.token("admin")
    return subprocess.run(
        [*HOPTRACE, "--dispatcher", address, *args], capture_output=True, text=True, timeout=60, env=env
    )


def test_revoked_certificates_are_refused_without_a_restart(pki: CertBundle, dispatcher: str, tmp_path: Path):
    """Before: the admin's CLI and the agent sec-a work, and the collector takes sec-b's records. `hoptrace
    revoke admin agent-sec-a agent-sec-b` replaces the CRL; within the servers' poll (1 s) and the agent's
    heartbeat (2 s), the admin's calls and CLI fail saying the certificate is revoked, the agent's open
    session ends and it cannot register again, the collector refuses sec-b's records; the web's certificate
    still works."""
    collector = pki.files("collector")
    tls = TLSFiles.of(collector.ca, collector.cert, collector.key, pki.crl)
    receiver, port = start_receiver(
        CollectorReceiver(lambda batch: None), ReceiverConfig(listen="127.0.0.1:0", tls=tls)
    )
    agent = start_daemon_agent(tmp_path, "sec-a", dispatcher, "", tls_args(pki.agent("sec-a")))
    try:
        wait_until(lambda: "sec-a" in _connected(pki, dispatcher), "sec-a's session", 20)
        assert _refusal(pki, dispatcher, "admin") is None
        before = _cli(pki, dispatcher, "agents")
        assert before.returncode == 0 and "sec-a" in before.stdout, before.stderr
        collector_address = f"127.0.0.1:{port}"
        assert stream_as(collector_address, "sec-b", pki.ca, pki.agent("sec-b")) == (grpc.StatusCode.OK, "")

        revoked = subprocess.run(
            [*HOPTRACE, "revoke", "admin", "agent-sec-a", "agent-sec-b", "--out", str(pki.out)],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        assert revoked.stdout.count("revoked ") == 3, revoked.stdout

        code, details = wait_until(
            lambda: _refusal(pki, dispatcher, "admin"), "the dispatcher to refuse the admin", 10
        )
        assert code == grpc.StatusCode.UNAUTHENTICATED
        assert (
            details.startswith("certificate 'admin' (role client, serial ")
            and f"is revoked by {pki.crl}" in details
        )
        after = _cli(pki, dispatcher, "agents")
        assert after.returncode == 1 and "Traceback" not in after.stderr, after.stderr
        assert "the dispatcher refused the request: certificate 'admin' (role client" in after.stderr, (
            after.stderr
        )

        wait_until(
            lambda: "sec-a" not in _connected(pki, dispatcher), "the revoked agent's session to end", 10
        )
        log = agent.wait_log("certificate 'sec-a' (role agent, serial ")
        assert "is revoked by" in log
        assert agent.process.poll() is None  # it retries, and is refused each time

        code, details = stream_as(collector_address, "sec-b", pki.ca, pki.agent("sec-b"))
        assert code == grpc.StatusCode.UNAUTHENTICATED, (code, details)
        assert details.startswith("certificate 'sec-b' (role agent, serial ") and "is revoked" in details
        assert _refusal(pki, dispatcher, "web") is None  # not on the list
    finally:
        agent.stop()
        receiver.stop(0)
