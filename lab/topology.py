"""Two emulated hosts with one container each, built from network namespaces.

This is the topology of hoptrace's end-to-end tests and of ``make demo``. It depends only on the standard
library and the ``ip``, ``sysctl``, ``ping`` and (for the delay box) ``ethtool`` commands, so it can be
imported as a plain module::

    c1 eth0 -- veth-c1 [br0  host-a  wire0] ==wire== [wire0  host-b  br0] veth-c2 -- eth0 c2

``overlay="vxlan"`` carries container traffic in ``vxlan0`` (VNI 42, UDP 4789) over the wire, the way
flannel's vxlan backend does; ``overlay="routed"`` routes it on the wire directly. ``delay_box=True`` splits
the wire through a namespace ``box`` whose user-space relay (``lab/delaybox.py``) holds every frame
for a set delay: ``host-a wire0 -- in0 [box] out0 -- wire0 host-b``. The wire carries nothing until
``start_delay_box()`` runs the relay.

Everything lives in namespaces named after the prefix; nothing is created in the root namespace. Addresses
come only from the test networks 198.18.0.0/15 and fd00::/8, and no namespace has a route out.
"""

from __future__ import annotations

import json
import os
import random
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Literal

from hoptrace.common.netns import inet_checksum, socket_in_netns
from hoptrace.lab.lifecycle import Reaper, dies_with_parent

Overlay = Literal["vxlan", "routed"]

HOST_ROLES = ("host-a", "host-b", "c1", "c2")
BOX_ROLE = "box"
DELAYBOX_SCRIPT = Path(__file__).resolve().parent / "delaybox.py"

VXLAN_ID = 42
VXLAN_PORT = 4789
# The nftables table (netdev family) of drop_flow_on_wire.
LOSS_TABLE = "htloss"
WIRE_MTU = 1500
# VXLAN over IPv4 adds 50 bytes (outer Ethernet 14 + IPv4 20 + UDP 8 + VXLAN 8, RFC 7348), so the overlay
# and everything behind it gets 1450 for the encapsulated frame to fit the 1500-byte wire.
VXLAN_MTU = 1450

# Offloads the delay box path runs without: the relay copies frames as they are, so every frame must already
# be a finished, checksummed, MTU-sized packet when a packet socket sees it (a CHECKSUM_PARTIAL skb carries
# only the pseudo-header sum, a GSO skb is up to 64 KiB).
OFFLOADS_OFF = [
    *("gro", "off", "gso", "off", "tso", "off", "tx", "off", "rxvlan", "off", "txvlan", "off"),
    *("tx-udp_tnl-segmentation", "off", "tx-udp_tnl-csum-segmentation", "off", "tx-gso-list", "off"),
]


@dataclass(frozen=True)
class Iface:
    """One interface of the topology, with its fixed MAC and addresses (if any)."""

    role: str
    name: str
    mac: str
    ipv4: str | None = None
    ipv6: str | None = None
    prefix4: int = 24
    prefix6: int = 64

    def addr(self, family: int) -> str:
        """The interface's IPv4 (family 4) or IPv6 (family 6) address."""
        value = self.ipv4 if family == 4 else self.ipv6
        if value is None:
            raise KeyError(f"{self.role}/{self.name} has no IPv{family} address")
        return value


# Fixed, locally administered MACs (02:...) so neighbour entries can be static: no ARP or NDP on the path.
IFACES: dict[tuple[str, str], Iface] = {
    (i.role, i.name): i
    for i in (
        Iface("c1", "eth0", "02:00:c6:12:01:02", "198.18.1.2", "fd00:1::2"),
        Iface("host-a", "veth-c1", "02:00:c6:12:01:fe"),
        Iface("host-a", "br0", "02:00:c6:12:01:01", "198.18.1.1", "fd00:1::1"),
        Iface("host-a", "wire0", "02:00:c6:13:00:01", "198.19.0.1", "fd00:19::1"),
        Iface("host-a", "vxlan0", "02:00:c6:12:fe:01", "198.18.254.1", "fd00:254::1"),
        Iface("host-b", "vxlan0", "02:00:c6:12:fe:02", "198.18.254.2", "fd00:254::2"),
        Iface("host-b", "wire0", "02:00:c6:13:00:02", "198.19.0.2", "fd00:19::2"),
        Iface("host-b", "br0", "02:00:c6:12:02:01", "198.18.2.1", "fd00:2::1"),
        Iface("host-b", "veth-c2", "02:00:c6:12:02:fe"),
        Iface("c2", "eth0", "02:00:c6:12:02:02", "198.18.2.2", "fd00:2::2"),
        Iface("box", "in0", "02:00:c6:13:00:fa"),
        Iface("box", "out0", "02:00:c6:13:00:fb"),
    )
}

# The interface that carries each role's "main" address: a container's eth0, a host's wire0.
MAIN_IFACE = {"c1": "eth0", "c2": "eth0", "host-a": "wire0", "host-b": "wire0"}


class TopologyError(RuntimeError):
    """A command that builds or drives the topology failed."""


def _run(cmd: list[str], check: bool = True, timeout: float = 30.0) -> subprocess.CompletedProcess[str]:
    """Run a command, capturing output; raise TopologyError with its stderr if it fails and check is set."""
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError as exc:
        raise TopologyError(
            f"{cmd[0]} not found: install it (make setup, or apt-get install {cmd[0]})"
        ) from exc
    if check and proc.returncode != 0:
        raise TopologyError(f"{' '.join(cmd)}: exit {proc.returncode}: {proc.stderr.strip()}")
    return proc


def netns_list() -> list[str]:
    """Names of the namespaces in /run/netns (what `ip netns list` shows)."""
    out = _run(["ip", "-j", "netns", "list"]).stdout.strip()
    return [entry["name"] for entry in json.loads(out)] if out else []


class TwoHostTopology:
    """Two emulated hosts (host-a, host-b), a container on each (c1, c2), and optionally a delay box.

    Use as a context manager or call ``create()``/``destroy()``. ``destroy()`` is idempotent and also cleans
    up after a partial ``create()`` (which destroys by itself on failure).
    """

    def __init__(
        self,
        prefix: str,
        overlay: Overlay = "vxlan",
        delay_box: bool = False,
        static_neighbours: bool = True,
        disable_offloads: bool | None = None,
    ) -> None:
        """Describe the topology; nothing is created before ``create()``.

        prefix: namespace names are ``{prefix}-a``, ``{prefix}-b``, ``{prefix}-c1``, ``{prefix}-c2``
        (and ``{prefix}-box``); keep it short and unique per run.
        disable_offloads: turn off GRO/GSO/TSO/tx checksum offload on the wire ends (default: only with a
        delay box, which needs it).
        """
        if overlay not in ("vxlan", "routed"):
            raise ValueError(f"overlay must be 'vxlan' or 'routed', not {overlay!r}")
        self.prefix = prefix
        self.overlay: Overlay = overlay
        self.delay_box = delay_box
        self.static_neighbours = static_neighbours
        self.disable_offloads = delay_box if disable_offloads is None else disable_offloads
        self.host_a = f"{prefix}-a"
        self.host_b = f"{prefix}-b"
        self.c1 = f"{prefix}-c1"
        self.c2 = f"{prefix}-c2"
        self.box = f"{prefix}-box" if delay_box else None
        self.mtu = VXLAN_MTU if overlay == "vxlan" else WIRE_MTU
        self._namespaces = {"host-a": self.host_a, "host-b": self.host_b, "c1": self.c1, "c2": self.c2}
        if self.box:
            self._namespaces[BOX_ROLE] = self.box
        self._created: list[str] = []
        self._reaper: Reaper | None = None  # deletes the namespaces if this process dies first
        self._procs: list[subprocess.Popen[Any]] = []
        self._box_proc: subprocess.Popen[str] | None = None
        self._box_stderr: Path | None = None
        self._lock = threading.Lock()

    # ---- lookups ---------------------------------------------------------------------------------------

    @property
    def roles(self) -> tuple[str, ...]:
        """The roles of this topology: host-a, host-b, c1, c2 and, with a delay box, box."""
        return tuple(self._namespaces)

    @property
    def namespaces(self) -> list[str]:
        """All namespace names of this topology."""
        return list(self._namespaces.values())

    def netns(self, role: str) -> str:
        """The namespace name of a role ("host-a", "host-b", "c1", "c2", "box")."""
        try:
            return self._namespaces[role]
        except KeyError:
            raise KeyError(
                f"no role {role!r} in this topology; roles: {', '.join(self._namespaces)}"
            ) from None

    def netns_path(self, role: str) -> str:
        """The nsfs path of a role's namespace (what `setns` and hop plans accept)."""
        return f"/run/netns/{self.netns(role)}"

    def netns_inode(self, role: str) -> int:
        """The inode of a role's namespace (the BPF constant ``hop_netns_ino``)."""
        return os.stat(self.netns_path(role)).st_ino

    def iface(self, role: str, name: str | None = None) -> Iface:
        """The interface record of ``name`` in ``role`` (default: eth0 of a container, wire0 of a host)."""
        name = name or MAIN_IFACE[role]
        if (role, name) not in IFACES:
            raise KeyError(f"no interface {name!r} in {role!r}")
        if name == "vxlan0" and self.overlay != "vxlan":
            raise KeyError("vxlan0 exists only with overlay='vxlan'")
        return IFACES[(role, name)]

    def addr(self, role: str, family: int = 4, iface: str | None = None) -> str:
        """The IPv4 or IPv6 address of ``role`` (its main interface unless ``iface`` is given)."""
        return self.iface(role, iface).addr(family)

    def mac(self, role: str, iface: str | None = None) -> str:
        """The MAC address of an interface."""
        return self.iface(role, iface).mac

    def ifindex(self, role: str, iface: str) -> int:
        """The ifindex of ``iface`` inside the namespace of ``role``."""
        out = self.run(role, "ip", "-j", "link", "show", "dev", iface).stdout
        return int(json.loads(out)[0]["ifindex"])

    # ---- commands --------------------------------------------------------------------------------------

    def run(
        self, role: str, *cmd: str, check: bool = True, timeout: float = 30.0
    ) -> subprocess.CompletedProcess[str]:
        """Run ``cmd`` inside the namespace of ``role`` and return the finished process (text output)."""
        return _run(["ip", "netns", "exec", self.netns(role), *cmd], check=check, timeout=timeout)

    def popen(self, role: str, *cmd: str, **kwargs: Any) -> subprocess.Popen[Any]:
        """Start ``cmd`` inside the namespace of ``role``; ``destroy()`` kills it if it still runs."""
        proc = subprocess.Popen(dies_with_parent(["ip", "netns", "exec", self.netns(role), *cmd]), **kwargs)
        with self._lock:
            self._procs.append(proc)
        return proc

    def _ip(self, role: str, *args: str) -> None:
        _run(["ip", "-n", self.netns(role), *args])

    def _sysctl(self, role: str, *settings: str) -> None:
        self.run(role, "sysctl", "-q", "-w", *settings)

    # ---- lifecycle -------------------------------------------------------------------------------------

    def __enter__(self) -> TwoHostTopology:
        return self.create()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.destroy()

    def create(self) -> TwoHostTopology:
        """Build namespaces, links, addresses and routes; on any failure remove what was built and raise."""
        if self._created:
            return self
        try:
            self._build()
        except BaseException:
            self.destroy()
            raise
        return self

    def destroy(self) -> None:
        """Stop the delay box and every process started with ``popen()``, then delete the namespaces.

        Idempotent; safe after a partial ``create()``. Deleting a namespace removes its links and routes.
        """
        self.stop_delay_box(check=False)
        with self._lock:
            procs, self._procs = self._procs, []
        for proc in procs:
            _terminate(proc)
        existing = set(netns_list())
        for name in self.namespaces:
            if name in existing:
                _run(["ip", "netns", "del", name], check=False)
        self._created = []
        if self._reaper is not None:
            self._reaper.release()
            self._reaper = None

    def _add_netns(self, role: str) -> None:
        name = self.netns(role)
        if self._reaper is None:
            self._reaper = Reaper()
        self._reaper.watch_netns(name)
        _run(["ip", "netns", "add", name])
        self._created.append(name)
        # Before any link exists, so every interface inherits them from "default": addresses usable at once
        # (no DAD), no router solicitations or RAs, no reverse-path filter (inherited from the root netns
        # for IPv4, and Debian sets it there).
        settings = [
            "net.ipv6.conf.all.accept_dad=0",
            "net.ipv6.conf.default.accept_dad=0",
            "net.ipv6.conf.all.accept_ra=0",
            "net.ipv6.conf.default.accept_ra=0",
            "net.ipv6.conf.default.router_solicitations=0",
            "net.ipv4.conf.all.rp_filter=0",
            "net.ipv4.conf.default.rp_filter=0",
        ]
        if role in ("host-a", "host-b"):
            settings += ["net.ipv4.ip_forward=1", "net.ipv6.conf.all.forwarding=1"]
        if role == BOX_ROLE:
            # The box is a wire, not a host: it must not send anything of its own (MLD, RS) onto it.
            settings += ["net.ipv6.conf.all.disable_ipv6=1", "net.ipv6.conf.default.disable_ipv6=1"]
        self._sysctl(role, *settings)
        self._ip(role, "link", "set", "lo", "up")

    def _veth(self, role_a: str, name_a: str, role_b: str, name_b: str, mtu: int) -> None:
        """A veth pair created directly in its two namespaces (never in the root namespace)."""
        self._ip(
            role_a,
            "link", "add", name_a, "address", self.mac(role_a, name_a), "mtu", str(mtu),
            "type", "veth",
            "peer", "name", name_b, "address", self.mac(role_b, name_b), "mtu", str(mtu),
            "netns", self.netns(role_b),
        )  # fmt: skip

    def _addresses(self, role: str, name: str) -> None:
        iface = IFACES[(role, name)]
        if iface.ipv4:
            self._ip(role, "addr", "add", f"{iface.ipv4}/{iface.prefix4}", "dev", name)
        if iface.ipv6:
            self._ip(role, "-6", "addr", "add", f"{iface.ipv6}/{iface.prefix6}", "dev", name, "nodad")

    def _neigh(self, role: str, dev: str, peer_role: str, peer_dev: str) -> None:
        """Permanent neighbour entries for the peer's addresses, so no ARP/NDP frame crosses the path."""
        peer = IFACES[(peer_role, peer_dev)]
        for family in (4, 6):
            self._ip(
                role,
                "neigh",
                "replace",
                peer.addr(family),
                "lladdr",
                peer.mac,
                "dev",
                dev,
                "nud",
                "permanent",
            )

    def _build(self) -> None:
        for role in self._namespaces:
            self._add_netns(role)
        mtu = self.mtu

        # The wire, split by the box if there is one.
        if self.box:
            self._veth("host-a", "wire0", BOX_ROLE, "in0", WIRE_MTU)
            self._veth(BOX_ROLE, "out0", "host-b", "wire0", WIRE_MTU)
            for dev in ("in0", "out0"):
                self._ip(BOX_ROLE, "link", "set", dev, "promisc", "on", "up")
                self.run(BOX_ROLE, "ethtool", "-K", dev, *OFFLOADS_OFF)
        else:
            self._veth("host-a", "wire0", "host-b", "wire0", WIRE_MTU)

        for host, peer, container, port, side in (
            ("host-a", "host-b", "c1", "veth-c1", 1),
            ("host-b", "host-a", "c2", "veth-c2", 2),
        ):
            if self.disable_offloads:
                self.run(host, "ethtool", "-K", "wire0", *OFFLOADS_OFF)
            self._addresses(host, "wire0")
            self._ip(host, "link", "set", "wire0", "up")
            # The container's bridge: no STP, so ports forward at once.
            self._ip(
                host,
                "link", "add", "br0", "address", self.mac(host, "br0"), "mtu", str(mtu),
                "type", "bridge", "stp_state", "0", "forward_delay", "0", "mcast_snooping", "0",
            )  # fmt: skip
            self._veth(host, port, container, "eth0", mtu)
            self._ip(host, "link", "set", port, "master", "br0", "up")
            self._ip(host, "link", "set", "br0", "up")
            self._addresses(host, "br0")
            self._addresses(container, "eth0")
            self._ip(container, "link", "set", "eth0", "up")
            self._ip(container, "route", "add", "default", "via", self.addr(host, 4, "br0"))
            self._ip(container, "-6", "route", "add", "default", "via", self.addr(host, 6, "br0"))

            remote4, remote6 = f"198.18.{3 - side}.0/24", f"fd00:{3 - side}::/64"
            if self.overlay == "vxlan":
                self._ip(
                    host,
                    "link", "add", "vxlan0", "address", self.mac(host, "vxlan0"), "mtu", str(VXLAN_MTU),
                    "type", "vxlan", "id", str(VXLAN_ID), "dstport", str(VXLAN_PORT),
                    "local", self.addr(host, 4, "wire0"), "remote", self.addr(peer, 4, "wire0"),
                    "dev", "wire0",
                )  # fmt: skip
                self._addresses(host, "vxlan0")
                self._ip(host, "link", "set", "vxlan0", "up")
                via_dev, via4, via6 = "vxlan0", self.addr(peer, 4, "vxlan0"), self.addr(peer, 6, "vxlan0")
            else:
                via_dev, via4, via6 = "wire0", self.addr(peer, 4, "wire0"), self.addr(peer, 6, "wire0")
            self._ip(host, "route", "add", remote4, "via", via4, "dev", via_dev)
            self._ip(host, "-6", "route", "add", remote6, "via", via6, "dev", via_dev)

            if self.static_neighbours:
                self._neigh(container, "eth0", host, "br0")
                self._neigh(host, "br0", container, "eth0")
                self._neigh(host, "wire0", peer, "wire0")
                if self.overlay == "vxlan":
                    self._neigh(host, "vxlan0", peer, "vxlan0")

    # ---- checks ----------------------------------------------------------------------------------------

    def socket(self, role: str, family: int, type: int, proto: int = 0) -> socket.socket:
        """A socket created inside the namespace of ``role`` (the calling thread stays where it is)."""
        return socket_in_netns(self.netns_path(role), family, type, proto)

    def ping_rtts(
        self,
        src: str,
        dst: str,
        family: int = 4,
        count: int = 1,
        interval_s: float = 0.01,
        timeout_s: float = 1.0,
    ) -> list[int | None]:
        """ICMP echo from role ``src`` to the main address of role ``dst``: round trips in ns, None if lost.

        Pure Python (raw ICMP socket opened in the source namespace), so it needs no ``ping`` binary.
        """
        return icmp_echo(
            self.socket(src, *_ICMP_SOCKET[family]), self.addr(dst, family), count, interval_s, timeout_s
        )

    def ping(self, src: str, dst: str, family: int = 4, count: int = 1, timeout_s: float = 1.0) -> bool:
        """Whether ``count`` echo requests from ``src`` to the main address of ``dst`` all get replies."""
        return all(rtt is not None for rtt in self.ping_rtts(src, dst, family, count, timeout_s=timeout_s))

    def ping_failures(self, pairs: Iterable[tuple[str, str]] = (("c1", "c2"), ("c2", "c1"))) -> list[str]:
        """The (src -> dst, family) combinations that do not ping, for IPv4 and IPv6; empty when all do."""
        return [
            f"{src} -> {dst} IPv{family}"
            for src, dst in pairs
            for family in (4, 6)
            if not self.ping(src, dst, family)
        ]

    def ping_ok(self, pairs: Iterable[tuple[str, str]] = (("c1", "c2"), ("c2", "c1"))) -> bool:
        """Whether c1 and c2 (or the given role pairs) reach each other over IPv4 and IPv6."""
        return not self.ping_failures(pairs)

    # ---- loss ------------------------------------------------------------------------------------------

    def drop_flow_on_wire(self, per_mille: int, udp_dport: int, host: str = "host-b") -> None:
        """Drop ``per_mille``/1000 (at random) of the VXLAN packets that carry IPv4 UDP to ``udp_dport``.

        The rule sits at ``host``'s wire0 ingress, after tc ingress (where the wire hop runs), and counts
        what it drops: that counter is the ground truth for the wire segment's loss. It matches the inner
        datagram, so a frame the overlay carries for itself (an MLD report when vxlan0 comes up, say) is
        never dropped and counted. Offsets from the outer UDP header: UDP 8 + VXLAN 8 + Ethernet 14 + IPv4 20.
        """
        if self.overlay != "vxlan":
            raise TopologyError("drop_flow_on_wire needs overlay='vxlan'")
        table = ("netdev", LOSS_TABLE)
        self.run(host, "nft", "add", "table", *table)
        self.run(
            host, "nft", "add", "chain", *table, "wire",
            "{ type filter hook ingress device wire0 priority 0; }",
        )  # fmt: skip
        self.run(
            host, "nft", "add", "rule", *table, "wire",
            "udp", "dport", str(VXLAN_PORT),
            "@th,224,16", "0x0800",  # inner ethertype: IPv4
            "@th,240,8", "0x45",  # IPv4 with a 20-byte header
            "@th,312,8", "17",  # inner protocol: UDP
            "@th,416,16", str(udp_dport),
            "numgen", "random", "mod", "1000", "<", str(per_mille), "counter", "drop",
        )  # fmt: skip

    def dropped_on_wire(self, host: str = "host-b") -> int:
        """Packets the rule of ``drop_flow_on_wire`` dropped so far."""
        data = json.loads(self.run(host, "nft", "-j", "list", "table", "netdev", LOSS_TABLE).stdout)
        for item in data.get("nftables", []):
            for expr in item.get("rule", {}).get("expr", []):
                if "counter" in expr:
                    return int(expr["counter"]["packets"])
        raise TopologyError(f"no counter in the loss rule: {data}")

    def stop_dropping(self, host: str = "host-b") -> None:
        """Remove the rule of ``drop_flow_on_wire`` (nothing happens if there is none)."""
        self.run(host, "nft", "delete", "table", "netdev", LOSS_TABLE, check=False)

    # ---- delay box -------------------------------------------------------------------------------------

    def start_delay_box(
        self,
        delay_ns: int,
        jitter_ns: int = 0,
        log_path: str | os.PathLike[str] | None = None,
        distribution: str = "uniform",
        seed: int | None = None,
        extra_args: Iterable[str] = (),
        ready_timeout_s: float = 10.0,
    ) -> subprocess.Popen[str]:
        """Run the delay box relay between in0 and out0 (restarting it if it runs) and wait until it relays.

        Every frame is held ``delay_ns`` (plus jitter: uniform in +-jitter_ns, or normal with sigma
        jitter_ns); with ``log_path`` each relayed frame gets a JSON line (CSV if the name ends in .csv).
        """
        if not self.box:
            raise TopologyError("this topology has no delay box: create it with delay_box=True")
        self.stop_delay_box()
        cmd = [
            sys.executable, str(DELAYBOX_SCRIPT), "in0", "out0",
            "--delay", f"{int(delay_ns)}ns", "--jitter", f"{int(jitter_ns)}ns",
            "--distribution", distribution,
        ]  # fmt: skip
        if log_path is not None:
            cmd += ["--log", os.fspath(log_path)]
        if seed is not None:
            cmd += ["--seed", str(seed)]
        cmd += list(extra_args)
        fd, stderr_name = tempfile.mkstemp(prefix=f"{self.prefix}-delaybox-", suffix=".stderr")
        self._box_stderr = Path(stderr_name)
        with os.fdopen(fd, "w") as stderr:
            proc = subprocess.Popen(
                dies_with_parent(["ip", "netns", "exec", self.box, *cmd]),
                stdout=subprocess.PIPE,
                stderr=stderr,
                text=True,
            )
        self._box_proc = proc
        line = _readline_with_timeout(proc, ready_timeout_s)
        if line.strip() != "ready":
            self.stop_delay_box(check=False)
            raise TopologyError(f"delay box did not start (got {line!r}): {self._box_stderr_text()}")
        return proc

    def stop_delay_box(self, check: bool = True) -> int | None:
        """Stop the relay (SIGTERM): it flushes its log and exits. Returns its exit code (None: not running).

        With ``check`` a non-zero exit raises TopologyError carrying the relay's stderr.
        """
        proc, self._box_proc = self._box_proc, None
        if proc is None:
            return None
        rc = _terminate(proc, sig=signal.SIGTERM)
        text = self._box_stderr_text()
        if self._box_stderr is not None:
            self._box_stderr.unlink(missing_ok=True)
            self._box_stderr = None
        if check and rc != 0:
            raise TopologyError(f"delay box exited with {rc}: {text}")
        return rc

    def _box_stderr_text(self) -> str:
        if self._box_stderr is None or not self._box_stderr.exists():
            return ""
        return self._box_stderr.read_text(errors="replace").strip()


def _readline_with_timeout(proc: subprocess.Popen[str], timeout_s: float) -> str:
    """One line of ``proc``'s stdout, or "" after ``timeout_s`` or at EOF."""
    result: list[str] = []
    assert proc.stdout is not None
    reader = threading.Thread(target=lambda: result.append(proc.stdout.readline()), daemon=True)  # type: ignore[union-attr]
    reader.start()
    reader.join(timeout_s)
    return result[0] if result else ""


def _terminate(proc: subprocess.Popen[Any], sig: int = signal.SIGTERM, timeout_s: float = 5.0) -> int:
    """Signal a process, wait for it, kill it if it lingers; return its exit code."""
    if proc.poll() is None:
        try:
            proc.send_signal(sig)
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        except ProcessLookupError:
            proc.wait()
    for stream in (proc.stdout, proc.stderr, proc.stdin):
        if stream is not None:
            stream.close()
    return proc.returncode


def require_tools(*tools: str) -> None:
    """Raise TopologyError naming any missing command (``make setup`` installs them)."""
    missing = [tool for tool in tools if shutil.which(tool) is None]
    if missing:
        raise TopologyError(f"missing commands: {', '.join(missing)}: run make setup (apt-get install ...)")


# ---- sockets inside a namespace and ICMP echo ------------------------------------------------------------

_ICMP_SOCKET = {
    4: (socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP),
    6: (socket.AF_INET6, socket.SOCK_RAW, socket.IPPROTO_ICMPV6),
}


def icmp_echo(
    sock: socket.socket, dst: str, count: int = 1, interval_s: float = 0.01, timeout_s: float = 1.0
) -> list[int | None]:
    """Send ``count`` echo requests on a raw ICMP/ICMPv6 socket (which it closes) and time each reply.

    Returns the round-trip times in ns (None for a request without reply within ``timeout_s``).
    """
    v6 = sock.family == socket.AF_INET6
    echo_request, echo_reply = (128, 129) if v6 else (8, 0)
    ident = (os.getpid() ^ threading.get_ident() ^ random.getrandbits(16)) & 0xFFFF
    rtts: list[int | None] = []
    with sock:
        for seq in range(count):
            payload = os.urandom(32)
            header = struct.pack("!BBHHH", echo_request, 0, 0, ident, seq)
            # The kernel fills in the ICMPv6 checksum (it covers a pseudo-header, RFC 4443); IPv4's is ours.
            csum = 0 if v6 else inet_checksum(header + payload)
            packet = struct.pack("!BBHHH", echo_request, 0, csum, ident, seq) + payload
            sent = time.monotonic_ns()
            sock.sendto(packet, (dst, 0))
            deadline = sent + int(timeout_s * 1e9)
            rtt = None
            while (left := deadline - time.monotonic_ns()) > 0:
                ready, _, _ = select.select([sock], [], [], left / 1e9)
                if not ready:
                    break
                data = sock.recv(65535)
                now = time.monotonic_ns()
                if not v6:
                    data = data[(data[0] & 0x0F) * 4 :]  # raw IPv4 sockets deliver the IP header too
                if len(data) >= 8:
                    kind, _, _, r_ident, r_seq = struct.unpack("!BBHHH", data[:8])
                    if kind == echo_reply and r_ident == ident and r_seq == seq and data[8:] == payload:
                        rtt = now - sent
                        break
            rtts.append(rtt)
            if seq + 1 < count and interval_s > 0:
                time.sleep(interval_s)
    return rtts


def add_container(topo: TwoHostTopology, name: str, addr: str, mac: str) -> str:
    """A third container netns ``{prefix}-{name}`` on host-a's bridge (198.18.1.0/24); returns its netns.

    topo.destroy() does not know it: the caller deletes it (``ip netns del``).
    """
    ns = f"{topo.prefix}-{name}"
    subprocess.run(["ip", "netns", "add", ns], check=True)
    port = f"veth-{name}"
    cmds = [
        [
            "ip",
            "-n",
            topo.host_a,
            "link",
            "add",
            port,
            "type",
            "veth",
            "peer",
            "name",
            "eth0",
            "address",
            mac,
            "netns",
            ns,
        ],
        ["ip", "-n", topo.host_a, "link", "set", port, "master", "br0", "up"],
        ["ip", "-n", ns, "link", "set", "lo", "up"],
        ["ip", "-n", ns, "addr", "add", f"{addr}/24", "dev", "eth0"],
        ["ip", "-n", ns, "link", "set", "eth0", "up"],
        ["ip", "-n", ns, "route", "add", "default", "via", topo.addr("host-a", 4, "br0")],
    ]
    for cmd in cmds:
        subprocess.run(cmd, check=True, capture_output=True)
    return ns
