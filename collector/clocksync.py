"""Reference Cristian client of the collector's time service (`timeservice.py`), in Python.

The agents (Go) implement the same exchange; this module is what they are checked against and what the
tests use. One probe: T1 is the kernel's TX stamp of the request (software timestamping); the server
stamps its receive time T2 and transmit time T3 at the same layer (`timeservice.py`); T4 is the reply's
kernel receive time (SO_TIMESTAMPNS). Times read in user space around the syscalls would put the syscall
and wake-up cost on one leg only and bias the offset by half of it.

    delay  = (T4 - T1) - (T3 - T2)              round trip minus the server's processing time
    offset = ((T1 - T2) + (T4 - T3)) / 2         node clock - master clock

Of `probes` probes the one with the smallest delay wins (Cristian; vNetTracer III-C samples 100): it is the
one least disturbed by queueing. Whatever the asymmetry of its two legs, the true offset lies within
delay / 2 of the estimate, plus the timestamps' resolution: `bound_ns` = delay / 2 + `RESOLUTION_NS`.
T2 and T3 are read from the reply's fixed-point fields to the nanosecond (`reply_times`), not through
ntplib's floats. With a `ClientKey` the probes are authenticated as the agents' (`clockauth.py`): a reply
that is not the server's authentic answer to the probe is counted in `refused` and never used.
"""

from __future__ import annotations

import secrets
import socket
import time
from dataclasses import dataclass

import ntplib

from hoptrace.collector.clockauth import ClockAuthError, auth_request, check_reply
from hoptrace.collector.timeservice import (
    CMSG_SPACE,
    NTP_PACKET_SIZE,
    enable_rx_timestamps,
    enable_tx_timestamps,
    kernel_rx_ns,
    kernel_tx_ns,
    ns_to_ntp,
    parse_addr,
    reply_times,
)
from hoptrace.v1 import records_pb2

# The four times are nanoseconds; T2 and T3 cross the wire as 32.32 fixed point, rounded to 0.23 ns each.
RESOLUTION_NS = 1


@dataclass(frozen=True)
class ClientKey:
    """A node's clock key (`ClockKeys.issue`, or `derive_key` of a key file with key_id 0)."""

    node: str
    key_id: int
    key: bytes


def _probes(
    addr: str,
    probes: int,
    timeout_s: float,
    key: ClientKey | None = None,
    refused: dict[str, int] | None = None,
) -> list[tuple[int, int, int]]:
    """Run the exchanges; return (delay_ns, offset_ns, node wall time at the probe's midpoint) of each."""
    host, port = parse_addr(addr)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    out: list[tuple[int, int, int]] = []
    with socket.socket(family, socket.SOCK_DGRAM) as sock:
        sock.connect((host, port))
        sock.settimeout(timeout_s)
        enable_rx_timestamps(sock)
        tx_stamps = enable_tx_timestamps(sock)
        for _ in range(probes):
            # The transmit timestamp is only a nonce the server echoes (as chrony does); T1 is kept here, read
            # like the server's T3: before the encoding and the send, so both legs carry the same overhead.
            request = ntplib.NTPPacket(version=4, mode=3, tx_timestamp=ns_to_ntp(time.time_ns()))
            nonce = secrets.token_bytes(16)
            t1 = time.time_ns()
            data = request.to_data()
            if key is not None:
                data = auth_request(data, key.key, key.key_id, nonce, key.node)
            sock.send(data)
            if tx_stamps:
                t1 = kernel_tx_ns(sock) or t1
            sent = ntplib.NTPPacket()
            sent.from_data(data[:NTP_PACKET_SIZE])  # the nonce as the server reads it
            deadline = time.monotonic() + timeout_s  # replies that are not this probe's end it no later
            while True:
                try:
                    data, ancdata, _flags, _peer = sock.recvmsg(512, CMSG_SPACE)
                except TimeoutError:
                    data = b""
                    break
                t4 = kernel_rx_ns(ancdata) or time.time_ns()
                if key is not None:
                    try:
                        check_reply(data, key.key, key.key_id, nonce)
                    except ClockAuthError as err:
                        if refused is not None:
                            refused[err.reason] = refused.get(err.reason, 0) + 1
                        if time.monotonic() > deadline:
                            data = b""
                            break
                        continue
                reply = ntplib.NTPPacket()
                try:
                    reply.from_data(data[:NTP_PACKET_SIZE])
                except ntplib.NTPException:
                    continue
                if reply.mode == 4 and abs(reply.orig_timestamp - sent.tx_timestamp) < 1e-6:
                    break  # the answer to this probe (older, late answers are skipped)
            if not data:
                continue
            t2, t3 = reply_times(data)
            delay = (t4 - t1) - (t3 - t2)
            if delay < 0:  # impossible: a timestamp was off (e.g. a T3 correction still settling)
                continue
            offset = ((t1 - t2) + (t4 - t3)) // 2
            out.append((delay, offset, (t1 + t4) // 2))
    return out


def measure_offset(
    addr: str,
    probes: int = 100,
    timeout_s: float = 1.0,
    key: ClientKey | None = None,
    refused: dict[str, int] | None = None,
) -> tuple[int, int, int]:
    """Cristian's algorithm against the time service at `addr` ("HOST:PORT"), authenticated with `key`
    (replies refused are counted by reason in `refused`).

    Returns (offset_ns, delay_ns, bound_ns) of the minimum-delay probe: offset = this machine's
    CLOCK_REALTIME - the master's. Raises TimeoutError when no probe is answered.
    """
    delay, offset, _ = _best(addr, probes, timeout_s, key, refused)
    return offset, delay, delay // 2 + RESOLUTION_NS


def _best(
    addr: str,
    probes: int,
    timeout_s: float,
    key: ClientKey | None = None,
    refused: dict[str, int] | None = None,
) -> tuple[int, int, int]:
    samples = _probes(addr, probes, timeout_s, key, refused)
    if not samples:
        raise TimeoutError(f"time service at {addr} answered none of {probes} probes")
    return min(samples)


def node_clock(addr: str, probes: int = 100, drift_ppm: float = 0.0) -> records_pb2.NodeClock:
    """A `NodeClock` for this machine, as an agent sends it: the measured offset, sampled at the midpoint of
    the best probe (T1 + T4) / 2, and the CLOCK_REALTIME - CLOCK_MONOTONIC difference read now."""
    delay, offset, sampled_at = _best(addr, probes, 1.0)
    mono_to_real = time.clock_gettime_ns(time.CLOCK_REALTIME) - time.clock_gettime_ns(time.CLOCK_MONOTONIC)
    return records_pb2.NodeClock(
        monotonic_to_realtime_ns=mono_to_real,
        offset_ns=offset,
        bound_ns=delay // 2 + RESOLUTION_NS,
        drift_ppm=drift_ppm,
        delay_ns=delay,
        sampled_at_ns=sampled_at,
    )
