"""The master clock: the collector answers NTP client requests over UDP (`--clock-listen`, default
127.0.0.1:7123) with its CLOCK_REALTIME.

Agents send >= 100 probes, keep the one with the smallest round-trip delay (Cristian's algorithm, as in
vNetTracer section III-C) and report the resulting offset, bound and drift in `NodeClock`; `clocksync.py` is
the reference client. Packets are encoded and decoded with ntplib's codec (`ntplib.NTPPacket`, RFC 5905
layout). The receive timestamp T2 is the kernel's receive time of the request (SO_TIMESTAMPNS, taken in the
network stack before the packet waits in the socket queue). The transmit timestamp T3 is the clock read
before encoding plus the smallest recent lag from that read to the reply's own kernel TX stamp (software
timestamping, read back from the error queue after each send): a Python server spends microseconds between
reading the clock and the packet leaving, and that time would otherwise bias every client's offset by half
of it. Clients take T1 and T4 from kernel stamps too, so all four times are taken at the same layer.
All are CLOCK_REALTIME. ntplib holds timestamps as float seconds since 1900, which round to about
0.24 us (half a float ulp at 3.9e9 s): more than a minimum-delay probe's whole bound on one machine. So T2
and T3 are written into the reply as exact 32.32 fixed point (`ntp_fixed`), to the nanosecond.

A request with an HTC1 trailer (`clockauth.py`) is answered only when its tag verifies under the node's key,
with a reply whose tag covers T2, T3 and the request's nonce; one that fails gets no answer and is counted
(`refused`, by reason). The MAC is computed after T3 is read, so its cost is inside the measured TX lag, which
authenticated and plain replies keep apart (their lags differ by it). A plain request gets a plain reply, as
before: an agent that authenticates refuses such replies itself, so answering them gives an attacker nothing.
"""

from __future__ import annotations

import logging
import socket
import struct
import threading
import time
from collections import deque

import ntplib

from hoptrace.collector.clockauth import ClockAuthError, ClockKeys, sign_reply

log = logging.getLogger(__name__)

# linux/asm-generic/socket.h: SO_TIMESTAMPNS (= SCM_TIMESTAMPNS) delivers a struct timespec of the receive
# time as ancillary data (the "old" 64-bit layout: two longs).
SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)
_TIMESPEC = struct.Struct("@ll")
CMSG_SPACE = socket.CMSG_SPACE(_TIMESPEC.size)
SO_TIMESTAMPING = getattr(socket, "SO_TIMESTAMPING", 37)
# linux/net_tstamp.h: software TX stamps, reported without the packet (OPT_TSONLY).
TX_STAMP_FLAGS = (1 << 1) | (1 << 4) | (1 << 11)
TX_LAG_WINDOW = 256  # replies whose lag the next T3 correction is taken from (their minimum)
TX_LAG_MIN_SAMPLES = 64  # below this the minimum is not yet a floor: T3 stays uncorrected (early, never late)
NTP_PACKET_SIZE = 48
REF_ID = int.from_bytes(b"HOPT", "big")  # reference ID of a stratum-1 server: 4 ASCII characters


def parse_addr(addr: str) -> tuple[str, int]:
    """Split "HOST:PORT" (or "[V6]:PORT") into host and port; raise ValueError when malformed."""
    host, sep, port = addr.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise ValueError(f"address must be HOST:PORT, got {addr!r}")
    return host, int(port)


def ns_to_ntp(ns: int) -> float:
    """Unix nanoseconds -> NTP time (float seconds since 1900), ntplib's representation."""
    return ntplib.system_to_ntp_time(ns / 1e9)


def ntp_to_ns(ntp: float) -> int:
    """NTP time (float seconds since 1900) -> Unix nanoseconds."""
    return round(ntplib.ntp_to_system_time(ntp) * 1e9)


NTP_UNIX_EPOCH_S = 2_208_988_800  # 1900-01-01 to 1970-01-01
# A reply's receive (T2) and transmit (T3) timestamps: the last two 64-bit fields of the header.
REPLY_TIMES = struct.Struct("!QQ")
REPLY_TIMES_OFFSET = NTP_PACKET_SIZE - REPLY_TIMES.size


def ntp_fixed(ns: int) -> int:
    """Unix nanoseconds -> a 64-bit NTP timestamp (32.32 fixed point seconds since 1900), rounded to the
    nearest 2^-32 s; times from 2036 on wrap into era 1."""
    sec, nsec = divmod(ns, 1_000_000_000)
    return (((sec + NTP_UNIX_EPOCH_S) << 32) + ((nsec << 32) + 500_000_000) // 1_000_000_000) % (1 << 64)


def ns_of_ntp_fixed(ts: int) -> int:
    """A 64-bit NTP timestamp -> Unix nanoseconds, to the nearest ns; seconds with the top bit clear are era
    1 (2036-2104, RFC 4330 section 3)."""
    sec = ts >> 32
    if not sec & (1 << 31):
        sec += 1 << 32
    return (sec - NTP_UNIX_EPOCH_S) * 1_000_000_000 + (((ts & 0xFFFFFFFF) * 1_000_000_000 + (1 << 31)) >> 32)


def reply_times(data: bytes) -> tuple[int, int]:
    """(T2, T3) of an NTP reply, exactly as the server wrote them, in Unix nanoseconds."""
    t2, t3 = REPLY_TIMES.unpack_from(data, REPLY_TIMES_OFFSET)
    return ns_of_ntp_fixed(t2), ns_of_ntp_fixed(t3)


def kernel_rx_ns(ancdata: list[tuple[int, int, bytes]]) -> int | None:
    """The SO_TIMESTAMPNS receive time in a `recvmsg` ancillary list, or None."""
    for level, kind, data in ancdata:
        if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS and len(data) >= _TIMESPEC.size:
            sec, nsec = _TIMESPEC.unpack_from(data)
            return sec * 1_000_000_000 + nsec
    return None


def enable_rx_timestamps(sock: socket.socket) -> bool:
    """Ask the kernel for receive timestamps on `sock`; False when it refuses (userspace time then)."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        return True
    except OSError:
        return False


def enable_tx_timestamps(sock: socket.socket) -> bool:
    """Ask the kernel for software TX stamps on `sock`; False when it refuses (T3 uncorrected then)."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPING, TX_STAMP_FLAGS)
        return True
    except OSError:
        return False


def kernel_tx_ns(sock: socket.socket) -> int | None:
    """The TX stamp of the datagram just sent (the error queue), or None."""
    while True:
        try:
            _, ancdata, _, _ = sock.recvmsg(1, 256, socket.MSG_ERRQUEUE | socket.MSG_DONTWAIT)
        except (BlockingIOError, InterruptedError, OSError):
            return None
        for level, kind, data in ancdata:
            if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPING and len(data) >= _TIMESPEC.size:
                sec, nsec = _TIMESPEC.unpack_from(data)  # the first of three timespecs: software
                if sec or nsec:
                    return sec * 1_000_000_000 + nsec


class TimeServer:
    """A minimal NTP server (mode 4 answers to mode 3 requests) on one UDP socket, in a thread."""

    def __init__(self, listen: str = "127.0.0.1:7123", keys: ClockKeys | None = None) -> None:
        """`keys`: answer authenticated requests (None: only plain ones, and a trailer is ignored)."""
        host, port = parse_addr(listen)
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.sock = socket.socket(family, socket.SOCK_DGRAM)
        self.sock.bind((host, port))
        self.sock.settimeout(0.2)  # lets the thread notice stop()
        self.kernel_timestamps = enable_rx_timestamps(self.sock)
        self.tx_correction = enable_tx_timestamps(self.sock)
        self.keys = keys
        # The TX lag of plain and of authenticated replies (which compute a MAC after reading T3).
        self._tx_lags: dict[bool, deque[int]] = {
            False: deque(maxlen=TX_LAG_WINDOW),
            True: deque(maxlen=TX_LAG_WINDOW),
        }
        self.port: int = self.sock.getsockname()[1]
        self.requests = 0
        self.authenticated = 0  # of `requests`: answered with a MAC
        self.bad_requests = 0
        self.refused: dict[str, int] = {}  # authenticated requests left unanswered: key, mac, malformed
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="collector-time", daemon=True)

    def start(self) -> TimeServer:
        """Start answering; returns self."""
        self._thread.start()
        log.info("time service on udp port %d (kernel rx timestamps: %s)", self.port, self.kernel_timestamps)
        return self

    def stop(self) -> None:
        """Stop answering and close the socket."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(2)
        self.sock.close()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                data, ancdata, _flags, peer = self.sock.recvmsg(512, CMSG_SPACE)
            except TimeoutError:
                continue
            except OSError:
                if self._stop.is_set():
                    return
                continue
            t2 = kernel_rx_ns(ancdata) or time.time_ns()
            request = ntplib.NTPPacket()
            try:
                request.from_data(data[:NTP_PACKET_SIZE])
            except ntplib.NTPException:
                self.bad_requests += 1
                continue
            if request.mode != 3:  # only client requests
                self.bad_requests += 1
                continue
            auth = None
            if self.keys is not None and len(data) > NTP_PACKET_SIZE:
                try:
                    _node, key_id, key, nonce = self.keys.check_request(data)
                except ClockAuthError as err:
                    self.refused[err.reason] = self.refused.get(err.reason, 0) + 1
                    continue
                auth = (key, key_id, nonce)
            lags = self._tx_lags[auth is not None]
            reply = ntplib.NTPPacket(version=request.version or 4, mode=4)
            reply.stratum = 1
            reply.precision = -20  # about 1 us (log2 seconds)
            reply.ref_id = REF_ID
            reply.orig_timestamp = request.tx_timestamp  # the client matches replies on it
            reply.recv_timestamp = ns_to_ntp(t2)
            reply.ref_timestamp = reply.recv_timestamp
            read_at = time.time_ns()
            lag = min(lags) if len(lags) >= TX_LAG_MIN_SAMPLES else 0
            t3 = read_at + lag  # when the reply leaves, as measured lately
            reply.tx_timestamp = ns_to_ntp(t3)
            try:
                data = bytearray(reply.to_data())
                REPLY_TIMES.pack_into(data, REPLY_TIMES_OFFSET, ntp_fixed(t2), ntp_fixed(t3))
                out = bytes(data) if auth is None else sign_reply(bytes(data), *auth)
                self.sock.sendto(out, peer)
                self.requests += 1
                self.authenticated += auth is not None
                if self.tx_correction and (sent_at := kernel_tx_ns(self.sock)):
                    lags.append(sent_at - read_at)
            except (OSError, ntplib.NTPException):
                self.bad_requests += 1
