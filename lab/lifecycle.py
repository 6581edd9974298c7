"""Nothing the lab starts outlives it.

- `dies_with_parent(argv)`: every child process the lab starts gets PR_SET_PDEATHSIG, so the kernel kills
  it when the lab's process dies, however it dies (SIGKILL included). Agents then close their BPF links on
  the way (fd-based: the kernel detaches them).
- `Reaper`: network namespaces are files, not processes; a small watchdog in its own session holds the
  read end of a pipe. When the lab's process dies its end closes, and the watchdog kills what still runs in
  the namespaces it was told about and deletes them, and kills the process groups it was told about (a
  guest's qemu, which PDEATHSIG does not reach). A clean shutdown tells it to leave quietly.

Run as ``python -m hoptrace.lab.lifecycle FD`` by `Reaper` only.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Sequence


def dies_with_parent(argv: Sequence[str]) -> list[str]:
    """``argv``, run so that the kernel kills it when the process that started it dies (PR_SET_PDEATHSIG,
    kept across exec). setpriv sets it after the fork, not a ``preexec_fn``: Python code between fork and
    exec can deadlock on a lock another thread held at the fork (CI's Popen once hung there for 600 s)."""
    return ["setpriv", "--pdeathsig", "KILL", "--", *argv]


class Reaper:
    """Deletes the namespaces it was told about if this process dies without releasing it."""

    def __init__(self) -> None:
        read_end, self._write_end = os.pipe()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "hoptrace.lab.lifecycle", str(read_end)],
            pass_fds=[read_end],
            start_new_session=True,  # a Ctrl-C to the lab's process group must not reach it
            stdin=subprocess.DEVNULL,
        )
        os.close(read_end)

    def watch_netns(self, name: str) -> None:
        """Delete netns `name` if this process dies."""
        os.write(self._write_end, f"netns {name}\n".encode())

    def watch_process_group(self, pgid: int) -> None:
        """Kill process group `pgid` if this process dies (for trees PDEATHSIG cannot reach: it acts on
        a direct child only, and a guest's qemu is virtme-ng's grandchild)."""
        os.write(self._write_end, f"pgroup {pgid}\n".encode())

    def release(self) -> None:
        """The lab cleaned up itself: the watchdog exits without touching anything."""
        if self._write_end < 0:
            return
        try:
            os.write(self._write_end, b"done\n")
        finally:
            os.close(self._write_end)
            self._write_end = -1
        self.process.wait(10)


def _delete_netns(name: str) -> None:
    pids = subprocess.run(["ip", "netns", "pids", name], capture_output=True, text=True).stdout.split()
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid), signal.SIGKILL)
    subprocess.run(["ip", "netns", "del", name], capture_output=True)


def _watch(fd: int) -> int:
    namespaces: list[str] = []
    groups: list[int] = []
    with os.fdopen(fd, "r") as pipe:
        for line in pipe:
            word, _, arg = line.strip().partition(" ")
            if word == "done":
                return 0
            if word == "netns" and arg:
                namespaces.append(arg)
            if word == "pgroup" and arg.isdigit():
                groups.append(int(arg))
    # EOF without "done": the lab's process died
    for pgid in groups:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)
    for name in reversed(namespaces):
        _delete_netns(name)
    return 0


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    sys.exit(_watch(int(sys.argv[1])))
