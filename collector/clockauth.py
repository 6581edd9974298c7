"""Authenticated clock rounds: the bytes each request and reply carry after their 48-byte NTP header, and the
collector's keys (`ClockKeys`), handed to each agent over its mutual-TLS gRPC connection (`ClockKeyService`,
`hoptrace.v1.ClockKeys/GetClockKey`) or derived from a shared `--clock-key-file`.

The exchange itself stays UDP with kernel timestamps at both ends (`timeservice.py`); only a trailer is added:

    request: header(48) "HTC1" key_id(4) nonce(16) len(1) node tag(16)
    reply:   header(48) "HTC1" key_id(4) nonce(16) tag(16)

`tag` = HMAC-SHA256(K, label || every byte before the tag)[:16], with a label per direction, and K the node's
key of `key_id`: HMAC-SHA256(master, "hoptrace clock key v1" 0 node 0 key_id). The reply echoes the request's
nonce (random per probe), so an agent takes a reply only as the server's answer to that very probe: a forged
or rewritten reply (its T2, T3 or nonce changed) fails the tag, a recorded one played again answers another
nonce. The agent's side is `agent/internal/clock/auth.go`; both pin the same test vector.

Keys: the collector's master secret is random per process (or a key file's contents); a key_id is an epoch
of `rotate_s` seconds of the collector's monotonic clock (1, 2, ...; 0 = a key file's, never rotated), and a
request is taken with the current or the previous key_id. Nothing depends on wall-clock time: the clock is
what the keys protect.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import secrets
import struct
import threading
import time
from pathlib import Path

import grpc

from hoptrace.common.grpcutil import ROLE_AGENT, peer_identity
from hoptrace.v1 import clock_pb2, clock_pb2_grpc

NTP_HEADER = 48
MAGIC = b"HTC1"
NONCE_SIZE = 16
TAG_SIZE = 16
KEY_SIZE = 32
REQUEST_LABEL = b"hoptrace clock request v1\x00"
REPLY_LABEL = b"hoptrace clock reply v1\x00"
KEY_LABEL = b"hoptrace clock key v1\x00"
_KEY_ID = struct.Struct("!I")
REPLY_SIZE = NTP_HEADER + len(MAGIC) + _KEY_ID.size + NONCE_SIZE + TAG_SIZE


class ClockAuthError(ValueError):
    """A request or reply that is not authentic, and why (`reason`: a Prometheus label)."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason


def derive_key(master: bytes, node: str, key_id: int) -> bytes:
    """The node's key of `key_id` under `master`."""
    return hmac.digest(master, KEY_LABEL + node.encode() + b"\x00" + _KEY_ID.pack(key_id), hashlib.sha256)


def _tag(key: bytes, label: bytes, message: bytes) -> bytes:
    return hmac.digest(key, label + message, hashlib.sha256)[:TAG_SIZE]


def read_key_file(path: str) -> bytes:
    """A `--clock-key-file`: at least 32 bytes of secret, raw or hex (surrounding whitespace ignored)."""
    data = Path(path).read_bytes()
    with contextlib.suppress(UnicodeDecodeError, ValueError):  # not hex: the raw bytes are the secret
        data = bytes.fromhex(data.decode().strip())
    if len(data) < KEY_SIZE:
        raise ValueError(
            f"clock key file {path}: {len(data)} bytes of secret, want at least {KEY_SIZE} "
            "(e.g. head -c 32 /dev/urandom > FILE)"
        )
    return data


def auth_request(header: bytes, key: bytes, key_id: int, nonce: bytes, node: str) -> bytes:
    """A request: the 48-byte NTP header and its trailer (the reference client's side, `clocksync.py`)."""
    name = node.encode()
    if not 0 < len(name) < 256 or len(nonce) != NONCE_SIZE:
        raise ValueError("node name of 1..255 bytes and a 16-byte nonce")
    body = header[:NTP_HEADER] + MAGIC + _KEY_ID.pack(key_id) + nonce + bytes([len(name)]) + name
    return body + _tag(key, REQUEST_LABEL, body)


def sign_reply(header: bytes, key: bytes, key_id: int, nonce: bytes) -> bytes:
    """A reply: the 48-byte NTP header (T2, T3 written) and its trailer echoing the request's nonce."""
    body = header[:NTP_HEADER] + MAGIC + _KEY_ID.pack(key_id) + nonce
    return body + _tag(key, REPLY_LABEL, body)


def check_reply(data: bytes, key: bytes, key_id: int, nonce: bytes) -> None:
    """Raise `ClockAuthError` unless `data` is the server's authentic answer to the request sent with `nonce`
    (reasons as the agent's: unauthenticated, key, mac, nonce, malformed)."""
    if len(data) < NTP_HEADER or data[0] & 7 != 4:
        raise ClockAuthError("malformed", "not a server reply")
    if len(data) != REPLY_SIZE or data[NTP_HEADER : NTP_HEADER + 4] != MAGIC:
        raise ClockAuthError("unauthenticated", f"{len(data)} bytes without the HTC1 trailer")
    (got_id,) = _KEY_ID.unpack_from(data, NTP_HEADER + 4)
    if got_id != key_id:
        raise ClockAuthError("key", f"key_id {got_id}, the request's is {key_id}")
    if not hmac.compare_digest(_tag(key, REPLY_LABEL, data[:-TAG_SIZE]), data[-TAG_SIZE:]):
        raise ClockAuthError("mac", "the tag does not match the reply's bytes")
    if not hmac.compare_digest(data[NTP_HEADER + 8 : NTP_HEADER + 8 + NONCE_SIZE], nonce):
        raise ClockAuthError("nonce", "it answers another request")


class ClockKeys:
    """The collector's clock keys: a master secret (random, or a key file's) from which each node's key of
    each key_id is derived, so nothing is stored per node."""

    def __init__(self, master: bytes | None = None, rotate_s: float = 3600.0) -> None:
        """`master` None: a random secret, rotated every `rotate_s`; given (a key file): key_id 0 for good."""
        if rotate_s <= 0:
            raise ValueError("clock key rotation must be positive")
        self.fixed = master is not None
        self.master = master if master is not None else secrets.token_bytes(KEY_SIZE)
        self.rotate_s = rotate_s
        self._start = time.monotonic()
        self._cache: dict[tuple[str, int], bytes] = {}
        self._lock = threading.Lock()
        self.issued = 0

    @classmethod
    def from_file(cls, path: str) -> ClockKeys:
        """The keys of a `--clock-key-file` (agents given the same file derive the same)."""
        return cls(read_key_file(path))

    def key_id(self, now: float | None = None) -> int:
        """The current key_id: 0 with a key file, else the epoch of the collector's monotonic clock."""
        if self.fixed:
            return 0
        elapsed = (time.monotonic() if now is None else now) - self._start
        return 1 + int(elapsed // self.rotate_s)

    def key_of(self, node: str, key_id: int, now: float | None = None) -> bytes | None:
        """The node's key of `key_id` if it is taken now (the current or the previous), else None."""
        current = self.key_id(now)
        if key_id not in (current, current - 1) or key_id < 0 or (key_id == 0 and not self.fixed):
            return None
        with self._lock:
            key = self._cache.get((node, key_id))
            if key is None:
                if len(self._cache) > 4096:  # nodes x two key_ids; bounded against made-up node names
                    self._cache.clear()
                key = self._cache[(node, key_id)] = derive_key(self.master, node, key_id)
        return key

    def issue(self, node: str, now: float | None = None) -> clock_pb2.ClockKey:
        """The node's current key, when to ask again (the next rotation) and how long it is taken (to the end
        of the rotation after: the previous key_id is still taken)."""
        now = time.monotonic() if now is None else now
        key_id = self.key_id(now)
        refresh = self.rotate_s if self.fixed else self._start + key_id * self.rotate_s - now
        self.issued += 1
        answer = clock_pb2.ClockKey(node=node, key_id=key_id, key=derive_key(self.master, node, key_id))
        answer.refresh_after.FromNanoseconds(max(1, int(refresh * 1e9)))
        answer.valid_for.FromNanoseconds(int((refresh + self.rotate_s) * 1e9))
        return answer

    def check_request(self, data: bytes) -> tuple[str, int, bytes, bytes]:
        """(node, key_id, key, nonce) of an authentic request; `ClockAuthError` (malformed, key, mac) else."""
        at = NTP_HEADER + len(MAGIC) + _KEY_ID.size + NONCE_SIZE + 1
        if len(data) < at + TAG_SIZE or data[NTP_HEADER : NTP_HEADER + 4] != MAGIC:
            raise ClockAuthError("malformed", "no HTC1 trailer")
        (key_id,) = _KEY_ID.unpack_from(data, NTP_HEADER + 4)
        nonce = data[NTP_HEADER + 8 : NTP_HEADER + 8 + NONCE_SIZE]
        end = at + data[at - 1]
        if len(data) != end + TAG_SIZE:
            raise ClockAuthError("malformed", "trailer length")
        try:
            node = data[at:end].decode()
        except UnicodeDecodeError as err:
            raise ClockAuthError("malformed", "node name") from err
        key = self.key_of(node, key_id)
        if key is None:
            raise ClockAuthError("key", f"key_id {key_id} of node {node!r} is not taken now")
        if not hmac.compare_digest(_tag(key, REQUEST_LABEL, data[:end]), data[end:]):
            raise ClockAuthError("mac", f"request of node {node!r} does not verify")
        return node, key_id, key, nonce


class ClockKeyService(clock_pb2_grpc.ClockKeysServicer):
    """`hoptrace.v1.ClockKeys` on the collector's gRPC port: an agent's key, to the agent whose certificate
    names the node (mutual TLS only: on a plaintext port anyone could ask for any node's key)."""

    def __init__(self, keys: ClockKeys) -> None:
        self.keys = keys

    def GetClockKey(  # noqa: N802 - the gRPC method's name
        self, request: clock_pb2.GetClockKeyRequest, context: grpc.ServicerContext
    ) -> clock_pb2.ClockKey:
        """The calling agent's current key."""
        identity = peer_identity(context)
        if identity is None:
            context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                "clock keys are handed only over mutual TLS; without it give the collector and the agents "
                "the same --clock-key-file",
            )
        if identity.role != ROLE_AGENT or not identity.name:
            context.abort(
                grpc.StatusCode.PERMISSION_DENIED,
                f"certificate {identity.name!r} has role {identity.role!r}, not an agent certificate",
            )
        if request.node and request.node != identity.name:
            context.abort(
                grpc.StatusCode.PERMISSION_DENIED,
                f"the certificate of node {identity.name!r} cannot ask for node {request.node!r}'s clock key",
            )
        return self.keys.issue(identity.name)
