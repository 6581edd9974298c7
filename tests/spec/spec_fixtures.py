"""The spec tests' shared data, also used by the dispatcher's tests: the contract spec (spec/README.md's
example) and the registrations of the example agents it is validated against."""

from __future__ import annotations

from hoptrace import kernel_abi
from hoptrace.v1 import agent_pb2

CONTRACT_SPEC = """\
name: udp-a-to-b                 # [a-z0-9-]+, unique
filter:                          # every field optional; fields are ANDed
  protocol: udp                  # udp | tcp
  src: 198.18.1.2                # address or CIDR, IPv4 or IPv6
  dst: 198.18.2.2
  src_port: 0                    # 0 or absent = any
  dst_port: 11111
sample: 1                        # trace 1 packet in N
hops:                            # in path order; each hop runs on one node's agent
  - {name: a-c1-out,   node: host-a, at: tc-egress,  dev: eth0, netns: c1}
  - {name: a-br-in,    node: host-a, at: "tracepoint:net:netif_receive_skb", dev: veth-c1}
  - {name: a-wire-out, node: host-a, at: tc-egress,  dev: wire0}
  - {name: b-wire-in,  node: host-b, at: tc-ingress, dev: wire0}
  - {name: b-c2-in,    node: host-b, at: tc-ingress, dev: eth0, netns: c2}
"""

# The heads of the actions' and the events' test specs: one UDP hop out of c1 on host-a, then the hops or
# events a test lists (`with_items`).
ACTIONS_HEAD = """\
name: acts
filter: {protocol: udp, dst_port: 5000}
hops:
  - {name: a-out, node: host-a, at: tc-egress, dev: eth0, netns: c1}
"""
EVENTS_HEAD = ACTIONS_HEAD.replace("name: acts", "name: evs") + "events:\n"
# Hops after ACTIONS_HEAD's with every kind of action: a latency histogram on host-a (so a-out keeps
# timestamps for it), count, histogram and record on host-b.
ACTION_HOPS = (
    "{name: a-wire, node: host-a, at: tc-egress, dev: wire0,"
    " actions: [timestamp, {count: {by: cpu}}, {histogram: latency}]}",
    "{name: b-in, node: host-b, at: tc-ingress, dev: wire0, actions: [timestamp, count, {histogram: len}]}",
    "{name: b-c2, node: host-b, at: tc-ingress, dev: eth0, netns: c2,"
    " actions: [timestamp, {count: , by: mark}, {record: [len, ttl]}]}",
)


def with_items(head: str, *items: str) -> str:
    """`head` and one YAML list item per entry of `items` (flow mappings: hops or events)."""
    return head + "".join(f"  - {item}\n" for item in items)


# What this machine's kernel allows (docs/ENVIRONMENT): fentry refused by lockdown, kprobes not compiled in.
ATTACH_SUPPORT = {
    "tc": (True, ""),
    "tcx": (True, ""),
    "xdp": (True, ""),
    "tp_btf": (True, ""),
    "raw_tp": (True, ""),
    "cgroup_skb": (True, ""),
    "sock_ops": (True, ""),
    "fentry": (False, "fentry not permitted: kernel lockdown"),
    "fexit": (False, "fexit not permitted: kernel lockdown"),
    "kprobe": (False, "kprobes not compiled into this kernel"),
    "kretprobe": (False, "kretprobe not supported: kernel has no kprobe_events"),
}

DROP_REASONS = {1: "CONSUMED", 2: "NOT_SPECIFIED", 3: "NO_SOCKET", 12: "NETFILTER_DROP"}

NODE_NAMESPACES = {
    "host-a": {"": ["lo", "wire0", "veth-c1", "br0"], "c1": ["lo", "eth0"]},
    "host-b": {"": ["lo", "wire0", "veth-c2", "br0"], "c2": ["lo", "eth0"]},
}


def make_registration(
    node: str, namespaces: dict[str, list[str]], running: list[agent_pb2.TraceStatus] | None = None
) -> agent_pb2.Register:
    """A Register as an agent on this kind of machine sends it."""
    registration = agent_pb2.Register(node=node, kernel_release="6.18.0-test", agent_version="test")
    registration.capabilities.btf = True
    registration.capabilities.ring_buffer = True
    registration.capabilities.tcp_header_options = True
    # Every field of the catalogue, as probe.Capabilities reports it.
    registration.capabilities.action_fields.extend(range(1, len(kernel_abi.FIELDS)))
    # A few of the kernel's enum skb_drop_reason names, as probe.DropReasons reads them from BTF.
    registration.capabilities.drop_reasons.update(DROP_REASONS)
    for kind, (supported, reason) in ATTACH_SUPPORT.items():
        registration.capabilities.attach[kind].supported = supported
        registration.capabilities.attach[kind].reason = reason
    for inode, (name, devices) in enumerate(namespaces.items(), start=4026531840):
        namespace = registration.namespaces.add(name=name, inode=inode)
        for ifindex, device in enumerate(devices, start=1):
            namespace.devices.add(name=device, ifindex=ifindex, mtu=1500, kind="veth")
    registration.running.extend(running or [])
    return registration


def example_registrations() -> dict[str, agent_pb2.Register]:
    """host-a and host-b of the contract spec."""
    return {node: make_registration(node, namespaces) for node, namespaces in NODE_NAMESPACES.items()}


def guest_registrations() -> dict[str, agent_pb2.Register]:
    """Registrations of nodes whose kernels allow kprobes and fentry (Debian's, in the VM lab)."""
    agents = example_registrations()
    for registration in agents.values():
        for kind in ("kprobe", "fentry"):
            registration.capabilities.attach[kind].supported = True
            registration.capabilities.attach[kind].reason = ""
    return agents


POD_UID = "0d5b2a53-6f0c-4e9e-9d38-1c2b3a4d5e6f"


def registrations_with_workloads() -> dict[str, agent_pb2.Register]:
    """host-a runs Docker containers ht-names-a (in /run/netns c1, adopted by inode) and a pod's two
    containers in a namespace with no /run/netns name; host-b runs no runtime."""
    registrations = example_registrations()
    host_a = registrations["host-a"]
    host_a.runtime.endpoint, host_a.runtime.version = "/var/run/docker.sock", "20.10.24"
    c1 = next(ns for ns in host_a.namespaces if ns.name == "c1")
    c1.workloads.add(container_id="a" * 64, container_name="ht-names-a", image="hoptrace/debian:bookworm")
    pod_ns = host_a.namespaces.add(name="/proc/4242/ns/net", inode=4026532999)
    pod_ns.devices.add(name="eth0", ifindex=3, mtu=1450, kind="veth")
    for name, image in (("k8s_POD_web-0", "pause:3.9"), ("k8s_app_web-0", "nginx:1.25")):
        pod_ns.workloads.add(
            container_id=name.encode().hex().ljust(64, "0"),
            container_name=name,
            image=image,
            pod_namespace="shop",
            pod_name="web-0",
            cgroup=f"/kubepods/burstable/pod{POD_UID}/x",
        )
    return registrations


# Hops named by their workloads (container:, pod:) on registrations_with_workloads' host-a.
WORKLOAD_SPEC = """\
name: names
filter: {protocol: udp, dst: 198.18.2.2}
hops:
  - {node: host-a, at: tc-egress, dev: eth0, netns: "container:ht-names-a"}
  - {name: a-wire-out, node: host-a, at: tc-egress, dev: wire0}
  - {node: host-a, at: tc-ingress, dev: eth0, netns: "pod:shop/web-0"}
"""
