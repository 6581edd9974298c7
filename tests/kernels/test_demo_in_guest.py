"""`make demo` in guests of the oldest kernels the matrix runs (5.10, 6.1): the whole system (InfluxDB, the
collector, the dispatcher, an agent per emulated host, sockperf) in one guest's kernel, as `make demo-guest`
runs it, with Python read from the guest's memory (lab/vm.py's PYTHON_TREES). The demo itself waits until
the report accounts for every datagram sent; here every datagram sent must be a complete packet."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from hoptrace.common.timeouts import timeout_scale
from hoptrace.lab import vm

# 4.5 minutes on 5.10 and 2.5 on 6.1 here (docs/kernels.md, "The demo in a guest"), boot included.
GUEST_TIMEOUT_S = 1200


@pytest.mark.timeout(int(GUEST_TIMEOUT_S * timeout_scale()) + 120)
@pytest.mark.parametrize("version", ("5.10", "6.1"))
def test_demo_completes_in_a_guest(version: str, tmp_path: Path) -> None:
    kernel = vm.kernel_for(version)
    result = vm.run(
        kernel,
        f"cd {vm.REPO_ROOT} && {vm.GUEST_DEMO}",
        timeout=GUEST_TIMEOUT_S,
        memory="3G",
        log=tmp_path / "guest.log",  # tail -f it while it runs
        in_memory=vm.PYTHON_TREES,
    )
    output = result.output
    assert result.returncode == 0, f"make demo failed in {kernel.release}:\n{output[-6000:]}"
    sent = re.search(r"c1 sent (\d+) datagrams to c2", output)
    report = re.search(r"trace demo-udp: (\d+) packets, (\d+) complete", output)
    assert sent and report, f"no demo summary from {kernel.release}:\n{output[-6000:]}"
    count = int(sent.group(1))
    packets, complete = int(report.group(1)), int(report.group(2))
    assert count > 0 and packets == complete == count, (sent.group(0), report.group(0))
