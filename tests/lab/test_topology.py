"""The two-host namespace topology: connectivity over VXLAN and routed, MTU, and complete cleanup."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable

import pytest

from hoptrace.lab.processes import udp_transfer
from hoptrace.lab.topology import VXLAN_MTU, TopologyError, TwoHostTopology, netns_list

ALL_PAIRS = (("c1", "c2"), ("c2", "c1"), ("host-a", "host-b"), ("host-b", "host-a"))


def root_links() -> set[str]:
    """Names of the links in the root namespace."""
    out = subprocess.run(["ip", "-j", "link", "show"], capture_output=True, text=True, check=True).stdout
    return {link["ifname"] for link in json.loads(out)}


def link_stats(topo: TwoHostTopology, role: str, dev: str) -> dict[str, int]:
    """rx/tx packet counters of a link."""
    out = topo.run(role, "ip", "-j", "-s", "link", "show", "dev", dev).stdout
    stats = json.loads(out)[0]["stats64"]
    return {"rx": stats["rx"]["packets"], "tx": stats["tx"]["packets"]}


def test_vxlan_connectivity_goes_through_the_tunnel(topology: TwoHostTopology) -> None:
    before = link_stats(topology, "host-b", "vxlan0")
    assert topology.ping_failures(ALL_PAIRS) == []
    after = link_stats(topology, "host-b", "vxlan0")
    # c1 -> c2 and c2 -> c1, IPv4 and IPv6: each echo crosses host-b's vxlan0 once in and once out.
    assert after["rx"] - before["rx"] >= 4
    assert after["tx"] - before["tx"] >= 4
    assert topology.run("c1", "ip", "-j", "link", "show", "eth0").stdout.count(f'"mtu":{VXLAN_MTU}') == 1


def test_vxlan_full_mtu_datagrams_fit_the_wire(topology: TwoHostTopology) -> None:
    # The largest unfragmented datagrams of a 1450-byte overlay MTU (IPv4 28, IPv6 48 header bytes).
    for family, size in ((4, VXLAN_MTU - 28), (6, VXLAN_MTU - 48)):
        payloads = [os.urandom(size) for _ in range(5)]
        assert udp_transfer(topology, "c1", "c2", payloads, family=family) == payloads


def test_routed_connectivity(routed_topology: TwoHostTopology) -> None:
    assert routed_topology.ping_failures(ALL_PAIRS) == []
    assert routed_topology.run("host-a", "ip", "link", "show", "vxlan0", check=False).returncode != 0
    route = routed_topology.run("host-a", "ip", "route", "get", "198.18.2.2").stdout
    assert "via 198.19.0.2 dev wire0" in route
    payloads = [os.urandom(1472) for _ in range(3)]  # full 1500 MTU
    assert udp_transfer(routed_topology, "c1", "c2", payloads) == payloads


def test_lookups(topology: TwoHostTopology) -> None:
    assert topology.netns("c1") == f"{topology.prefix}-c1"
    assert topology.addr("c2", 6) == "fd00:2::2"
    assert topology.addr("host-a", 4, "vxlan0") == "198.18.254.1"
    assert topology.ifindex("host-a", "wire0") > 0
    assert topology.netns_inode("host-b") != topology.netns_inode("host-a")
    with pytest.raises(KeyError):
        topology.netns("box")


def test_destroy_removes_everything_and_is_idempotent() -> None:
    links_before = root_links()
    topo = TwoHostTopology("htzz" + os.urandom(2).hex(), "vxlan")
    with topo:
        assert set(topo.namespaces) <= set(netns_list())
        assert root_links() == links_before, "the topology must not create links in the root namespace"
        assert topo.ping_ok()
    assert not set(topo.namespaces) & set(netns_list())
    topo.destroy()
    topo.destroy()
    assert root_links() == links_before


def test_failed_create_cleans_up(monkeypatch: pytest.MonkeyPatch) -> None:
    topo = TwoHostTopology("htzz" + os.urandom(2).hex(), "vxlan")
    original: Callable[..., None] = TwoHostTopology._addresses

    def fail_on_c2(self: TwoHostTopology, role: str, name: str) -> None:
        if role == "c2":
            raise TopologyError("injected failure")
        original(self, role, name)

    monkeypatch.setattr(TwoHostTopology, "_addresses", fail_on_c2)
    with pytest.raises(TopologyError, match="injected"):
        topo.create()
    assert not set(topo.namespaces) & set(netns_list())


def test_two_topologies_side_by_side(topology_factory: Callable[..., TwoHostTopology]) -> None:
    first, second = topology_factory("vxlan"), topology_factory("routed")
    assert first.prefix != second.prefix
    assert first.ping_ok() and second.ping_ok()
