"""The dispatcher's signatures on what it sends agents (docs/security.md, "Signed plans and presets").

Every plan (the compiled object's bytes and the attach plan) and every remote preset leaves the dispatcher as
a `SignedMessage`: the serialized message, the node it is for, a signature by the dispatcher's key (the one
it serves TLS with) and its certificate. An agent with a CA verifies the signature over the payload's bytes as
received before parsing them (protobuf has no canonical encoding: nothing is re-encoded to be checked), and
takes only a certificate of that CA whose role (subject OU) is ``dispatcher``.

The signed bytes are ``CONTEXT 0x00 TYPE 0x00 NODE 0x00 PAYLOAD``, TYPE the payload's full message name: the
Go side (``agent/internal/signing.SignedBytes``) builds the same, and its tests pin the format.
"""

from __future__ import annotations

import logging
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519
from cryptography.x509.oid import NameOID

from hoptrace.common.grpcutil import ROLE_DISPATCHER
from hoptrace.v1 import agent_pb2

log = logging.getLogger(__name__)

CONTEXT = b"hoptrace-signed-message-v1"
PLAN_TYPE = agent_pb2.TracePlan.DESCRIPTOR.full_name
PRESET_TYPE = agent_pb2.RunPreset.DESCRIPTOR.full_name


def signed_bytes(type_name: str, node: str, payload: bytes) -> bytes:
    """What a signature covers: CONTEXT, the payload's type and the node, each NUL-terminated, then the
    payload."""
    for what, value in (("type", type_name), ("node", node)):
        if "\0" in value:
            raise ValueError(f"{what} {value!r} holds a NUL byte")
    return b"\0".join([CONTEXT, type_name.encode(), node.encode(), payload])


def certificate_role(cert: x509.Certificate) -> str:
    """The role a hoptrace certificate carries (its subject OU; "" when it has none)."""
    units = cert.subject.get_attributes_for_oid(NameOID.ORGANIZATIONAL_UNIT_NAME)
    return str(units[0].value) if units else ""


class MessageSigner:
    """Turns plans and preset requests into the messages the dispatcher sends, signed with `key_pem` and
    `cert_pem` (PEM); without them (``--insecure``) the messages go unsigned, and only agents that run
    ``--insecure`` too take them."""

    def __init__(self, cert_pem: bytes | None = None, key_pem: bytes | None = None) -> None:
        self._key: ec.EllipticCurvePrivateKey | ed25519.Ed25519PrivateKey | None = None
        self._cert_der = b""
        self.subject = ""
        if cert_pem is None and key_pem is None:
            return
        if cert_pem is None or key_pem is None:
            raise ValueError("signing needs both the certificate and its key")
        cert = x509.load_pem_x509_certificate(cert_pem)
        key = serialization.load_pem_private_key(key_pem, password=None)
        if not isinstance(key, ec.EllipticCurvePrivateKey | ed25519.Ed25519PrivateKey):
            raise ValueError(f"cannot sign with a {type(key).__name__}: want an ECDSA or Ed25519 key")
        der, spki = serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
        if key.public_key().public_bytes(der, spki) != cert.public_key().public_bytes(der, spki):
            raise ValueError("the signing key is not the certificate's key")
        self._key = key
        self._cert_der = cert.public_bytes(serialization.Encoding.DER)
        self.subject = cert.subject.rfc4514_string()
        role = certificate_role(cert)
        if role != ROLE_DISPATCHER:
            log.warning(
                "signing with certificate %s of role %r: agents take only plans and presets signed by a %r "
                "certificate, so they will refuse this dispatcher's",
                self.subject,
                role,
                ROLE_DISPATCHER,
            )

    @classmethod
    def from_files(cls, cert: str | Path, key: str | Path) -> MessageSigner:
        """A signer with the certificate and key in these PEM files (the dispatcher's --cert and --key)."""
        return cls(Path(cert).read_bytes(), Path(key).read_bytes())

    @property
    def signs(self) -> bool:
        """False for the unsigned (--insecure) signer."""
        return self._key is not None

    def sign(self, type_name: str, node: str, payload: bytes) -> agent_pb2.SignedMessage:
        """A SignedMessage of `payload` (a serialized `type_name`) for `node`."""
        if self._key is None:
            raise ValueError("this dispatcher has no signing key (--insecure)")
        data = signed_bytes(type_name, node, payload)
        if isinstance(self._key, ec.EllipticCurvePrivateKey):
            signature = self._key.sign(data, ec.ECDSA(hashes.SHA256()))  # ASN.1 DER, as Go's VerifyASN1 reads
        else:
            signature = self._key.sign(data)
        return agent_pb2.SignedMessage(
            payload=payload, node=node, signature=signature, signer_cert=self._cert_der
        )

    def apply(self, node: str, plan: agent_pb2.TracePlan) -> agent_pb2.DispatcherMessage:
        """The message that applies `plan` on `node`."""
        if not self.signs:
            return agent_pb2.DispatcherMessage(apply=plan)
        return agent_pb2.DispatcherMessage(
            signed_apply=self.sign(PLAN_TYPE, node, plan.SerializeToString(deterministic=True))
        )

    def run_preset(self, node: str, request: agent_pb2.RunPreset) -> agent_pb2.DispatcherMessage:
        """The message that runs preset `request` on `node`."""
        if not self.signs:
            return agent_pb2.DispatcherMessage(run_preset=request)
        return agent_pb2.DispatcherMessage(
            signed_run_preset=self.sign(PRESET_TYPE, node, request.SerializeToString(deterministic=True))
        )
