"""A guest (lab/vm.py) is gone after its run however the run ends: on time, past its timeout, or with the
process that started it SIGKILLed (virtme-ng forks qemu, so PDEATHSIG alone would leave qemu running)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hoptrace.lab import vm
from hoptrace.lab.waiting import wait_until

pytestmark = pytest.mark.vm  # each test boots a guest


def guests() -> list[int]:
    """Running qemu processes that boot one of the lab's kernels."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if (
            argv
            and argv[0].endswith(b"qemu-system-x86_64")
            and str(vm.KERNELS_DIR).encode() in b" ".join(argv)
        ):
            found.append(int(pid))
    return found


@pytest.fixture
def kernel() -> vm.Kernel:
    kernels = vm.kernels()
    if not kernels:
        pytest.fail("no kernels fetched: run 'make vm-kernels'")
    assert not guests(), f"qemu guests already running: {guests()}"
    return kernels[-1]


def test_guest_past_its_timeout_is_killed(kernel: vm.Kernel) -> None:
    started = time.monotonic()
    result = vm.run(kernel, "sleep 600", timeout=15)
    assert result.returncode == -9 and "killed after" in result.output, result.output[-3000:]
    assert time.monotonic() - started < 60
    wait_until(lambda: not guests(), "no qemu left after the timeout", 10)


def test_guest_that_dies_booting_is_booted_again(kernel: vm.Kernel, tmp_path: Path) -> None:
    # 24 MB is too little for the kernel to reach init: every boot dies, and each death is kept, in the
    # result and in the log (which each boot's qemu empties when it opens it).
    log = tmp_path / "guest.log"
    result = vm.run(kernel, "true", timeout=60, memory="24M", log=log)
    assert result.returncode == vm.VNG_NO_EXIT_STATUS, result.output[-3000:]
    assert result.output.count("died booting") == vm.BOOT_ATTEMPTS - 1, result.output[-3000:]
    assert log.read_text().count("died booting") == vm.BOOT_ATTEMPTS - 1, log.read_text()[-3000:]
    assert vm.SCRIPT_STARTED not in result.output


def test_guest_that_dies_running_the_command_is_not_booted_again(kernel: vm.Kernel) -> None:
    # A crash the command causes is the command's failure, not the boot's: one boot, its panic reported.
    result = vm.run(kernel, "echo hoptrace-crash > /dev/kmsg; echo c > /proc/sysrq-trigger", timeout=60)
    assert result.returncode == vm.VNG_NO_EXIT_STATUS, result.output[-3000:]
    assert result.output.count(vm.SCRIPT_STARTED) == 1 and "died booting" not in result.output
    assert "Kernel panic" in result.output, result.output[-3000:]


def test_guest_dies_with_a_sigkilled_lab(kernel: vm.Kernel) -> None:
    code = "from hoptrace.lab import vm; vm.run(vm.kernels()[-1], 'sleep 600', timeout=600)"
    lab = subprocess.Popen([sys.executable, "-c", code])
    try:
        wait_until(guests, "the guest's qemu started", 30)
        os.kill(lab.pid, signal.SIGKILL)
        lab.wait()
        wait_until(lambda: not guests(), "no qemu left after the lab was SIGKILLed", 15)
    finally:
        lab.kill()
        for pid in guests():
            os.kill(pid, signal.SIGKILL)
