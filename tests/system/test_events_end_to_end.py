"""Event probes end to end (a spec's ``events:``): tracepoints counted in the kernel by the agents, their
counts and histograms through the collector and InfluxDB into `hoptrace report --json`, checked against
the datagrams sent; and bad events refused with the spec field named, nothing left attached.

The datagrams go to a port the trace's filter does not match, so no hop writes an ID into them: every
frame on the wire is the sent payload + 92 bytes (Ethernet, IPv4, UDP, VXLAN, then the inner Ethernet,
IPv4 and UDP headers), and only host-a's wire0 transmits frames of that size (the inner frame, 50 bytes
shorter, crosses c1's eth0, host-a's vxlan0 and host-b's veth-c2). The probes also name the device
(`name == "wire0"`): tracepoints see every netns, and a loopback TCP segment can have any size.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from typing import Any

import grpc
import pytest
from system_helpers import running_cluster

from hoptrace.lab.processes import udp_transfer
from hoptrace.lab.reference import vxlan_path_spec
from hoptrace.spec import spec_from_data
from hoptrace.v1 import trace_pb2

SENT = 150
PAYLOAD = 1001  # odd, so the wire frame (1093 bytes) is unlike anything else on this machine
WIRE_FRAME = PAYLOAD + 92
OTHER_PORT = 5555  # not the trace filter's port: the datagrams stay untagged, their size as sent


def _with_events(spec: trace_pb2.TraceSpec, events: list[dict[str, Any]]) -> trace_pb2.TraceSpec:
    spec.events.extend(spec_from_data({"name": spec.name, "hops": [], "events": events}).events)
    return spec


def _event(data: dict[str, Any], name: str) -> dict[str, Any]:
    found = [e for e in data.get("events", []) if e["name"] == name]
    assert len(found) <= 1, found
    return found[0] if found else {"name": name, "count": 0, "by": {}, "histogram": []}


def _event_programs() -> list[dict[str, Any]]:
    """Loaded event programs (event.bpf.h) on this machine."""
    out = subprocess.run(["bpftool", "-j", "prog", "show"], capture_output=True, text=True, check=True).stdout
    return [p for p in json.loads(out or "[]") if str(p.get("name", "")).startswith("event_tp")]


def test_event_counts_and_histograms_reach_the_report(topology, influxd):
    spec = _with_events(
        vxlan_path_spec(topology, "e2e-events"),
        [
            {
                "name": "wire-frames",
                "node": "host-a",
                "tracepoint": "net:net_dev_xmit",
                "where": f'len == {WIRE_FRAME} and rc == 0 and name == "wire0"',
                "actions": [{"count": {"by": "cpu"}}, {"histogram": "len"}],
            },
            {
                "name": "wire-frames-by-len",
                "node": "host-b",
                "tracepoint": "net:net_dev_xmit",
                "where": [
                    {"arg": "len", "op": "in", "values": [WIRE_FRAME, 7]},
                    {"arg": "name", "op": "!=", "value": "lo"},
                ],
                "actions": [{"count": {"by": "len"}}],
            },
        ],
    )
    # A spec of event probes alone: no path, no records.
    softirqs = spec_from_data(
        {
            "name": "e2e-softirqs",
            "events": [
                {
                    "name": "net-rx",
                    "node": "host-a",
                    "tracepoint": "irq:softirq_entry",
                    "where": "vec == 3",
                    "actions": [{"count": {"by": "cpu"}}],
                }
            ],
        }
    )
    with running_cluster(topology, influxd.url) as cluster:
        cluster.apply(spec)
        cluster.apply(softirqs)
        payloads = [os.urandom(PAYLOAD) for _ in range(SENT)]
        assert udp_transfer(topology, "c1", "c2", payloads, 4, OTHER_PORT, 0.002) == payloads
        # Event results come with the agents' counters (every second): wait until they are all in.
        deadline = time.monotonic() + 40
        data: dict[str, Any] = {}
        while time.monotonic() < deadline:
            cluster.check_running()
            result = cluster.hoptrace("report", "e2e-events", "--since", "30m", "--json", check=False)
            if result.returncode == 0:
                data = json.loads(result.stdout)
                frames, by_len = _event(data, "wire-frames"), _event(data, "wire-frames-by-len")
                if (
                    frames["count"] >= SENT
                    and by_len["count"] >= SENT
                    and sum(b["count"] for b in frames["histogram"]) >= SENT
                ):
                    break
            time.sleep(1)
        text = cluster.hoptrace("report", "e2e-events", "--since", "30m").stdout
        rx_data = json.loads(cluster.hoptrace("report", "e2e-softirqs", "--since", "30m", "--json").stdout)

    frames = _event(data, "wire-frames")
    assert (frames["node"], frames["count"], frames["count_by"]) == ("host-a", SENT, "cpu"), frames
    cpus = os.cpu_count() or 1
    assert all(0 <= int(cpu) < cpus for cpu in frames["by"]) and sum(frames["by"].values()) == SENT, frames
    # One size, one log2 bucket: 1093 is in [1024, 2047].
    assert frames["histogram"] == [{"le": 2047, "count": SENT}], frames
    assert frames["histogram_arg"] == "len"

    by_len = _event(data, "wire-frames-by-len")
    # host-b's agent probes the same kernel (both emulated hosts share it): the same frames, keyed by len.
    assert (by_len["node"], by_len["count"], by_len["by"]) == ("host-b", SENT, {str(WIRE_FRAME): SENT}), (
        by_len
    )
    assert by_len["histogram"] == []

    assert rx_data["segments"] == [] and rx_data["packets"] == 0  # no path: no records
    net_rx = _event(rx_data, "net-rx")
    assert net_rx["count_by"] == "cpu" and net_rx["count"] > 0, net_rx
    assert all(0 <= int(cpu) < cpus for cpu in net_rx["by"]), net_rx
    assert sum(net_rx["by"].values()) == net_rx["count"]

    # The plain report has a readable events section.
    assert f"wire-frames on host-a: count {SENT}; by cpu:" in text, text
    assert f"len (n={SENT}): <=2047 {SENT}" in text, text
    assert f"wire-frames-by-len on host-b: count {SENT}; by len: {WIRE_FRAME}={SENT}" in text, text


@pytest.mark.parametrize(
    ("event", "field", "words"),
    [
        (
            {"tracepoint": "net:no_such_event"},
            "events[0].tracepoint",
            "net:no_such_event: this kernel has no such tracepoint",
        ),
        (
            {"tracepoint": "irq:softirq_entry", "where": "vecc == 3"},
            "events[0].where[0]",
            'no argument "vecc"',
        ),
        (
            {"tracepoint": "net:net_dev_xmit", "where": "len > 0", "actions": [{"count": {"by": "name"}}]},
            "events[0].actions",
            "argument name of net:net_dev_xmit is a string",
        ),
        (
            {"tracepoint": "net:net_dev_xmit", "where": 'len == "wire0"'},
            "events[0].where[0]",
            "argument len of net:net_dev_xmit is an integer (unsigned int), not a string",
        ),
        (
            {"tracepoint": "net:net_dev_xmit", "where": "name == 3"},
            "events[0].where[0]",
            "argument name of net:net_dev_xmit is a string (__data_loc char[] name): compare it with ==",
        ),
    ],
    ids=[
        "unknown-tracepoint",
        "unknown-argument",
        "string-argument",
        "text-for-an-integer",
        "number-for-a-string",
    ],
)
def test_bad_events_are_refused_and_nothing_stays_attached(topology, influxd, event, field, words):
    spec = _with_events(vxlan_path_spec(topology, "bad-events"), [{"name": "bad", "node": "host-b", **event}])
    with running_cluster(topology, influxd.url) as cluster:
        with pytest.raises(grpc.RpcError) as refused:
            cluster.apply(spec)
        message = refused.value.details()
        assert f"event bad on node host-b: {field}: " in message and words in message, message
        # All or nothing: no hop of host-a or host-b, no event probe stays attached, no trace runs.
        assert _event_programs() == []
        # The hops of host-a, attached before host-b refused its event, were rolled back: no trace runs.
        assert "bad-events" not in cluster.hoptrace("trace", "ls").stdout


def test_bad_operator_is_refused_by_the_dispatcher(topology, influxd):
    spec = vxlan_path_spec(topology, "bad-operator")
    spec.events.add(
        name="bad",
        node="host-a",
        tracepoint="irq:softirq_entry",
        where=[trace_pb2.EventTerm(arg="vec", op=42, values=[3])],
    )
    with running_cluster(topology, influxd.url) as cluster:
        with pytest.raises(grpc.RpcError) as refused:
            cluster.apply(spec)
        assert "events[0].where[0]: unknown operator number 42" in refused.value.details()
        assert _event_programs() == []


def test_events_update_and_delete_at_runtime(topology, influxd):
    """A new generation replaces the probe (new where:, counting from zero), and the report sums both
    generations; delete detaches it."""

    def sized(length: int) -> trace_pb2.TraceSpec:
        return spec_from_data(
            {
                "name": "e2e-event-update",
                "events": [
                    {"name": "frames", "node": "host-b", "tracepoint": "net:net_dev_xmit",
                     "where": f'len == {length} and name == "wire0"'},
                ],
            }
        )  # fmt: skip

    first, second = 40, 25
    with running_cluster(topology, influxd.url) as cluster:
        cluster.apply(sized(WIRE_FRAME))
        assert len(_event_programs()) == 1
        payloads = [os.urandom(PAYLOAD) for _ in range(first)]
        assert udp_transfer(topology, "c1", "c2", payloads, 4, OTHER_PORT, 0.002) == payloads
        # Second generation: frames 2 bytes longer; the first generation's probe is detached.
        cluster.apply(sized(WIRE_FRAME + 2))
        assert len(_event_programs()) == 1
        payloads = [os.urandom(PAYLOAD + 2) for _ in range(second)]
        payloads += [os.urandom(PAYLOAD) for _ in range(7)]  # the old size: no longer counted
        assert udp_transfer(topology, "c1", "c2", payloads, 4, OTHER_PORT, 0.002) == payloads
        deadline = time.monotonic() + 30
        frames: dict[str, Any] = {}
        while time.monotonic() < deadline:
            result = cluster.hoptrace("report", "e2e-event-update", "--since", "30m", "--json", check=False)
            if result.returncode == 0:
                frames = _event(json.loads(result.stdout), "frames")
                if frames["count"] >= first + second:
                    break
            time.sleep(1)
        time.sleep(2)  # a late extra count would show now
        frames = _event(
            json.loads(cluster.hoptrace("report", "e2e-event-update", "--since", "30m", "--json").stdout),
            "frames",
        )
        assert (frames["count"], frames["count_by"], frames["by"]) == (first + second, "", {}), frames
        cluster.hoptrace("trace", "rm", "e2e-event-update")
        deadline = time.monotonic() + 10
        while _event_programs() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _event_programs() == []


WRITES = 100  # write(2) calls of 1..WRITES bytes to a file descriptor no other process uses here
WRITE_FD = 777
NAPS = 50  # sleeps of the same task: each ends with a wake-up and a switch to it


def test_event_record_and_wakeup_to_run_latency(topology, influxd):
    """`record: [ARGS]` keeps an argument's count, sum, min, max and last in the kernel: 100 write(2)s of
    1..100 bytes give exactly n=100, sum=5050, min=1, max=100, last=100. `histogram: latency, since:` pairs
    a task's wake-up with its next switch-in by pid: every switch-in of the task lands in the histogram
    or is counted as missed (a preempted task runs again without a wake-up), at least one per sleep."""
    child = subprocess.Popen(
        [
            "python3",
            "-c",
            "import os, sys, time\n"
            f"os.dup2(os.open('/dev/null', os.O_WRONLY), {WRITE_FD})\n"
            "sys.stdin.readline()\n"
            f"for size in range(1, {WRITES + 1}): os.write({WRITE_FD}, b'x' * size)\n"
            f"for _ in range({NAPS}): time.sleep(0.002)\n",
        ],
        stdin=subprocess.PIPE,
        text=True,
    )
    spec = spec_from_data(
        {
            "name": "e2e-event-latency",
            "events": [
                {"name": "writes", "node": "host-a", "tracepoint": "syscalls:sys_enter_write",
                 "where": f"fd == {WRITE_FD}", "actions": ["count", {"record": ["count", "fd"]}]},
                {"name": "wakeup", "node": "host-a", "tracepoint": "sched:sched_wakeup",
                 "where": f"pid == {child.pid}", "key": "pid"},
                {"name": "wakeup-to-run", "node": "host-a", "tracepoint": "sched:sched_switch",
                 "where": f"next_pid == {child.pid}", "key": "next_pid",
                 "actions": ["count", {"histogram": "latency", "since": "wakeup"}]},
            ],
        }
    )  # fmt: skip
    try:
        with running_cluster(topology, influxd.url) as cluster:
            cluster.apply(spec)
            assert child.stdin is not None
            child.stdin.write("go\n")
            child.stdin.flush()
            assert child.wait(timeout=60) == 0
            deadline = time.monotonic() + 40
            data: dict[str, Any] = {}
            while time.monotonic() < deadline:
                cluster.check_running()
                result = cluster.hoptrace("report", spec.name, "--since", "30m", "--json", check=False)
                if result.returncode == 0:
                    data = json.loads(result.stdout)
                    run = _event(data, "wakeup-to-run")
                    latencies = sum(b["count"] for b in run["histogram"])
                    if (
                        _event(data, "writes")["count"] >= WRITES
                        and latencies >= NAPS
                        and latencies + run.get("latency_missed", 0) >= run["count"]
                    ):
                        break
                time.sleep(1)
            text = cluster.hoptrace("report", spec.name, "--since", "30m").stdout
    finally:
        child.kill()
        child.wait()

    writes = _event(data, "writes")
    assert writes["count"] == WRITES, writes
    recorded = {r["arg"]: r for r in writes["recorded"]}
    assert recorded["count"] == {
        "arg": "count", "count": WRITES, "sum": WRITES * (WRITES + 1) / 2, "mean": (WRITES + 1) / 2,
        "min": 1, "max": WRITES, "last": WRITES, "signed": False,
    }, recorded  # fmt: skip
    assert (recorded["fd"]["min"], recorded["fd"]["max"], recorded["fd"]["count"]) == (
        WRITE_FD,
        WRITE_FD,
        WRITES,
    )

    wakeups, run = _event(data, "wakeup"), _event(data, "wakeup-to-run")
    latencies = sum(b["count"] for b in run["histogram"])
    assert run["histogram_arg"] == "latency"
    # Every switch-in of the task either found its wake-up or is counted missed; one wake-up gives at
    # most one latency; each sleep gives one.
    assert latencies + run["latency_missed"] == run["count"], run
    assert NAPS <= latencies <= wakeups["count"], (latencies, wakeups, run)
    # Wake-up to run on an idle 2-CPU machine: well under a second each (log2 buckets of ns).
    assert max(b["le"] for b in run["histogram"]) < 1_000_000_000, run
    assert f"latency ns (n={latencies}" in text and "count: n=100 sum=5050 mean=50.5 min=1 max=100" in text, (
        text
    )


def test_kernel_function_events_are_refused_at_validation_on_this_kernel(topology, influxd):
    """This machine's kernel has no kprobe_events and refuses fentry under lockdown: the real agents report
    it at registration, and the dispatcher refuses the events naming field, node and reason, before any
    plan is sent (the VM lab's guests attach both: tests/kernels, TestEventKernelFunctions)."""
    spec = spec_from_data(
        {
            "name": "e2e-function-events",
            "events": [
                {"name": "rx-action", "node": "host-a", "kprobe": "net_rx_action",
                 "actions": [{"count": {"by": "cpu"}}]},
                {"name": "ip-rcv", "node": "host-b", "fentry": "ip_rcv", "where": "pid == 1"},
            ],
        }
    )  # fmt: skip
    with running_cluster(topology, influxd.url) as cluster:
        with pytest.raises(grpc.RpcError) as refused:
            cluster.apply(spec)
        message = refused.value.details()
        assert "events[0].kprobe: node host-a cannot attach kprobe: kprobe not supported" in message, message
        assert "events[1].fentry: node host-b cannot attach fentry: " in message and "lockdown" in message, (
            message
        )
        assert _event_programs() == []
