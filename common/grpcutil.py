"""gRPC plumbing of hoptrace's Python parts: TLS credentials, the user API channel, the servers' checks.

Who is who (docs/security.md):
- every connection to the dispatcher and the collector is mutual TLS with certificates of one hoptrace CA
  (`hoptrace certs`); the certificate's subject says the role (OU: agent, client, dispatcher, collector) and
  the name (CN: the node name for agents);
- an agent may only speak for the node its certificate names: `AgentIdentityInterceptor` compares the CN
  with `Register.node` (dispatcher) and `RecordBatch.node` (collector);
- the user API (`hoptrace.v1.Hoptrace`) also needs a bearer token (`authorization: Bearer <token>`),
  checked by `TokenAuthInterceptor` against a file of `name:sha256hex` lines.
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import hmac
import logging
import os
import re
import secrets
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from hoptrace.common.tlscheck import check_tls_files

log = logging.getLogger(__name__)

API_SERVICE_PREFIX = "/hoptrace.v1.Hoptrace/"
AGENT_CONNECT_METHOD = "/hoptrace.v1.AgentSession/Connect"
STREAM_RECORDS_METHOD = "/hoptrace.v1.Collector/StreamRecords"
TOKEN_ENV = "HOPTRACE_TOKEN"
TOKEN_FILE_ENV = f"{TOKEN_ENV}_FILE"  # the file holding it (--token-file)
DISPATCHER_ENV = "HOPTRACE_DISPATCHER"  # the user API's address (--dispatcher)
CA_ENV, CERT_ENV, KEY_ENV = "HOPTRACE_CA", "HOPTRACE_CERT", "HOPTRACE_KEY"
MAX_MESSAGE_BYTES = 64 * 1024 * 1024  # reports and plans carry up to a few MB

# Certificate roles (the subject's OU), written by hoptrace.common.certs.
ROLE_AGENT, ROLE_CLIENT, ROLE_DISPATCHER, ROLE_COLLECTOR = "agent", "client", "dispatcher", "collector"


# ---- TLS files -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TLSFiles:
    """PEM files of one component: the CA that signs every peer, the component's own certificate and key; a
    server's also the CA's revocation list (None: none; hoptrace.common.revocation)."""

    ca: Path
    cert: Path
    key: Path
    crl: Path | None = None

    @classmethod
    def of(cls, ca: str | Path, cert: str | Path, key: str | Path, crl: str | Path | None = None) -> TLSFiles:
        """From paths given as strings (command-line values)."""
        return cls(Path(ca), Path(cert), Path(key), Path(crl) if crl else None)

    def read(self) -> tuple[bytes, bytes, bytes]:
        """(ca, cert, key) PEM bytes; OSError names the missing file."""
        return self.ca.read_bytes(), self.cert.read_bytes(), self.key.read_bytes()


def server_credentials(tls: TLSFiles) -> grpc.ServerCredentials:
    """Server TLS that demands a client certificate signed by `tls.ca` (the handshake fails without one).
    TLSFileError (a ValueError) names a file that cannot work, before gRPC reads it. Whether the certificate
    is the CA's is the caller's check (server_tls_from_args): tests present foreign ones on purpose."""
    check_tls_files(tls.ca, tls.cert, tls.key, issued_by_ca=False)
    ca, cert, key = tls.read()
    return grpc.ssl_server_credentials([(key, cert)], root_certificates=ca, require_client_auth=True)


def channel_credentials(
    ca: str | Path, cert: str | Path | None = None, key: str | Path | None = None
) -> grpc.ChannelCredentials:
    """Client TLS: the server must present a certificate of `ca` for the dialed host; cert/key are ours.
    TLSFileError (a ValueError) names a file that cannot work, before gRPC reads it (whether the certificate
    is the CA's, as in server_credentials, is the caller's check)."""
    if (cert is None) != (key is None):
        raise ValueError("a client certificate needs both cert and key")
    check_tls_files(ca, cert, key, issued_by_ca=False)
    return grpc.ssl_channel_credentials(
        root_certificates=Path(ca).read_bytes(),
        private_key=Path(key).read_bytes() if key else None,
        certificate_chain=Path(cert).read_bytes() if cert else None,
    )


# ---- the user API channel ------------------------------------------------------------------------------


class _CallDetails(
    collections.namedtuple(
        "_CallDetails", ("method", "timeout", "metadata", "credentials", "wait_for_ready", "compression")
    ),
    grpc.ClientCallDetails,
):
    pass


class _BearerToken(
    grpc.UnaryUnaryClientInterceptor,
    grpc.UnaryStreamClientInterceptor,
    grpc.StreamUnaryClientInterceptor,
    grpc.StreamStreamClientInterceptor,
):
    """Adds `authorization: Bearer <token>` to every call (gRPC refuses call credentials on plaintext)."""

    def __init__(self, token: str) -> None:
        self._header = ("authorization", f"Bearer {token}")

    def _details(self, details: grpc.ClientCallDetails) -> _CallDetails:
        metadata = [*(details.metadata or ()), self._header]
        return _CallDetails(
            details.method,
            details.timeout,
            metadata,
            details.credentials,
            getattr(details, "wait_for_ready", None),
            getattr(details, "compression", None),
        )

    def intercept_unary_unary(self, continuation, client_call_details, request):  # type: ignore[no-untyped-def]
        """Unary call with the token."""
        return continuation(self._details(client_call_details), request)

    def intercept_unary_stream(self, continuation, client_call_details, request):  # type: ignore[no-untyped-def]
        """Server-streaming call with the token."""
        return continuation(self._details(client_call_details), request)

    def intercept_stream_unary(self, continuation, client_call_details, request_iterator):  # type: ignore[no-untyped-def]
        """Client-streaming call with the token."""
        return continuation(self._details(client_call_details), request_iterator)

    def intercept_stream_stream(self, continuation, client_call_details, request_iterator):  # type: ignore[no-untyped-def]
        """Bidirectional call with the token."""
        return continuation(self._details(client_call_details), request_iterator)


# A token travels as an HTTP/2 header value: printable ASCII, no space.
_TOKEN_CHARACTERS = re.compile(r"[!-~]+")


def api_channel(
    address: str,
    *,
    ca: str | Path | None = None,
    cert: str | Path | None = None,
    key: str | Path | None = None,
    token: str | None = None,
    insecure: bool = False,
    options: list[tuple[str, Any]] | None = None,
) -> grpc.Channel:
    """A channel to the dispatcher's user API: mutual TLS (ca, cert, key) and the bearer `token`.

    `insecure=True` dials plaintext (a dispatcher started with --insecure); the token is still sent if given.
    """
    options = [("grpc.max_receive_message_length", MAX_MESSAGE_BYTES), *(options or [])]
    if token is not None and not _TOKEN_CHARACTERS.fullmatch(token):
        # gRPC would refuse the header later with a bare "Illegal metadata".
        raise ValueError(
            f"the API token (--token-file, ${TOKEN_FILE_ENV} or ${TOKEN_ENV}) holds whitespace or a "
            "character outside printable ASCII: a token is the one word `hoptrace certs` wrote"
        )
    if insecure:
        channel = grpc.insecure_channel(address, options=options)
        return grpc.intercept_channel(channel, _BearerToken(token)) if token else channel
    if ca is None:
        raise ValueError(
            f"no CA certificate to check the dispatcher at {address} with: pass --ca (or ${CA_ENV}), "
            "or --insecure for a dispatcher started with --insecure"
        )
    credentials = channel_credentials(ca, cert, key)
    if token:
        credentials = grpc.composite_channel_credentials(
            credentials, grpc.access_token_call_credentials(token)
        )
    return grpc.secure_channel(address, credentials, options=options)


# ---- secrets on the command line: never --------------------------------------------------------------

INFLUX_TOKEN_ENV = "HOPTRACE_INFLUX_TOKEN"


class SecretOnCommandLine(argparse.Action):
    """Refuses a secret given as a flag's value, without echoing it: every local user can read
    /proc/PID/cmdline. `use` says where the secret goes instead."""

    def __init__(self, *args: Any, use: str = "", **kwargs: Any) -> None:
        kwargs.setdefault("nargs", "?")
        kwargs.setdefault("help", argparse.SUPPRESS)
        super().__init__(*args, **kwargs)
        self.use = use

    def __call__(self, parser: argparse.ArgumentParser, *_: Any) -> None:
        """Exit 2 with why (argparse's usage error), never with the value."""
        parser.error(
            f"{self.option_strings[0]} is not taken on the command line (anyone on the host can read it): "
            f"use {self.use}"
        )


class SecretFileError(ValueError):
    """A secret's file that cannot be read; the message names the flag, the file and the cause."""


# A token or password is a line; a file much longer than that is not the one meant (and /dev/zero never ends).
MAX_SECRET_BYTES = 64 * 1024


def add_secret_argument(parser: Any, flag: str, env: str, what: str) -> None:
    """`--FLAG-file FILE` for a secret: read from the file (default $ENV_FILE), else from $ENV. `--FLAG
    VALUE` is refused without echoing VALUE: a value on the command line would be readable by every local
    user in /proc/PID/cmdline."""
    parser.add_argument(
        f"--{flag}", action=SecretOnCommandLine, use=f"--{flag}-file FILE or ${env}", dest=argparse.SUPPRESS
    )
    parser.add_argument(
        f"--{flag}-file",
        metavar="FILE",
        default=os.environ.get(f"{env}_FILE"),
        help=f"file holding {what} (or put it in ${env})",
    )


def secret_from(args: Any, flag: str, env: str) -> str:
    """The secret of `add_secret_argument(parser, flag, env, ...)`: the file's content, else $ENV, else "".
    SecretFileError names the flag (and $ENV_FILE when the path came from it) and the file it cannot read."""
    path = getattr(args, f"{flag.replace('-', '_')}_file", None)
    if path:
        where = f"--{flag}-file {path}"
        if os.environ.get(f"{env}_FILE") == path:
            where += f" (${env}_FILE)"
        try:
            with open(path, "rb") as file:
                data = file.read(MAX_SECRET_BYTES + 1)
        except OSError as error:
            raise SecretFileError(f"{where}: {error.strerror or error}") from None
        if len(data) > MAX_SECRET_BYTES:
            raise SecretFileError(f"{where}: more than {MAX_SECRET_BYTES} bytes, not a secret's file")
        try:
            secret = data.decode().strip()
        except UnicodeDecodeError:
            raise SecretFileError(f"{where}: not text") from None
        if not secret:
            raise SecretFileError(f"{where}: the file is empty")
        return secret
    return os.environ.get(env, "").strip()  # a newline or space pasted with it is never part of a secret


# ---- tokens --------------------------------------------------------------------------------------------


def hash_token(token: str) -> str:
    """The sha256 hex digest a token file keeps instead of the token."""
    return hashlib.sha256(token.encode()).hexdigest()


def new_token() -> str:
    """A fresh random token (256 bits, URL-safe)."""
    return "ht_" + secrets.token_urlsafe(32)


# What a token may do on the user API, each role including the ones before it.
ROLES = ("viewer", "operator", "admin")
# The least role each user API method needs; a method not listed needs admin (fail closed).
METHOD_ROLES = {
    "ListAgents": "viewer",
    "GetAgent": "viewer",
    "ListTraces": "viewer",
    "GetTrace": "viewer",
    "GetReport": "viewer",
    "WatchSegmentStats": "viewer",
    "WatchSpecs": "viewer",
    "ValidateTrace": "viewer",
    "GetVersion": "viewer",
    "GetPackets": "viewer",
    "ApplyTrace": "operator",
    "DeleteTrace": "operator",
    "RunPreset": "operator",
    # Attaches short-lived programs on the nodes and detaches them, as a preset does.
    "Discover": "operator",
    # Who changed what: what an operator answers for, and the web UI (operator) shows.
    "ListAudit": "operator",
}
# The most a client certificate's role (subject OU) allows, whatever its token says: the collector only
# reads, agents have no business on the user API.
CERTIFICATE_CAPS = {"client": "admin", "collector": "viewer", "dispatcher": "viewer"}


@dataclass(frozen=True)
class TokenEntry:
    """One line of a token file."""

    name: str
    role: str
    digest: str  # sha256 hex of the token


def read_token_file(path: str | Path) -> dict[str, TokenEntry]:
    """name -> entry of a token file: `name:role:sha256hex` lines (`name:sha256hex`, the old form, is an
    admin); blank lines and `#` comments skipped."""
    entries: dict[str, TokenEntry] = {}
    for number, raw in enumerate(Path(path).read_text().splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        parts = [part.strip() for part in line.split(":")]
        name, role, digest = (parts[0], "admin", parts[1]) if len(parts) == 2 else (parts + ["", "", ""])[:3]
        digest = digest.lower()
        if (
            len(parts) not in (2, 3)
            or not name
            or role not in ROLES
            or not re.fullmatch(r"[0-9a-f]{64}", digest)
        ):
            raise ValueError(f"{path}:{number}: expected NAME:ROLE:SHA256HEX, ROLE one of {', '.join(ROLES)}")
        entries[name] = TokenEntry(name, role, digest)
    return entries


def add_token(path: str | Path, name: str, role: str = "viewer") -> str:
    """Create a token `name` with `role`, append its hash to the token file `path` (mode 0600); return the
    token."""
    if not name or ":" in name or any(c.isspace() for c in name):
        raise ValueError(f"bad token name {name!r}: no ':' and no spaces")
    if role not in ROLES:
        raise ValueError(f"bad role {role!r}: one of {', '.join(ROLES)}")
    path = Path(path)
    if path.exists() and name in read_token_file(path):
        raise ValueError(f"{path} already has a token called {name!r}")
    token = new_token()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    with os.fdopen(fd, "a") as out:
        out.write(f"{name}:{role}:{hash_token(token)}\n")
    return token


class TokenFile:
    """The token hashes of a file, re-read when the file changes (add a token without a restart)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._stamp: tuple[int, int] | None = None
        self._entries: dict[str, TokenEntry] = {}
        self._load()  # a bad file fails the server's start, not its first call

    def _load(self) -> None:
        stat = self.path.stat()
        stamp = (stat.st_mtime_ns, stat.st_size)
        if stamp != self._stamp:
            self._entries = read_token_file(self.path)
            self._stamp = stamp
            if not self._entries:
                log.warning("token file %s has no tokens: every user API call will be refused", self.path)

    def match(self, token: str) -> TokenEntry | None:
        """The entry of `token`, or None when no line has its hash (constant-time comparisons)."""
        with self._lock:
            try:
                self._load()
            except (OSError, ValueError) as error:  # keep the last good set rather than lock everyone out
                log.error("token file %s: %s (keeping the tokens read before)", self.path, error)
            entries = list(self._entries.values())
        digest = hash_token(token)
        found = None
        for entry in entries:
            if hmac.compare_digest(digest, entry.digest):
                found = entry
        return found


# ---- server-side checks --------------------------------------------------------------------------------


def _refusing(handler: grpc.RpcMethodHandler, code: grpc.StatusCode, message: str) -> grpc.RpcMethodHandler:
    """A handler of the same shape as `handler` that answers `code` with `message`."""

    def refuse(request_or_iterator: Any, context: grpc.ServicerContext) -> Any:
        log.warning("refused %s from %s: %s", code.name, context.peer(), message)
        context.abort(code, message)

    kwargs = {
        "request_deserializer": handler.request_deserializer,
        "response_serializer": handler.response_serializer,
    }
    if handler.request_streaming and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(refuse, **kwargs)
    if handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(refuse, **kwargs)
    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(refuse, **kwargs)
    return grpc.unary_unary_rpc_method_handler(refuse, **kwargs)


class TokenAuthInterceptor(grpc.ServerInterceptor):
    """Calls of the user API need `authorization: Bearer <token>` with a token of `tokens` whose role (capped
    by the client certificate's) allows the method (METHOD_ROLES); other services' calls pass."""

    def __init__(self, tokens: TokenFile, prefix: str = API_SERVICE_PREFIX) -> None:
        self.tokens = tokens
        self.prefix = prefix

    def _token(self, metadata: Any) -> tuple[TokenEntry | None, str]:
        values = [value for key, value in (metadata or ()) if key == "authorization"]
        if not values:
            return (
                None,
                f"missing token: use --token-file or set ${TOKEN_ENV} (authorization: Bearer <token>)",
            )
        scheme, _, token = str(values[0]).partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return None, "malformed authorization metadata: expected 'Bearer <token>'"
        entry = self.tokens.match(token.strip())
        if entry is None:
            return (
                None,
                "invalid token: not in the dispatcher's token file (`hoptrace token create` makes one)",
            )
        return entry, ""

    def intercept_service(self, continuation, handler_call_details):  # type: ignore[no-untyped-def]
        """Pass authorized user API calls (and every other service's) on; refuse the rest."""
        if not handler_call_details.method.startswith(self.prefix):
            return continuation(handler_call_details)
        handler = continuation(handler_call_details)
        if handler is None:
            return handler
        entry, problem = self._token(handler_call_details.invocation_metadata)
        if entry is None:
            return _refusing(handler, grpc.StatusCode.UNAUTHENTICATED, problem)
        method = handler_call_details.method.removeprefix(self.prefix)
        needed = METHOD_ROLES.get(method, "admin")
        if ROLES.index(entry.role) < ROLES.index(needed):
            message = f"token {entry.name!r} has role {entry.role}; {method} needs {needed}"
            return _refusing(handler, grpc.StatusCode.PERMISSION_DENIED, message)
        return _certificate_capped(handler, entry, method, needed)


def _certificate_capped(
    handler: grpc.RpcMethodHandler, entry: TokenEntry, method: str, needed: str
) -> grpc.RpcMethodHandler:
    """`handler`, refusing calls whose client certificate's role caps below `needed` (a collector's
    certificate with an operator's token still only reads). Checked in the call: the peer's certificate
    is known there, not in the interceptor."""

    def check(context: grpc.ServicerContext) -> None:
        peer = peer_identity(context)
        if peer is None:  # plaintext (--insecure): no certificate to cap by
            return
        cap = CERTIFICATE_CAPS.get(peer.role)
        if cap is None or ROLES.index(cap) < ROLES.index(needed):
            context.abort(
                grpc.StatusCode.PERMISSION_DENIED,
                f"certificate {peer.name!r} has role {peer.role!r}, which may not call {method}",
            )

    return _wrapped(handler, check)


def _wrapped(handler: grpc.RpcMethodHandler, check: Any) -> grpc.RpcMethodHandler:
    """A handler like `handler` that runs `check(context)` first."""
    kwargs = {
        "request_deserializer": handler.request_deserializer,
        "response_serializer": handler.response_serializer,
    }
    if handler.request_streaming and handler.response_streaming:
        inner = handler.stream_stream

        def stream_stream(requests: Any, context: grpc.ServicerContext) -> Any:
            check(context)
            yield from inner(requests, context)

        return grpc.stream_stream_rpc_method_handler(stream_stream, **kwargs)
    if handler.request_streaming:
        inner_su = handler.stream_unary

        def stream_unary(requests: Any, context: grpc.ServicerContext) -> Any:
            check(context)
            return inner_su(requests, context)

        return grpc.stream_unary_rpc_method_handler(stream_unary, **kwargs)
    if handler.response_streaming:
        inner_us = handler.unary_stream

        def unary_stream(request: Any, context: grpc.ServicerContext) -> Any:
            check(context)
            yield from inner_us(request, context)

        return grpc.unary_stream_rpc_method_handler(unary_stream, **kwargs)
    inner_uu = handler.unary_unary

    def unary_unary(request: Any, context: grpc.ServicerContext) -> Any:
        check(context)
        return inner_uu(request, context)

    return grpc.unary_unary_rpc_method_handler(unary_unary, **kwargs)


@dataclass(frozen=True)
class PeerIdentity:
    """Who the client certificate says the peer is."""

    role: str  # subject OU
    name: str  # subject CN (the node for agents)


def peer_identity(context: grpc.ServicerContext) -> PeerIdentity | None:
    """The verified client certificate's role and name; None on a plaintext connection or without a cert."""
    from cryptography import x509
    from cryptography.x509.oid import NameOID

    pems = context.auth_context().get("x509_pem_cert")
    if not pems:
        return None
    subject = x509.load_pem_x509_certificate(pems[0]).subject

    def first(oid: x509.ObjectIdentifier) -> str:
        values = subject.get_attributes_for_oid(oid)
        return str(values[0].value) if values else ""

    return PeerIdentity(role=first(NameOID.ORGANIZATIONAL_UNIT_NAME), name=first(NameOID.COMMON_NAME))


# The user a client acts for (the web UI's logged-in user), as the client's token vouches for it: the audit
# trail's `on_behalf_of`.
ON_BEHALF_OF_HEADER = "x-hoptrace-on-behalf-of"


@dataclass(frozen=True)
class Caller:
    """Who made a user API call, for the audit trail: the token's name and role (empty without tokens), the
    client certificate's name and role (empty on plaintext), the user the client says it acts for, and its
    address."""

    token: str = ""
    token_role: str = ""
    certificate: str = ""
    certificate_role: str = ""
    on_behalf_of: str = ""
    peer: str = ""


def bearer_token(metadata: Any) -> str:
    """The token of `authorization: Bearer <token>` in call metadata ("" when there is none)."""
    values = [value for key, value in (metadata or ()) if key == "authorization"]
    scheme, _, token = str(values[0]).partition(" ") if values else ("", "", "")
    return token.strip() if scheme.lower() == "bearer" else ""


def caller_of(context: grpc.ServicerContext, tokens: TokenFile | None) -> Caller:
    """Who is calling: the token of the call's metadata looked up in `tokens`, the verified client
    certificate, the on-behalf-of header (at most 64 printable characters kept)."""
    metadata = context.invocation_metadata()
    entry = tokens.match(bearer_token(metadata)) if tokens is not None and bearer_token(metadata) else None
    peer = peer_identity(context)
    claimed = next((str(value) for key, value in (metadata or ()) if key == ON_BEHALF_OF_HEADER), "")
    return Caller(
        token=entry.name if entry else "",
        token_role=entry.role if entry else "",
        certificate=peer.name if peer else "",
        certificate_role=peer.role if peer else "",
        on_behalf_of="".join(c for c in claimed if c.isprintable())[:64],
        peer=context.peer(),
    )


def _agent_identity(context: grpc.ServicerContext) -> PeerIdentity:
    identity = peer_identity(context)
    if identity is None:
        context.abort(grpc.StatusCode.UNAUTHENTICATED, "no client certificate: agents need --cert and --key")
    if identity.role != ROLE_AGENT or not identity.name:
        context.abort(
            grpc.StatusCode.PERMISSION_DENIED,
            f"certificate {identity.name!r} has role {identity.role!r}, not an agent certificate",
        )
    return identity


def _checked_messages(
    messages: Iterator[Any],
    context: grpc.ServicerContext,
    identity: PeerIdentity,
    node_of: Callable[[Any], str | None],
) -> Iterator[Any]:
    for message in messages:
        node = node_of(message)
        if node is not None and node != identity.name:
            log.warning("refused agent %s at %s: it spoke for node %r", identity.name, context.peer(), node)
            context.abort(
                grpc.StatusCode.PERMISSION_DENIED,
                f"the certificate of node {identity.name!r} cannot speak for node {node!r}",
            )
        yield message


class AgentIdentityInterceptor(grpc.ServerInterceptor):
    """Client-streaming methods that only agents call: the peer must hold an agent certificate, and every
    message's node (`node_of(message)`; None = the message names none) must be the certificate's CN."""

    def __init__(self, methods: dict[str, Callable[[Any], str | None]]) -> None:
        self.methods = methods

    def intercept_service(self, continuation, handler_call_details):  # type: ignore[no-untyped-def]
        """Wrap the listed methods' request streams with the identity check."""
        handler = continuation(handler_call_details)
        node_of = self.methods.get(handler_call_details.method)
        if handler is None or node_of is None or not handler.request_streaming:
            return handler
        inner = handler.stream_stream if handler.response_streaming else handler.stream_unary

        def checked(request_iterator: Iterator[Any], context: grpc.ServicerContext) -> Any:
            identity = _agent_identity(context)
            return inner(_checked_messages(request_iterator, context, identity, node_of), context)

        make = (
            grpc.stream_stream_rpc_method_handler
            if handler.response_streaming
            else grpc.stream_unary_rpc_method_handler
        )
        return make(
            checked,
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )


def register_node(message: Any) -> str | None:
    """The node an `AgentMessage` speaks for: Register.node, None for heartbeats and statuses."""
    return message.register.node if message.WhichOneof("body") == "register" else None


def batch_node(message: Any) -> str:
    """The node a `RecordBatch` speaks for."""
    return message.node


def insecure_warning(component: str, listen: str) -> str:
    """The WARNING line a server logs when it runs without TLS."""
    return (
        f"WARNING: {component} on {listen} runs WITHOUT TLS or authentication (--insecure): anyone who can "
        "reach the port can push traces or records. Use only on loopback for demos and tests."
    )


# ---- command-line flags --------------------------------------------------------------------------------


def add_server_tls_arguments(parser: Any) -> None:
    """--ca/--cert/--key/--insecure of a server command (`hoptrace dispatcher`, `hoptrace collector`)."""
    group = parser.add_argument_group("TLS (docs/security.md)")
    group.add_argument("--ca", metavar="PEM", help="CA certificate that client certificates must chain to")
    group.add_argument("--cert", metavar="PEM", help="this server's certificate")
    group.add_argument("--key", metavar="PEM", help="this server's private key")
    group.add_argument(
        "--crl",
        metavar="FILE",
        help="the CA's certificate revocation list (`hoptrace revoke`): a client certificate on it is "
        "refused; re-read when the file changes",
    )
    group.add_argument(
        "--insecure",
        action="store_true",
        help="serve plaintext without client authentication (loopback demos and tests only)",
    )


def server_tls_from_args(args: Any) -> TLSFiles | None:
    """The TLS files the flags name; None with --insecure; ValueError when neither is complete."""
    given = [flag for flag in ("ca", "cert", "key", "crl") if getattr(args, flag, None)]
    if args.insecure:
        if given:
            raise ValueError(f"--insecure and --{given[0]} exclude each other")
        return None
    if len({"ca", "cert", "key"} & set(given)) < 3:
        missing = ", ".join(f"--{flag}" for flag in ("ca", "cert", "key") if flag not in given)
        raise ValueError(
            f"TLS needs --ca, --cert and --key (missing {missing}; `hoptrace certs` makes them), "
            "or --insecure for a plaintext server"
        )
    tls = TLSFiles.of(args.ca, args.cert, args.key, getattr(args, "crl", None))
    check_tls_files(tls.ca, tls.cert, tls.key)  # TLSFileError names the file and the cause
    return tls
