"""Network namespaces from Python: where a namespace's file is, and sockets created inside one.

Shared by `hoptrace mace` (its in-container pinger) and the test topology (tests/topology.py).
"""

from __future__ import annotations

import ctypes
import os
import socket
import struct
import threading
from typing import Any

_CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)


def netns_path(netns: str) -> str:
    """A netns given as a /run/netns name, a path, or a PID, as a path."""
    if netns.isdigit():
        return f"/proc/{netns}/ns/net"
    return netns if "/" in netns else f"/run/netns/{netns}"


def socket_in_netns(path: str, family: int, type_: int, proto: int = 0) -> socket.socket:
    """A socket created inside the namespace at `path`.

    A socket keeps the namespace it was created in, so a short-lived thread enters the namespace (setns(2)
    changes only the calling thread), creates the socket and ends; the caller's thread never moves.
    """
    result: dict[str, Any] = {}

    def create() -> None:
        try:
            with open(path, "rb") as nsfile:
                if _libc.setns(nsfile.fileno(), _CLONE_NEWNET) != 0:
                    err = ctypes.get_errno()
                    raise OSError(err, f"setns {path}: {os.strerror(err)}")
            result["sock"] = socket.socket(family, type_, proto)
        except BaseException as exc:  # handed to the caller's thread
            result["error"] = exc

    thread = threading.Thread(target=create, name="setns")
    thread.start()
    thread.join()
    if "error" in result:
        raise result["error"]
    return result["sock"]


def inet_checksum(data: bytes) -> int:
    """RFC 1071 Internet checksum."""
    if len(data) % 2:
        data += b"\0"
    total = sum(struct.unpack(f"!{len(data) // 2}H", data))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return ~total & 0xFFFF
