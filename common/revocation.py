"""Certificate revocation for hoptrace's gRPC servers (the dispatcher, the collector): the CA's CRL (`--crl`,
written by `hoptrace revoke`), read again when the file changes, and a server interceptor that refuses
every call whose client certificate the CRL lists (docs/security.md, "Revocation").

gRPC's Python TLS has no CRL check of its own (the C core's is not exposed), so the check runs on each call
with the certificate the handshake verified: a revoked client completes the handshake and gets
``UNAUTHENTICATED: certificate 'admin' (role client, serial 1f3a...) is revoked by /etc/hoptrace/ca.crl
since ...`` on every call. A stream that is open when its certificate is revoked ends at its next message
(an agent's session within its 2 s heartbeat, a record stream at its next batch).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import grpc
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from cryptography.x509.oid import NameOID

log = logging.getLogger(__name__)

# How often the file's modification time and size are looked at (on calls; no thread of its own).
POLL_S = 1.0


@dataclass(frozen=True)
class Revoked:
    """Why a certificate is refused."""

    subject: str
    role: str
    serial: int
    at: datetime
    crl: Path

    def __str__(self) -> str:
        return (
            f"certificate {self.subject!r} (role {self.role}, serial {self.serial:x}) is revoked by "
            f"{self.crl} since {self.at.isoformat(timespec='seconds')}"
        )


def load_crl(path: str | Path, ca_certificates: list[x509.Certificate]) -> x509.CertificateRevocationList:
    """The CRL in `path` (PEM or DER), checked to be signed by one of `ca_certificates`; ValueError says why
    not."""
    data = Path(path).read_bytes()
    try:
        crl = x509.load_pem_x509_crl(data) if b"-----BEGIN" in data else x509.load_der_x509_crl(data)
    except ValueError as error:
        raise ValueError(f"CRL {path}: not a certificate revocation list ({error})") from None
    for ca in ca_certificates:
        key = ca.public_key()
        if (
            isinstance(key, ec.EllipticCurvePublicKey | rsa.RSAPublicKey | ed25519.Ed25519PublicKey)
            and crl.issuer == ca.subject
            and crl.is_signature_valid(key)
        ):
            return crl
    raise ValueError(f"CRL {path} is not signed by the CA (issuer {crl.issuer.rfc4514_string()})")


def _crl_number(crl: x509.CertificateRevocationList) -> int | None:
    try:
        return crl.extensions.get_extension_for_class(x509.CRLNumber).value.crl_number
    except x509.ExtensionNotFound:
        return None


class RevocationList:
    """The CA's CRL in `path`, re-read when its modification time or size changes (looked at no more than
    once per POLL_S). A file that no longer reads, is not the CA's, or is older (a lower CRL number) keeps
    the list read before, and says so once: a half-written file never lets a revoked certificate back in."""

    def __init__(self, path: str | Path, ca: str | Path) -> None:
        self.path = Path(path)
        self._cas = x509.load_pem_x509_certificates(Path(ca).read_bytes())
        self._lock = threading.Lock()
        self._polled = 0.0
        self._failed = ""
        self._stamp: tuple[int, int] | None = None
        self._revoked: dict[int, datetime] = {}
        self._number: int | None = None
        self._load()  # a bad file fails the server's start

    def _load(self) -> None:
        stat = os.stat(self.path)
        crl = load_crl(self.path, self._cas)
        number = _crl_number(crl)
        if self._number is not None and number is not None and number < self._number:
            # RFC 5280 5.2.3: CRL numbers only grow; an older list would take revocations back.
            raise ValueError(
                f"CRL {self.path} has number {number}, older than the {self._number} read before"
            )
        next_update = crl.next_update_utc
        if next_update is not None and next_update < datetime.now(UTC):
            log.warning("CRL %s: its next update (%s) is past: issue a new one", self.path, next_update)
        self._revoked = {entry.serial_number: entry.revocation_date_utc for entry in crl}
        self._number = number
        self._stamp = (stat.st_mtime_ns, stat.st_size)

    def _refresh(self) -> None:
        now = time.monotonic()
        if now - self._polled < POLL_S:
            return
        self._polled = now
        try:
            stat = os.stat(self.path)
            if (stat.st_mtime_ns, stat.st_size) == self._stamp:
                return
            self._load()
        except (OSError, ValueError) as error:
            if str(error) != self._failed:
                self._failed = str(error)
                log.error("CRL not reloaded, keeping the one read before: %s", error)
            return
        self._failed = ""
        log.info("CRL %s reloaded: %d revoked (number %s)", self.path, len(self._revoked), self._number)

    def check(self, certificate: x509.Certificate) -> Revoked | None:
        """Why `certificate` is refused, or None when the CRL does not list it."""
        with self._lock:
            self._refresh()
            at = self._revoked.get(certificate.serial_number)
        if at is None:
            return None

        def first(oid: x509.ObjectIdentifier) -> str:
            values = certificate.subject.get_attributes_for_oid(oid)
            return str(values[0].value) if values else ""

        return Revoked(
            first(NameOID.COMMON_NAME),
            first(NameOID.ORGANIZATIONAL_UNIT_NAME),
            certificate.serial_number,
            at,
            self.path,
        )


def peer_certificate(context: grpc.ServicerContext) -> x509.Certificate | None:
    """The client certificate the handshake verified; None on plaintext."""
    pems = context.auth_context().get("x509_pem_cert")
    return x509.load_pem_x509_certificate(pems[0]) if pems else None


class RevocationInterceptor(grpc.ServerInterceptor):
    """Refuses every call, of every service, whose client certificate `crl` revokes (UNAUTHENTICATED, the
    reason in the details); a stream is checked again at each message either way, so one open when the
    certificate is revoked ends at its next message."""

    def __init__(self, crl: RevocationList) -> None:
        self.crl = crl

    def intercept_service(self, continuation, handler_call_details):  # type: ignore[no-untyped-def]
        """Wrap the method's handler with the check."""
        handler = continuation(handler_call_details)
        if handler is None:
            return None
        return _checked_handler(handler, self.crl, handler_call_details.method)


def _checked_handler(
    handler: grpc.RpcMethodHandler, crl: RevocationList, method: str
) -> grpc.RpcMethodHandler:
    def revoked(certificate: x509.Certificate | None) -> str:
        found = crl.check(certificate) if certificate is not None else None
        return str(found) if found else ""

    def refuse(context: grpc.ServicerContext, reason: str) -> None:
        log.warning("refused %s from %s: %s", method, context.peer(), reason)
        context.abort(grpc.StatusCode.UNAUTHENTICATED, reason)

    def requests(iterator: Iterator[Any], context: grpc.ServicerContext, certificate: Any) -> Iterator[Any]:
        # Read on the handler's thread or a reader thread of its own (the dispatcher's agent sessions): end
        # the stream with the status set, rather than raise there.
        for message in iterator:
            reason = revoked(certificate)
            if reason:
                log.warning("ended %s from %s: %s", method, context.peer(), reason)
                context.set_code(grpc.StatusCode.UNAUTHENTICATED)
                context.set_details(reason)
                return
            yield message

    def responses(iterator: Iterator[Any], context: grpc.ServicerContext, certificate: Any) -> Iterator[Any]:
        for message in iterator:
            reason = revoked(certificate)
            if reason:
                refuse(context, reason)
            yield message

    def start(context: grpc.ServicerContext) -> x509.Certificate | None:
        certificate = peer_certificate(context)
        reason = revoked(certificate)
        if reason:
            refuse(context, reason)
        return certificate

    kwargs = {
        "request_deserializer": handler.request_deserializer,
        "response_serializer": handler.response_serializer,
    }
    if handler.request_streaming and handler.response_streaming:
        inner_ss: Callable[..., Any] = handler.stream_stream

        def stream_stream(iterator: Any, context: grpc.ServicerContext) -> Any:
            certificate = start(context)
            yield from responses(
                inner_ss(requests(iterator, context, certificate), context), context, certificate
            )

        return grpc.stream_stream_rpc_method_handler(stream_stream, **kwargs)
    if handler.request_streaming:
        inner_su: Callable[..., Any] = handler.stream_unary

        def stream_unary(iterator: Any, context: grpc.ServicerContext) -> Any:
            certificate = start(context)
            return inner_su(requests(iterator, context, certificate), context)

        return grpc.stream_unary_rpc_method_handler(stream_unary, **kwargs)
    if handler.response_streaming:
        inner_us: Callable[..., Any] = handler.unary_stream

        def unary_stream(request: Any, context: grpc.ServicerContext) -> Any:
            certificate = start(context)
            yield from responses(inner_us(request, context), context, certificate)

        return grpc.unary_stream_rpc_method_handler(unary_stream, **kwargs)
    inner_uu: Callable[..., Any] = handler.unary_unary

    def unary_unary(request: Any, context: grpc.ServicerContext) -> Any:
        start(context)
        return inner_uu(request, context)

    return grpc.unary_unary_rpc_method_handler(unary_unary, **kwargs)


def revocation_interceptors(crl: str | Path | None, ca: str | Path | None) -> list[grpc.ServerInterceptor]:
    """The interceptor of the CRL `crl` of CA `ca`, first in a server's list; none without a CRL."""
    if not crl:
        return []
    if not ca:
        raise ValueError("--crl needs --ca: the CRL must be signed by the CA")
    return [RevocationInterceptor(RevocationList(crl, ca))]
