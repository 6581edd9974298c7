"""Three emulated hosts with a routed hop between them, and two equal-cost wires on the first leg::

    c1 eth0 -- veth-c1 [br0 host-a wa0,wa1] ==two wires== [ra0,ra1 host-r rb0] ==wire== [wb0 host-b br0]
                                                                                   veth-c2 -- eth0 c2

host-a routes c2's subnet over both wires (ECMP, hashed on the 5-tuple: ``fib_multipath_hash_policy=1``), so
flows from c1 to c2 split between wa0 and wa1 by their ports; host-r routes between its three wires; host-b
bridges c2. Discovery tests use it for a path with a routed hop, and for flows on different paths.

Namespaces are ``{prefix}-a``, ``-r``, ``-b``, ``-c1``, ``-c2``; addresses only from 198.18.0.0/15, no
route out. ``destroy()`` (and the Reaper if the test process dies) removes everything.
"""

from __future__ import annotations

import socket
import subprocess
from types import TracebackType

from hoptrace.common.netns import socket_in_netns
from hoptrace.lab.lifecycle import Reaper
from hoptrace.lab.topology import netns_list

ROLES = ("host-a", "host-r", "host-b", "c1", "c2")
SHORT = {"host-a": "a", "host-r": "r", "host-b": "b", "c1": "c1", "c2": "c2"}
# (role, dev, address/prefix) of every addressed interface.
ADDRESSES = [
    ("c1", "eth0", "198.18.1.2/24"),
    ("host-a", "br0", "198.18.1.1/24"),
    ("host-a", "wa0", "198.19.1.1/30"),
    ("host-a", "wa1", "198.19.2.1/30"),
    ("host-r", "ra0", "198.19.1.2/30"),
    ("host-r", "ra1", "198.19.2.2/30"),
    ("host-r", "rb0", "198.19.3.1/30"),
    ("host-b", "wb0", "198.19.3.2/30"),
    ("host-b", "br0", "198.18.2.1/24"),
    ("c2", "eth0", "198.18.2.2/24"),
]
# veth pairs: (role, dev) -- (role, dev)
WIRES = [
    (("c1", "eth0"), ("host-a", "veth-c1")),
    (("host-a", "wa0"), ("host-r", "ra0")),
    (("host-a", "wa1"), ("host-r", "ra1")),
    (("host-r", "rb0"), ("host-b", "wb0")),
    (("c2", "eth0"), ("host-b", "veth-c2")),
]
ROUTES = [
    ("c1", ["default", "via", "198.18.1.1"]),
    ("c2", ["default", "via", "198.18.2.1"]),
    (
        "host-a",
        [
            "198.18.2.0/24",
            "nexthop",
            "via",
            "198.19.1.2",
            "dev",
            "wa0",
            "nexthop",
            "via",
            "198.19.2.2",
            "dev",
            "wa1",
        ],
    ),
    ("host-r", ["198.18.1.0/24", "via", "198.19.1.1", "dev", "ra0"]),
    ("host-r", ["198.18.2.0/24", "via", "198.19.3.2", "dev", "rb0"]),
    ("host-b", ["198.18.1.0/24", "via", "198.19.3.1", "dev", "wb0"]),
]


class RoutedTopology:
    """host-a (c1 behind br0) -- two equal-cost wires -- host-r (router) -- wire -- host-b (c2 behind br0)."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.c1 = self.netns("c1")
        self.c2 = self.netns("c2")
        self._reaper: Reaper | None = None

    def netns(self, role: str) -> str:
        """The namespace name of a role (host-a, host-r, host-b, c1, c2)."""
        return f"{self.prefix}-{SHORT[role]}"

    def addr(self, role: str) -> str:
        """The container's address (c1, c2)."""
        return next(a.split("/")[0] for r, d, a in ADDRESSES if r == role and d == "eth0")

    def socket(self, role: str, family: int, type_: int) -> socket.socket:
        """A socket inside the role's namespace."""
        return socket_in_netns(f"/run/netns/{self.netns(role)}", family, type_)

    def _ip(self, role: str, *args: str) -> None:
        proc = subprocess.run(
            ["ip", "-n", self.netns(role), *args], capture_output=True, text=True, timeout=30
        )
        if proc.returncode != 0:
            raise RuntimeError(f"ip -n {self.netns(role)} {' '.join(args)}: {proc.stderr.strip()}")

    def create(self) -> RoutedTopology:
        """Build everything; on failure remove what was built and raise."""
        try:
            self._build()
        except BaseException:
            self.destroy()
            raise
        return self

    def _build(self) -> None:
        self._reaper = Reaper()
        for role in ROLES:
            name = self.netns(role)
            self._reaper.watch_netns(name)
            subprocess.run(["ip", "netns", "add", name], check=True, capture_output=True, timeout=30)
            settings = ["net.ipv4.conf.all.rp_filter=0", "net.ipv4.conf.default.rp_filter=0"]
            if role.startswith("host-"):
                # L4 hashing: flows of one source and destination spread over the equal-cost wires by port.
                settings += ["net.ipv4.ip_forward=1", "net.ipv4.fib_multipath_hash_policy=1"]
            subprocess.run(
                ["ip", "netns", "exec", name, "sysctl", "-q", "-w", *settings],
                check=True,
                capture_output=True,
            )
            self._ip(role, "link", "set", "lo", "up")
        for role in ("host-a", "host-b"):
            self._ip(role, "link", "add", "br0", "type", "bridge")
        for (role_a, dev_a), (role_b, dev_b) in WIRES:
            self._ip(
                role_a,
                "link",
                "add",
                dev_a,
                "type",
                "veth",
                "peer",
                "name",
                dev_b,
                "netns",
                self.netns(role_b),
            )
        self._ip("host-a", "link", "set", "veth-c1", "master", "br0")
        self._ip("host-b", "link", "set", "veth-c2", "master", "br0")
        for role, dev, address in ADDRESSES:
            self._ip(role, "addr", "add", address, "dev", dev)
        for role in ROLES:
            devs = {d for r, d, _ in ADDRESSES if r == role} | {
                d for pair in WIRES for r, d in pair if r == role
            }
            for dev in sorted(devs):
                self._ip(role, "link", "set", dev, "up")
        for role, route in ROUTES:
            self._ip(role, "route", "add", *route)

    def destroy(self) -> None:
        """Delete the namespaces (and with them every link and route). Idempotent."""
        existing = set(netns_list())
        for role in ROLES:
            if self.netns(role) in existing:
                subprocess.run(["ip", "netns", "del", self.netns(role)], capture_output=True, timeout=30)
        if self._reaper is not None:
            self._reaper.release()
            self._reaper = None

    def __enter__(self) -> RoutedTopology:
        return self.create()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.destroy()
