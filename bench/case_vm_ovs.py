"""vNetTracer case study 1 with Open vSwitch: a latency-sensitive flow through an OVS bridge that a bulk
flow congests, from the same VM or from another one, then the bulk flow policed at its OVS port.

This machine's kernel has no Open vSwitch module, so OVS runs in a Debian guest (6.12, under qemu) that
is the virtualization host here: its kernel's OVS datapath switches between three "VMs", namespaces
vm1..vm3 whose eth0 is a veth with its other end (vmN-port) on the OVS bridge, in place of a VM's tap
(lab/guest_host.sh, `ovs-setup`). The guest runs its own agent; the control plane runs on this machine
(lab/guest_cluster.py).

- the traced flow: UDP datagrams from vm1 to sockperf's server in vm2, 5 ms apart (the application reads
  each: the socket-read hop);
- the load: iperf3 UDP flows to vm2 (one iperf3 server each) at --load-mbps from vm1 (the same VM as the
  traced sender), vm3 (a second VM) or both;
- cases, switched without rebooting, as vNetTracer's: `alone` (its case I), `load-same-vm` (II),
  `load-other-vm`, `load-same-and-other-vm` (III), and `load-same-and-other-vm-policed`: III with OVS
  ingress policing (`ingress_policing_rate`, --police-kbps) on both loading VMs' ports, its fix. The
  policer drops what exceeds the rate, the traced datagrams included: that case may lose some, and the
  table says how many.

One hoptrace spec per case, every hop on the OVS host: vm1's eth0 egress (the sender's stack done) ->
vm1-port ingress (the packet enters OVS: the veth crossing and the CPU's backlog queue in front of OVS) ->
vm2-port egress (OVS's datapath done) -> vm2's eth0 ingress -> sockperf's read in vm2 (the receiver's
stack and socket queue).

Under TCG (this machine's /dev/kvm cannot run stock kernels) the guest's one vCPU is a qemu thread that
emulates every instruction: absolute times are inflated several-fold and the bulk flow reaches far fewer
Mbit/s than on hardware; compare the cases with each other.

    sudo .venv/bin/python bench/case_vm_ovs.py [--datagrams 200] [--load-mbps 50] [--json]
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import grpc

from hoptrace.common.timeouts import scaled
from hoptrace.lab.guest_cluster import GuestCluster, fetched_kernel, guest_cluster
from hoptrace.lab.guests import UDP_PORT, Guest
from hoptrace.lab.processes import start_influxd
from hoptrace.v1 import api_pb2, trace_pb2

RESULTS = Path(__file__).resolve().parent / "results"
OVS_HOST = "ovs-host"
OVS_NET = "198.19.241"  # lab/guest_host.sh's VM network inside the OVS host
# case: (the VMs that send a bulk flow, or none; police their OVS ports)
CASES: dict[str, tuple[str, bool]] = {
    "alone": ("none", False),
    "load-same-vm": ("vm1", False),
    "load-other-vm": ("vm3", False),
    "load-same-and-other-vm": ("vm1,vm3", False),
    "load-same-and-other-vm-policed": ("vm1,vm3", True),
}
SEGMENTS = {
    "vm1-out>ovs-in": "vm1 NIC -> OVS in",
    "ovs-in>ovs-out": "OVS datapath",
    "ovs-out>vm2-in": "OVS out -> vm2 NIC",
    "vm2-in>vm2-read": "vm2 NIC -> read",
}


def ovs_spec(name: str) -> trace_pb2.TraceSpec:
    """vm1's NIC -> into OVS -> out of OVS to vm2 -> vm2's NIC -> sockperf's read, on the OVS host."""
    hops = [
        trace_pb2.HopSpec(name="vm1-out", node=OVS_HOST, at="tc-egress", dev="eth0", netns="vm1"),
        trace_pb2.HopSpec(name="ovs-in", node=OVS_HOST, at="tc-ingress", dev="vm1-port"),
        trace_pb2.HopSpec(name="ovs-out", node=OVS_HOST, at="tc-egress", dev="vm2-port"),
        trace_pb2.HopSpec(name="vm2-in", node=OVS_HOST, at="tc-ingress", dev="eth0", netns="vm2"),
        trace_pb2.HopSpec(name="vm2-read", node=OVS_HOST, at="socket-read", netns="vm2"),
    ]
    return trace_pb2.TraceSpec(
        name=name,
        filter=trace_pb2.Filter(protocol="udp", src=f"{OVS_NET}.1", dst=f"{OVS_NET}.2", dst_port=UDP_PORT),
        sample=1,
        hops=hops,
    )


def apply_when_seen(guests: GuestCluster, spec: trace_pb2.TraceSpec, timeout_s: float = 120) -> None:
    """Apply once the dispatcher knows the VMs' namespaces (the agent reports new ones with its next
    heartbeat)."""
    deadline = time.monotonic() + scaled(timeout_s)
    while True:
        try:
            guests.cluster.apply(spec, timeout_s=120)
            return
        except grpc.RpcError as err:
            if "did not report" not in (err.details() or "") or time.monotonic() > deadline:
                raise
            time.sleep(1)


def wait_accounted(guests: GuestCluster, trace: str, sent: int, timeout_s: float = 180) -> dict[str, Any]:
    """The trace's report once every datagram sent is complete or lost in a segment (a policer drops some)."""
    deadline = time.monotonic() + scaled(timeout_s)
    while True:
        result = guests.cluster.hoptrace("report", trace, "--since", "30m", "--json", check=False)
        if result.returncode == 0:
            data = json.loads(result.stdout)
            lost = sum(s.get("loss_count", 0) for s in data.get("segments", []))
            if data.get("segments") and data.get("complete", 0) + lost >= sent:
                return data
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"{trace}: {sent} sent, never all accounted for: {result.stdout or result.stderr}"
            )
        time.sleep(1)


def segment_stats(data: dict[str, Any]) -> dict[str, dict[str, float]]:
    """Per segment, mean / p50 / p90 / p99 in µs and its count."""
    return {
        f"{s['from']}>{s['to']}": {
            "count": s["count"],
            **{k: s[f"{k}_ns"] / 1e3 for k in ("mean", "p50", "p90", "p99")},
        }
        for s in data["segments"]
    }


def run_case(guests: GuestCluster, host: Guest, case: str, args: argparse.Namespace) -> dict[str, Any]:
    """One traced flow vm1 -> vm2 under `case`'s load; its decomposition."""
    load_vm, policed = CASES[case]
    host.command(f"ovs-police vm1,vm3 {args.police_kbps if policed else 0}")
    # The load outlasts the traced flow (however slow the guest): it is stopped once the flow was sent.
    host.command(f"ovs-load {load_vm} {args.load_mbps} 600")
    time.sleep(scaled(2))  # the bulk flow is up before the traced one starts
    spec = ovs_spec(f"vm-ovs-{case}")
    apply_when_seen(guests, spec)
    answer = host.command(f"ovs-udp {args.datagrams}", timeout_s=300)
    found = re.fullmatch(r"sent (\d+)", answer)
    if not found:
        raise RuntimeError(f"unexpected answer to the traced flow: {answer!r}")
    sent = int(found.group(1))
    stopped = re.fullmatch(r"delivered (\d+) ([\d.]+)", host.command("ovs-load none 0 0"))
    if not stopped:
        raise RuntimeError("unexpected answer to stopping the load")
    delivered_mbps = int(stopped.group(1)) * 8 / float(stopped.group(2)) / 1e6 if load_vm != "none" else 0.0
    data = wait_accounted(guests, spec.name, sent)
    guests.cluster.api().DeleteTrace(api_pb2.DeleteTraceRequest(name=spec.name), timeout=scaled(60))
    return {
        "case": case,
        "load_vm": load_vm,
        "load_mbps": args.load_mbps if load_vm != "none" else 0,
        "police_kbps": args.police_kbps if policed else 0,
        "load_delivered_mbps": round(delivered_mbps, 2),
        "sent": sent,
        "complete": data["complete"],
        "lost": sum(s["loss_count"] for s in data["segments"]),
        "segments": segment_stats(data),
        "end_to_end": {k: data["end_to_end"][f"{k}_ns"] / 1e3 for k in ("mean", "p50", "p90", "p99")},
    }


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Every case in turn on one OVS host."""
    influx = start_influxd()
    try:
        with tempfile.TemporaryDirectory(prefix="hoptrace-vm-ovs-") as work:
            kernels = {OVS_HOST: fetched_kernel("6.12")}
            with guest_cluster(influx.url, Path(work), "htvmovs", kernels) as guests:
                host = guests.guests[OVS_HOST]
                print(host.command("ovs-setup", timeout_s=300), flush=True)
                results = []
                for case in CASES:
                    results.append(run_case(guests, host, case, args))
                    print(f"{case}: {json.dumps(results[-1]['segments'])}", flush=True)
                return results
    finally:
        influx.stop()


def table(results: list[dict[str, Any]]) -> str:
    """Markdown: per case, every segment's mean / p50 / p90 / p99 µs."""
    head = ["case", "load at vm2 (Mbit/s)", "complete / lost / sent", *SEGMENTS.values(), "end to end"]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in results:
        cells = [r["case"], f"{r['load_delivered_mbps']:.1f}", f"{r['complete']} / {r['lost']} / {r['sent']}"]
        for name in SEGMENTS:
            s = r["segments"].get(name)
            cells.append(" / ".join(f"{s[k]:.0f}" for k in ("mean", "p50", "p90", "p99")) if s else "-")
        cells.append(" / ".join(f"{r['end_to_end'][k]:.0f}" for k in ("mean", "p50", "p90", "p99")))
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--datagrams", type=int, default=200)
    parser.add_argument("--load-mbps", type=int, default=50, help="the bulk flow's rate (iperf3 -u -b)")
    parser.add_argument("--police-kbps", type=int, default=10000, help="the OVS ingress policing rate")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    args = parser.parse_args()
    results = run(args)
    RESULTS.mkdir(exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    out = RESULTS / f"{stamp}-vm-ovs.json"
    out.write_text(json.dumps({"args": vars(args), "results": results}, indent=2) + "\n")
    print(json.dumps(results, indent=2) if args.json else table(results))
    print(f"written: {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
