"""`make demo` in a guest of the oldest kernel the matrix runs (5.10, the floor variants): the whole system
(InfluxDB, the collector, the dispatcher, an agent per emulated host, sockperf) in one guest's kernel, as
`make demo-guest` runs it, with Python read from the guest's memory (lab/vm.py's PYTHON_TREES). The demo
itself waits until the report accounts for every datagram sent; here every datagram sent must be a complete
packet. The full variants' kernels need no demo of their own: 6.18 runs it here (tests/lab), 6.1 and 6.12
run each host's agent of a traced cluster in tests/vms, and every kernel's BPF runs in test_matrix.py."""

from __future__ import annotations

import re

import pytest
from guest_runs import SHARED_STRETCH

from hoptrace.common.timeouts import timeout_scale
from hoptrace.lab import vm

# 4.5 minutes on 5.10 here (docs/kernels.md, "The demo in a guest"), boot included; stretched beside
# another guest (guest_runs.py).
GUEST_TIMEOUT_S = 1200 * SHARED_STRETCH


def run_demo(version: str, tmp_path_factory: pytest.TempPathFactory) -> vm.GuestRun:
    """Boots `version`'s guest and runs the demo in it (beside other guests: guest_runs.py)."""
    return vm.run(
        vm.kernel_for(version),
        f"cd {vm.REPO_ROOT} && {vm.GUEST_DEMO}",
        timeout=GUEST_TIMEOUT_S,
        memory="3G",
        log=tmp_path_factory.mktemp(f"demo-{version}") / "guest.log",  # tail -f it while it runs
        in_memory=vm.PYTHON_TREES,
    )


@pytest.mark.timeout(int(GUEST_TIMEOUT_S * timeout_scale()) + 120)
@pytest.mark.guest_run(run=run_demo)
@pytest.mark.parametrize("version", ("5.10",))
def test_demo_completes_in_a_guest(version: str, guest_run: vm.GuestRun) -> None:
    release, output = guest_run.kernel.release, guest_run.output
    assert guest_run.returncode == 0, f"make demo failed in {release}:\n{output[-6000:]}"
    sent = re.search(r"c1 sent (\d+) datagrams to c2", output)
    report = re.search(r"trace demo-udp: (\d+) packets, (\d+) complete", output)
    assert sent and report, f"no demo summary from {release}:\n{output[-6000:]}"
    count = int(sent.group(1))
    packets, complete = int(report.group(1)), int(report.group(2))
    assert count > 0 and packets == complete == count, (sent.group(0), report.group(0))
