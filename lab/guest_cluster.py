"""Guests as traced hosts with their control plane: the lab's guests (lab/guests.py), this machine as node
`hypervisor`, the dispatcher, collector and clock service on the lab network's hypervisor address, and the
reference path from guest-a's application to guest-b's. Shared by the guest tier (tests/vms/) and the VM
case studies (bench/case_vm_scheduling.py).
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hoptrace.common.certs import add_agent, create_bundle
from hoptrace.common.timeouts import scaled
from hoptrace.lab import vm
from hoptrace.lab.guests import HYPERVISOR_ADDRESS, TCP_PORT, UDP_PORT, Guest, GuestLab
from hoptrace.lab.localcluster import AGENT_BINARY, LocalCluster, free_port
from hoptrace.v1 import trace_pb2

HYPERVISOR = "hypervisor"


# The fetched Debian kernel of a version (major.minor); raises telling how to fetch it.
fetched_kernel = vm.kernel_for


@dataclass
class GuestCluster:
    """The lab's guests (by node) and the control plane they report to."""

    lab: GuestLab
    cluster: LocalCluster
    guests: dict[str, Guest]

    @property
    def a(self) -> Guest:
        return self.guests["guest-a"]

    @property
    def b(self) -> Guest:
        return self.guests["guest-b"]

    @property
    def nodes(self) -> list[str]:
        return [HYPERVISOR, *self.guests]


def guest_agent_argv(cluster: LocalCluster, node: str) -> list[str]:
    """The agent command line of a guest: this checkout's static agent, TLS material shared into the guest,
    clock rounds every 2 s (a stepped clock is seen soon)."""
    assert cluster.certs is not None
    files = add_agent(cluster.certs.out, node)
    return [
        str(AGENT_BINARY), "--node", node,
        "--dispatcher", cluster.dispatcher_addr, "--collector", cluster.collector_addr,
        "--clock-server", cluster.clock_addr, "--clock-interval", "2s", "--clock-probes", "20",
        "--metrics-listen", "127.0.0.1:9172",
        "--ca", str(files.ca), "--cert", str(files.cert), "--key", str(files.key),
    ]  # fmt: skip


@contextlib.contextmanager
def guest_cluster(
    influx_url: str, workdir: Path, name: str, kernels: dict[str, vm.Kernel]
) -> Iterator[GuestCluster]:
    """Boot the guests of `kernels` (by node: guest-a and guest-b for the reference path) at once, with the
    control plane on the lab network's hypervisor address and every agent connected; everything gone on
    exit. `workdir` is shared into the guests (certificates, agent logs)."""
    started = time.monotonic()
    with GuestLab(name, workdir) as lab:
        cluster = LocalCluster(
            influx_url=influx_url,
            workdir=workdir,
            dispatcher_addr=f"{HYPERVISOR_ADDRESS}:{free_port()}",
            collector_addr=f"{HYPERVISOR_ADDRESS}:{free_port()}",
            clock_addr=f"{HYPERVISOR_ADDRESS}:{free_port()}",
            certs=create_bundle(workdir / "certs", hosts=[HYPERVISOR_ADDRESS]),
        )
        with cluster:
            # A guest's agent loads and attaches its programs under TCG: seconds, not the default 5 s.
            cluster.start_dispatcher("--ack-timeout", "90")
            cluster.start_collector("--join-window", "2")
            cluster.wait_listening()
            cluster.start_agent(HYPERVISOR, lab.netns, "--netns-owned", lab.netns)
            guests = {
                node: lab.boot(node, kernel, index, guest_agent_argv(cluster, node))
                for index, (node, kernel) in enumerate(kernels.items())
            }
            for guest in guests.values():
                guest.wait_ready(240)
            booted = time.monotonic()
            cluster.wait_agents([HYPERVISOR, *guests], timeout_s=120)
            print(
                f"guests booted in {booted - started:.0f} s, agents up in {time.monotonic() - booted:.0f} s"
            )
            yield GuestCluster(lab, cluster, guests)


def path_spec(guests: GuestCluster, name: str, protocol: str) -> trace_pb2.TraceSpec:
    """guest-a's application -> its virtio NIC -> the hypervisor's tap of guest-a, bridge, tap of guest-b ->
    guest-b's virtio NIC (-> guest-b's application's read, for UDP), in path order."""
    a, b = guests.a, guests.b
    hops = [
        trace_pb2.HopSpec(name="a-nic-out", node=a.node, at="tc-egress", dev=a.nic),
        # The hypervisor agent's own namespace (--netns) is the lab's, where the taps and bridge are.
        trace_pb2.HopSpec(name="hv-tap-a-in", node=HYPERVISOR, at="tc-ingress", dev=a.tap),
        trace_pb2.HopSpec(name="hv-tap-b-out", node=HYPERVISOR, at="tc-egress", dev=b.tap),
        trace_pb2.HopSpec(name="b-nic-in", node=b.node, at="tc-ingress", dev=b.nic),
    ]
    # UDP goes on to guest-b's receiving application: the socket-read hop records each datagram when
    # sockperf's server reads it (6.1: the UDP read path before 6.6, spec/README.md). A TCP flow ends
    # at the NIC: its handshake, pure ACKs and FIN never reach the application, so they would read as lost
    # at a socket-read hop.
    if protocol == "udp":
        hops.append(trace_pb2.HopSpec(name="b-read", node=b.node, at="socket-read"))
    port = UDP_PORT if protocol == "udp" else TCP_PORT
    return trace_pb2.TraceSpec(
        name=name,
        filter=trace_pb2.Filter(protocol=protocol, src=a.address, dst=b.address, dst_port=port),
        sample=1,
        hops=hops,
    )


def wait_complete(cluster: LocalCluster, trace: str, packets: int, timeout_s: float = 90.0) -> dict[str, Any]:
    """The trace's report once it counts `packets` complete packets in every segment."""
    deadline = time.monotonic() + scaled(timeout_s)
    last = ""
    while time.monotonic() < deadline:
        cluster.check_running()
        result = cluster.hoptrace("report", trace, "--since", "30m", "--json", check=False)
        if result.returncode == 0:
            data = json.loads(result.stdout)
            last = result.stdout
            if data.get("complete", 0) >= packets and all(
                s.get("count", 0) >= packets for s in data.get("segments", [])
            ):
                return data
        else:
            last = result.stderr
        time.sleep(1)
    raise AssertionError(f"{trace} never had {packets} complete packets: {last}")
