"""The guest-hosts lab (lab/guests.py) leaves nothing behind: no guest, tap, bridge, namespace or uplink,
whether it closes itself or its process is SIGKILLed (the Reaper kills qemu's process group and deletes the
namespace, and the uplink dies with its peer in it)."""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from test_vm import guests

from hoptrace.lab import vm
from hoptrace.lab.guests import GuestLab
from hoptrace.lab.waiting import wait_until

pytestmark = pytest.mark.vm  # each test boots guests


def netns_exists(name: str) -> bool:
    return Path("/run/netns", name).exists()


def link_exists(name: str) -> bool:
    return subprocess.run(["ip", "link", "show", name], capture_output=True).returncode == 0


def taps(netns: str) -> list[str]:
    out = subprocess.run(
        ["ip", "-netns", netns, "-o", "link", "show", "type", "tun"], capture_output=True, text=True
    ).stdout
    return [line.split(":")[1].strip() for line in out.splitlines()]


def test_closed_lab_leaves_nothing(tmp_path: Path) -> None:
    assert not guests(), f"qemu guests already running: {guests()}"
    name = f"htvm{secrets.token_hex(2)}"
    with GuestLab(name, tmp_path) as lab:
        lab.boot("guest-a", vm.kernels()[-1], 0, ["sleep", "600"])
        assert taps(name) == ["tap0"] and link_exists(lab.uplink)
        wait_until(guests, "the guest's qemu started", 30)
        uplink = lab.uplink
    assert not guests(), f"qemu left after close: {guests()}"
    assert not netns_exists(name) and not link_exists(uplink)


def test_sigkilled_lab_leaves_nothing(tmp_path: Path) -> None:
    assert not guests(), f"qemu guests already running: {guests()}"
    name = f"htvm{secrets.token_hex(2)}"
    code = (
        "import sys, time; from pathlib import Path; from hoptrace.lab import vm; "
        "from hoptrace.lab.guests import GuestLab; "
        f"lab = GuestLab({name!r}, Path({str(tmp_path)!r})); "
        "lab.boot('guest-a', vm.kernels()[-1], 0, ['sleep', '600']); print(lab.uplink, flush=True); "
        "time.sleep(600)"
    )
    process = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        uplink = process.stdout.readline().strip()
        assert uplink and link_exists(uplink) and taps(name) == ["tap0"]
        wait_until(guests, "the guest's qemu started", 30)
        os.kill(process.pid, signal.SIGKILL)
        process.wait()
        wait_until(lambda: not guests(), "no qemu left after the lab was SIGKILLed", 15)
        wait_until(lambda: not netns_exists(name), f"namespace {name} removed", 15)
        assert not link_exists(uplink), f"uplink {uplink} left"
    finally:
        process.kill()
        for pid in guests():
            os.kill(pid, signal.SIGKILL)
        subprocess.run(["ip", "netns", "del", name], capture_output=True)
