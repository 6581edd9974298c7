"""Guests as real hosts: Debian kernels in qemu (lab/vm.py) with virtio NICs on taps this machine bridges.

This machine is the hypervisor node. The lab owns one network namespace holding a bridge and one tap per guest
(qemu runs inside it, so its taps are created there), and a veth whose other end stays in this machine's
namespace with the lab network's first address: the dispatcher, collector and clock service listen there, so
the guests reach them over the bridge and the tests reach them directly. Addresses are in 198.18.0.0/15.

Each guest shares this machine's root read-only, runs lab/guest_host.sh (NIC up, its own agent, a UDP and a
TCP receiver) and then serves a handful of commands on a control port: send a UDP or TCP flow and answer the
packets its kernel sent (an nftables counter), or step its wall clock. Guests, taps and the namespace are gone
when the lab closes, also when the test's process is SIGKILLed (lifecycle.Reaper).
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import signal
import socket
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from hoptrace.common.timeouts import scaled
from hoptrace.lab import vm
from hoptrace.lab.lifecycle import Reaper

GUEST_SCRIPT = Path(__file__).resolve().parent / "guest_host.sh"
LAB_NETWORK = "198.19.240"  # /24 inside 198.18.0.0/15; nothing routes it out of this machine
PREFIX_LEN = 24
HYPERVISOR_ADDRESS = f"{LAB_NETWORK}.1"
CONTROL_PORT = 7000
UDP_PORT = 9000
TCP_PORT = 9001
_READY = re.compile(r"hoptrace-guest ready nic=(\S+) kernel=(\S+)")


@dataclass
class Guest:
    """One running guest: its node name, kernel, address, tap on the lab bridge and console output."""

    node: str
    kernel: vm.Kernel
    address: str
    tap: str
    process: subprocess.Popen[str]
    nic: str = ""
    console: list[str] = field(default_factory=list)
    _changed: threading.Condition = field(default_factory=threading.Condition)

    def _read_console(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            with self._changed:
                self.console.append(line.replace("\r", "").rstrip("\n"))
                self._changed.notify_all()
        with self._changed:
            self._changed.notify_all()

    def console_tail(self, lines: int = 40) -> str:
        """The last `lines` lines the guest printed."""
        with self._changed:
            return "\n".join(self.console[-lines:])

    def wait_ready(self, timeout_s: float) -> None:
        """Wait for the guest's ready line (NIC up, agent and receivers started); fail if qemu exits first."""
        deadline = time.monotonic() + scaled(timeout_s)
        with self._changed:
            while True:
                for line in self.console:
                    found = _READY.search(line)
                    if found:
                        self.nic = found.group(1)
                        if found.group(2) != self.kernel.release:
                            raise RuntimeError(
                                f"{self.node} booted {found.group(2)}, not {self.kernel.release}"
                            )
                        return
                if self.process.poll() is not None:
                    raise RuntimeError(
                        f"{self.node} exited with {self.process.returncode}:\n{self.console_tail()}"
                    )
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"{self.node} not ready after {timeout_s} s:\n{self.console_tail()}")
                self._changed.wait(min(left, 1.0))

    def command(self, line: str, timeout_s: float = 120.0) -> str:
        """Run one command of lab/guest_host.sh's control server in the guest; returns its answer."""
        with socket.create_connection((self.address, CONTROL_PORT), timeout=scaled(timeout_s)) as conn:
            conn.sendall(line.encode() + b"\n")
            answer = b""
            while chunk := conn.recv(4096):
                answer += chunk
        text = answer.decode().strip()
        if not text or text.startswith("error"):
            raise RuntimeError(f"{self.node}: {line!r} answered {text!r}")
        return text

    def send_flow(self, protocol: str, destination: Guest, count: int) -> int:
        """Send a `protocol` (udp/tcp) flow of `count` writes to `destination`'s receiver; returns the packets
        this guest's kernel sent for it (TCP: handshake, ACKs and FIN included)."""
        port = UDP_PORT if protocol == "udp" else TCP_PORT
        answer = self.command(f"{protocol} {destination.address} {port} {count}")
        found = re.fullmatch(r"sent (\d+)", answer)
        if not found:
            raise RuntimeError(f"{self.node}: unexpected answer to the {protocol} flow: {answer!r}")
        return int(found.group(1))

    def send_tcp_bulk(self, destination: Guest, kib: int) -> int:
        """Send `kib` KiB over one TCP connection to `destination`'s receiver at once (TSO skbs of many
        segments); returns the segments this guest's socket sent (tcpi_segs_out, handshake and close
        included), read once the connection is closed."""
        answer = self.command(f"tcp-bulk {destination.address} {TCP_PORT} {kib}")
        found = re.fullmatch(r"segments (\d+)", answer)
        if not found:
            raise RuntimeError(f"{self.node}: unexpected answer to the bulk TCP flow: {answer!r}")
        return int(found.group(1))

    def shift_clock_ms(self, milliseconds: int) -> int:
        """Step the guest's CLOCK_REALTIME forward by `milliseconds` (read and set in one process there);
        returns the step the guest's clock made, in ns (as the guest measured it against CLOCK_MONOTONIC)."""
        answer = self.command(f"clock-shift-ms {milliseconds}")
        found = re.fullmatch(r"shifted (-?\d+)", answer)
        if not found:
            raise RuntimeError(f"{self.node}: unexpected answer to the clock step: {answer!r}")
        return int(found.group(1))


class GuestLab:
    """The lab namespace with its bridge and the guests on it; close() removes all of it."""

    def __init__(self, name: str, workdir: Path) -> None:
        self.netns = name
        self.bridge = "br0"
        # The hypervisor's own end of the lab network, in this machine's namespace (a device name < 16 bytes).
        self.uplink = f"{name[:11]}-hv"
        self.workdir = workdir
        self.guests: dict[str, Guest] = {}
        self._reaper = Reaper()
        self._reaper.watch_netns(name)
        self._setup_network()

    def _ip(self, *args: str, netns: str | None = None) -> None:
        prefix = ["ip", "netns", "exec", netns] if netns else []
        subprocess.run([*prefix, "ip", *args], check=True, capture_output=True, text=True)

    def _setup_network(self) -> None:
        subprocess.run(["ip", "netns", "add", self.netns], check=True)
        ns = self.netns
        self._ip("link", "set", "lo", "up", netns=ns)
        self._ip("link", "add", self.bridge, "type", "bridge", netns=ns)
        self._ip("link", "set", self.bridge, "up", netns=ns)
        # The uplink's lab end is created in this namespace and moved, so its pair dies with the namespace.
        self._ip("link", "add", self.uplink, "type", "veth", "peer", "name", "uplink", "netns", ns)
        self._ip("link", "set", "uplink", "master", self.bridge, "up", netns=ns)
        self._ip("addr", "add", f"{HYPERVISOR_ADDRESS}/{PREFIX_LEN}", "dev", self.uplink)
        self._ip("link", "set", self.uplink, "up")

    def boot(self, node: str, kernel: vm.Kernel, index: int, agent_argv: list[str], cpus: int = 1) -> Guest:
        """Boot `kernel` as host `node` (address .10+index) running `agent_argv`; returns at once."""
        address = f"{LAB_NETWORK}.{10 + index}"
        tap = f"tap{index}"
        # A persistent tap on the bridge before qemu opens it: no wait for qemu to create one.
        self._ip("tuntap", "add", "dev", tap, "mode", "tap", netns=self.netns)
        self._ip("link", "set", tap, "master", self.bridge, "up", netns=self.netns)
        config = self.workdir / f"{node}.conf"
        config.write_text(
            "\n".join(
                [
                    f"ADDR={address}",
                    f"PREFIX_LEN={PREFIX_LEN}",
                    f"CONTROL_PORT={CONTROL_PORT}",
                    f"UDP_PORT={UDP_PORT}",
                    f"TCP_PORT={TCP_PORT}",
                    f"AGENT_LOG={shlex.quote(str(self.workdir / f'agent-{node}.log'))}",
                    f"AGENT=({shlex.join(agent_argv)})",
                    "",
                ]
            )
        )
        mac = f"52:54:00:00:f0:{10 + index:02x}"
        vng = vm.vng_path()
        argv = [
            "ip", "netns", "exec", self.netns,
            vng, "--run", str(kernel.vmlinuz), "--memory", "1G", "--cpus", str(cpus),
            "--rwdir", str(self.workdir),
            # one argument with "=": its value starts with "-" (argparse would take it for an option)
            f"--qemu-opts=-netdev tap,id=lab0,ifname={tap},script=no,downscript=no "
            f"-device virtio-net-pci,netdev=lab0,mac={mac}",
            "--exec", f"{GUEST_SCRIPT} boot {config}",
        ]  # fmt: skip
        if not vm.kvm_usable():
            argv.insert(argv.index("--run"), "--disable-kvm")
        env = dict(os.environ, PATH=f"{Path(vng).parent}:{os.environ.get('PATH', '/usr/bin:/bin')}")
        process = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
            start_new_session=True,  # vng -> virtme-run -> qemu: one group to kill (the Reaper too)
        )
        self._reaper.watch_process_group(process.pid)
        guest = Guest(node, kernel, address, tap, process)
        threading.Thread(target=guest._read_console, daemon=True).start()
        self.guests[node] = guest
        return guest

    def close(self) -> None:
        """Power off every guest, delete the taps, bridge and namespace (and the uplink with it)."""
        for guest in self.guests.values():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(guest.process.pid, signal.SIGKILL)
            guest.process.wait(30)
        subprocess.run(["ip", "netns", "del", self.netns], capture_output=True, check=False)
        subprocess.run(["ip", "link", "del", self.uplink], capture_output=True, check=False)
        self._reaper.release()

    def __enter__(self) -> GuestLab:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()
