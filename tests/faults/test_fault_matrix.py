"""Faults as a matrix: every component killed, stopped or cut off during a traced flow, measured.

One cluster (tests/faults/faults_helpers.py: dispatcher, collector, an agent per emulated host, an InfluxDB
of its own) serves every cell in turn; each cell has a trace and a flow of its own (200 datagrams/s c1 -> c2
on a port of its own), faults one component while the flow runs, and checks what a user would: every
datagram sent reached c2 (the nftables counter), the report accounts for every one of them (complete, or
counted where it went missing: loss, tracer loss, before attach) or says where the rest went, no packet is
in InfluxDB twice, and how long after the fault's end the report was whole. docs/reliability.md shows the
table these cells print at the end of the run (tests/faults/conftest.py).
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from faults_helpers import (
    COLLECTOR_ARGS,
    CellResult,
    FaultLab,
    Flow,
    MemoryCgroup,
    copy_agent,
    held_links,
    hoptrace_console_script,
    metric_sum,
    proc_status,
    stop_for,
)
from google.protobuf import json_format

from hoptrace.lab import localcluster
from hoptrace.lab.processes import start_influxd
from hoptrace.lab.reference import vxlan_path_spec
from hoptrace.lab.waiting import wait_until
from hoptrace.v1 import api_pb2

OUTAGE_S = 3.0  # every outage: SIGSTOP held, a cut rule in place, a killed component down
PATHS_LATE_S = 2.0  # a restarted collector's trace paths this long after the agents' backlog
BEFORE_S = 0.5  # traffic before each fault
AGENT_MEMORY = 64 << 20  # the memory cgroup's limit for the agent cell that runs in one


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory):
    """The matrix's cluster, with an InfluxDB of its own (its cells stop it)."""
    try:
        influx = start_influxd()
    except RuntimeError as exc:
        pytest.fail(str(exc), pytrace=False)
    try:
        with FaultLab.running(influx, tmp_path_factory.mktemp("faults")) as running:
            yield running
    finally:
        influx.stop()


# ---- the cells ---------------------------------------------------------------------------------------------


def control(lab: FaultLab) -> CellResult:
    """No fault: the reference for the others' time to whole (the join window and the windows' close)."""
    flow = Flow.start(lab, "control")
    time.sleep(1.0)  # traffic (pacing)
    flow.fault_over()
    flow.finish()
    return flow.result("none", "no fault (reference)", 0)


def agent_sigstop(lab: FaultLab) -> CellResult:
    """host-b's agent frozen: its hops keep writing the ring buffer, which it drains when it runs again."""
    flow = Flow.start(lab, "agent-stop")
    time.sleep(BEFORE_S)  # traffic before the fault (pacing)
    stop_for(lab.agent("host-b").process.pid, OUTAGE_S)
    flow.fault_over()
    flow.finish()
    lost = metric_sum(lab.agent_metrics("host-b"), "hoptrace_agent_records_dropped_total")
    return flow.result("agent", "SIGSTOP, SIGCONT", OUTAGE_S, f"agent's records dropped: {lost:.0f}")


def agent_cut(lab: FaultLab) -> CellResult:
    """host-a's agent's traffic to the collector dropped (records and clock rounds): its queue holds the
    records until TCP's retransmission gets through."""
    flow = Flow.start(lab, "agent-cut")
    time.sleep(BEFORE_S)  # traffic before the fault (pacing)
    with lab.cut("host-a"):
        time.sleep(OUTAGE_S)  # the outage (the thing tested)
        dropped = lab.cut_packets()
    flow.fault_over()
    flow.finish()
    assert dropped > 0, "the cut dropped nothing: the rule did not match the agent's connection"
    return flow.result(
        "agent", "connection to the collector cut (nftables)", OUTAGE_S, f"{dropped} segments dropped"
    )


def traced_again(lab: FaultLab, flow: Flow, node: str) -> str:
    """After `node`'s agent's restart: wait until it holds every hop of its node (it takes the pinned ones
    over at its start), send 1 s more, and check that those packets are complete (the trace goes on by
    itself). Says how long that took."""
    agent = lab.agent(node).process.pid
    # the agent's own links (the dispatcher's status of the node may still be its predecessor's)
    wait_until(lambda: held_links(agent) >= 4, f"{node}'s 4 hops held by the new agent", 30, 0.1)
    attached = time.monotonic() - flow.fault_ended
    assert flow.sender is not None
    after = flow.sender.sent
    flow.finish(after_s=attached + 1.0)
    resumed = flow.sender.sent - after
    assert flow.last_report.get("complete", 0) >= resumed > 0, (resumed, flow.last_report.get("complete"))
    return f"taken over {attached:.1f} s after the restart"


def without_gap(lab: FaultLab, flow: Flow, result: CellResult) -> CellResult:
    """An agent's restart left no gap: every packet sent is complete (none before attach, none lost), and
    each segment has an exemplar of every packet under an ID of its own (the ID sequence went on)."""
    assert result.complete == result.sent and not any(result.counted.values()), f"a gap: {result}"
    ids = lab.packet_ids(flow.name)
    assert ids and all(n == result.sent for n in ids.values()), f"packet IDs per segment {ids}: {result}"
    return result


def agent_sigkill(lab: FaultLab) -> CellResult:
    """host-a's agent killed, the one whose first hop gives each packet its ID: its hops, pinned in bpffs,
    go on recording into the pinned ring buffer while no agent runs; restarted, it takes them over (and the
    pinned ID sequence) and reads on from the first record its predecessor had not sent."""
    flow = Flow.start(lab, "agent-kill")
    time.sleep(BEFORE_S)  # traffic before the fault (pacing)
    lab.agent("host-a").stop(signal.SIGKILL)
    time.sleep(OUTAGE_S)  # the outage (the thing tested)
    lab.start_agent("host-a")
    flow.fault_over()
    resumed = traced_again(lab, flow, "host-a")
    return without_gap(lab, flow, flow.result("agent", "SIGKILL, restart", OUTAGE_S, resumed))


def agent_upgrade_in_memory_cgroup(lab: FaultLab) -> CellResult:
    """host-b's agent stopped (SIGTERM, --keep-on-exit) and started from a copy of its binary at another path
    (an upgrade), in a memory cgroup of 64 MiB: it takes the pinned trace over without a gap, runs and
    traces; what it holds is reported. It stays there for the cells after it (one restart for both: the
    tier's time)."""
    binary = copy_agent(lab.workdir)
    group = MemoryCgroup.create(f"{lab.prefix}-agent-memory", AGENT_MEMORY)
    lab.memory_groups.append(group)
    flow = Flow.start(lab, "agent-upgrade")
    time.sleep(BEFORE_S)  # traffic before the fault (pacing)
    started = time.monotonic()
    lab.agent("host-b").stop(signal.SIGTERM)
    agent = lab.start_agent("host-b", binary=binary, memory=group)
    flow.fault_over()
    outage = time.monotonic() - started
    exe = Path(f"/proc/{agent.process.pid}/exe")
    wait_until(lambda: exe.resolve() == binary, f"{exe} -> {binary} (setpriv, then the script exec it)", 10)
    resumed = traced_again(lab, flow, "host-b")
    usage, status = group.usage(), proc_status(agent.process.pid)
    assert usage["oom_kills"] == 0 and agent.process.poll() is None, usage
    note = (
        f"cgroup v{group.version} limit 64 MiB: peak {usage['peak'] / 2**20:.1f} MiB charged (the maps taken "
        f"over stay charged where they were made), RSS {status['VmRSS'] / 2**20:.1f} MiB "
        f"(peak {status['VmHWM'] / 2**20:.1f})"
    )
    result = flow.result(
        "agent", "SIGTERM, start from a new path in a 64 MiB memory cgroup", outage, f"{resumed}; {note}"
    )
    return without_gap(lab, flow, result)


def late_records(lab: FaultLab) -> str:
    """What the (restarted) collector left out as before its written-before mark, from its /metrics."""
    late = metric_sum(lab.collector_metrics(), "hoptrace_collector_dropped_total", reason="late_record")
    return f"late_record: {late:.0f} records"


def collector_sigstop(lab: FaultLab) -> CellResult:
    """The collector frozen: the agents' streams stall and their queues hold the records."""
    flow = Flow.start(lab, "collector-stop")
    time.sleep(BEFORE_S)  # traffic before the fault (pacing)
    stop_for(lab.cluster.components["collector"].process.pid, OUTAGE_S)
    flow.fault_over()
    flow.finish()
    return flow.result("collector", "SIGSTOP, SIGCONT", OUTAGE_S)


def collector_sigkill(lab: FaultLab) -> CellResult:
    """The collector killed and restarted: the agents resend what was in flight, the restarted collector
    leaves out what it had written (its mark beside the spool) and writes the rest once. It restarts while
    the dispatcher does not answer (stopped), so the agents' backlog comes before the trace paths: the join
    holds it until they come (a restart's race, made certain here)."""
    flow = Flow.start(lab, "collector-kill")
    time.sleep(BEFORE_S)  # traffic before the fault (pacing)
    lab.cluster.components["collector"].stop(signal.SIGKILL)
    time.sleep(OUTAGE_S)  # the outage (the thing tested)
    dispatcher = lab.cluster.components["dispatcher"].process.pid
    os.kill(dispatcher, signal.SIGSTOP)
    try:
        lab.cluster.start_collector(*COLLECTOR_ARGS)
        wait_until(
            lambda: all(lab.collector_received(node) for node in ("host-a", "host-b")),
            "both agents' backlog at the restarted collector",
            30,
            0.1,
        )
        # the backlog waits without its paths for longer than the join window (1 s): a join that did not
        # hold it would have emitted it without them by now
        time.sleep(PATHS_LATE_S)
        assert lab.collector_metrics()["hoptrace_collector_join_pending_packets"] > 0
    finally:
        os.kill(dispatcher, signal.SIGCONT)
    flow.fault_over()
    flow.finish()
    return flow.result(
        "collector",
        f"SIGKILL, restart; trace paths {PATHS_LATE_S:.0f} s after the backlog",
        OUTAGE_S,
        late_records(lab),
    )


def collector_new_entry_point(lab: FaultLab) -> CellResult:
    """The collector stopped (SIGTERM) and started through the `hoptrace` console script instead of
    `python -m hoptrace.cli.main`: an upgrade of the Python package. The agents stream on, so the stop writes
    the windows its watermark closed and marks them; the agents send the rest again to the next one, which
    writes it once."""
    flow = Flow.start(lab, "collector-upgrade")
    time.sleep(BEFORE_S)  # traffic before the fault (pacing)
    started = time.monotonic()
    lab.cluster.components["collector"].stop(signal.SIGTERM)
    entry, localcluster.HOPTRACE = localcluster.HOPTRACE, hoptrace_console_script()
    try:
        lab.cluster.start_collector(*COLLECTOR_ARGS)
    finally:
        localcluster.HOPTRACE = entry
    lab.cluster.wait_listening(addrs=[lab.cluster.collector_addr])
    flow.fault_over()
    outage = time.monotonic() - started
    flow.finish()
    return flow.result("collector", "SIGTERM, start from another entry point", outage, late_records(lab))


def dispatcher_sigkill(lab: FaultLab) -> CellResult:
    """The dispatcher killed during the flow: the trace keeps running on the agents; an apply meanwhile
    fails saying what to do; restarted from its state directory, it lists the trace again."""
    flow = Flow.start(lab, "dispatcher-kill")
    time.sleep(BEFORE_S)  # traffic before the fault (pacing)
    lab.cluster.components["dispatcher"].stop(signal.SIGKILL)
    spec = lab.workdir / "while-down.json"
    spec.write_text(
        json.dumps(
            json_format.MessageToDict(
                vxlan_path_spec(lab.topo, "fault-while-down"), preserving_proto_field_name=True
            )
        )
    )
    refused = lab.cluster.hoptrace("trace", "apply", "-f", str(spec), check=False)
    time.sleep(max(0.0, OUTAGE_S - 1))  # the rest of the outage (the thing tested)
    lab.restart_dispatcher()
    flow.fault_over()
    lab.cluster.wait_agents(["host-a", "host-b"])
    flow.finish()
    assert refused.returncode == 1, refused
    error = refused.stderr.strip()
    assert (
        len(error.splitlines()) == 1
        and f"cannot reach the dispatcher at {lab.cluster.dispatcher_addr}" in error
    )
    assert "hoptrace dispatcher" in error and "--dispatcher" in error, f"says nothing of what to do: {error}"
    listed = [
        t.spec.name for t in lab.cluster.api().ListTraces(api_pb2.ListTracesRequest(), timeout=10).traces
    ]
    assert flow.name in listed and "fault-while-down" not in listed, listed
    return flow.result(
        "dispatcher", "SIGKILL, apply while down, restart", OUTAGE_S, "apply while down: exit 1"
    )


def influx_sigstop(lab: FaultLab) -> CellResult:
    """InfluxDB hung (SIGSTOP): the collector's write waits (its timeout, 10 s, is longer than the hang)
    and the export queue holds the points; written once InfluxDB answers, each once."""
    flow = Flow.start(lab, "influx-stop")
    time.sleep(BEFORE_S)  # traffic before the fault (pacing)
    assert lab.influx.process is not None
    stop_for(lab.influx.process.pid, OUTAGE_S)
    flow.fault_over()
    flow.finish()
    return flow.result("InfluxDB", "SIGSTOP, SIGCONT", OUTAGE_S)


def spool_disk_full(lab: FaultLab) -> CellResult:
    """InfluxDB stopped while the collector's spool directory is a 1 MiB tmpfs: the spool fills the disk;
    what it cannot hold is dropped and counted (spool_error), and the spool is replayed once InfluxDB is
    back. The disk is empty again afterwards."""
    spool = lab.workdir / "spool-tmpfs"
    spool.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "hoptrace-spool", str(spool)], check=True)
    try:
        # (SIGKILL: the graceful stop's 5 s grace is not what this cell measures)
        lab.cluster.components["collector"].stop(signal.SIGKILL)
        lab.cluster.start_collector(*COLLECTOR_ARGS, "--spool-dir", str(spool))
        lab.cluster.wait_listening(addrs=[lab.cluster.collector_addr])
        flow = Flow.start(lab, "spool-full")
        time.sleep(BEFORE_S)  # traffic before the fault (pacing)
        started = time.monotonic()
        lab.influx.stop_process()

        def spool_error() -> float:
            return metric_sum(
                lab.collector_metrics(), "hoptrace_collector_dropped_total", reason="spool_error"
            )

        wait_until(spool_error, "the spool's disk full", 30, 0.2)
        values = lab.collector_metrics()
        spooled = metric_sum(values, "hoptrace_collector_spool_points")
        held = (
            f"{metric_sum(values, 'hoptrace_collector_spool_bytes') / spooled:.0f} B a point spooled"
            if spooled
            else "no batch fitted"
        )
        lab.influx.restart()
        flow.fault_over()
        outage = time.monotonic() - started
        flow.finish()
        dropped = spool_error()
        log = lab.cluster.components["collector"].log_tail(400)
        assert "spool: cannot write" in log, log
        # what is left: the written-before mark, no batch (replayed) and no part of one (the full disk's)
        wait_until(
            lambda: [p.name for p in spool.iterdir()] == ["written-before-ns"],
            f"the spool's disk empty after the replay ({sorted(p.name for p in spool.iterdir())})",
            20,
            0.2,
        )
        result = flow.result(
            "collector spool",
            "disk full while InfluxDB is stopped",
            outage,
            f"spool_error: {dropped:.0f} points; {held}",
        )
        assert result.unaccounted > 0 and dropped > 0  # the cell did fill the disk
        return result
    finally:
        # the cells after this one get InfluxDB and a collector on its usual spool again
        if lab.influx.process is not None and lab.influx.process.poll() is not None:
            lab.influx.restart()
        lab.cluster.components["collector"].stop(signal.SIGKILL)
        lab.cluster.start_collector(*COLLECTOR_ARGS)
        subprocess.run(["umount", "-l", str(spool)], check=False)


class KnownBug(Exception):
    """A cell showed only what docs/reliability.md lists as a known bug of that cell (its xfail)."""


# What a cell can show that is wrong: each check of test_fault names one.
DUPLICATES = "duplicates"  # a packet's exemplar in InfluxDB twice
PHANTOM_LOSS = "phantom loss"  # the report counts as loss packets the network delivered
UNACCOUNTED = "unaccounted"  # packets neither complete nor counted anywhere in the report
INCOMPLETE = "incomplete"  # a cell whose buffers hold everything: packets not complete (counted or not)


@dataclass
class Cell:
    """A fault; whether it loses packets by design (counted elsewhere); whether every packet sent must be
    complete (no buffer ran out and no hop was detached); the known bugs it shows, each listed with its
    cause in docs/reliability.md (an xfail: the cell fails on anything else)."""

    run: Callable[[FaultLab], CellResult]
    loses: bool = False
    whole: bool = True
    known: tuple[str, ...] = ()
    why: str = ""

    def __str__(self) -> str:
        return self.run.__name__.replace("_", "-")

    def param(self) -> object:
        """The cell as a test parameter, with its known bugs as a non-strict xfail (some show at times)."""
        marks = [pytest.mark.xfail(raises=KnownBug, strict=False, reason=self.why)] if self.known else []
        return pytest.param(self, id=str(self), marks=marks)


CELLS = [
    Cell(control),
    Cell(agent_sigstop),
    Cell(agent_cut),
    Cell(agent_sigkill),
    Cell(agent_upgrade_in_memory_cgroup),
    Cell(collector_sigstop),
    Cell(collector_sigkill),
    Cell(collector_new_entry_point),
    Cell(dispatcher_sigkill),
    Cell(influx_sigstop),
    Cell(spool_disk_full, loses=True, whole=False),
]


@pytest.mark.parametrize("cell", [cell.param() for cell in CELLS])
def test_fault(lab: FaultLab, cell: Cell) -> None:
    """The cell's fault during its flow: c2 got every datagram; the report accounts for each, counting loss
    only where the network lost them (or, where the cell loses some by design, the counters say so), and
    shows every one complete where the buffers hold them all; nothing in InfluxDB twice; the report whole
    again."""
    lab.cluster.check_running()
    lab.cluster.wait_agents(["host-a", "host-b"])
    try:
        result = cell.run(lab)
    finally:
        lab.delete_traces()
    print(result.row())
    assert result.delivered == result.sent, f"the network lost datagrams: {result}"
    assert result.complete <= result.sent, f"more complete packets than sent: {result}"
    wrong = {
        DUPLICATES: result.duplicates > 0,
        PHANTOM_LOSS: result.counted["loss_count"] > result.sent - result.delivered,
        UNACCOUNTED: not cell.loses and result.unaccounted != 0,
        INCOMPLETE: cell.whole and result.complete != result.sent,
    }
    unknown = [kind for kind, shown in wrong.items() if shown and kind not in cell.known]
    assert not unknown, f"{', '.join(unknown)}: {result}"
    if not cell.loses and not any(wrong.values()):
        assert not math.isnan(result.time_to_whole_s), f"the report never accounted for the packets: {result}"
    shown = [kind for kind, found in wrong.items() if found]
    if shown:
        raise KnownBug(f"{', '.join(shown)} ({cell.why}): {result}")
