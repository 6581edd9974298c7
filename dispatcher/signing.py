"""The dispatcher's signatures on what it sends agents (docs/security.md, "Signed commands").

Every command to an agent (apply a plan, remove a trace, run a preset) leaves the dispatcher as a `Command`
in a `SignedMessage`: the serialized command, the node it is for, a signature by the dispatcher's key (the one
it serves TLS with) and its certificate. The command carries a sequence (growing with every command signed,
across restarts), the time it was signed and its expiry, and its action names the trace and the generation:
all of it is signed, so an agent can refuse a command played again. An agent with a CA verifies the signature
over the payload's bytes as received before parsing them (protobuf has no canonical encoding: nothing is
re-encoded to be checked), and takes only a certificate of that CA whose role (subject OU) is ``dispatcher``.

The signed bytes are ``CONTEXT 0x00 TYPE 0x00 NODE 0x00 PAYLOAD``, TYPE the payload's full message name: the
Go side (``agent/internal/signing.SignedBytes``) builds the same, and its tests pin the format. Plan files
(``hoptrace plan sign``) are bare signed TracePlans, without sequence or expiry: only ``hoptrace-agent run
--plan`` takes them.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519
from cryptography.x509.oid import NameOID

from hoptrace.common.grpcutil import ROLE_DISPATCHER
from hoptrace.dispatcher.registry import AgentConnection
from hoptrace.v1 import agent_pb2

log = logging.getLogger(__name__)

CONTEXT = b"hoptrace-signed-message-v1"
COMMAND_TYPE = agent_pb2.Command.DESCRIPTOR.full_name
PLAN_TYPE = agent_pb2.TracePlan.DESCRIPTOR.full_name
# How long an agent may act on a command after it was signed (--command-ttl): its way to the agent and the
# two clocks' difference (the agent allows --max-clock-skew on top); it checks commands as they arrive.
DEFAULT_COMMAND_TTL_S = 60.0
# The longest agents take (agent/internal/signing.MaxCommandLifetime): it bounds what they must remember.
MAX_COMMAND_TTL_S = 600.0


class TimeSequence:
    """Command sequences without a state directory: nanoseconds since the epoch, each above the last. A
    dispatcher keeps its own above a persisted floor too (StateStore.next_sequence), so a clock set back
    across a restart never repeats one."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last = 0

    def __call__(self) -> int:
        with self._lock:
            self._last = max(time.time_ns(), self._last + 1)
            return self._last


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

    def __init__(
        self,
        cert_pem: bytes | None = None,
        key_pem: bytes | None = None,
        *,
        ttl_s: float = DEFAULT_COMMAND_TTL_S,
    ) -> None:
        if not 0 < ttl_s <= MAX_COMMAND_TTL_S:
            raise ValueError(f"a command's time to live must be above 0 and at most {MAX_COMMAND_TTL_S:g}s")
        self.ttl_s = ttl_s
        # The next command's sequence; the dispatcher puts its persisted one here (DispatcherServer).
        self.sequence: Callable[[], int] = TimeSequence()
        # Held from a command's sequence to its place in the agent's queue: each agent gets its commands in
        # sequence order, so none is refused as older than one sent before it.
        self._order = threading.Lock()
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
    def from_files(
        cls, cert: str | Path, key: str | Path, *, ttl_s: float = DEFAULT_COMMAND_TTL_S
    ) -> MessageSigner:
        """A signer with the certificate and key in these PEM files (the dispatcher's --cert and --key)."""
        return cls(Path(cert).read_bytes(), Path(key).read_bytes(), ttl_s=ttl_s)

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

    def command(
        self,
        node: str,
        *,
        apply: agent_pb2.TracePlan | None = None,
        remove: agent_pb2.RemoveTrace | None = None,
        run_preset: agent_pb2.RunPreset | None = None,
        signed_at: datetime | None = None,
    ) -> agent_pb2.DispatcherMessage:
        """The message that orders `node`'s agent to do one of apply, remove, run_preset: a signed Command
        with the next sequence, valid for `ttl_s` from `signed_at` (default now; tests sign in the past);
        unsigned without a key (--insecure). Use `deliver` to queue it for an agent."""
        actions = {"apply": apply, "remove": remove, "run_preset": run_preset}
        given = {name: message for name, message in actions.items() if message is not None}
        if len(given) != 1:
            raise ValueError(f"a command orders exactly one of {', '.join(actions)}, not {sorted(given)}")
        if not self.signs:
            return agent_pb2.DispatcherMessage(**given)
        signed_at = signed_at or datetime.now(UTC)
        command = agent_pb2.Command(sequence=self.sequence(), **given)
        command.signed_at.FromDatetime(signed_at)
        command.expires_at.FromDatetime(signed_at + timedelta(seconds=self.ttl_s))
        payload = command.SerializeToString(deterministic=True)
        return agent_pb2.DispatcherMessage(signed=self.sign(COMMAND_TYPE, node, payload))

    def deliver(
        self,
        connection: AgentConnection,
        node: str,
        *,
        apply: agent_pb2.TracePlan | None = None,
        remove: agent_pb2.RemoveTrace | None = None,
        run_preset: agent_pb2.RunPreset | None = None,
    ) -> bool:
        """Sign the command and queue it on `connection` (an AgentConnection), in sequence order; False when
        the connection is closed."""
        with self._order:
            message = self.command(node, apply=apply, remove=remove, run_preset=run_preset)
            return connection.send(message)
