"""`hoptrace certs`: a CA and the certificates of every component, for mutual TLS (docs/security.md).

Files written in OUT (keys mode 0600; an existing CA in OUT is reused, so agents can be added later)::

    ca.pem, ca.key                          the hoptrace CA (keep ca.key off the nodes)
    dispatcher.pem, dispatcher.key          server (and client of nothing)
    collector.pem, collector.key            server for agents, client of the dispatcher's user API
    agent-NODE.pem, agent-NODE.key          one per --agent NODE: CN = NODE, the only node it may speak for
    web.pem/.key, admin.pem/.key            user API clients (the web app, the CLI)
    tokens                                  NAME:SHA256 lines for the dispatcher's --tokens
    admin.token, web.token, collector.token the tokens themselves (only created when absent)
    ca.crl                                  the CA's revocation list for every --crl (empty until
                                            `hoptrace revoke NAME` lists a certificate)

The subject's OU carries the role (agent, client, dispatcher, collector), the CN the name; servers check both.
Keys are ECDSA P-256: small, fast handshakes, supported by gRPC's C core and Go's crypto/tls alike.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from hoptrace.common.grpcutil import (
    ROLE_AGENT,
    ROLE_CLIENT,
    ROLE_COLLECTOR,
    ROLE_DISPATCHER,
    TLSFiles,
    add_token,
    read_token_file,
)

ORGANIZATION = "hoptrace"
DEFAULT_HOSTS = ("localhost", "127.0.0.1", "::1")
DEFAULT_CLIENTS = ("admin", "web")
# The tokens `hoptrace certs` makes and their roles: each component gets only what it needs (the web
# applies traces and runs presets, the collector only follows the applied specs).
DEFAULT_TOKENS = {"admin": "admin", "web": "operator", "collector": "viewer"}
CA_DAYS = 3650
LEAF_DAYS = 825  # the longest validity clients such as browsers still accept for a server certificate
CRL_FILE = "ca.crl"
# A CRL's nextUpdate: servers warn once it is past (they keep using it); `hoptrace revoke` writes a new one.
CRL_DAYS = 365
_DNS_LABEL = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?$")


@dataclass
class CertBundle:
    """Where `create_bundle` wrote everything."""

    out: Path
    agents: list[str] = field(default_factory=list)
    clients: list[str] = field(default_factory=list)

    @property
    def ca(self) -> Path:
        """The CA certificate every component trusts."""
        return self.out / "ca.pem"

    def files(self, name: str) -> TLSFiles:
        """TLS files of `name`: dispatcher, collector, agent-NODE, admin, web."""
        return TLSFiles(self.ca, self.out / f"{name}.pem", self.out / f"{name}.key")

    def agent(self, node: str) -> TLSFiles:
        """TLS files of the agent of `node`."""
        return self.files(f"agent-{node}")

    @property
    def crl(self) -> Path:
        """The CA's certificate revocation list (the servers' and agents' --crl)."""
        return self.out / CRL_FILE

    @property
    def tokens(self) -> Path:
        """The dispatcher's token file (hashes)."""
        return self.out / "tokens"

    def token_file(self, name: str) -> Path:
        """The file holding the token called `name` (admin, web, collector)."""
        return self.out / f"{name}.token"

    def token(self, name: str) -> str:
        """The token called `name` (admin, web, collector)."""
        return self.token_file(name).read_text().strip()


def _write_private(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(data)
    os.chmod(path, 0o600)  # O_CREAT's mode does not apply to a file that already existed


def key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    """A private key as unencrypted PKCS#8 PEM."""
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _name(common_name: str, role: str) -> x509.Name:
    return x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, ORGANIZATION),
            x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, role),
            x509.NameAttribute(NameOID.COMMON_NAME, common_name),
        ]
    )


def alt_names(hosts: Iterable[str]) -> list[x509.GeneralName]:
    """Subject alternative names of `hosts`: an IP address entry for each address, a DNS name otherwise."""
    names: list[x509.GeneralName] = []
    for host in dict.fromkeys(hosts):
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    return names


def _now() -> datetime.datetime:
    # A minute back: a node whose clock is slightly behind still accepts a certificate made just now.
    return datetime.datetime.now(datetime.UTC) - datetime.timedelta(minutes=1)


def new_ca(name: x509.Name, valid: datetime.timedelta) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    """A self-signed CA (ECDSA P-256) named `name`, valid from a minute ago for `valid`: signs leaves only."""
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(_now())
        .not_valid_after(_now() + valid)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return cert, key


def load_or_create_ca(out: Path) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    """The CA in `out` (ca.pem, ca.key), created if absent."""
    cert_path, key_path = out / "ca.pem", out / "ca.key"
    if cert_path.exists() and key_path.exists():
        key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
        if not isinstance(key, ec.EllipticCurvePrivateKey):
            raise ValueError(f"{key_path}: not an ECDSA key")
        return x509.load_pem_x509_certificate(cert_path.read_bytes()), key
    cert, key = new_ca(_name("hoptrace CA", "ca"), datetime.timedelta(days=CA_DAYS))
    _write_private(key_path, key_pem(key))
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return cert, key


def issue(
    out: Path,
    ca: tuple[x509.Certificate, ec.EllipticCurvePrivateKey],
    file_name: str,
    common_name: str,
    role: str,
    *,
    server_hosts: Sequence[str] = (),
    client: bool = True,
) -> TLSFiles:
    """Write FILE_NAME.pem/.key signed by `ca`: a server certificate for `server_hosts` (SANs) if any, a
    client certificate if `client`."""
    ca_cert, ca_key = ca
    key = ec.generate_private_key(ec.SECP256R1())
    usages = ([ExtendedKeyUsageOID.SERVER_AUTH] if server_hosts else []) + (
        [ExtendedKeyUsageOID.CLIENT_AUTH] if client else []
    )
    sans = alt_names(server_hosts)
    if not server_hosts and _DNS_LABEL.match(common_name):
        sans = [x509.DNSName(common_name)]  # agents: the node name, for tools that only read SANs
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name, role))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(_now())
        .not_valid_after(_now() + datetime.timedelta(days=LEAF_DAYS))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=False,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_cert.public_key()),  # type: ignore[arg-type]
            critical=False,
        )
    )
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    cert = builder.sign(ca_key, hashes.SHA256())
    files = TLSFiles(out / "ca.pem", out / f"{file_name}.pem", out / f"{file_name}.key")
    _write_private(files.key, key_pem(key))
    files.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return files


def check_node_name(node: str) -> str:
    """`node` if it can be an agent certificate's CN (what --node must then be); ValueError otherwise."""
    if not node or len(node) > 64 or not re.fullmatch(r"[A-Za-z0-9._-]+", node):
        raise ValueError(f"bad node name {node!r}: letters, digits, '.', '_', '-' (at most 64)")
    return node


def create_bundle(
    out: str | Path,
    *,
    hosts: Sequence[str] = (),
    agents: Sequence[str] = (),
    clients: Sequence[str] = DEFAULT_CLIENTS,
    tokens: dict[str, str] = DEFAULT_TOKENS,
) -> CertBundle:
    """Create (or extend) the certificates in `out`: CA, dispatcher and collector (server certificates for
    `hosts` plus loopback), one agent certificate per node of `agents`, client certificates, tokens."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    os.chmod(out, 0o700)
    for node in agents:
        check_node_name(node)
    ca = load_or_create_ca(out)
    server_hosts = [*DEFAULT_HOSTS, *hosts]
    issue(out, ca, "dispatcher", "dispatcher", ROLE_DISPATCHER, server_hosts=server_hosts, client=False)
    # The collector also calls the dispatcher's user API (it follows the traces' paths).
    issue(out, ca, "collector", "collector", ROLE_COLLECTOR, server_hosts=server_hosts)
    for node in agents:
        issue(out, ca, f"agent-{node}", node, ROLE_AGENT)
    for name in clients:
        issue(out, ca, name, name, ROLE_CLIENT)
    if not (out / CRL_FILE).exists():
        write_crl(out, ca, {})
    token_file = out / "tokens"
    known = read_token_file(token_file) if token_file.exists() else {}
    for name, role in tokens.items():
        if name not in known:
            _write_private(out / f"{name}.token", (add_token(token_file, name, role) + "\n").encode())
    return CertBundle(out, list(agents), list(clients))


def add_agent(out: str | Path, node: str) -> TLSFiles:
    """Issue the certificate of the agent of `node` with the CA in `out` (created if absent)."""
    out = Path(out)
    ca = load_or_create_ca(out)
    return issue(out, ca, f"agent-{check_node_name(node)}", node, ROLE_AGENT)


def read_crl(out: Path) -> tuple[dict[int, datetime.datetime], int]:
    """The serial numbers the CRL in `out` revokes, each with its revocation time, and the CRL's number
    (none and 0 when there is no CRL yet)."""
    path = out / CRL_FILE
    if not path.exists():
        return {}, 0
    crl = x509.load_pem_x509_crl(path.read_bytes())
    number = crl.extensions.get_extension_for_class(x509.CRLNumber).value.crl_number
    return {entry.serial_number: entry.revocation_date_utc for entry in crl}, number


def write_crl(
    out: Path,
    ca: tuple[x509.Certificate, ec.EllipticCurvePrivateKey],
    revoked: dict[int, datetime.datetime],
) -> Path:
    """Write `out`/ca.crl (RFC 5280 section 5) signed by the CA, revoking the serials of `revoked`, numbered
    one above the CRL it replaces (servers refuse a list older than the one they read). Replaced atomically:
    servers re-read it when it changes, never half-written."""
    ca_cert, ca_key = ca
    _, number = read_crl(out)
    builder = (
        x509.CertificateRevocationListBuilder()
        .issuer_name(ca_cert.subject)
        .last_update(_now())
        .next_update(_now() + datetime.timedelta(days=CRL_DAYS))
        .add_extension(x509.CRLNumber(number + 1), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
    )
    for serial, at in sorted(revoked.items()):
        builder = builder.add_revoked_certificate(
            x509.RevokedCertificateBuilder().serial_number(serial).revocation_date(at).build()
        )
    crl = builder.sign(ca_key, hashes.SHA256())
    path = out / CRL_FILE
    partial = out / f".{CRL_FILE}.{os.getpid()}.tmp"
    partial.write_bytes(crl.public_bytes(serialization.Encoding.PEM))
    os.replace(partial, path)
    return path


def revoke(out: str | Path, names: Sequence[str]) -> list[x509.Certificate]:
    """Add certificates to the CA's CRL in `out` (written if absent): each of `names` is a certificate of
    `out` by name (``agent-host-a``, ``admin``) or a PEM file's path. Returns the certificates revoked;
    ValueError names one that is not there or not of this CA."""
    out = Path(out)
    ca = load_or_create_ca(out)
    revoked, _ = read_crl(out)
    certificates = []
    for name in names:
        path = Path(name) if Path(name).suffix == ".pem" else out / f"{name}.pem"
        try:
            certificate = x509.load_pem_x509_certificate(path.read_bytes())
        except (OSError, ValueError) as error:
            raise ValueError(f"{name}: no certificate at {path} ({error})") from None
        if certificate.issuer != ca[0].subject or certificate == ca[0]:
            raise ValueError(f"{name}: {path} is not a certificate issued by the CA in {out}")
        revoked.setdefault(certificate.serial_number, datetime.datetime.now(datetime.UTC))
        certificates.append(certificate)
    write_crl(out, ca, revoked)
    return certificates
