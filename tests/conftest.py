"""Fixtures of every test tier: root check, namespace topologies, InfluxDB, the standalone agent."""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from guest_runs import GUESTS_AT_ONCE, GuestRuns, run_of

from hoptrace.lab.processes import AGENT_BINARY, AgentProcess, InfluxServer, start_influxd
from hoptrace.lab.routed import RoutedTopology
from hoptrace.lab.topology import TwoHostTopology, netns_list

TESTS_DIR = Path(__file__).resolve().parent

# Prefixes handed out in this session, to prove at the end that none of their namespaces is left.
_PREFIXES: set[str] = set()

# Tiers (markers registered in pyproject.toml, make targets in the Makefile: docs/testing.md). Every test
# has exactly one of `unit` (pure code, runs anywhere, unprivileged; a module's own marker) and `root`
# (namespaces, BPF, servers: every other test), plus what else it needs: `kernel` (loads BPF into this
# machine's kernel), `vm` (qemu guests), `browser` (Chromium), `docker` (the Docker engine), `kafka` (a Kafka
# broker), `slow` (minutes). Those follow from the test's folder under tests/ and the fixtures it uses; a
# module marks what neither says. A unit test that uses a fixture needing root contradicts itself.
FOLDER_TIERS: dict[str, tuple[str, ...]] = {
    "e2e": ("kernel",),
    "faults": ("kernel",),
    "kafka": ("kernel", "kafka"),
    "k8s": ("k8s", "slow"),
    "kernels": ("vm", "slow"),
    "presets": ("kernel",),
    "security": ("kernel",),
    "system": ("kernel",),
    "vms": ("vm", "slow"),
}
FIXTURE_TIERS: dict[str, tuple[str, ...]] = {
    "agent_binary": ("root", "kernel"),
    "browser": ("browser",),
    "influxd": ("root",),
    "kafka_broker": ("kafka",),
    "restartable_influxd": ("root",),
    "three_host_topology": ("root",),
    "topology_factory": ("root",),
}
TIERS = ("unit", "root", "kernel", "vm", "browser", "docker", "kafka", "slow")
# Marks a test whose tiers contradict each other.
NO_TIER = "no_tier"
# A file to which collection writes every test's tiers (JSON), for tests/test_tiers.py.
LIST_TIERS = "HOPTRACE_LIST_TIERS"


def tiers_of(item: pytest.Item) -> set[str]:
    """The tiers of a test: its own markers, its fixtures' and, unless it is unit, root and its folder's."""
    tiers = {mark.name for mark in item.iter_markers() if mark.name in TIERS}
    fixtures = set(getattr(item, "fixturenames", ()))
    tiers.update(tier for name in fixtures & FIXTURE_TIERS.keys() for tier in FIXTURE_TIERS[name])
    if "unit" not in tiers:
        tiers.add("root")
        tiers.update(FOLDER_TIERS.get(Path(item.path).relative_to(TESTS_DIR).parts[0], ()))
    return tiers


def run_order(item: pytest.Item) -> int:
    """Where a test runs in the session: the host's own tests first, beside the guest runs started in the
    background (tests/guest_runs.py); then the tests checking those runs; then the tests that boot guests of
    their own (`vm`), on a machine no background guest uses any more."""
    if run_of(item) is not None:
        return 1
    return 2 if item.get_closest_marker("vm") is not None else 0


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Gives each test its tiers' markers (`-m kernel` selects by them); a unit test that needs root gets
    `no_tier` too, and fails when run. Orders the tests by run_order, each group as collected."""
    listed = {}
    for item in items:
        tiers = tiers_of(item)
        if len(tiers & {"unit", "root"}) != 1:
            item.add_marker(NO_TIER)
        for tier in sorted(tiers):
            item.add_marker(tier)
        listed[item.nodeid] = sorted(tiers)
    if os.environ.get(LIST_TIERS):
        Path(os.environ[LIST_TIERS]).write_text(json.dumps(listed, indent=0))
    items.sort(key=run_order)


def pytest_runtest_setup(item: pytest.Item) -> None:
    """A test whose tiers contradict each other fails before it runs."""
    if item.get_closest_marker(NO_TIER) is not None:
        pytest.fail(
            f"{item.nodeid} is marked unit but uses a fixture that needs root ({sorted(tiers_of(item))}): "
            "drop its unit marker, or the fixture",
            pytrace=False,
        )


@pytest.fixture(autouse=True)
def require_root(request: pytest.FixtureRequest) -> None:
    """The tests build namespaces and load BPF programs: they need root, and fail (never skip) without it.
    Only the unit tier (marker `unit`: pure code, `make test-unit`) runs anywhere."""
    if request.node.get_closest_marker("unit") is None and os.geteuid() != 0:
        pytest.fail(
            "hoptrace tests must run as root (namespaces, BPF): run `sudo make test` "
            "or `sudo .venv/bin/python -m pytest tests`",
            pytrace=False,
        )


@pytest.fixture(scope="session", autouse=True)
def guest_runs(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GuestRuns | None]:
    """The guest runs the session's selected tests check, started with its first test: one at a time while
    tests of the host's own run beside them, as many as GUESTS_AT_ONCE when nothing else runs."""
    items = request.session.items
    runs = dict(found for item in items if (found := run_of(item)) is not None)
    if not runs:
        yield None
        return
    beside_host_tests = any(run_order(item) == 0 for item in items)
    pool = GuestRuns(runs, tmp_path_factory, at_once=1 if beside_host_tests else GUESTS_AT_ONCE)
    try:
        yield pool
    finally:
        pool.close()


@pytest.fixture(scope="session", autouse=True)
def no_leftover_namespaces() -> Iterator[None]:
    """After the session, no namespace created by a test of this session may remain."""
    yield
    leftovers = [name for name in netns_list() if name.split("-", 1)[0] in _PREFIXES]
    assert not leftovers, f"namespaces left behind: {leftovers}"


def unique_prefix() -> str:
    """A namespace prefix ("ht" + 4 hex digits) unused by any namespace now present."""
    existing = {name.split("-", 1)[0] for name in netns_list()}
    while True:
        prefix = "ht" + secrets.token_hex(2)
        if prefix not in existing and prefix not in _PREFIXES:
            _PREFIXES.add(prefix)
            return prefix


@pytest.fixture
def topology_factory() -> Iterator[Callable[..., TwoHostTopology]]:
    """``make(overlay="vxlan", **options)``: create a TwoHostTopology with a fresh prefix; all are destroyed
    after the test, whatever happened."""
    made: list[TwoHostTopology] = []

    def make(overlay: str = "vxlan", **options: Any) -> TwoHostTopology:
        topo = TwoHostTopology(unique_prefix(), overlay, **options)  # type: ignore[arg-type]
        made.append(topo)
        return topo.create()

    try:
        yield make
    finally:
        for topo in made:
            topo.destroy()


@pytest.fixture
def topology(topology_factory: Callable[..., TwoHostTopology]) -> TwoHostTopology:
    """Two hosts and two containers, container traffic in VXLAN over the wire."""
    return topology_factory("vxlan")


@pytest.fixture
def routed_topology(topology_factory: Callable[..., TwoHostTopology]) -> TwoHostTopology:
    """Two hosts and two containers, container traffic routed on the wire (no overlay)."""
    return topology_factory("routed")


@pytest.fixture
def three_host_topology() -> Iterator[RoutedTopology]:
    """host-a (c1) -- two equal-cost wires -- host-r (router) -- host-b (c2): lab/routed.py; destroyed after
    the test, whatever happened."""
    with RoutedTopology(unique_prefix()) as topo:
        yield topo


@pytest.fixture(scope="session")
def influxd() -> Iterator[InfluxServer]:
    """An InfluxDB 1.8 server for the session (database "hoptrace"; bucket "hoptrace/autogen", token "",
    org "-"); stopped and removed at the end."""
    try:
        server = start_influxd()
    except RuntimeError as exc:
        pytest.fail(str(exc), pytrace=False)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def agent_binary() -> Path:
    """The built standalone agent; a missing binary is a failure telling how to build it."""
    if not AGENT_BINARY.exists():
        pytest.fail(f"{AGENT_BINARY} is missing: run `make agent`", pytrace=False)
    return AGENT_BINARY


@pytest.fixture
def agent_factory(agent_binary: Path) -> Iterator[Callable[..., AgentProcess]]:
    """``start(plan, node, netns=None, extra_args=())``: a started AgentProcess; all are stopped (SIGINT) and
    cleaned up after the test. Call ``agent.stop()`` yourself to assert a clean exit."""
    agents: list[AgentProcess] = []

    def start(
        plan: Any, node: str, netns: str | None = None, extra_args: tuple[str, ...] = ()
    ) -> AgentProcess:
        agent = AgentProcess(agent_binary, plan, node, netns, extra_args)
        agents.append(agent)
        return agent.start()

    try:
        yield start
    finally:
        for agent in agents:
            agent.cleanup()


@pytest.fixture
def restartable_influxd() -> Iterator[InfluxServer]:
    """A function-scoped influxd the test may `stop_process()` and `restart()`; removed afterwards."""
    try:
        server = start_influxd()
    except RuntimeError as exc:
        pytest.fail(str(exc), pytrace=False)
    try:
        yield server
    finally:
        server.stop()
