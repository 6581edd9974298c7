"""The PEM files of a TLS endpoint checked before gRPC reads them, so a wrong file names itself and the cause.

gRPC's C core reports a key that does not match its certificate, or a CA file that is not PEM, as library
noise followed by "empty address list"; a client certificate that its server refuses (another CA, expired)
reaches the client as "Socket closed". Each of those is found here first and said in one line.
"""

from __future__ import annotations

import datetime
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization

RENEW_HINT = "issue a new one with `hoptrace certs --out DIR` (the CA in DIR is reused)"


class TLSFileError(ValueError):
    """A certificate, key or CA file that cannot work; the message names the file and the cause."""


def _read(path: Path, what: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as error:
        raise TLSFileError(f"{what} {path}: {error.strerror or error}") from None


def load_ca(path: str | Path) -> list[x509.Certificate]:
    """The CA certificates in `path` (PEM); TLSFileError when it holds none."""
    path = Path(path)
    data = _read(path, "CA file")
    try:
        return x509.load_pem_x509_certificates(data)
    except ValueError:
        raise TLSFileError(
            f"CA file {path} holds no PEM certificate (expected '-----BEGIN CERTIFICATE-----')"
        ) from None


def load_certificate(path: str | Path) -> x509.Certificate:
    """The first certificate in `path` (PEM)."""
    path = Path(path)
    data = _read(path, "certificate")
    try:
        return x509.load_pem_x509_certificates(data)[0]
    except ValueError:
        raise TLSFileError(
            f"certificate {path} holds no PEM certificate (expected '-----BEGIN CERTIFICATE-----')"
        ) from None


def _public_bytes(key: object) -> bytes:
    return key.public_bytes(  # type: ignore[attr-defined]
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def check_key_pair(cert_path: str | Path, key_path: str | Path) -> x509.Certificate:
    """The certificate of `cert_path` once its key is `key_path`'s private key; TLSFileError otherwise."""
    cert = load_certificate(cert_path)
    data = _read(Path(key_path), "key")
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError) as error:
        cause = (
            "it is encrypted (give an unencrypted key)" if isinstance(error, TypeError) else "not a PEM key"
        )
        raise TLSFileError(f"key {key_path}: {cause}") from None
    if _public_bytes(key.public_key()) != _public_bytes(cert.public_key()):
        raise TLSFileError(
            f"key {key_path} is not the key of certificate {cert_path}: give the pair issued together"
        )
    return cert


def check_validity(cert: x509.Certificate, path: str | Path, now: datetime.datetime | None = None) -> None:
    """TLSFileError when `cert` has expired or is not valid yet."""
    now = now or datetime.datetime.now(datetime.UTC)
    if now > cert.not_valid_after_utc:
        raise TLSFileError(
            f"certificate {path} expired on {cert.not_valid_after_utc:%Y-%m-%d %H:%M} UTC: {RENEW_HINT}"
        )
    if now < cert.not_valid_before_utc:
        raise TLSFileError(
            f"certificate {path} is not valid before {cert.not_valid_before_utc:%Y-%m-%d %H:%M} UTC: "
            "check this machine's clock"
        )


def check_issued_by(
    cert: x509.Certificate, path: str | Path, cas: list[x509.Certificate], ca_path: str | Path
) -> None:
    """TLSFileError unless one of `cas` signed `cert`: its peers, which trust only that CA, refuse it."""
    for ca in cas:
        try:
            cert.verify_directly_issued_by(ca)
            return
        except (ValueError, TypeError, InvalidSignature):
            continue
    raise TLSFileError(
        f"certificate {path} was not issued by the CA in {ca_path} (its issuer is "
        f"{cert.issuer.rfc4514_string()}): its peers trust only that CA; use the files of one "
        "`hoptrace certs` directory"
    )


def check_tls_files(
    ca: str | Path, cert: str | Path | None, key: str | Path | None, *, issued_by_ca: bool = True
) -> None:
    """The checks above on one endpoint's files: the CA parses, the key is the certificate's, the certificate
    is valid now and (with `issued_by_ca`, as every hoptrace component's own files are) issued by the CA.
    Raises TLSFileError naming the file and the cause."""
    cas = load_ca(ca)
    if cert is None or key is None:
        return
    certificate = check_key_pair(cert, key)
    check_validity(certificate, cert)
    if issued_by_ca:
        check_issued_by(certificate, cert, cas, ca)
