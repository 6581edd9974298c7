"""A UDP sender at a fixed packet rate, run inside a namespace by the preset tests and benches.

    python3 flood.py DST PORT RATE SIZE SECONDS [SEED]

Each datagram starts with a sequence number and a per-run random prefix, so no two share their first bytes.
"""

from __future__ import annotations

import contextlib
import os
import socket
import struct
import sys
import time


def flood(dst: str, port: int, rate: float, size: int, seconds: float) -> int:
    """Send ``rate`` datagrams per second for ``seconds``; return how many were sent."""
    sock = socket.socket(socket.AF_INET6 if ":" in dst else socket.AF_INET, socket.SOCK_DGRAM)
    prefix = os.urandom(4)
    pad = b"x" * max(0, size - 12)
    start = time.monotonic()
    sent = 0
    while (now := time.monotonic()) - start < seconds:
        due = int((now - start) * rate) + 1
        while sent < due:
            # ICMP unreachable from the peer surfaces as ECONNREFUSED on the next send
            with contextlib.suppress(OSError):
                sock.sendto(prefix + struct.pack("!Q", sent) + pad, (dst, port))
            sent += 1
        time.sleep(min(0.001, 1 / rate))
    return sent


if __name__ == "__main__":
    n = flood(sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5]))
    print(n, flush=True)
