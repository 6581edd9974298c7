"""Guests with the kernels users run: Debian's kernel packages booted in qemu by virtme-ng.

A guest shares this machine's root file system (read-only) and the directories it is given (writable),
so it runs this checkout's binaries and tests under its own kernel. `make vm-kernels` fetches the kernels
(lab/kernels.sh) and `make setup` installs qemu and virtme-ng.

KVM is used when it boots a stock kernel here, TCG otherwise (slower, 5-15x, but it always works):
`kvm_usable` tries instead of assuming. A guest is killed with the process that started it, however
that process dies (lifecycle.Reaper kills its process group).
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from hoptrace.common.timeouts import timeout_scale
from hoptrace.lab.lifecycle import Reaper, dies_with_parent
from hoptrace.lab.localcluster import BPF_CACHE_DIR

REPO_ROOT = Path(__file__).resolve().parents[1]
KERNELS_DIR = REPO_ROOT / ".tools" / "kernels"


@dataclass(frozen=True)
class Kernel:
    """A kernel fetched by lab/kernels.sh: its release (uname -r), Debian suite and image."""

    release: str
    suite: str
    vmlinuz: Path

    @property
    def version(self) -> tuple[int, int]:
        major, minor = self.release.split(".")[:2]
        return int(major), int(minor)


def kernels(directory: Path = KERNELS_DIR) -> list[Kernel]:
    """The fetched kernels whose modules are in place, oldest first."""
    found = []
    for image in sorted(directory.glob("*/vmlinuz")):
        release = image.parent.name
        suite_file = image.parent / "suite"
        if Path("/lib/modules", release).is_dir():
            suite = suite_file.read_text().strip() if suite_file.exists() else "?"
            found.append(Kernel(release, suite, image))
    return sorted(found, key=lambda k: k.version)


def vng_path() -> str:
    """virtme-ng from this interpreter's environment (the venv), else from PATH."""
    beside = Path(sys.executable).parent / "vng"
    found = str(beside) if beside.exists() else shutil.which("vng")
    if not found:
        raise FileNotFoundError("virtme-ng (vng) is not installed: run 'make setup'")
    return found


# Where kvm_usable keeps its answer for this boot of the machine, so that each lab process does not boot
# its probe again.
KVM_PROBE = KERNELS_DIR.parent / "kvm-usable"


@functools.cache
def kvm_usable() -> bool:
    """Whether qemu can run a stock guest with KVM here. Some hosts expose a /dev/kvm that starts qemu but
    cannot run a stock kernel (a paravirtual-only KVM: the guest spins before its first line, or stops on
    an emulation failure), so a fetched kernel is booted to its panic (no root): a few seconds with KVM,
    never there without it. The answer is kept for the machine's boot (KVM_PROBE)."""
    if not os.access("/dev/kvm", os.R_OK | os.W_OK):
        return False
    qemu = shutil.which("qemu-system-x86_64")
    found = kernels()
    if not qemu or not found:
        return False
    boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    with contextlib.suppress(OSError, ValueError):
        kept_boot, kept = KVM_PROBE.read_text().split()
        if kept_boot == boot:
            return kept == "1"
    argv = [qemu, "-accel", "kvm", "-cpu", "host", "-m", "256", "-display", "none", "-serial", "stdio",
            "-no-reboot", "-kernel", str(found[0].vmlinuz), "-append", "console=ttyS0 panic=-1"]  # fmt: skip
    try:
        # a lab SIGKILLed mid-probe leaves no qemu spinning
        probe = subprocess.run(
            dies_with_parent(argv), capture_output=True, text=True, timeout=20, check=False
        )
        usable = "Kernel panic" in probe.stdout
    except subprocess.TimeoutExpired:
        usable = False
    with contextlib.suppress(OSError):
        kept_file = KVM_PROBE.with_suffix(f".{os.getpid()}")
        kept_file.write_text(f"{boot} {int(usable)}\n")
        kept_file.replace(KVM_PROBE)
    return usable


# virtme-run's exit status when qemu ends without the guest script's own (a guest kernel panic, or
# qemu itself killed).
VNG_NO_EXIT_STATUS = 255

# Under TCG, a guest whose kernel patches its syscall entry path while the other vCPU runs it can hang
# there for good: a 6.1 guest attaching a program to syscalls:sys_enter_kill had both vCPUs soft-locked at
# the same instruction of syscall_trace_enter (a jump label site; exc_int3 and do_sync_core of the text
# patching on their stacks), in 2 of 7 runs here. The patching happens when the sys_enter/sys_exit
# tracepoints go from 0 to 1 probe (static key) or 1 to 2 (static call): two probes on each before the
# command, one per tracefs instance (ftrace's probe is per instance), leave nothing to patch when a
# program attaches. The event (sys_*_reboot) fires only at the guest's power-off.
SYSCALL_TRACEPOINTS_ON = (
    "t=/sys/kernel/tracing; mkdir -p $t/instances/hoptrace-lab 2>/dev/null; "
    "for d in $t $t/instances/hoptrace-lab; do for e in sys_enter_reboot sys_exit_reboot; do "
    "echo 1 > $d/events/syscalls/$e/enable; done; done; "
)

# Seconds before a guest's limit at which it reports what it is stuck in.
HANG_REPORT_LEAD_S = 45


def hang_report(limit: float) -> str:
    """A guest script prefix: shortly before `limit`, the kernel prints its blocked tasks and every CPU's
    backtrace (sysrq w and l) on the console, so a guest killed at its limit says where it hung."""
    at = max(int(limit - HANG_REPORT_LEAD_S), 1)
    # Through the kernel's console (printk raised to show every level), not the script's output: the
    # command may hold that, and a kernel hang leaves only the console.
    return (
        f"(sleep {at}; echo 8 > /proc/sys/kernel/printk; echo 1 > /proc/sys/kernel/sysrq; "
        f"echo '[hoptrace lab] still running after {at} s: blocked tasks and CPU backtraces' > /dev/kmsg; "
        "echo w > /proc/sysrq-trigger; echo l > /proc/sysrq-trigger) </dev/null >/dev/null 2>&1 & "
    )


# The trees a Python program of this checkout reads at start-up: the standard library, the venv and the
# hoptrace packages (Makefile's PY_PACKAGES). Over 5.10's 9p every import is several round trips to the
# host, and every process pays them again (the share is mounted without a cache): `import
# hoptrace.cli.demo` alone took 4.5 minutes there.
PYTHON_PACKAGES = ("cli", "collector", "common", "dispatcher", "lab", "results", "spec", "web")
PYTHON_TREES = (
    Path(f"/usr/lib/python{sys.version_info.major}.{sys.version_info.minor}"),
    REPO_ROOT / ".venv",
    *(REPO_ROOT / name for name in PYTHON_PACKAGES),
    REPO_ROOT / "proto" / "gen" / "python",
)


# `make demo` as a guest runs it (`make demo-guest`, tests/kernels/test_demo_in_guest.py): every deadline
# stretched for TCG, a short flow.
GUEST_DEMO = "HOPTRACE_TIMEOUT_SCALE=20 make demo DEMO_ARGS='--seconds 2 --mps 200'"
# What the guest's demo writes through the share, at the same path as here: the demo's compiled BPF objects
# (the dispatcher's --bpf-cache-dir). They do not depend on the kernel (CO-RE), so objects compiled here
# spare the guest clang under TCG (minutes), and the guest's own are kept for the next run.
GUEST_DEMO_WRITABLE = (BPF_CACHE_DIR,)


def ram_trees(trees: tuple[Path, ...], archive: Path) -> str:
    """A guest script prefix that serves `trees` from the guest's memory: each gets a tmpfs mounted over
    it, filled from one archive made here (`archive`), which the guest reads as one sequential file."""
    relative = [str(tree.relative_to("/")) for tree in trees]
    subprocess.run(["tar", "-cf", str(archive), "-C", "/", *relative], check=True)
    mounts = " ".join(f"/{path}" for path in relative)
    return f"for d in {mounts}; do mount -t tmpfs tmpfs $d; done; tar -xf {archive} -C /; "


@dataclass
class GuestRun:
    """What a command printed in a guest, with the guest's serial noise removed."""

    kernel: Kernel
    returncode: int
    output: str


# The guest script's first line: a guest that dies before printing it died booting, before the command
# ran (a TCG guest of 6.12 once took an int3 oops in enqueue_timer at 1.3 s, its boot patching a jump label
# while the other vCPU ran it).
SCRIPT_STARTED = "[hoptrace lab] guest script started"

# Boots of one run: a guest that dies booting is booted again, its death kept in the output and the log.
BOOT_ATTEMPTS = 3


def run(
    kernel: Kernel,
    command: str,
    *,
    timeout: float,
    writable: tuple[Path, ...] = (),
    memory: str = "2G",
    cpus: int = 2,
    log: Path | None = None,
    in_memory: tuple[Path, ...] = (),
    nice: int = 0,
) -> GuestRun:
    """Boots `kernel`, runs `command` as root in it (bpffs and tracefs mounted) and powers it off.

    `timeout` is in this machine's seconds before HOPTRACE_TIMEOUT_SCALE; a guest past it is killed
    and the run fails with what it printed so far. `log`, if given, receives the output as the guest
    prints it (`tail -f` it to watch a long run; each boot starts it anew) and keeps every boot's output
    after. `in_memory`: directories the guest
    reads from a copy in its memory (see `ram_trees`; e.g. PYTHON_TREES), not through the share.
    `nice`: the guest's niceness (qemu's), to leave this machine's CPU to other work first.
    A guest that dies booting, before the command starts, is booted again (BOOT_ATTEMPTS in all).
    """
    limit = timeout * timeout_scale()
    earlier, attempt = "", 1
    while True:
        with tempfile.TemporaryDirectory(prefix="hoptrace-guest-") as scripts:
            result = _boot_and_run(
                kernel,
                command,
                limit,
                Path(scripts),
                writable,
                memory,
                cpus,
                log,
                in_memory,
                nice,
            )
        died_booting = result.returncode == VNG_NO_EXIT_STATUS and SCRIPT_STARTED not in result.output
        if not died_booting or attempt == BOOT_ATTEMPTS:
            if log is not None and earlier:
                log.write_text(earlier + result.output)  # each boot's qemu emptied it: every boot's output
            return GuestRun(kernel, result.returncode, earlier + result.output)
        note = (
            f"\n[hoptrace lab] guest {kernel.release} died booting "
            f"(boot {attempt} of {BOOT_ATTEMPTS}): booting again\n"
        )
        if log is not None:
            with open(log, "a") as kept:
                kept.write(note)
        earlier += result.output + note
        attempt += 1


def _boot_and_run(
    kernel: Kernel,
    command: str,
    limit: float,
    scripts: Path,
    writable: tuple[Path, ...],
    memory: str,
    cpus: int,
    log: Path | None,
    in_memory: tuple[Path, ...],
    nice: int,
) -> GuestRun:
    """One boot of `run`: `limit` in this machine's seconds; `scripts` holds the guest script and the
    output when no `log` is given. The output file starts empty: qemu opens it anew for the guest's
    stdout (virtme-ng's file chardev on /proc/self/fd/1, which truncates and writes from offset 0), so a
    boot's output cannot go after an earlier boot's in the same file."""
    setup = (
        f"echo '{SCRIPT_STARTED}'; "
        "mount -t bpf bpf /sys/fs/bpf 2>/dev/null; mount -t tracefs tracefs /sys/kernel/tracing 2>/dev/null; "
        # A task blocked for a minute is reported on the console (the kernel's hung-task detector).
        "sysctl -qw kernel.hung_task_timeout_secs=60 2>/dev/null; "
        + SYSCALL_TRACEPOINTS_ON
        + hang_report(limit)
        + (ram_trees(in_memory, scripts / "trees.tar") if in_memory else "")
    )
    vng = vng_path()
    argv = [vng, "--run", str(kernel.vmlinuz), "--memory", memory, "--cpus", str(cpus)]
    if nice:
        argv = ["nice", "-n", str(nice), *argv]  # vng, virtme-run and qemu inherit it
    if not kvm_usable():
        argv.append("--disable-kvm")
    # The guest kernel's warnings and errors (lockups, RCU stalls, hung tasks, oopses, panics) join the
    # output, its boot chatter does not: a guest that hangs or dies says where. vng's --verbose routes
    # the console to the output at loglevel 7; the later loglevel wins (5: warnings and worse).
    argv += ["--verbose", "--append", "loglevel=5"]
    for directory in writable:
        argv += ["--rwdir", str(directory)]
    # --exec travels base64-encoded on the kernel command line, which x86 cuts at 2048 bytes (a cut
    # script never starts and the guest idles until killed): the command goes in a file the guest reads
    # through the shared root instead.
    script = scripts / "run.sh"
    script.write_text(setup + command + "\n")
    argv += ["--exec", f"sh {script}"]
    # vng runs virtme-run, which lives beside it in the venv.
    env = dict(os.environ, PATH=f"{Path(vng).parent}:{os.environ.get('PATH', '/usr/bin:/bin')}")
    # vng forks virtme-run, which forks qemu: the guest is the whole process group, and the group is
    # killed when the run ends, times out, or this process dies (the Reaper).
    reaper = Reaper()
    # The output goes to a file as it comes (a pipe would show nothing until the guest ends).
    log_path = log or scripts / "output.log"
    # The kernel's console goes to a file of its own, added to the log at the end: qemu opens it anew
    # (virtme-ng's dmesg chardev on /proc/self/fd/2, truncating, at an offset of its own), and sharing the
    # log with it wrote console lines over the command's output (a PASS line of the matrix, once).
    console_path = log_path.with_name(log_path.name + ".console")
    with open(log_path, "wb") as sink, open(console_path, "wb") as console:
        process = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=sink,
            stderr=console,
            env=env,
            start_new_session=True,
        )
    reaper.watch_process_group(process.pid)
    note = ""
    try:
        code = process.wait(timeout=limit)
        if code == VNG_NO_EXIT_STATUS:
            note = (
                f"\n[hoptrace lab] guest {kernel.release}: exit status {code}, the command's own or "
                "qemu's end without one (a guest panic, or qemu killed)\n"
            )
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        note = f"\n[hoptrace lab] guest {kernel.release} killed after {limit:.0f} s\n"
        code = -9
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        reaper.release()
        with open(log_path, "ab") as kept:
            kept.write(console_path.read_bytes())
        console_path.unlink(missing_ok=True)
        output = log_path.read_bytes().decode(errors="replace") + note
        if log is not None and note:
            with open(log, "a") as kept:
                kept.write(note)
    return GuestRun(kernel, code, output.replace("\r", ""))


def kernel_for(version: str, directory: Path = KERNELS_DIR) -> Kernel:
    """The fetched kernel whose release starts with `version` ("5.10", "6.1.176"); raises RuntimeError
    telling how to fetch it."""
    for kernel in kernels(directory):
        if kernel.release == version or kernel.release.startswith(f"{version}."):
            return kernel
    have = ", ".join(k.release for k in kernels(directory)) or "none (run 'make vm-kernels')"
    raise RuntimeError(f"kernel {version} is not fetched (fetched: {have}): run 'make vm-kernels'")


def main(argv: list[str] | None = None) -> int:
    """`python -m hoptrace.lab.vm KERNEL COMMAND`: run COMMAND as root in a guest of KERNEL, its output
    streamed here; the guest's exit status is this one's."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m hoptrace.lab.vm", description=main.__doc__)
    parser.add_argument("kernel", help="a fetched kernel's version: 5.10, 6.1, 6.12 or a full release")
    parser.add_argument("command", nargs="?", help="a shell command, run in this checkout's directory")
    parser.add_argument("--demo", action="store_true", help=f"run {GUEST_DEMO} (Python from guest memory)")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds (x HOPTRACE_TIMEOUT_SCALE)")
    parser.add_argument("--memory", default="3G")
    parser.add_argument(
        "--python-in-memory", action="store_true", help="serve PYTHON_TREES from the guest's memory"
    )
    parser.add_argument("--log", type=Path, help="keep the guest's output in this file")
    args = parser.parse_args(argv)
    if args.demo == bool(args.command):
        parser.error("give a command or --demo")
    command = GUEST_DEMO if args.demo else args.command
    writable = GUEST_DEMO_WRITABLE if args.demo else ()
    for directory in writable:
        directory.mkdir(parents=True, exist_ok=True)  # the guest mounts it: it must exist
    try:
        kernel = kernel_for(args.kernel)
    except RuntimeError as err:
        print(f"hoptrace lab: {err}", file=sys.stderr)
        return 2
    log = args.log or Path(tempfile.mkstemp(prefix="hoptrace-guest-", suffix=".log")[1])
    print(f"guest {kernel.release}: {command} (output: {log})", flush=True)
    tail = subprocess.Popen(["tail", "-F", "-n", "+1", "-q", str(log)], stderr=subprocess.DEVNULL)
    try:
        result = run(
            kernel,
            f"cd {REPO_ROOT} && {command}",
            timeout=args.timeout,
            memory=args.memory,
            log=log,
            writable=writable,
            in_memory=PYTHON_TREES if args.python_in_memory or args.demo else (),
        )
    finally:
        tail.terminate()
        tail.wait()
    print(f"guest {kernel.release}: exit status {result.returncode}", flush=True)
    return result.returncode


if __name__ == "__main__":
    sys.exit(main())
