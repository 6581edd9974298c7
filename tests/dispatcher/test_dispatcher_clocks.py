"""Each node's clock status travels one path: the collector writes `node_clock` to InfluxDB, the dispatcher
reads it (hoptrace.results.store.node_clocks) into ListAgents, and `hoptrace agents` and `hoptrace
version` print what the API says. Real InfluxDB, a real dispatcher, fake agents (dispatcher_fakes), the CLI
as a subprocess."""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from dispatcher_fakes import FakeAgent
from test_dispatcher_server import _hoptrace

from hoptrace.collector.clock import NodeClockPoint
from hoptrace.collector.influx import InfluxConfig, InfluxExporter
from hoptrace.collector.points import window_points
from hoptrace.common.version import API_VERSION, package_version
from hoptrace.dispatcher.reports import influx_clock_provider
from hoptrace.dispatcher.server import DispatcherServer
from hoptrace.lab.processes import InfluxServer
from hoptrace.v1 import api_pb2, api_pb2_grpc


@pytest.fixture
def nodes() -> tuple[str, str]:
    """Node names of this test only: `node_clock` is not per trace, and influxd is shared by the session."""
    tag = secrets.token_hex(3)
    return f"clk-{tag}-a", f"clk-{tag}-b"


def write_clocks(influxd: InfluxServer, points: list[NodeClockPoint]) -> None:
    """Write `node_clock` points the way the collector does (its exporter)."""
    exporter = InfluxExporter(
        InfluxConfig(url=influxd.url, bucket=influxd.bucket, org=influxd.org, token=influxd.token)
    )
    try:
        exporter.export(window_points(clocks=points))
        assert exporter.flush(timeout_s=30), "node_clock points not written"
    finally:
        exporter.close()


@pytest.fixture
def measured_at(influxd: InfluxServer, nodes: tuple[str, str]) -> int:
    """The first node's clock estimates in InfluxDB, an older one and the newest (returns its time, unix ns);
    the second node has none."""
    now = time.time_ns()
    write_clocks(
        influxd,
        [
            NodeClockPoint(nodes[0], now - 5_000_000_000, 900, 400, 250, 0.5),
            NodeClockPoint(nodes[0], now, -231, 150, 85, 1.5),
        ],
    )
    return now


@pytest.fixture
def dispatcher(
    tmp_path: Path, influxd: InfluxServer, nodes: tuple[str, str], measured_at: int
) -> Iterator[DispatcherServer]:
    """A dispatcher reading clocks from the session's InfluxDB (written before it starts), with both nodes'
    fake agents connected."""
    server = DispatcherServer(
        "127.0.0.1:0",
        tmp_path / "state",
        clock_provider=influx_clock_provider(influxd.url, influxd.bucket, influxd.org, influxd.token),
    ).start()
    agents = [FakeAgent(server.address, node).start() for node in nodes]
    try:
        channel = grpc.insecure_channel(server.address)
        api = api_pb2_grpc.HoptraceStub(channel)
        deadline = time.monotonic() + 10
        while {
            a.registration.node
            for a in api.ListAgents(api_pb2.ListAgentsRequest(), timeout=5).agents
            if a.connected
        } != set(nodes):
            assert time.monotonic() < deadline, "fake agents did not connect"
            time.sleep(0.05)
        channel.close()
        yield server
    finally:
        for agent in agents:
            agent.stop()
        server.stop(grace=0)


def test_agents_show_the_collectors_clock_or_unknown(
    dispatcher: DispatcherServer, nodes: tuple[str, str], measured_at: int
) -> None:
    measured, unmeasured = nodes  # the newest of two estimates is shown; the other node has none: unknown
    result = _hoptrace(dispatcher.address, "agents", "--json")
    assert result.returncode == 0, result.stderr
    clocks = {agent["node"]: agent["clock"] for agent in json.loads(result.stdout)}
    assert clocks[measured] == {
        "measured": True,
        "offset_ns": -231,
        "bound_ns": 85,
        "drift_ppm": 1.5,
        "delay_ns": 150,
        "measured_at": clocks[measured]["measured_at"],
        "last_jump": None,
    }
    assert abs(_epoch(clocks[measured]["measured_at"]) - measured_at / 1e9) < 1.5
    assert clocks[unmeasured] == {
        "measured": False,
        "offset_ns": None,
        "bound_ns": None,
        "drift_ppm": None,
        "delay_ns": None,
        "measured_at": None,
        "last_jump": None,
    }

    table = _hoptrace(dispatcher.address, "agents", "--wide")  # the clock's columns in full
    assert table.returncode == 0, table.stderr
    header, *rows = table.stdout.splitlines()
    assert "CLOCK OFFSET" in header and "BOUND" in header and "DRIFT" in header and "CLOCK MEASURED" in header
    row = {line.split()[0]: line for line in rows}
    assert "-231ns" in row[measured] and "±85ns" in row[measured] and "1.50 ppm" in row[measured]
    assert " s ago)" in row[measured]
    assert "unknown" in row[unmeasured] and "0ns" not in row[unmeasured] and "±" not in row[unmeasured]


def test_clocks_read_unknown_when_the_store_is_down(tmp_path: Path, nodes: tuple[str, str]) -> None:
    """No InfluxDB: the agents are still listed, every clock unknown, and no traceback reaches the user."""
    server = DispatcherServer(
        "127.0.0.1:0", tmp_path / "state", clock_provider=influx_clock_provider("http://127.0.0.1:9", "x/y")
    ).start()
    agent = FakeAgent(server.address, nodes[0]).start()
    try:
        deadline = time.monotonic() + 10
        while True:
            result = _hoptrace(server.address, "agents", "--json")
            assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
            listed = json.loads(result.stdout)
            if listed or time.monotonic() > deadline:
                break
        assert [(a["node"], a["clock"]["measured"]) for a in listed] == [(nodes[0], False)]
    finally:
        agent.stop()
        server.stop(grace=0)


def test_version_names_client_dispatcher_and_agents(
    dispatcher: DispatcherServer, nodes: tuple[str, str]
) -> None:
    result = _hoptrace(dispatcher.address, "version", "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert (data["hoptrace"], data["api"]) == (
        package_version(),
        API_VERSION,
    ) and API_VERSION == "hoptrace.v1"
    assert data["dispatcher"] == {
        "address": dispatcher.address,
        "version": package_version(),
        "api": API_VERSION,
        "error": None,
    }
    assert data["agents"] == {nodes[0]: "test", nodes[1]: "test"}  # dispatcher_fakes' agent_version
    text = _hoptrace(dispatcher.address, "version")
    assert text.stdout.splitlines() == [
        f"hoptrace {package_version()} (API hoptrace.v1)",
        f"dispatcher {dispatcher.address}: hoptrace {package_version()} (API hoptrace.v1)",
        f"agent {nodes[0]}: test",
        f"agent {nodes[1]}: test",
    ]
    # no dispatcher: the local part, and why the rest is missing; exit 0, no traceback
    alone = _hoptrace("127.0.0.1:9", "version")
    assert alone.returncode == 0 and "Traceback" not in alone.stderr
    assert alone.stdout.splitlines()[0] == f"hoptrace {package_version()} (API hoptrace.v1)"
    assert alone.stdout.splitlines()[1].startswith("dispatcher 127.0.0.1:9: not reached: cannot reach")


def _epoch(iso: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(iso).timestamp()
