"""The dispatcher's signer: the bytes it signs (pinned: the Go agent builds the same), signed commands that
verify with the certificate it sends and carry a growing sequence and an expiry, the persisted sequence floor,
and the keys it refuses. The agent's side is tested in Go (agent/internal/signing) and both together in
tests/security/test_signed_plans.py and test_replay.py."""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta

import pytest
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec

from hoptrace.common.certs import create_bundle
from hoptrace.dispatcher.signing import (
    COMMAND_TYPE,
    PLAN_TYPE,
    MessageSigner,
    certificate_role,
    signed_bytes,
)
from hoptrace.dispatcher.state import SEQUENCE_FLOOR_AHEAD_NS, StateStore
from hoptrace.v1 import agent_pb2

pytestmark = pytest.mark.unit  # pure code: make test-unit runs it without root


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    """A CA with the dispatcher's, the collector's and an agent's certificates."""
    return create_bundle(tmp_path_factory.mktemp("certs"), agents=["host-a"])


def test_signed_bytes_are_the_agents_format():
    """CONTEXT, type and node NUL-terminated, then the payload, as agent/internal/signing.SignedBytes."""
    assert PLAN_TYPE == "hoptrace.v1.TracePlan" and COMMAND_TYPE == "hoptrace.v1.Command"
    assert (
        signed_bytes(PLAN_TYPE, "host-a", b"\x0a\x01x")
        == b"hoptrace-signed-message-v1\0hoptrace.v1.TracePlan\0host-a\0\x0a\x01x"
    )
    with pytest.raises(ValueError, match="node 'a\\\\x00b' holds a NUL byte"):
        signed_bytes(PLAN_TYPE, "a\0b", b"")


def test_command_signed_with_the_dispatcher_certificate(bundle):
    """The message carries the command's exact bytes (the plan, a sequence, when it was signed, its expiry
    ttl_s later), the node, the dispatcher's certificate (DER) and an ECDSA signature over signed_bytes that
    the certificate's key verifies; a changed byte does not verify."""
    files = bundle.files("dispatcher")
    signer = MessageSigner.from_files(files.cert, files.key, ttl_s=42)
    plan = agent_pb2.TracePlan(trace="t", generation=3, object=b"\x7fELF...", sample=1)
    plan.hops.add(hop_index=0, name="h0", program="hop_tc", dev="eth0")
    before = datetime.now(UTC)
    message = signer.command("host-a", apply=plan)
    assert message.WhichOneof("body") == "signed"
    signed = message.signed
    command = agent_pb2.Command.FromString(signed.payload)
    assert command.apply == plan
    signed_at = command.signed_at.ToDatetime(tzinfo=UTC)
    assert before - timedelta(seconds=1) <= signed_at <= datetime.now(UTC)
    assert command.expires_at.ToDatetime(tzinfo=UTC) - signed_at == timedelta(seconds=42)
    assert signed.node == "host-a"
    cert = x509.load_der_x509_certificate(signed.signer_cert)
    assert certificate_role(cert) == "dispatcher"
    assert cert == x509.load_pem_x509_certificate(files.cert.read_bytes())
    key = cert.public_key()
    assert isinstance(key, ec.EllipticCurvePublicKey)
    ecdsa = ec.ECDSA(hashes.SHA256())
    key.verify(signed.signature, signed_bytes(COMMAND_TYPE, "host-a", signed.payload), ecdsa)
    tampered = bytearray(signed.payload)
    tampered[-1] ^= 1
    with pytest.raises(InvalidSignature):
        key.verify(signed.signature, signed_bytes(COMMAND_TYPE, "host-a", bytes(tampered)), ecdsa)
    with pytest.raises(InvalidSignature):  # the same bytes as a plan file, or for another node
        key.verify(signed.signature, signed_bytes(PLAN_TYPE, "host-a", signed.payload), ecdsa)
    with pytest.raises(InvalidSignature):
        key.verify(signed.signature, signed_bytes(COMMAND_TYPE, "host-b", signed.payload), ecdsa)

    # Removals and presets are commands too, each with a higher sequence.
    removal = signer.command("host-a", remove=agent_pb2.RemoveTrace(trace="t", generation=3))
    preset = signer.command("host-a", run_preset=agent_pb2.RunPreset(id="1", preset="mace"))
    sequences = [agent_pb2.Command.FromString(m.signed.payload).sequence for m in (message, removal, preset)]
    assert sequences == sorted(set(sequences)), sequences
    assert agent_pb2.Command.FromString(removal.signed.payload).remove.generation == 3
    with pytest.raises(ValueError, match="exactly one of"):
        signer.command("host-a")
    with pytest.raises(ValueError, match="at most 600s"):
        MessageSigner.from_files(files.cert, files.key, ttl_s=3600)


def test_without_a_key_messages_go_unsigned():
    """--insecure: the plain apply, remove and run_preset bodies, which only --insecure agents take."""
    signer = MessageSigner()
    assert not signer.signs
    plan = agent_pb2.TracePlan(trace="t", generation=1)
    assert signer.command("n", apply=plan) == agent_pb2.DispatcherMessage(apply=plan)
    removal = agent_pb2.RemoveTrace(trace="t", generation=1)
    assert signer.command("n", remove=removal) == agent_pb2.DispatcherMessage(remove=removal)
    preset = agent_pb2.RunPreset(id="1", preset="iron")
    assert signer.command("n", run_preset=preset) == agent_pb2.DispatcherMessage(run_preset=preset)


def test_sequences_survive_a_restart_with_the_clock_set_back(tmp_path):
    """The dispatcher's sequences follow the wall clock; a restarted dispatcher whose clock went back an hour
    still continues above every sequence handed out before (the floor in its state directory)."""
    store = StateStore(tmp_path)
    first = [store.next_sequence() for _ in range(3)]
    assert first == sorted(set(first))
    restarted = StateStore(tmp_path)
    restarted.clock_ns = lambda: first[-1] - 3600 * 10**9
    after = restarted.next_sequence()
    assert first[-1] < after <= first[-1] + SEQUENCE_FLOOR_AHEAD_NS + 1
    assert restarted.next_sequence() == after + 1
    # Without its state directory, a dispatcher whose clock is right still continues above.
    assert StateStore(tmp_path / "fresh").next_sequence() > first[-1]


def test_a_certificate_that_is_not_the_dispatchers_is_announced(bundle, caplog):
    """Signing with another role's certificate works, but the dispatcher says agents will refuse it."""
    files = bundle.files("collector")
    with caplog.at_level(logging.WARNING, logger="hoptrace.dispatcher.signing"):
        MessageSigner.from_files(files.cert, files.key)
    assert "of role 'collector'" in caplog.text and "will refuse" in caplog.text


def test_key_must_be_the_certificates(bundle):
    """A certificate with another component's key is refused at start, not at the first plan."""
    dispatcher, agent = bundle.files("dispatcher"), bundle.agent("host-a")
    with pytest.raises(ValueError, match="not the certificate's key"):
        MessageSigner.from_files(dispatcher.cert, agent.key)
    with pytest.raises(ValueError, match="both the certificate and its key"):
        MessageSigner(dispatcher.cert.read_bytes(), None)
