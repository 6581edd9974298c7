"""`make demo` in a guest of the oldest kernel the matrix runs (5.10, the floor variants): the whole system
(InfluxDB, the collector, the dispatcher, an agent per emulated host, sockperf) in one guest's kernel, as
`make demo-guest` runs it, with Python read from the guest's memory (lab/vm.py's PYTHON_TREES). The demo
itself waits until the report accounts for every datagram sent; here every datagram sent must be a complete
packet. The full variants' kernels need no demo of their own: 6.18 runs it here (tests/lab), 6.1 and 6.12
run each host's agent of a traced cluster in tests/vms, and every kernel's BPF runs in test_matrix.py.

The demo's BPF objects are compiled here before the guest boots, into the cache its dispatcher reads
(lab/localcluster.py's BPF_CACHE_DIR, writable in the guest at the same path): by the dispatcher's own
compile path (check_spec, compile_spec) for the demo's own spec, so the guest's dispatcher finds exactly the
objects it would have compiled. That keeps what the test proves: the compile does not depend on the kernel
(CO-RE objects from kernel-patch/build's vmlinux.h, the same clang either way; clang under TCG took 3 of the
guest's 7 minutes), and everything that does happens in 5.10: the agents pick the floor variants, load them
through 5.10's verifier and attach them, and the traced flow runs there."""

from __future__ import annotations

import re
import subprocess

import pytest
from guest_runs import GUEST_NICE, SHARED_STRETCH

from hoptrace.cli.demo import demo_spec
from hoptrace.common.timeouts import timeout_scale
from hoptrace.lab import vm
from hoptrace.lab.localcluster import BPF_CACHE_DIR, compile_spec_objects
from hoptrace.lab.topology import TwoHostTopology

# 5 minutes on 5.10 here (docs/kernels.md, "The demo in a guest"), boot included; stretched beside
# another guest (guest_runs.py).
GUEST_TIMEOUT_S = 1200 * SHARED_STRETCH


def run_demo(version: str, tmp_path_factory: pytest.TempPathFactory) -> vm.GuestRun:
    """Compiles the demo's BPF objects into its cache here, then boots `version`'s guest and runs the demo
    in it (beside other guests: guest_runs.py)."""
    for directory in vm.GUEST_DEMO_WRITABLE:
        directory.mkdir(parents=True, exist_ok=True)
    # `make demo` builds first: whatever is stale (a regenerated Go file is newer than the agent) is built
    # here, in seconds, not in the guest, where a Go build under TCG takes minutes.
    subprocess.run(["make", "--no-print-directory", "build"], cwd=vm.REPO_ROOT, check=True)
    # The namespaces' names do not reach the objects: only the hops' attach kinds do.
    compile_spec_objects(demo_spec(TwoHostTopology("htdemo", overlay="vxlan")), BPF_CACHE_DIR)
    return vm.run(
        vm.kernel_for(version),
        f"cd {vm.REPO_ROOT} && {vm.GUEST_DEMO}",
        timeout=GUEST_TIMEOUT_S,
        memory="3G",
        writable=vm.GUEST_DEMO_WRITABLE,
        log=tmp_path_factory.mktemp(f"demo-{version}") / "guest.log",  # tail -f it while it runs
        in_memory=vm.PYTHON_TREES,
        nice=GUEST_NICE,
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
