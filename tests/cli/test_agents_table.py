"""`hoptrace agents` fits 100 columns on a machine with many namespaces and containers: counts, and as many
container names as a line holds; `--wide` lists every one (it printed 244-263 columns: every namespace)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from hoptrace.cli.agents import WIDE_HEADER, WIDTH, agent_row, summary_table
from hoptrace.cli.table import table
from hoptrace.v1 import agent_pb2, api_pb2, trace_pb2

pytestmark = pytest.mark.unit

NOW = datetime(2026, 3, 1, 14, 5, 0, tzinfo=UTC)


def busy_agent(node: str, namespaces: int, containers: int) -> api_pb2.Agent:
    """An agent on a machine with `namespaces` network namespaces, `containers` of them a container's."""
    registration = agent_pb2.Register(node=node, kernel_release="6.1.0-50-amd64", agent_version="0.1.0")
    for index in range(namespaces):
        namespace = registration.namespaces.add(name=f"cni-1f2e3d4c-5b6a-7988-{index:04d}-0123456789ab")
        if index < containers:
            namespace.workloads.append(
                trace_pb2.Workload(container_name=f"shop-frontend-{index}", pod_namespace="shop",
                                   pod_name=f"frontend-7d9c-{index}")
            )  # fmt: skip
    registration.capabilities.attach["kprobe"].supported = False
    agent = api_pb2.Agent(registration=registration, connected=True)
    agent.last_heartbeat.FromDatetime(datetime(2026, 3, 1, 14, 4, 57))
    agent.clock.measured = True
    agent.clock.offset_ns, agent.clock.bound_ns = -231, 85
    agent.clock.measured_at.FromDatetime(datetime(2026, 3, 1, 14, 4, 58))
    agent.transport.kind, agent.transport.connected = "grpc", True
    agent.transport.dropped_records = 12
    return agent


def test_many_namespaces_and_containers_fit_100_columns() -> None:
    agents = [busy_agent("worker-node-a", 40, 30), busy_agent("host-b", 3, 1)]
    lines = summary_table(agents, NOW).splitlines()
    assert max(len(line) for line in lines) <= WIDTH, "\n".join(lines)
    header, busy, quiet, busy_containers, quiet_containers = lines
    assert header.split() == ["NODE", "CONNECTED", "KERNEL", "CLOCK", "TRANSPORT", "NETNS", "CONTAINERS"]
    assert busy.split("  ")[0] == "worker-node-a"
    for cell in ("yes, 3s ago", "6.1.0-50-amd64", "-231ns ±85ns", "grpc up, 12 dropped"):
        assert cell in busy, (cell, busy)
    assert busy.split()[-2:] == ["40", "30"] and quiet.split()[-2:] == ["3", "1"], (busy, quiet)
    assert busy_containers.startswith("worker-node-a containers: shop-frontend-0[pod shop/frontend-7d9c-0], ")
    assert busy_containers.endswith(" more (--wide)"), busy_containers
    assert quiet_containers == "host-b containers: shop-frontend-0[pod shop/frontend-7d9c-0]"

    wide = table([WIDE_HEADER, *(agent_row(agent) for agent in agents)])
    assert "shop-frontend-29[pod shop/frontend-7d9c-29]" in wide and "cni-1f2e3d4c-5b6a-7988-0039" in wide
    assert "kprobe" in wide
