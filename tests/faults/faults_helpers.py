"""The fault matrix's lab: one cluster on the two-host topology whose components a cell kills, stops or cuts
off while a UDP flow of known rate crosses the traced path, and what each cell measures.

Ground truth per cell: the sender's count and an nftables counter in c2's namespace (datagrams delivered).
What the cell reads back: the report (the API's GetReport through the same view as `hoptrace report --json`),
the exemplars in InfluxDB (every packet is one here: duplicates are points beyond the distinct packet IDs),
and the agents' and the collector's /metrics.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from system_helpers import UdpSender

from hoptrace.common.client import ApiClient
from hoptrace.common.grpcutil import api_channel
from hoptrace.lab import localcluster
from hoptrace.lab.influx import BUCKET, EVERY_PACKET, flux
from hoptrace.lab.localcluster import BPF_CACHE_DIR, LocalCluster
from hoptrace.lab.processes import InfluxServer
from hoptrace.lab.prometheus import scrape
from hoptrace.lab.reference import vxlan_path_spec
from hoptrace.lab.topology import TwoHostTopology, netns_list
from hoptrace.lab.waiting import wait_until
from hoptrace.results.report_view import report_from_proto

RATE_PPS = 200  # the flow of every cell: 200 datagrams/s c1 -> c2, 8 hops (4 per node)
FIRST_PORT = 12100  # each cell's flow goes to a port of its own, so its trace and counter are its own
COLLECTOR_ARGS = ("--join-window", "1", *EVERY_PACKET)
CUT_TABLE = "hoptrace_fault_cut"  # the agent's cut: a table of its own in the agents' (root) namespace
COUNT_TABLE = "hoptrace_fault_count"  # c2's delivered datagrams, one counter per cell's port


def unique_prefix() -> str:
    """A namespace prefix ("ht" + 4 hex digits, as the other tiers' topologies) no namespace uses now."""
    existing = {name.split("-", 1)[0] for name in netns_list()}
    while True:
        prefix = "ht" + secrets.token_hex(2)
        if prefix not in existing:
            return prefix


def metric_sum(values: dict[str, float], name: str, **labels: str) -> float:
    """The sum of a metric family's samples whose labels include `labels`."""
    total = 0.0
    for key, value in values.items():
        family, _, rest = key.partition("{")
        if family == name and all(f'{k}="{v}"' in rest for k, v in labels.items()):
            total += value
    return total


# ---- cgroups ---------------------------------------------------------------------------------------------


def _mounts() -> list[tuple[str, Path, str]]:
    """(type, mount point, options) of every mount."""
    out = []
    for line in Path("/proc/self/mounts").read_text().splitlines():
        _, point, kind, options, *_ = line.split()
        out.append((kind, Path(point), options))
    return out


def cgroup2_mount() -> Path:
    """Where cgroup v2 is mounted: /sys/fs/cgroup on a pure v2 host, /sys/fs/cgroup/unified on a hybrid one
    (this machine); never hard-coded."""
    for kind, point, _ in _mounts():
        if kind == "cgroup2":
            return point
    raise RuntimeError("no cgroup v2 mount (/proc/self/mounts)")


@dataclass
class MemoryCgroup:
    """A memory cgroup with a hard limit: v2's memory.max where the v2 hierarchy has the memory controller,
    else v1's memory.limit_in_bytes (a hybrid host, whose memory controller is v1's: this machine)."""

    path: Path
    version: int
    limit: int

    @classmethod
    def create(cls, name: str, limit: int) -> MemoryCgroup:
        """The group `name` with `limit` bytes: at the v2 root with the memory controller there, else under
        this process's own v1 memory group (a child of what it is accounted to already)."""
        v2 = cgroup2_mount()
        if "memory" in (v2 / "cgroup.controllers").read_text().split():
            subtree = v2 / "cgroup.subtree_control"
            if "memory" not in subtree.read_text().split():
                subtree.write_text("+memory")
            group = cls(v2 / name, 2, limit)
            group.path.mkdir()
            (group.path / "memory.max").write_text(str(limit))
            (group.path / "memory.swap.max").write_text("0")
            return group
        v1 = next(
            point for kind, point, opts in _mounts() if kind == "cgroup" and "memory" in opts.split(",")
        )
        own = next(
            line.split(":", 2)[2]
            for line in Path("/proc/self/cgroup").read_text().splitlines()
            if "memory" in line.split(":", 2)[1].split(",")
        )
        group = cls(v1 / own.lstrip("/") / name, 1, limit)
        group.path.mkdir()
        (group.path / "memory.limit_in_bytes").write_text(str(limit))
        return group

    def usage(self) -> dict[str, int]:
        """What the group's processes hold now and at most (bytes), and how often the limit was hit."""
        if self.version == 2:
            events = dict(line.split() for line in (self.path / "memory.events").read_text().splitlines())
            return {
                "current": int((self.path / "memory.current").read_text()),
                "peak": int((self.path / "memory.peak").read_text()),
                "limit_hits": int(events.get("max", 0)),
                "oom_kills": int(events.get("oom_kill", 0)),
            }
        oom = dict(line.split() for line in (self.path / "memory.oom_control").read_text().splitlines())
        return {
            "current": int((self.path / "memory.usage_in_bytes").read_text()),
            "peak": int((self.path / "memory.max_usage_in_bytes").read_text()),
            "limit_hits": int((self.path / "memory.failcnt").read_text()),
            "oom_kills": int(oom.get("oom_kill", 0)),
        }

    def remove(self) -> None:
        """Remove the group once its processes are gone."""
        remove_cgroup(self.path)


def remove_cgroup(path: Path) -> None:
    """rmdir a cgroup, waiting for its last process to be reaped."""
    if not path.exists():
        return
    with contextlib.suppress(Exception):
        wait_until(lambda: not (path / "cgroup.procs").read_text().strip(), f"{path} empty", 10, 0.1)
    with contextlib.suppress(OSError):
        path.rmdir()


def held_links(pid: int) -> int:
    """How many BPF links process `pid` holds: its attached hops. A link it made is anon_inode:bpf_link, one
    it opened from a pin anon_inode:bpf-link (the kernel's bpf_link_prime and bpf_link_new_fd)."""
    count = 0
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):
            count += os.readlink(fd) in ("anon_inode:bpf_link", "anon_inode:bpf-link")
    return count


def proc_status(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM of a process (bytes)."""
    values = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            values[key] = int(rest.split()[0]) * 1024
    return values


# ---- the lab ---------------------------------------------------------------------------------------------


@dataclass
class CellResult:
    """One cell of the matrix as measured."""

    component: str
    fault: str
    outage_s: float
    sent: int
    delivered: int
    complete: int
    counted: dict[str, int]
    unaccounted: int
    duplicates: int
    time_to_whole_s: float
    note: str = ""

    def row(self) -> str:
        """The cell as a row of the table docs/reliability.md shows."""
        counted = ", ".join(f"{k} {v}" for k, v in self.counted.items() if v) or "-"
        return (
            f"| {self.component} | {self.fault} | {self.outage_s:.0f} s | {self.sent} | {self.delivered} | "
            f"{self.complete} | {counted} | {self.unaccounted} | {self.duplicates} | "
            f"{self.time_to_whole_s:.1f} s | {self.note} |"
        )


RESULTS: list[CellResult] = []  # what the cells measured, in order: tests/faults/conftest.py prints them


@dataclass
class FaultLab:
    """A cluster (dispatcher, collector, two agents), its own InfluxDB and the topology, whose components
    the cells fault one at a time. Every agent runs through a small script that puts it in a cgroup v2 of
    its node (what the cut's nftables rule matches) and, for one cell, in a memory cgroup, then execs the
    agent binary that script names."""

    topo: TwoHostTopology
    influx: InfluxServer
    cluster: LocalCluster
    workdir: Path
    prefix: str
    cells: int = 0
    agent_cgroups: dict[str, Path] = field(default_factory=dict)
    memory_groups: list[MemoryCgroup] = field(default_factory=list)
    _scripts: int = 0

    @classmethod
    @contextlib.contextmanager
    def running(cls, influx: InfluxServer, workdir: Path) -> Iterator[FaultLab]:
        """The lab, up with both agents connected; everything removed afterwards."""
        prefix = unique_prefix()
        topo = TwoHostTopology(prefix, "vxlan")
        cluster = LocalCluster(
            influx_url=influx.url, workdir=workdir / "cluster", bpf_cache_dir=BPF_CACHE_DIR
        )
        lab = cls(topo, influx, cluster, workdir, prefix)
        try:
            topo.create()
            lab._count_table()
            cluster.start_dispatcher()
            cluster.start_collector(*COLLECTOR_ARGS)
            cluster.wait_listening()
            for node in ("host-a", "host-b"):
                lab.start_agent(node)
            cluster.wait_agents(["host-a", "host-b"])
            yield lab
        finally:
            cluster.stop()
            # the agents keep their traces on exit: unpinned, they detach
            shutil.rmtree(lab.pin_dir, ignore_errors=True)
            subprocess.run(["nft", "delete", "table", "inet", CUT_TABLE], capture_output=True)
            topo.destroy()
            for path in lab.agent_cgroups.values():
                remove_cgroup(path)
            for group in lab.memory_groups:
                group.remove()

    # -- agents ----------------------------------------------------------------------------------------

    @property
    def pin_dir(self) -> Path:
        """Where the lab's agents pin their traces (bpffs): a killed or stopped agent's hops stay attached
        there, and the next agent of the node takes them over."""
        return Path("/sys/fs/bpf") / f"hoptrace-{self.prefix}"

    def netns_of(self, node: str) -> tuple[str, str]:
        """The emulated host's namespace and its container's."""
        return (self.topo.host_a, self.topo.c1) if node == "host-a" else (self.topo.host_b, self.topo.c2)

    def start_agent(
        self, node: str, binary: Path | None = None, memory: MemoryCgroup | None = None
    ) -> localcluster.Component:
        """Start `node`'s agent (`binary`, default the built one) in its cgroup v2, and in `memory` if given.
        The agent runs in the root namespace, as LocalCluster starts it (--netns names the host's): what the
        cut drops is its traffic there. It pins its traces in `pin_dir` and keeps them when it stops, as a
        deployed agent restarted or upgraded does."""
        group = self.agent_cgroups.get(node)
        if group is None:
            group = cgroup2_mount() / f"{self.prefix}-{node}"
            group.mkdir(exist_ok=True)
            self.agent_cgroups[node] = group
        binary = binary or localcluster.AGENT_BINARY
        self._scripts += 1
        script = self.workdir / f"agent-{node}-{self._scripts}.sh"
        joins = [group / "cgroup.procs", *([memory.path / "cgroup.procs"] if memory else [])]
        script.write_text(
            "#!/bin/sh\n"
            + "".join(f"echo $$ > {path} || exit 97\n" for path in joins)
            + f'exec {binary} "$@"\n'
        )
        script.chmod(script.stat().st_mode | stat.S_IXUSR)
        netns, owned = self.netns_of(node)
        # LocalCluster.start_agent runs its module's AGENT_BINARY: this script, for this start only.
        built = localcluster.AGENT_BINARY
        localcluster.AGENT_BINARY = script
        try:
            return self.cluster.start_agent(
                node, netns, "--netns-owned", owned, "--pin-dir", str(self.pin_dir), "--keep-on-exit"
            )
        finally:
            localcluster.AGENT_BINARY = built

    def api_channel(self) -> grpc.Channel:
        """A new channel to the user API (the admin's), with a subchannel of its own: gRPC shares
        subchannels between channels, and one that saw the dispatcher fail stays in its reconnect backoff
        (its default grows to 120 s) after the dispatcher listens again: 14-20 s measured here."""
        certs = self.cluster.certs
        options = [("grpc.use_local_subchannel_pool", 1)]
        if certs is None:
            return api_channel(self.cluster.dispatcher_addr, insecure=True, options=options)
        admin = certs.files("admin")
        return api_channel(
            self.cluster.dispatcher_addr,
            ca=admin.ca,
            cert=admin.cert,
            key=admin.key,
            token=certs.token("admin"),
            options=options,
        )

    def restart_dispatcher(self) -> None:
        """Start the dispatcher again (same address and state directory), wait until it listens, and give
        the cluster's API calls a new channel (`api_channel`)."""
        self.cluster.start_dispatcher()
        self.cluster.wait_listening(addrs=[self.cluster.dispatcher_addr])
        if self.cluster._channel is not None:  # LocalCluster's one channel, made on its first call
            self.cluster._channel.close()
        self.cluster._channel = self.api_channel()

    def agent(self, node: str) -> localcluster.Component:
        """The running agent of `node`."""
        return self.cluster.components[f"agent-{node}"]

    def agent_metrics(self, node: str) -> dict[str, float]:
        """`node`'s agent's /metrics."""
        return scrape(self.cluster.metrics_addr(f"agent-{node}"))

    def collector_idle(self) -> bool:
        """Whether the collector holds no packet in its join and no point in its spool (its export queue
        is never empty for long: every heartbeat adds points)."""
        try:
            values = self.collector_metrics()
        except OSError:  # not listening (yet): it may hold what it gets next
            return False
        return not any(
            metric_sum(values, name)
            for name in (
                "hoptrace_collector_join_pending_packets",
                "hoptrace_collector_spool_points",
            )
        )

    def collector_received(self, node: str) -> float:
        """Records the (running) collector got from `node`'s agent; 0 while it does not answer yet."""
        try:
            values = self.collector_metrics()
        except OSError:
            return 0.0
        return metric_sum(values, "hoptrace_collector_records_received_total", node=node)

    def collector_metrics(self) -> dict[str, float]:
        """The collector's /metrics."""
        return scrape(self.cluster.metrics_addr("collector"))

    def wait_attached(self, trace: str, hops: int = 8, timeout_s: float = 30.0) -> None:
        """Wait until the dispatcher says all `hops` of `trace` are attached (its nodes' trace status)."""
        from hoptrace.v1 import api_pb2

        def attached() -> bool:
            found = self.cluster.api().GetTrace(api_pb2.GetTraceRequest(name=trace), timeout=5)
            return sum(hop.attached for status in found.nodes for hop in status.hops) == hops

        wait_until(attached, f"every hop of {trace} attached", timeout_s, 0.1)

    def delete_traces(self) -> None:
        """Delete every trace: a restarted agent restores each trace it is given, one after the other, so
        a cell leaves none behind for the next."""
        from hoptrace.v1 import api_pb2

        api = self.cluster.api()
        for trace in api.ListTraces(api_pb2.ListTracesRequest(), timeout=10).traces:
            api.DeleteTrace(api_pb2.DeleteTraceRequest(name=trace.spec.name), timeout=30)

    # -- the cut -----------------------------------------------------------------------------------------

    @contextlib.contextmanager
    def cut(self, node: str) -> Iterator[None]:
        """Drop everything `node`'s agent sends to the collector (its record stream and its clock rounds),
        matched by the agent's cgroup v2 in an nftables table of its own; removed on leaving."""
        group = self.agent_cgroups[node]
        relative = os.path.relpath(group, "/sys/fs/cgroup")  # nft resolves the path below /sys/fs/cgroup
        level = len(group.relative_to(cgroup2_mount()).parts)
        ports = ", ".join(
            a.rpartition(":")[2] for a in (self.cluster.collector_addr, self.cluster.clock_addr)
        )
        rule = (
            f"table inet {CUT_TABLE} {{\n chain agent_out {{\n type filter hook output priority 0;\n"
            f' socket cgroupv2 level {level} "{relative}" ip daddr 127.0.0.1 th dport {{ {ports} }} '
            "counter drop\n }\n}\n"
        )
        subprocess.run(["nft", "-f", "-"], input=rule, text=True, check=True)
        try:
            yield
        finally:
            subprocess.run(["nft", "delete", "table", "inet", CUT_TABLE], check=True)

    def cut_packets(self) -> int:
        """What the cut's rule dropped (read before it is removed)."""
        data = json.loads(
            subprocess.run(
                ["nft", "-j", "list", "table", "inet", CUT_TABLE], capture_output=True, text=True, check=True
            ).stdout
        )
        return sum(
            expr["counter"]["packets"]
            for item in data["nftables"]
            for expr in item.get("rule", {}).get("expr", [])
            if "counter" in expr
        )

    # -- ground truth ------------------------------------------------------------------------------------

    def _count_table(self) -> None:
        subprocess.run(
            ["ip", "netns", "exec", self.topo.c2, "nft", "-f", "-"],
            input=f"table inet {COUNT_TABLE} {{\n chain delivered {{\n"
            " type filter hook input priority 0;\n }\n}\n",
            text=True,
            check=True,
        )

    def count_port(self, port: int) -> None:
        """Count the datagrams c2 receives on `port` (its input hook: after every traced hop)."""
        self.topo.run(
            "c2", "nft", "add", "rule", "inet", COUNT_TABLE, "delivered", "udp", "dport", str(port), "counter"
        )

    def delivered(self, port: int) -> int:
        """Datagrams c2 received on `port`: the nftables counter."""
        data = json.loads(self.topo.run("c2", "nft", "-j", "list", "table", "inet", COUNT_TABLE).stdout)
        for item in data["nftables"]:
            exprs = item.get("rule", {}).get("expr", [])
            if any(e.get("match", {}).get("right") == port for e in exprs):
                return next(e["counter"]["packets"] for e in exprs if "counter" in e)
        raise AssertionError(f"no counter for port {port}: {data}")

    # -- reading back ------------------------------------------------------------------------------------

    def report(self, trace: str) -> dict[str, Any]:
        """The trace's report over the last 30 minutes, as `hoptrace report --json` prints it."""
        # A channel of its own per report, as each `hoptrace report` makes one.
        channel = self.api_channel()
        try:
            client = ApiClient(self.cluster.dispatcher_addr, channel_factory=lambda: channel)
            return report_from_proto(client.report(trace, 1800))
        finally:
            channel.close()

    def packet_ids(self, trace: str) -> dict[str, int]:
        """Per segment, the distinct packet IDs of its exemplars: as many as packets, unless an ID was
        reused (two packets joined as one) or a packet is missing."""
        query = (
            f'from(bucket: "{BUCKET}") |> range(start: -1h) '
            f'|> filter(fn: (r) => r._measurement == "hop_latency" and r.trace == "{trace}" '
            f'and r._field == "packet_id") |> group(columns: ["segment"]) |> distinct() |> count()'
        )
        return {r["segment"]: int(r["_value"]) for r in flux(self.influx.url, query)}

    def duplicates(self, trace: str) -> dict[str, int]:
        """Per segment, exemplar points beyond the distinct packet IDs: a packet written twice."""
        base = (
            f'from(bucket: "{BUCKET}") |> range(start: -1h) '
            f'|> filter(fn: (r) => r._measurement == "hop_latency" and r.trace == "{trace}" '
            f'and r._field == "packet_id") |> group(columns: ["segment"])'
        )
        points = {r["segment"]: int(r["_value"]) for r in flux(self.influx.url, base + " |> count()")}
        distinct = {
            r["segment"]: int(r["_value"]) for r in flux(self.influx.url, base + " |> distinct() |> count()")
        }
        return {segment: points[segment] - distinct.get(segment, 0) for segment in points}


def accounted(report: dict[str, Any]) -> tuple[int, dict[str, int]]:
    """The packets a report accounts for: complete ones, and for each incomplete one where it went missing
    and how that is counted, summed over the segments (a packet is counted at the first segment whose
    second hop lacks it): `loss_count`, `tracer_lost` (records the tracer lost), `before_attach`."""
    segments = [s for s in report.get("segments", []) if not re.fullmatch(r"hop\d+", s["from"])]
    counted = {
        key: sum(int(s.get(key, 0)) for s in segments)
        for key in ("loss_count", "tracer_lost", "before_attach")
    }
    return int(report.get("complete", 0)) + sum(counted.values()), counted


@dataclass
class Flow:
    """One cell's traced flow: its trace (a port of its own), the sender, and what the cell measured."""

    lab: FaultLab
    name: str
    port: int
    sender: UdpSender | None = None
    fault_ended: float = 0.0
    sent_at_end: int = 0
    whole_after_s: float | None = None
    last_report: dict[str, Any] = field(default_factory=dict)
    last_error: str = ""  # why the last report could not be read

    @classmethod
    def start(cls, lab: FaultLab, cell: str) -> Flow:
        """Apply the cell's trace, wait until both nodes attached it, count c2's datagrams, start sending."""
        lab.cells += 1
        flow = cls(lab, f"fault-{cell}", FIRST_PORT + lab.cells)
        spec = vxlan_path_spec(lab.topo, flow.name, port=flow.port)
        for attempt in range(3):
            try:
                lab.cluster.apply(spec)
                break
            except grpc.RpcError as error:
                # A loaded machine (other work on its 2 cores) can take longer than the dispatcher's
                # 5 s for an agent to load and attach: the apply fails and is undone. A user applies again.
                if attempt == 2 or "no status from the agent" not in (error.details() or ""):
                    raise
        lab.wait_attached(flow.name)
        lab.count_port(flow.port)
        flow.sender = UdpSender(lab.topo, "c1", "c2", flow.port, rate_pps=RATE_PPS).start()
        return flow

    def report(self) -> dict[str, Any]:
        """The trace's report now ({} while the dispatcher cannot give one)."""
        try:
            self.last_report = self.lab.report(self.name)
        except Exception as error:  # noqa: BLE001 - no data yet, or the dispatcher away: not whole
            self.last_error = str(error)
            return {}
        return self.last_report

    def fault_over(self) -> None:
        """The fault ended now (the component back, the rule gone): time to whole counts from here."""
        self.fault_ended = time.monotonic()
        assert self.sender is not None
        self.sent_at_end = self.sender.sent

    def _poll(self) -> int:
        """The packets the report accounts for now; notes when they first cover the fault's end."""
        total = accounted(self.report())[0]
        if self.whole_after_s is None and self.sent_at_end and total >= self.sent_at_end:
            self.whole_after_s = time.monotonic() - self.fault_ended
        return total

    def finish(self, after_s: float = 1.0, timeout_s: float = 45.0, settle_s: float = 4.0) -> dict[str, Any]:
        """Keep sending `after_s` more while reading the report: time to whole is when it first accounts
        for every packet sent until the fault's end. Then stop sending and wait until it accounts for every
        packet sent; or until the collector holds nothing any more (`collector_idle`) and the report stood
        still `settle_s` (more than a window takes to close): a cell that lost packets for good; or until
        `timeout_s`. Returns the last report."""
        assert self.sender is not None and self.fault_ended
        while time.monotonic() - self.fault_ended < after_s:
            self._poll()
            time.sleep(0.4)  # the traffic after the fault (pacing); each report is several Flux queries
        sent = self.sender.stop()
        deadline = time.monotonic() + timeout_s
        last, since = -1, time.monotonic()
        while time.monotonic() < deadline:
            total = self._poll()
            if total >= sent:
                break
            if total != last or not self.lab.collector_idle():
                last, since = total, time.monotonic()
            elif time.monotonic() - since >= settle_s:
                break
            time.sleep(0.4)
        return self.last_report

    def result(self, component: str, fault: str, outage_s: float, note: str = "") -> CellResult:
        """The cell's row, from the last report, c2's counter and InfluxDB's exemplars; kept in RESULTS."""
        assert self.sender is not None
        total, counted = accounted(self.last_report)
        result = CellResult(
            component=component,
            fault=fault,
            outage_s=outage_s,
            sent=self.sender.sent,
            delivered=self.lab.delivered(self.port),
            complete=int(self.last_report.get("complete", 0)),
            counted=counted,
            unaccounted=self.sender.sent - total,
            duplicates=sum(self.lab.duplicates(self.name).values()),
            time_to_whole_s=self.whole_after_s if self.whole_after_s is not None else float("nan"),
            note=note if self.last_report else f"{note} no report: {self.last_error}".strip(),
        )
        RESULTS.append(result)
        return result


def copy_agent(directory: Path) -> Path:
    """A copy of the built agent at another path (an upgrade in place: the new binary, a new path)."""
    target = directory / "next" / "hoptrace-agent"
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(localcluster.AGENT_BINARY, target)
    return target


def hoptrace_console_script() -> list[str]:
    """The `hoptrace` console script beside this interpreter: the collector's other entry point."""
    script = Path(sys.executable).parent / "hoptrace"
    assert script.exists(), f"{script} is missing (pip install -e .)"
    return [str(script)]


def stop_for(pid: int, seconds: float) -> None:
    """SIGSTOP `pid`, hold it `seconds` (the outage measured), SIGCONT it."""
    os.kill(pid, signal.SIGSTOP)
    try:
        time.sleep(seconds)  # the outage (the thing tested)
    finally:
        os.kill(pid, signal.SIGCONT)
