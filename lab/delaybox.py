#!/usr/bin/env python3
"""delaybox: the ground truth for latency tests, a user-space wire that holds every frame for a set delay.

The kernel here has no tc netem, so a test puts this relay on one segment of the path, in its own namespace
between two veth ends (``TwoHostTopology(delay_box=True)`` does it). It reads every frame arriving on either
interface through an AF_PACKET socket, holds it, and sends it unchanged out of the other interface::

    delaybox.py in0 out0 --delay 300us [--jitter 50us --distribution normal] --log holds.jsonl

Timing: a frame's hold starts at the kernel's receive timestamp (SO_TIMESTAMPNS, converted to
CLOCK_MONOTONIC), so the relay's own wake-up latency is absorbed by the delay instead of added to it; one
thread sleeps in select() until ~80 us before the earliest due frame and busy-waits the rest, because a sleep
alone overshoots by tens of microseconds. With a fixed delay (or ``--keep-order``) frames keep their order
per direction; with jitter they may reorder, like a real network.

Each relayed frame gets a log line (JSON lines, or CSV when the file ends in .csv) with its measured hold time
``hold_ns = t_tx_ns - t_rx_ns`` (CLOCK_MONOTONIC, the clock of bpf_ktime_get_ns) and fields to match it to a
packet: a hash of the whole frame and the innermost packet's addresses, ports, IPv4 ID and hoptrace packet
ID (UDP: the 4 bytes after the UDP length, RFC 9868 surplus area; TCP: option 253 with ExID 0x4854). For a
VXLAN frame the fields describe the inner packet and ``vni``/``outer_*`` the tunnel.

The relay prints "ready" on stdout once both sockets are bound. SIGTERM or SIGINT: frames still held are
dropped (counted), the log is flushed, a JSON summary goes to stderr, exit 0.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import ctypes
import hashlib
import heapq
import ipaddress
import json
import os
import random
import select
import signal
import socket
import struct
import sys
import time
from collections import deque
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

from hoptrace.common.durations import parse_duration_ns

ETH_P_ALL = 0x0003
SOL_PACKET = 263
PACKET_OUTGOING = 4  # sll_pkttype of a frame this host sends
PACKET_IGNORE_OUTGOING = 23  # Linux 4.20: do not deliver sent frames to this socket at all
SO_TIMESTAMPNS = 35
SO_TIMESTAMPING = 37  # also the cmsg type of SCM_TIMESTAMPING
SOF_TIMESTAMPING_TX_SOFTWARE = 1 << 1
SOF_TIMESTAMPING_SOFTWARE = 1 << 4
SOF_TIMESTAMPING_OPT_TSONLY = 1 << 11
TX_TIMESTAMP_FLAGS = SOF_TIMESTAMPING_TX_SOFTWARE | SOF_TIMESTAMPING_SOFTWARE | SOF_TIMESTAMPING_OPT_TSONLY
SO_RCVBUFFORCE = 33
PR_SET_TIMERSLACK = 29

SPIN_NS = 80_000  # busy-wait the last 80 us before a frame is due
IDLE_FLUSH_NS = 1_000_000  # write queued log lines only when nothing is due within 1 ms

VXLAN_PORT = 4789
TCPOPT_HOPTRACE = 253  # RFC 6994 experimental option, ExID 0x4854 ("HT"), then the 4-byte ID
TCPOPT_HOPTRACE_EXID = 0x4854

LOG_FIELDS = [
    "seq", "dir", "t_rx_ns", "t_tx_ns", "hold_ns", "target_ns", "rx_lag_ns", "len", "hash",
    "ethertype", "src", "dst", "proto", "ip_id", "sport", "dport", "packet_id",
    "vni", "outer_src", "outer_dst", "outer_sport",
]  # fmt: skip


def parse_duration(text: str) -> int:
    """Nanoseconds in a duration like "300us", "1.5ms", "250ns", "0"; a bare number is in us (as in tc)."""
    return parse_duration_ns(text, bare_unit="us")


# ---- frame description (for the log; never on the relay's hot path) -------------------------------------


def _parse_l4(frame: bytes, l4: int, ip_end: int, proto: int, info: dict[str, Any]) -> None:
    if proto == 17 and l4 + 8 <= ip_end:
        sport, dport, ulen = struct.unpack_from("!HHH", frame, l4)
        info.update(sport=sport, dport=dport)
        udp_end = l4 + ulen
        if ulen >= 8 and udp_end + 4 <= ip_end:
            info["packet_id"] = int.from_bytes(frame[udp_end : udp_end + 4], "big")
        if dport == VXLAN_PORT and l4 + 16 + 14 <= ip_end and frame[l4 + 8] & 0x08:
            inner = describe_packet(frame[l4 + 16 : ip_end])
            if inner.get("ethertype") is not None:
                outer = {"outer_src": info["src"], "outer_dst": info["dst"], "outer_sport": sport}
                info.clear()
                info.update(inner)
                info.update(outer)
                info["vni"] = int.from_bytes(frame[l4 + 12 : l4 + 15], "big")
    elif proto == 6 and l4 + 20 <= ip_end:
        sport, dport = struct.unpack_from("!HH", frame, l4)
        info.update(sport=sport, dport=dport)
        opt, opt_end = l4 + 20, min(l4 + (frame[l4 + 12] >> 4) * 4, ip_end)
        while opt < opt_end:
            kind = frame[opt]
            if kind == 0:
                break
            if kind == 1:
                opt += 1
                continue
            if opt + 1 >= opt_end or frame[opt + 1] < 2:
                break
            length = frame[opt + 1]
            if (
                kind == TCPOPT_HOPTRACE
                and length == 8
                and opt + 8 <= opt_end
                and struct.unpack_from("!H", frame, opt + 2)[0] == TCPOPT_HOPTRACE_EXID
            ):
                info["packet_id"] = struct.unpack_from("!I", frame, opt + 4)[0]
            opt += length


def describe_packet(frame: bytes) -> dict[str, Any]:
    """Addresses, ports, IPv4 ID and hoptrace packet ID of an Ethernet frame (innermost packet if VXLAN)."""
    info: dict[str, Any] = {}
    off = 12
    if len(frame) < 14:
        return info
    ethertype = struct.unpack_from("!H", frame, off)[0]
    while ethertype in (0x8100, 0x88A8) and len(frame) >= off + 6:
        off += 4
        ethertype = struct.unpack_from("!H", frame, off)[0]
    l3 = off + 2
    info["ethertype"] = ethertype
    if ethertype == 0x0800 and len(frame) >= l3 + 20:
        ihl = (frame[l3] & 0x0F) * 4
        total, ip_id = struct.unpack_from("!HH", frame, l3 + 2)
        proto = frame[l3 + 9]
        info.update(
            src=str(ipaddress.IPv4Address(frame[l3 + 12 : l3 + 16])),
            dst=str(ipaddress.IPv4Address(frame[l3 + 16 : l3 + 20])),
            proto=proto,
            ip_id=ip_id,
        )
        frag_offset = struct.unpack_from("!H", frame, l3 + 6)[0] & 0x1FFF
        if frag_offset == 0:
            _parse_l4(frame, l3 + ihl, min(l3 + total, len(frame)), proto, info)
    elif ethertype == 0x86DD and len(frame) >= l3 + 40:
        payload_len = struct.unpack_from("!H", frame, l3 + 4)[0]
        proto = frame[l3 + 6]
        info.update(
            src=str(ipaddress.IPv6Address(frame[l3 + 8 : l3 + 24])),
            dst=str(ipaddress.IPv6Address(frame[l3 + 24 : l3 + 40])),
            proto=proto,
        )
        _parse_l4(frame, l3 + 40, min(l3 + 40 + payload_len, len(frame)), proto, info)
    return info


def frame_hash(frame: bytes) -> str:
    """A short hash of the whole frame: equal for the frame sent and the frame received if nothing changed."""
    return hashlib.blake2b(frame, digest_size=8).hexdigest()


def read_log(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The records of a delay box log (JSON lines or CSV), numbers as ints, missing fields as None."""
    text = Path(path).read_text()
    if os.fspath(path).endswith(".csv"):
        rows: list[dict[str, Any]] = list(csv.DictReader(text.splitlines()))
        for row in rows:
            for key, value in row.items():
                if value == "":
                    row[key] = None
                elif key not in ("dir", "hash", "src", "dst", "outer_src", "outer_dst"):
                    row[key] = int(value)
        return rows
    return [json.loads(line) for line in text.splitlines() if line.strip()]


# ---- the relay -------------------------------------------------------------------------------------------


class LogWriter:
    """Queues relayed frames with their timing; writes them as JSON lines or CSV when the relay is idle."""

    def __init__(self, stream: IO[str] | None, fmt: str) -> None:
        self.stream = stream
        self.fmt = fmt
        self.pending: list[tuple[Any, ...]] = []
        self._csv = csv.DictWriter(stream, LOG_FIELDS) if stream is not None and fmt == "csv" else None
        if self._csv is not None:
            self._csv.writeheader()

    def add(self, *entry: Any) -> None:
        """Queue one relayed frame: (seq, dir, t_rx_ns, t_tx_ns, target_ns, rx_lag_ns, frame)."""
        if self.stream is not None:
            self.pending.append(entry)

    def flush(self) -> None:
        """Describe and write every queued frame."""
        if self.stream is None:
            return
        for seq, direction, t_rx, t_tx, target, rx_lag, frame in self.pending:
            row: dict[str, Any] = dict.fromkeys(LOG_FIELDS)
            row.update(
                seq=seq,
                dir=direction,
                t_rx_ns=t_rx,
                t_tx_ns=t_tx,
                hold_ns=t_tx - t_rx,
                target_ns=target,
                rx_lag_ns=rx_lag,
                len=len(frame),
                hash=frame_hash(frame),
            )
            row.update(describe_packet(frame))
            if self._csv is not None:
                self._csv.writerow(row)
            else:
                self.stream.write(json.dumps(row, separators=(",", ":")) + "\n")
        self.pending.clear()
        self.stream.flush()


def open_packet_socket(ifname: str) -> socket.socket:
    """A raw AF_PACKET socket that receives only ``ifname``'s incoming frames, with kernel timestamps."""
    # Protocol 0 until bind: a packet socket created with ETH_P_ALL would queue frames of every interface
    # in the namespace until it is bound to one.
    sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0)
    with contextlib.suppress(OSError):  # the pkttype check in the receive loop covers older kernels
        sock.setsockopt(SOL_PACKET, PACKET_IGNORE_OUTGOING, 1)
    try:
        sock.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, 8 << 20)
    except OSError:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
    sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
    # Software TX stamps: the kernel stamps a sent frame in the driver (veth_xmit -> skb_tx_timestamp), so
    # a hold ends when the frame really leaves, not before the relay's own send() syscall.
    sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPING, TX_TIMESTAMP_FLAGS)
    sock.bind((ifname, ETH_P_ALL))
    sock.setblocking(False)
    return sock


def tx_timestamp(sock: socket.socket) -> int:
    """The kernel's software TX stamp of the frame just sent (CLOCK_MONOTONIC ns), or 0 when there is none.

    The driver stamps synchronously inside send() on veth, so the stamp is queued when send() returns.
    """
    offset = time.time_ns() - time.monotonic_ns()
    while True:
        try:
            _, ancdata, _, _ = sock.recvmsg(1, 512, socket.MSG_ERRQUEUE | socket.MSG_DONTWAIT)
        except (BlockingIOError, InterruptedError):
            return 0
        for level, kind, data in ancdata:
            if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPING and len(data) >= 16:
                sec, nsec = struct.unpack_from("@qq", data)  # ts[0]: the software stamp
                if sec or nsec:
                    return sec * 1_000_000_000 + nsec - offset


def make_delay_sampler(
    delay_ns: int, jitter_ns: int, distribution: str, rng: random.Random
) -> Callable[[], int]:
    """A function returning each frame's target hold time in ns (never negative)."""
    if jitter_ns <= 0:
        return lambda: delay_ns
    if distribution == "uniform":
        return lambda: max(0, round(delay_ns + rng.uniform(-jitter_ns, jitter_ns)))
    if distribution == "normal":
        return lambda: max(0, round(rng.gauss(delay_ns, jitter_ns)))
    raise ValueError(f"unknown distribution {distribution!r}: uniform or normal")


class Relay:
    """Relays frames between two interfaces, holding each until its due time."""

    def __init__(self, ifnames: tuple[str, str], sample: Callable[[], int], keep_order: bool, log: LogWriter):
        self.ifnames = ifnames
        self.socks = (open_packet_socket(ifnames[0]), open_packet_socket(ifnames[1]))
        self.dirs = (f"{ifnames[0]}>{ifnames[1]}", f"{ifnames[1]}>{ifnames[0]}")
        self.sample = sample
        self.keep_order = keep_order
        self.log = log
        # heap of (due_ns, seq, from_index, t_rx_ns, target_ns, rx_lag_ns, frame)
        self.heap: list[tuple[int, int, int, int, int, int, bytes]] = []
        self.last_due = [0, 0]
        self.seq = 0
        self.stats = {
            "relayed": [0, 0],
            "send_errors": 0,
            "truncated": 0,
            "user_timestamps": 0,
            "user_tx_timestamps": 0,
        }
        self.stopping = False
        self._send_lags: deque[int] = deque(maxlen=256)

    def _receive(self, index: int) -> None:
        """Queue every frame waiting on socket ``index``."""
        sock = self.socks[index]
        # CLOCK_REALTIME (the kernel's receive stamp) minus CLOCK_MONOTONIC, read now: both clocks are slewed
        # alike, so the difference is exact unless the wall clock is stepped in between.
        mono_now = time.monotonic_ns()
        offset = time.time_ns() - mono_now
        while True:
            try:
                frame, ancdata, flags, addr = sock.recvmsg(65536, 64)
            except BlockingIOError:
                return
            if addr[2] == PACKET_OUTGOING:
                continue
            if flags & socket.MSG_TRUNC:
                self.stats["truncated"] += 1
                continue
            t_rx = 0
            for level, kind, data in ancdata:
                if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS and len(data) >= 16:
                    sec, nsec = struct.unpack_from("@qq", data)
                    t_rx = sec * 1_000_000_000 + nsec - offset
            user_now = time.monotonic_ns()
            if not 0 < user_now - t_rx < 1_000_000_000:  # no (or implausible) kernel stamp
                t_rx = user_now
                self.stats["user_timestamps"] += 1
            target = self.sample()
            due = t_rx + target
            if self.keep_order:
                due = max(due, self.last_due[index])
                self.last_due[index] = due
            self.seq += 1
            heapq.heappush(self.heap, (due, self.seq, index, t_rx, target, user_now - t_rx, frame))

    @property
    def send_lead_ns(self) -> int:
        """How early to call send() so the frame leaves (the kernel's TX stamp) when it is due: the smallest
        recent lag from calling send() to that stamp (the syscall and the stack down to veth_xmit)."""
        return min(self._send_lags) if len(self._send_lags) >= 8 else 0

    def _send_due(self) -> None:
        heap = self.heap
        while heap and heap[0][0] - self.send_lead_ns <= time.monotonic_ns():
            _, seq, index, t_rx, target, rx_lag, frame = heapq.heappop(heap)
            t_tx = time.monotonic_ns()
            called = t_tx
            sock = self.socks[1 - index]
            try:
                sock.send(frame)
            except OSError:
                self.stats["send_errors"] += 1
                continue
            kernel_tx = tx_timestamp(sock)
            if kernel_tx:
                t_tx = kernel_tx
                self._send_lags.append(kernel_tx - called)
            else:
                self.stats["user_tx_timestamps"] += 1
            self.stats["relayed"][index] += 1
            self.log.add(seq, self.dirs[index], t_rx, t_tx, target, rx_lag, frame)

    def run(self, wakeup_fd: int) -> None:
        """Relay until ``stop()`` (a signal handler; ``wakeup_fd`` is readable when one ran)."""
        readers = [self.socks[0], self.socks[1], wakeup_fd]
        while not self.stopping:
            self._send_due()
            wait = self.heap[0][0] - self.send_lead_ns - time.monotonic_ns() if self.heap else None
            if wait is not None and wait <= SPIN_NS:
                # Close to due: take in what arrived meanwhile, then spin.
                self._receive(0)
                self._receive(1)
                due = self.heap[0][0] - self.send_lead_ns
                while time.monotonic_ns() < due:
                    pass
                continue
            if self.log.pending and (wait is None or wait > IDLE_FLUSH_NS):
                self.log.flush()
                continue
            timeout = None if wait is None else (wait - SPIN_NS) / 1e9
            ready, _, _ = select.select(readers, [], [], timeout)
            for obj in ready:
                if obj is wakeup_fd:
                    os.read(wakeup_fd, 512)
                else:
                    self._receive(self.socks.index(obj))

    def stop(self, *_: Any) -> None:
        """Signal handler: leave the loop."""
        self.stopping = True


def _set_timer_slack(ns: int) -> None:
    """Shrink this thread's timer slack (default 50 us) so select() timeouts wake on time."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_TIMERSLACK, ctypes.c_ulong(ns), 0, 0, 0)


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("iface_a", help="first interface (e.g. in0)")
    parser.add_argument("iface_b", help="second interface (e.g. out0)")
    parser.add_argument("--delay", default="0", help="hold time, e.g. 300us (bare numbers: us)")
    parser.add_argument("--jitter", default="0", help="jitter: +-range (uniform) or sigma (normal)")
    parser.add_argument("--distribution", choices=("uniform", "normal"), default="uniform")
    parser.add_argument("--keep-order", action="store_true", help="never reorder frames, even with jitter")
    parser.add_argument("--seed", type=int, help="seed of the jitter generator")
    parser.add_argument("--log", help="per-frame log file (JSON lines; CSV if it ends in .csv)")
    parser.add_argument("--log-format", choices=("json", "csv"), help="override the format of --log")
    args = parser.parse_args(argv)

    try:
        delay_ns, jitter_ns = parse_duration(args.delay), parse_duration(args.jitter)
    except ValueError as exc:
        parser.error(str(exc))
    sample = make_delay_sampler(delay_ns, jitter_ns, args.distribution, random.Random(args.seed))
    fmt = args.log_format or ("csv" if (args.log or "").endswith(".csv") else "json")
    stream = open(args.log, "w", newline="" if fmt == "csv" else None) if args.log else None  # noqa: SIM115
    log = LogWriter(stream, fmt)
    relay = Relay((args.iface_a, args.iface_b), sample, args.keep_order or jitter_ns == 0, log)

    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGTERM, relay.stop)
    signal.signal(signal.SIGINT, relay.stop)
    _set_timer_slack(1)

    print("ready", flush=True)
    try:
        relay.run(wake_r)
    finally:
        log.flush()
        if stream is not None:
            stream.close()
        summary = {
            "relayed": dict(zip(relay.dirs, relay.stats["relayed"], strict=True)),
            "dropped_at_stop": len(relay.heap),
            "send_errors": relay.stats["send_errors"],
            "truncated": relay.stats["truncated"],
            "user_timestamps": relay.stats["user_timestamps"],
        }
        print(json.dumps(summary), file=sys.stderr, flush=True)
    return 0


def iter_holds(records: list[dict[str, Any]], direction: str | None = None) -> Iterator[int]:
    """Hold times (ns) of log records, optionally of one direction ("in0>out0")."""
    return (r["hold_ns"] for r in records if direction is None or r["dir"] == direction)


if __name__ == "__main__":
    sys.exit(main())
