"""End to end: an agent leaves nothing attached, whether it stops on SIGINT or is killed with SIGKILL.

Every attachment is an fd-based BPF link and nothing is pinned (docs/design.md), so the kernel detaches all
of an agent's programs when its last fd closes, even when the agent had no chance to clean up.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from e2e_helpers import (
    bpf_fds,
    bpftool_json,
    held_link_ids,
    hoptrace_links,
    spec_plans,
    start_attached,
    tcx_attachments,
)

from hoptrace.lab.processes import AgentProcess
from hoptrace.lab.topology import TwoHostTopology


def plans(topo: TwoHostTopology) -> tuple[dict[str, Any], dict[str, Any]]:
    """Plans that use every attach kind that works here: tcx both ways, both tracepoint programs, XDP and
    the sock_ops TCP tagger on the root cgroup (no protocol: UDP and TCP are both tagged)."""
    plans = spec_plans(
        {
            "name": "cleanup",
            "filter": {"dst_port": 6700},
            "hops": [
                {"name": "c1-out", "node": "host-a", "at": "tc-egress", "dev": "eth0", "netns": topo.c1},
                {"name": "a-veth-in", "node": "host-a", "at": "tc-ingress", "dev": "veth-c1"},
                {"name": "a-rx", "node": "host-a", "at": "tracepoint:net:netif_receive_skb", "dev": "br0"},
                {"name": "a-tx", "node": "host-a", "at": "tracepoint:net:net_dev_xmit", "dev": "wire0"},
                {"name": "b-wire-xdp", "node": "host-b", "at": "xdp", "dev": "wire0"},
                {"name": "b-vxlan-in", "node": "host-b", "at": "tc-ingress", "dev": "vxlan0"},
                {"name": "c2-in", "node": "host-b", "at": "tc-ingress", "dev": "eth0", "netns": topo.c2},
            ],
        }
    )
    return plans["host-a"], plans["host-b"]


def xdp_and_tc(topo: TwoHostTopology) -> dict[str, Any]:
    """What ``bpftool net show`` lists (XDP and tc) in each namespace of the topology, non-empty only."""
    found = {}
    for role in topo.roles:
        for entry in bpftool_json("net", "show", netns=topo.netns(role)) or []:
            listed = {kind: progs for kind, progs in entry.items() if kind in ("xdp", "tc") and progs}
            if listed:
                found[role] = listed
    return found


def leftovers(link_ids: set[int], prog_ids: set[int], topo: TwoHostTopology) -> list[str]:
    """Everything of the stopped agents the kernel still has, described; empty when all is gone."""
    problems = []
    links = {link["id"]: link for link in bpftool_json("link", "show") or []}
    if still := sorted(link_ids & set(links)):
        problems.append(f"links still present: {[links[i] for i in still]}")
    progs = {p["id"]: p for p in bpftool_json("prog", "show") or []}
    if still := sorted(prog_ids & set(progs)):
        problems.append(f"programs still loaded: {[progs[i] for i in still]}")
    # Links of hoptrace's programs that no live process holds (another run's agents may hold theirs).
    orphans = [link for link in hoptrace_links() if link["id"] not in held_link_ids()]
    if orphans:
        problems.append(f"hoptrace links held by no process: {orphans}")
    if tcx := tcx_attachments(topo):
        problems.append(f"tcx programs still attached: {tcx}")
    if net := xdp_and_tc(topo):
        problems.append(f"bpftool net still lists: {net}")
    return problems


@pytest.mark.parametrize("how", ["sigint", "sigkill"])
def test_agents_leave_no_program_attached(
    topology: TwoHostTopology,
    agent_factory: Callable[..., AgentProcess],
    bpf_object: Path,
    how: str,
) -> None:
    """While the agents run, their links (tcx, tracing, XDP, cgroup) exist and are theirs; after SIGINT, or
    SIGKILL, none of their links or programs is left, no tcx program stays on any device of the topology
    (BPF_PROG_QUERY) and ``bpftool net`` lists nothing in any of its namespaces."""
    plan_a, plan_b = plans(topology)
    agents = [
        start_attached(agent_factory, plan_a, "host-a", topology.host_a),
        start_attached(agent_factory, plan_b, "host-b", topology.host_b),
    ]
    link_ids: set[int] = set()
    prog_ids: set[int] = set()
    for agent, plan in zip(agents, (plan_a, plan_b), strict=True):
        assert agent.proc is not None
        held = bpf_fds(agent.proc.pid)
        want = len(plan["hops"]) + (1 if "tcpTagging" in plan else 0)
        assert len(held["link"]) == want, f"{agent.node} holds links {held['link']}, want {want}"
        link_ids |= held["link"]
        prog_ids |= held["prog"]

    # Before stopping: the checks below must see what they are looking for, or they prove nothing.
    ours = {link["id"]: link["prog_name"] for link in hoptrace_links() if link["id"] in link_ids}
    assert set(ours) == link_ids, f"bpftool shows {ours} of the agents' links {sorted(link_ids)}"
    assert set(ours.values()) == {"hop_tc", "hop_tp_btf", "hop_tp_btf_xmit", "hop_xdp", "tag_tcp"}
    tcx = tcx_attachments(topology)
    assert set(tcx) == {
        "c1/eth0/egress",
        "host-a/veth-c1/ingress",
        "host-b/vxlan0/ingress",
        "c2/eth0/ingress",
    }
    assert "host-b" in xdp_and_tc(topology), "bpftool net does not show the XDP hop on host-b's wire0"

    for agent in agents:
        assert agent.proc is not None
        if how == "sigint":
            assert agent.stop() == 0
        else:
            agent.proc.send_signal(signal.SIGKILL)
            assert agent.proc.wait(10) == -signal.SIGKILL

    # Program memory is freed after an RCU grace period: give the kernel a moment.
    deadline = time.monotonic() + 5
    while (problems := leftovers(link_ids, prog_ids, topology)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not problems, f"after {how}: " + "; ".join(problems)
