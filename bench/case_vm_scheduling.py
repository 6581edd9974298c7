"""vNetTracer case study 2 with VMs: the receiving VM's vCPU shares a host CPU with a CPU-bound VM.

Three Debian guests under qemu on this machine (lab/guests.py): guest-a (6.12) sends a UDP flow to guest-b
(6.1), whose application (sockperf's server) reads it; a third guest, `hog-vm` (6.1), spins a busy loop on
its one vCPU. guest-b's and hog-vm's qemu processes (every thread) are pinned to host CPU 1; guest-a's, the
control plane and the hypervisor's agent to CPU 0. Cases, switched without rebooting:
- `alone`: hog-vm stopped (SIGSTOP to its qemu: the VM holds no CPU);
- `cpu-shared`: hog-vm running at the same weight (nice 0), as in vNetTracer;
- `cpu-shared-nice-10`: hog-vm's qemu threads at nice -10 (9.3x guest-b's weight);
- `cpu-shared-sched-idle`: hog-vm's qemu threads under SCHED_IDLE, the Linux counterpart of vNetTracer's fix
  (there: Xen credit2's rate limit set to 0).

One hoptrace spec per case (lab/guest_cluster.path_spec): guest-a's NIC egress -> the hypervisor's tap of
guest-a -> the hypervisor's tap of guest-b (egress: the packet is handed to guest-b's qemu) -> guest-b's NIC
ingress -> guest-b's application's read (socket-read), each guest traced by its own agent in its own kernel.
The segment `hv-tap-b-out > b-nic-in` is the host tap -> guest NIC time: the wait for guest-b's vCPU to run.

Under TCG (this machine's /dev/kvm cannot run stock kernels) a vCPU is a qemu thread that emulates every
instruction, so absolute times are inflated several-fold; compare the cases with each other.

    sudo .venv/bin/python bench/case_vm_scheduling.py [--datagrams 200] [--json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from hoptrace.common.timeouts import scaled
from hoptrace.lab.guest_cluster import GuestCluster, fetched_kernel, guest_cluster, path_spec, wait_complete
from hoptrace.lab.guests import Guest
from hoptrace.lab.processes import start_influxd
from hoptrace.v1 import api_pb2

RESULTS = Path(__file__).resolve().parent / "results"
GUEST_CPU, OTHER_CPU = "1", "0"
HOG_LOOP = ["sh", "-c", "while :; do :; done"]
CASES = ("alone", "cpu-shared", "cpu-shared-nice-10", "cpu-shared-sched-idle")
TAP_TO_GUEST = "hv-tap-b-out>b-nic-in"


def qemu_pid(guest: Guest) -> int:
    """The qemu process of a guest (vng -> virtme-run -> qemu share the guest's process group)."""
    out = subprocess.run(
        ["pgrep", "-g", str(guest.process.pid), "qemu-system"], capture_output=True, text=True, check=False
    ).stdout.split()
    if len(out) != 1:
        raise RuntimeError(f"{guest.node}: expected one qemu process in group {guest.process.pid}, got {out}")
    return int(out[0])


def threads(pid: int) -> list[int]:
    return [int(tid) for tid in os.listdir(f"/proc/{pid}/task")]


def pin(pid: int, cpu: str) -> None:
    """Every thread of `pid` on host CPU `cpu`."""
    subprocess.run(["taskset", "-a", "-p", "-c", cpu, str(pid)], check=True, capture_output=True)


def set_policy(pid: int, nice: int, idle: bool) -> None:
    """Every thread of `pid` at `nice`, under SCHED_IDLE or SCHED_OTHER."""
    policy = os.SCHED_IDLE if idle else os.SCHED_OTHER
    for tid in threads(pid):
        # qemu starts and ends worker threads as it goes: one may be gone by now.
        with contextlib.suppress(ProcessLookupError):
            os.sched_setscheduler(tid, policy, os.sched_param(0))
            os.setpriority(os.PRIO_PROCESS, tid, nice)  # per thread: Linux's PRIO_PROCESS takes a thread id


def set_case(hog: int, case: str) -> None:
    """Put hog-vm's qemu in `case`'s state."""
    if case == "alone":
        os.kill(hog, signal.SIGSTOP)
        return
    os.kill(hog, signal.SIGCONT)
    set_policy(hog, -10 if case == "cpu-shared-nice-10" else 0, case == "cpu-shared-sched-idle")


def segment_stats(data: dict[str, Any]) -> dict[str, dict[str, float]]:
    """Per segment, mean / p50 / p90 / p99 in µs and its count."""
    return {
        f"{s['from']}>{s['to']}": {
            "count": s["count"],
            **{k: s[f"{k}_ns"] / 1e3 for k in ("mean", "p50", "p90", "p99")},
        }
        for s in data["segments"]
    }


def run_case(guests: GuestCluster, case: str, datagrams: int) -> dict[str, Any]:
    """One traced UDP flow guest-a -> guest-b in `case`; its decomposition."""
    spec = path_spec(guests, f"vm-sd-{case}", "udp")
    guests.cluster.apply(spec, timeout_s=120)
    sent = guests.a.send_flow("udp", guests.b, datagrams)
    data = wait_complete(guests.cluster, spec.name, sent, timeout_s=180)
    guests.cluster.api().DeleteTrace(api_pb2.DeleteTraceRequest(name=spec.name), timeout=scaled(60))
    return {"case": case, "sent": sent, "complete": data["complete"], "segments": segment_stats(data)}


@contextlib.contextmanager
def hog_vm(guests: GuestCluster) -> Iterator[int]:
    """Boot the CPU-bound VM on the lab (its "agent" is a busy loop); yields its qemu pid."""
    hog = guests.lab.boot("hog-vm", fetched_kernel("6.1"), 2, HOG_LOOP)
    hog.wait_ready(240)
    pid = qemu_pid(hog)
    try:
        yield pid
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)  # a stopped qemu would not die of the lab's SIGKILL until continued


def run(datagrams: int) -> list[dict[str, Any]]:
    """Every case in turn on one set of guests."""
    affinity = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {int(OTHER_CPU)})  # the control plane and the hypervisor agent inherit it
    influx = start_influxd()
    try:
        with tempfile.TemporaryDirectory(prefix="hoptrace-vm-case-") as work:
            kernels = {"guest-a": fetched_kernel("6.12"), "guest-b": fetched_kernel("6.1")}
            with guest_cluster(influx.url, Path(work), "htvmcase", kernels) as guests, hog_vm(guests) as hog:
                pin(qemu_pid(guests.a), OTHER_CPU)
                pin(qemu_pid(guests.b), GUEST_CPU)
                pin(hog, GUEST_CPU)
                results = []
                for case in CASES:
                    set_case(hog, case)
                    results.append(run_case(guests, case, datagrams))
                    print(f"{case}: {json.dumps(results[-1]['segments'])}", flush=True)
                return results
    finally:
        influx.stop()
        os.sched_setaffinity(0, affinity)


def table(results: list[dict[str, Any]]) -> str:
    """Markdown: per case, every segment's mean / p50 / p90 / p99 µs."""
    segments = list(results[0]["segments"])
    rows = [
        "| case | complete / sent | " + " | ".join(segments) + " |",
        "|---|---|" + "---|" * len(segments),
    ]
    for r in results:
        cells = [
            " / ".join(f"{r['segments'][s][k]:.0f}" for k in ("mean", "p50", "p90", "p99")) for s in segments
        ]
        rows.append(f"| {r['case']} | {r['complete']} / {r['sent']} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def main() -> int:
    """Command line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--datagrams", type=int, default=200, help="UDP datagrams per case, 5 ms apart")
    parser.add_argument("--json", action="store_true", help="print everything as JSON instead of the table")
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("run as root (guests, namespaces, BPF): sudo .venv/bin/python bench/case_vm_scheduling.py")
    results = run(args.datagrams)
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / (datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ") + "-vm-scheduling.json")
    path.write_text(json.dumps(results, indent=1))
    print(json.dumps(results, indent=2) if args.json else table(results))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
