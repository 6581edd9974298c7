"""The dispatcher's signer: the bytes it signs (pinned: the Go agent builds the same), signatures that verify
with the certificate it sends, and the keys it refuses. The agent's side is tested in Go
(agent/internal/signing) and both together in tests/security/test_signed_plans.py."""

from __future__ import annotations

import logging

import pytest
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec

from hoptrace.common.certs import create_bundle
from hoptrace.dispatcher.signing import (
    PLAN_TYPE,
    PRESET_TYPE,
    MessageSigner,
    certificate_role,
    signed_bytes,
)
from hoptrace.v1 import agent_pb2

pytestmark = pytest.mark.unit  # pure code: make test-unit runs it without root


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    """A CA with the dispatcher's, the collector's and an agent's certificates."""
    return create_bundle(tmp_path_factory.mktemp("certs"), agents=["host-a"])


def test_signed_bytes_are_the_agents_format():
    """CONTEXT, type and node NUL-terminated, then the payload, as agent/internal/signing.SignedBytes."""
    assert PLAN_TYPE == "hoptrace.v1.TracePlan" and PRESET_TYPE == "hoptrace.v1.RunPreset"
    assert (
        signed_bytes(PLAN_TYPE, "host-a", b"\x0a\x01x")
        == b"hoptrace-signed-message-v1\0hoptrace.v1.TracePlan\0host-a\0\x0a\x01x"
    )
    with pytest.raises(ValueError, match="node 'a\\\\x00b' holds a NUL byte"):
        signed_bytes(PLAN_TYPE, "a\0b", b"")


def test_plan_signed_with_the_dispatcher_certificate(bundle):
    """The message carries the plan's exact bytes, the node, the dispatcher's certificate (DER) and an ECDSA
    signature over signed_bytes that the certificate's key verifies; a changed byte does not verify."""
    files = bundle.files("dispatcher")
    signer = MessageSigner.from_files(files.cert, files.key)
    plan = agent_pb2.TracePlan(trace="t", generation=3, object=b"\x7fELF...", sample=1)
    plan.hops.add(hop_index=0, name="h0", program="hop_tc", dev="eth0")
    message = signer.apply("host-a", plan)
    assert message.WhichOneof("body") == "signed_apply"
    signed = message.signed_apply
    assert agent_pb2.TracePlan.FromString(signed.payload) == plan
    assert signed.node == "host-a"
    cert = x509.load_der_x509_certificate(signed.signer_cert)
    assert certificate_role(cert) == "dispatcher"
    assert cert == x509.load_pem_x509_certificate(files.cert.read_bytes())
    key = cert.public_key()
    assert isinstance(key, ec.EllipticCurvePublicKey)
    ecdsa = ec.ECDSA(hashes.SHA256())
    key.verify(signed.signature, signed_bytes(PLAN_TYPE, "host-a", signed.payload), ecdsa)
    tampered = bytearray(signed.payload)
    tampered[-1] ^= 1
    with pytest.raises(InvalidSignature):
        key.verify(signed.signature, signed_bytes(PLAN_TYPE, "host-a", bytes(tampered)), ecdsa)
    with pytest.raises(InvalidSignature):  # the same bytes as a preset, or for another node
        key.verify(signed.signature, signed_bytes(PRESET_TYPE, "host-a", signed.payload), ecdsa)
    with pytest.raises(InvalidSignature):
        key.verify(signed.signature, signed_bytes(PLAN_TYPE, "host-b", signed.payload), ecdsa)

    preset = agent_pb2.RunPreset(id="1", preset="mace", args={"container": "c1"})
    message = signer.run_preset("host-a", preset)
    assert message.WhichOneof("body") == "signed_run_preset"
    assert agent_pb2.RunPreset.FromString(message.signed_run_preset.payload) == preset
    key.verify(
        message.signed_run_preset.signature,
        signed_bytes(PRESET_TYPE, "host-a", message.signed_run_preset.payload),
        ecdsa,
    )


def test_without_a_key_messages_go_unsigned():
    """--insecure: the plain apply and run_preset bodies, which only --insecure agents take."""
    signer = MessageSigner()
    assert not signer.signs
    plan = agent_pb2.TracePlan(trace="t", generation=1)
    assert signer.apply("n", plan) == agent_pb2.DispatcherMessage(apply=plan)
    preset = agent_pb2.RunPreset(id="1", preset="iron")
    assert signer.run_preset("n", preset) == agent_pb2.DispatcherMessage(run_preset=preset)


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
