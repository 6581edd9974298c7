"""The kernel matrix: hoptrace's BPF in guests running the kernels users run (lab/vm.py).

In each guest: every program of every object loads the way the agent loads it (the variant that kernel
needs), the parser, tagging, sampling and filter tests pass through BPF_PROG_TEST_RUN, a tc hop
attached the way that kernel allows (tcx from 6.6, else a clsact filter) sees real packets on a veth, and
the agent's tracer tags a real datagram and streams every hop's record of it, kprobe and fentry hops
included (this host refuses both; Debian's kernels allow them), kretprobe and fexit hops record every
datagram of a flow at ip_route_input_noref's return, after its entry hop, the event program (event.bpf.h)
counts kill(2) calls through every where: operator on syscalls:sys_enter_kill, and socket-read and uprobe hops
follow UDP and TCP messages into a real application (socket-read's UDP path differs by kernel:
skb:consume_skb before 6.6, the per-socket ID queue from 6.6).
The test binaries are built here and run there: the guest shares this machine's root.
"""

from __future__ import annotations

import re
import subprocess
import threading
import warnings
from dataclasses import dataclass
from pathlib import Path

import pytest
from guest_runs import GUEST_NICE, SHARED_STRETCH

from hoptrace.common.timeouts import timeout_scale
from hoptrace.lab import vm

AGENT_DIR = Path(__file__).resolve().parents[2] / "agent"

# The tests each guest runs, per package. All of them must report PASS there.
GUEST_TESTS = {
    "loader": "TestEveryProgramLoads|TestParserFindsIDs|TestParserRejectsMalformed|TestTagUDP|TestSampleEvery"
    "|TestFilterSelectsPackets|TestActionCountEqualsMatchedPackets|TestActionCountByCPUAndMark"
    "|TestActionHistogramOfLen|TestActionLatencyFromPreviousHop|TestNoActionsTouchNothing"
    "|TestFieldsFromIPAndTCPHeaders|TestFieldsFromSkb|TestRecordActionCarriesValues"
    "|TestShortSegmentsInLinuxLayouts|TestUntaggedTCPSegmentsCountAlike"
    "|TestHookRecordsAsHop|TestHookNotMatchedAndOverflow|TestHookVerifierCost",
    "probe": "TestFieldCapabilities",
    "attach": "TestClsactFallback",
    "tracer": "TestTracerStreamsRealTraffic|TestKernelFunctionHops|TestKernelFunctionReturnHops"
    "|TestTracerActionsOnRealTraffic"
    "|TestEventCountsWhereTermsHold|TestEventBitTermAndCountByCPU|TestEventBadInputNamesTheField"
    "|TestEventRecordAndLatencyPairs|TestEventKernelFunctions|TestEventTextTerms"
    "|TestSocketReadHop|TestSocketReadFields|TestUprobeBadTargets"
    # a restarted agent takes its pinned traces over: clsact and no perf-event links before 5.15 included
    "|TestTakeOverKeepsTheTrace|TestTakeOverWaitsForThePlan|TestEveryAttachKindIsKept"
    "|TestTakeOverRefusesAnotherLayout"
    # --hooks: many traces' tc hops in one program a device and direction (tcx, or clsact before 6.6), and
    # their tracepoint hops in one a device and event; the sock_ops hook is verified in the loader's
    # TestHookVerifierCost (TestSockOpsHookTagsPastTheCgroupsCap's 71 applies took 5-6 minutes a guest
    # under TCG when each parsed the object again; it runs on the host)
    "|TestHooksHoldManyTraces|TestHookHopsComeBackWithThePlan|TestTracepointHooksKeepTheirEvents",
}

# Programs the matrix names in its load checks (every program of the objects loads in each guest).
FUNCTION_RETURN_PROGRAMS = ("hop_fexit", "hop_kretprobe", "hop_kretprobe_entry")
SOCKET_READ_PROGRAMS = ("hop_sock_read_tcp", "hop_sock_read_udp")

# Kernels the matrix requires: Debian 11 (5.10, also Amazon Linux 2's), Debian 12 (6.1, also the base of
# Amazon Linux 2023 and COS) and its backports (6.12). 5.10 runs the _floor variants.
REQUIRED = ("5.10", "6.1", "6.12")


def matrix_kernels() -> list[vm.Kernel]:
    found = {f"{k.version[0]}.{k.version[1]}": k for k in vm.kernels()}
    missing = [version for version in REQUIRED if version not in found]
    if missing:
        pytest.fail(f"kernels {', '.join(missing)} are not fetched: run 'make vm-kernels'")
    return [found[version] for version in REQUIRED]


_BINARIES_LOCK = threading.Lock()
_BINARIES: list[Path] = []


def guest_test_binaries(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The guest test binaries, built here once per session (the guests run them)."""
    with _BINARIES_LOCK:
        if not _BINARIES:
            out = tmp_path_factory.mktemp("guest-tests")
            for package in GUEST_TESTS:
                subprocess.run(
                    ["go", "test", "-c", "-o", str(out / f"{package}.test"), f"./internal/{package}"],
                    cwd=AGENT_DIR,
                    check=True,
                )
            _BINARIES.append(out)
        return _BINARIES[0]


# What each guest showed, for the README's kernel table (test_readme_table_is_this_matrix).
RESULTS: dict[str, dict[str, str]] = {}
README = Path(__file__).resolve().parents[2] / "README.md"


def table_row(result: dict[str, str]) -> str:
    """One README table row of a kernel the matrix ran."""
    return (
        f"| {result['release']} | {result['suite']} | {result['variant']} | {result['tc']} "
        f"| {result['functions']} | the matrix tests in a guest |"
    )


# The guest's own limit (vm.run's timeout) decides, not pytest's default: TCG runs these in minutes. 5.10,
# the slowest, took just over 900 s in CI once the return hops and function events joined (it was one event
# test short of done), and 11.5 min beside another guest: 1200 s leaves room without hiding a hang.
# Beside another guest (guest_runs.py), both stretch by SHARED_STRETCH.
GUEST_TIMEOUT_S = 1200 * SHARED_STRETCH
# Each package's own limit in the guest, well inside the guest's: a test that deadlocks in user space
# panics with every goroutine's stack instead of idling until the guest is killed.
PACKAGE_TIMEOUT_S = 600 * SHARED_STRETCH


def failure_excerpt(output: str, size: int = 6000) -> str:
    """The part of a guest's output that says why it failed: from a Go test's timeout panic or the
    guest's hang report (lab/vm.py) if there is one, else its end."""
    for mark in ("panic: test timed out", "[hoptrace lab] still running"):
        at = output.find(mark)
        if at >= 0:
            return output[max(at - 2000, 0) : at + size]
    return output[-size:]


@dataclass
class MatrixRun:
    """A kernel's matrix guest: what it printed; if a first run hung (then it ran again), that run's log
    and hang report."""

    kernel: vm.Kernel
    result: vm.GuestRun
    hung_log: Path | None = None
    hang_report: str = ""


def run_matrix(version: str, tmp_path_factory: pytest.TempPathFactory) -> MatrixRun:
    """Boots `version`'s guest and runs GUEST_TESTS in it (beside other guests: guest_runs.py)."""
    kernel = next(k for k in matrix_kernels() if f"{k.version[0]}.{k.version[1]}" == version)
    binaries = guest_test_binaries(tmp_path_factory)
    commands = [
        f"cd {AGENT_DIR}/internal/{package} && {binaries}/{package}.test -test.v -test.count=1 "
        f"-test.timeout {int(PACKAGE_TIMEOUT_S * timeout_scale())}s "
        f"-test.run '^({pattern})$'; echo \"exit {package} $?\""
        for package, pattern in GUEST_TESTS.items()
    ]
    # The guest's output as it runs: tail -f it (pytest keeps the last three runs' directories).
    logs = tmp_path_factory.mktemp(f"matrix-{version}")

    def run_guest(log: str) -> vm.GuestRun:
        return vm.run(
            kernel,
            "uname -r; " + "; ".join(commands),
            timeout=GUEST_TIMEOUT_S,
            writable=(binaries,),
            log=logs / log,
            nice=GUEST_NICE,
        )

    result = run_guest("guest.log")
    if result.returncode != -9:
        return MatrixRun(kernel, result)
    # Killed at its limit: a guest that stopped making progress. A 6.1 guest did, at the start of
    # TestEventCountsWhereTermsHold: TCG hung on the kernel patching its syscall entry (lab/vm.py's
    # SYSCALL_TRACEPOINTS_ON now avoids that patching). Its hang report goes to the log, and the kernel
    # runs the tests once more.
    return MatrixRun(kernel, run_guest("guest-again.log"), logs / "guest.log", failure_excerpt(result.output))


@pytest.mark.timeout(2 * int(GUEST_TIMEOUT_S * timeout_scale()) + 120)  # a hung guest's second run
@pytest.mark.guest_run(run=run_matrix)
@pytest.mark.parametrize("version", REQUIRED)
def test_bpf_runs_on_kernel(version: str, guest_run: MatrixRun) -> None:
    kernel, result = guest_run.kernel, guest_run.result
    if guest_run.hung_log is not None:
        # A warning, so a run that passes the second time still says so in pytest's summary.
        warnings.warn(
            f"{kernel.release}: the guest hung and ran again; its output, with the hang report: "
            f"{guest_run.hung_log}",
            stacklevel=1,
        )
        print(f"{kernel.release} hung; its hang report:\n{guest_run.hang_report}")
    output = result.output
    assert kernel.release in output, f"the guest did not boot {kernel.release}:\n{output[-3000:]}"
    for package in GUEST_TESTS:
        assert f"exit {package} 0" in output, (
            f"{package} tests failed on {kernel.release}:\n{failure_excerpt(output)}"
        )
    passed = re.findall(r"--- PASS: (\S+)", output)
    # Every requested test ran and passed (a pattern that matched nothing would pass on nothing).
    for name in "|".join(GUEST_TESTS.values()).split("|"):
        assert name in passed, f"{name} did not pass on {kernel.release}: {passed}"
    # Debian's kernels have kprobes and no lockdown: every kernel-function hop must record, not be refused;
    # the return hops record every datagram sent (TestKernelFunctionReturnHops sends 20).
    for kind in ("kprobe", "fentry"):
        assert f"recorded by {kind} ip_rcv" in output, f"{kind} hop recorded nothing on {kernel.release}"
    for kind, entry in (("kretprobe", "kprobe"), ("fexit", "fentry")):
        line = f"recorded by {kind} ip_route_input_noref: 20 of 20 datagrams, each after {entry}"
        assert line in output, f"{kind} hop did not record every datagram on {kernel.release}"
    loads = [name for name in passed if name.startswith("TestEveryProgramLoads/")]
    assert len(loads) >= 23, f"only {len(loads)} programs loaded on {kernel.release}"
    # Each program loads as the variant its kernel runs (TestEveryProgramLoads fails on an E2BIG fallback
    # to _floor, and names each subtest after the variant it loads): socket-read's full variant on the
    # kernels past the floor, 6.1 included; the floor kernels' _floor.
    variant_suffix = "_floor" if "floor variants: true" in output else ""
    for program in FUNCTION_RETURN_PROGRAMS + SOCKET_READ_PROGRAMS:
        loaded = f"TestEveryProgramLoads/hoptrace.bpf.o/{program}{variant_suffix}"
        assert loaded in loads, f"{program}{variant_suffix} not loaded on {kernel.release}"
    for program in SOCKET_READ_PROGRAMS:
        assert f"loaded variant {program}{variant_suffix}\n" in output, (
            f"{program}: variant on {kernel.release}"
        )
    tc = re.search(r"tc attach: (\w+)", output)
    assert tc, f"the tracer test did not say how tc hops attach on {kernel.release}"
    RESULTS[version] = {
        "release": kernel.release,
        "suite": kernel.suite,
        "variant": "floor" if "floor variants: true" in output else "full",
        "tc": tc.group(1),
        "functions": "kprobe, kretprobe, fentry, fexit",
    }


def test_readme_table_is_this_matrix() -> None:
    """The README's kernel table says what the guests showed in this run, row for row."""
    missing = [version for version in REQUIRED if version not in RESULTS]
    assert not missing, f"the matrix did not pass on {missing}: no table to check"
    rows = [table_row(RESULTS[version]) for version in reversed(REQUIRED)]
    text = README.read_text()
    stale = [row for row in rows if row not in text]
    assert not stale, "README.md's kernel table is not this run's; its rows should be:\n" + "\n".join(rows)
