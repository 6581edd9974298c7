"""What the benchmarks share: the run context, the standalone agent, a counting record sink, process usage,
BPF program statistics and small statistics helpers.

Every benchmark module has ``run(ctx: BenchContext) -> dict``; ``bench/run.py`` calls them in turn. A module
removes everything it creates (namespaces, processes, nft tables, tracefs instances, sysctls) in ``finally``
blocks, so a failing benchmark leaves the machine as it found it.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import math
import os
import random
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from hoptrace.lab.bpfstate import bpf_fds, tcx_programs
from hoptrace.lab.processes import InfluxServer, free_port, start_influxd
from hoptrace.lab.prometheus import scrape
from hoptrace.lab.reference import path_plans  # noqa: F401 (re-exported to the benchmarks)
from hoptrace.lab.topology import TwoHostTopology
from hoptrace.lab.workloads import wait_listening  # noqa: F401 (re-exported to the benchmarks)
from hoptrace.v1 import records_pb2, records_pb2_grpc

REPO = Path(__file__).resolve().parent.parent

AGENT_BINARY = REPO / "agent" / "bin" / "hoptrace-agent"
BPF_OBJECT = REPO / "kernel-patch" / "build" / "hoptrace.bpf.o"
SOCKPERF_PORT = 11111
# Where pinned traffic runs sockperf's client and server: one vCPU, so no step of a packet's way waits for
# another vCPU to be woken, and every hop of it runs there (overhead.sockperf_ping_pong, bpf_cost).
PINNED_CPU = "0"
CLK_TCK = os.sysconf("SC_CLK_TCK")
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")


def log(text: str) -> None:
    """A progress line on stderr (the summary goes to stdout and the results files)."""
    print(f"[bench {time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


@dataclass
class BenchContext:
    """Run-wide settings and shared resources of one `bench/run.py` invocation."""

    quick: bool
    workdir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="hoptrace-bench-")))
    _influx: InfluxServer | None = None
    _prefix_seq: int = 0

    def size(self, quick: Any, full: Any) -> Any:
        """The quick or the full value of a setting."""
        return quick if self.quick else full

    def prefix(self) -> str:
        """A short namespace prefix unique to this run and call."""
        self._prefix_seq += 1
        return f"hb{os.getpid() % 1000}{self._prefix_seq}"

    def influx(self) -> InfluxServer:
        """A shared influxd (started on first use, stopped by `close()`)."""
        if self._influx is None:
            self._influx = start_influxd()
        return self._influx

    def close(self) -> None:
        """Stop shared resources."""
        if self._influx is not None:
            self._influx.stop()
            self._influx = None


def target(name: str, value: float | None, limit: float, unit: str, higher_is_better: bool = False) -> dict:
    """One target: measured value, limit, met or missed and by how much (reported, never asserted)."""
    if value is None:
        return {"name": name, "value": None, "limit": limit, "unit": unit, "met": None, "margin": None}
    met = value >= limit if higher_is_better else value <= limit
    margin = (value - limit) / limit if limit else None
    return {"name": name, "value": value, "limit": limit, "unit": unit, "met": met, "margin": margin}


def pctl(values: list[float], q: float) -> float | None:
    """The q-quantile (0..1) by linear interpolation, None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    pos = q * (len(ordered) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def median(values: list[float]) -> float | None:
    """The median, None for no values."""
    return statistics.median(values) if values else None


def ratio_interval(ratios: list[float], resamples: int = 4000) -> tuple[float, float, float]:
    """The geometric mean of `ratios` and its 95 % bootstrap interval (percentiles of resampled geometric
    means; a fixed seed, so a run's figures are reproducible from its raw ratios)."""
    logs = [math.log(r) for r in ratios]
    rng = random.Random(0)
    means = sorted(statistics.fmean(rng.choices(logs, k=len(logs))) for _ in range(resamples))
    return (
        math.exp(statistics.fmean(logs)),
        math.exp(means[round(0.025 * (resamples - 1))]),
        math.exp(means[round(0.975 * (resamples - 1))]),
    )


def mad(values: list[float]) -> float | None:
    """Median absolute deviation around the median (robust spread)."""
    if not values:
        return None
    m = statistics.median(values)
    return statistics.median(abs(v - m) for v in values)


# ---- processes -----------------------------------------------------------------------------------


@dataclass
class ProcUsage:
    """CPU seconds (user + system) and resident memory of a process, from /proc."""

    cpu_s: float
    rss_bytes: int


def proc_usage(pid: int) -> ProcUsage:
    """Current CPU time and RSS of `pid` (threads included)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    cpu_s = (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime, stime (fields 14, 15 of proc(5))
    rss = int(fields[21]) * PAGE_SIZE  # field 24
    return ProcUsage(cpu_s, rss)


class UsageSampler:
    """Samples a process's CPU and RSS every `interval_s` in a thread; `stop()` returns the CPU share and
    peak."""

    def __init__(self, pid: int, interval_s: float = 0.2) -> None:
        """Start sampling `pid`."""
        self.pid = pid
        self.interval_s = interval_s
        self.peak_rss = 0
        self._stop = threading.Event()
        self._start = (time.monotonic(), proc_usage(pid).cpu_s)
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(OSError):
                self.peak_rss = max(self.peak_rss, proc_usage(self.pid).rss_bytes)
            self._stop.wait(self.interval_s)

    def stop(self) -> dict[str, float]:
        """Stop; the CPU share (1.0 = one core) and peak RSS over the sampled time."""
        self._stop.set()
        self._thread.join()
        t0, cpu0 = self._start
        usage = proc_usage(self.pid)
        self.peak_rss = max(self.peak_rss, usage.rss_bytes)
        dt = time.monotonic() - t0
        return {"cpu_cores": (usage.cpu_s - cpu0) / dt if dt else 0.0, "peak_rss_bytes": self.peak_rss}


def stop_process(
    proc: subprocess.Popen[Any] | None, sig: int = signal.SIGTERM, timeout_s: float = 10.0
) -> None:
    """Signal a process we started, wait, kill it if it lingers."""
    if proc is None or proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(sig)
    try:
        proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)


# ---- Prometheus text -----------------------------------------------------------------------------


def metric_sum(metrics: dict[str, float], name: str, **labels: str) -> float:
    """Sum of series `name` whose labels include `labels`."""
    total = 0.0
    for key, value in metrics.items():
        base, _, rest = key.partition("{")
        if base != name:
            continue
        if all(f'{k}="{v}"' in rest for k, v in labels.items()):
            total += value
    return total


# ---- a counting record sink (stands in for the collector where the collector is not what is measur


class _SinkServicer(records_pb2_grpc.CollectorServicer):
    def __init__(self, sink: RecordSink) -> None:
        self.sink = sink

    def StreamRecords(self, request_iterator: Any, context: Any) -> records_pb2.StreamSummary:  # noqa: N802
        batches = records = 0
        for batch in request_iterator:
            n = len(batch.records) // (batch.record_size or 32)
            batches += 1
            records += n
            with self.sink.lock:
                self.sink.records += n
                self.sink.batches += 1
                self.sink.by_node[batch.node] = self.sink.by_node.get(batch.node, 0) + n
        return records_pb2.StreamSummary(batches=batches, records=records)


class RecordSink:
    """A gRPC `Collector` that only counts what agents send (records, batches, per node)."""

    def __init__(self) -> None:
        """Listen on a free loopback port."""
        self.records = 0
        self.batches = 0
        self.by_node: dict[str, int] = {}
        self.lock = threading.Lock()
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        records_pb2_grpc.add_CollectorServicer_to_server(_SinkServicer(self), self.server)
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.addr = f"127.0.0.1:{self.port}"
        self.server.start()

    def count(self) -> int:
        """Records received so far."""
        with self.lock:
            return self.records

    def close(self) -> None:
        """Stop serving."""
        self.server.stop(grace=1).wait(5)


# ---- the standalone agent shipping to a collector ------------------------------------------------


class PlanAgent:
    """`hoptrace-agent run --plan P --collector ADDR` (no JSON lines), watched through its /metrics."""

    def __init__(
        self,
        plan: dict[str, Any],
        node: str,
        netns: str | None,
        collector: str,
        workdir: Path,
        *extra: str,
        binary: Path = AGENT_BINARY,
    ) -> None:
        """Write the plan; nothing runs before `start()`. `binary`: another build of the agent (A/B)."""
        self.node = node
        self.metrics_addr = f"127.0.0.1:{free_port()}"
        self.plan_path = workdir / f"plan-{node}-{plan['trace']}.json"
        self.plan_path.write_text(json.dumps(plan))
        self.log_path = workdir / f"agent-{node}.log"
        self.argv = [
            str(binary),
            "run",
            "--plan",
            str(self.plan_path),
            "--node",
            node,
            "--collector",
            collector,
            "--metrics-listen",
            self.metrics_addr,
            *extra,
        ]
        if _agent_speaks_tls():
            self.argv.append("--insecure")  # the sink is plaintext on loopback
        if _agent_takes_unsigned_flag():
            self.argv.append("--allow-unsigned-plan")  # the benchmark's own plan, objects by path
        if netns:
            self.argv += ["--netns", netns]
        self.proc: subprocess.Popen[bytes] | None = None
        self.hops = len(plan.get("hops", []))

    def start(self, timeout_s: float = 20.0) -> PlanAgent:
        """Start and wait until every hop of the plan is attached (the trace counted active)."""
        with open(self.log_path, "ab") as logf:
            self.proc = subprocess.Popen(
                self.argv, stdout=logf, stderr=subprocess.STDOUT, start_new_session=True
            )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"agent {self.node} exited {self.proc.returncode}: {self.log_tail()}")
            with contextlib.suppress(OSError, ValueError):
                if scrape(self.metrics_addr, 1).get("hoptrace_agent_traces_active", 0) >= 1:
                    return self
            time.sleep(0.1)
        raise RuntimeError(f"agent {self.node} not active within {timeout_s} s: {self.log_tail()}")

    def metrics(self) -> dict[str, float]:
        """Its /metrics now."""
        return scrape(self.metrics_addr)

    def log_tail(self, lines: int = 20) -> str:
        """The end of its log."""
        with contextlib.suppress(OSError):
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        return ""

    @property
    def pid(self) -> int:
        """Its process id."""
        assert self.proc is not None
        return self.proc.pid

    def stop(self) -> None:
        """SIGTERM (final counters, detach), then kill if it lingers."""
        stop_process(self.proc, signal.SIGTERM, 15)


@contextlib.contextmanager
def path_agents(
    topo: TwoHostTopology,
    collector: str,
    workdir: Path,
    plans: tuple[dict[str, Any], dict[str, Any]],
    *extra: str,
    binary: Path = AGENT_BINARY,
) -> Iterator[tuple[PlanAgent, PlanAgent]]:
    """host-a's and host-b's standalone agents (`binary`) running `plans`, stopped on exit."""
    agents = [
        PlanAgent(plans[i], node, netns, collector, workdir, "--clock-server", "off", *extra, binary=binary)
        for i, (node, netns) in enumerate((("host-a", topo.host_a), ("host-b", topo.host_b)))
    ]
    try:
        for agent in agents:
            agent.start()
        yield agents[0], agents[1]
    finally:
        for agent in agents:
            agent.stop()


# ---- BPF programs --------------------------------------------------------------------------------


def bpftool_json(*args: str, netns: str | None = None) -> Any:
    """`bpftool -j ARGS` (inside `netns` if given), parsed."""
    cmd = ["bpftool", "-j", *args]
    if netns:
        cmd = ["ip", "netns", "exec", netns, *cmd]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=30).stdout
    return json.loads(out or "[]")


def progs_of(pids: set[int]) -> dict[int, dict[str, Any]]:
    """`bpftool prog show` entries of the programs `pids` hold an fd of (/proc/PID/fdinfo), by program id."""
    held: set[int] = set()
    for pid in pids:
        held |= bpf_fds(pid)["prog"]
    return {p["id"]: p for p in bpftool_json("prog", "show") if p["id"] in held}


def tcx_prog_ids(topo: TwoHostTopology, role: str, dev: str) -> dict[str, list[int]]:
    """Program ids on `dev`'s tcx ingress and egress in `role`'s namespace (BPF_PROG_QUERY: bpftool 7.1's
    `net show` predates tcx)."""
    return tcx_programs(topo.netns_path(role), topo.ifindex(role, dev))


# Held while a benchmark has kernel.bpf_stats_enabled set (bpf_stats_enabled): scripts run side by side
# (bench/run.py's smoke runs, or by hand) take turns instead of switching it under each other's measurement.
BPF_STATS_LOCK = Path("/run/hoptrace-bench-bpf-stats.lock")


@contextlib.contextmanager
def bpf_stats_enabled(on: bool = True) -> Iterator[None]:
    """`kernel.bpf_stats_enabled` on (or off) for the block, holding BPF_STATS_LOCK; the previous value
    restored after, even on failure."""
    with open(BPF_STATS_LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, or the process dies
        path = Path("/proc/sys/kernel/bpf_stats_enabled")
        before = path.read_text().strip()
        path.write_text(f"{int(on)}\n")
        try:
            yield
        finally:
            path.write_text(before + "\n")


# ---- namespaces ----------------------------------------------------------------------------------


def udp_socket(topo: TwoHostTopology, role: str) -> socket.socket:
    """An IPv4 UDP socket inside `role`'s namespace."""
    return topo.socket(role, socket.AF_INET, socket.SOCK_DGRAM)


# ---- the whole system ----------------------------------------------------------------------------


def _agent_speaks_tls() -> bool:
    """Whether the built agent takes TLS flags (--ca/--insecure): the cluster's TLS must match what it
    takes."""
    out = subprocess.run([str(AGENT_BINARY), "run", "--help"], capture_output=True, text=True)
    return bool(re.search(r"^\s+-(ca|insecure)\b", out.stdout + out.stderr, re.M))


def _agent_takes_unsigned_flag() -> bool:
    """Whether the built agent wants --allow-unsigned-plan for a bare plan file (agents before signed plans
    do not know the flag)."""
    out = subprocess.run([str(AGENT_BINARY), "run", "--help"], capture_output=True, text=True)
    return "-allow-unsigned-plan" in out.stdout + out.stderr


def start_cluster(
    influx_url: str,
    topo: TwoHostTopology | None,
    workdir: Path,
    *collector_args: str,
    agents: bool = True,
    bpf_cache_dir: Path | None = None,
) -> Any:
    """A LocalCluster (dispatcher, collector, an agent per emulated host of `topo`), started; call stop().

    With an agent that takes TLS flags the cluster runs as LocalCluster sets it up (TLS and tokens); with an
    older agent binary, plaintext on loopback (the agents then get no TLS flags). The dispatcher compiles
    into `bpf_cache_dir` (e.g. the lab's BPF_CACHE_DIR, where objects compiled before are found), by
    default a new directory of its own: its first apply then compiles.
    """
    from hoptrace.lab.localcluster import LocalCluster

    workdir.mkdir(parents=True, exist_ok=True)
    tls = _agent_speaks_tls()
    cluster = (
        LocalCluster(influx_url=influx_url, workdir=workdir) if tls else _plain_cluster(influx_url, workdir)
    )
    cluster.bpf_cache_dir = bpf_cache_dir
    try:
        cluster.start_dispatcher()
        cluster.start_collector(*collector_args)
        cluster.wait_listening()
        if agents and topo is not None:
            start_cluster_agent(cluster, "host-a", topo.host_a)
            start_cluster_agent(cluster, "host-b", topo.host_b)
            cluster.wait_agents(["host-a", "host-b"])
    except BaseException:
        cluster.stop()
        raise
    return cluster


def _plain_cluster(influx_url: str, workdir: Path) -> Any:
    from hoptrace.lab.localcluster import LocalCluster

    try:
        return LocalCluster(influx_url=influx_url, workdir=workdir, secure=False)  # type: ignore[call-arg]
    except TypeError:  # a LocalCluster from before TLS
        return LocalCluster(influx_url=influx_url, workdir=workdir)


def start_cluster_agent(cluster: Any, node: str, netns: str, *extra: str) -> Any:
    """Start the daemon agent of `node` in `cluster` (as LocalCluster does, minus TLS flags it cannot
    take)."""
    if _agent_speaks_tls() or not hasattr(cluster, "secure"):
        return cluster.start_agent(node, netns, *extra)
    return cluster._spawn(
        f"agent-{node}",
        [
            str(AGENT_BINARY),
            "--node",
            node,
            "--netns",
            netns,
            "--dispatcher",
            cluster.dispatcher_addr,
            "--collector",
            cluster.collector_addr,
            "--clock-server",
            cluster.clock_addr,
            "--metrics-listen",
            cluster.metrics_addr(f"agent-{node}"),
            *extra,
        ],
    )


def get_report(cluster: Any, trace: str) -> Any:
    """The dispatcher's report of `trace` (api_pb2.Report) over the last 30 minutes."""
    from google.protobuf.timestamp_pb2 import Timestamp

    from hoptrace.v1 import api_pb2

    start = Timestamp()
    start.FromNanoseconds(time.time_ns() - 30 * 60 * 10**9)
    return cluster.api().GetReport(api_pb2.GetReportRequest(trace=trace, start=start), timeout=30)


def wait_report(
    cluster: Any, trace: str, complete: int, timeout_s: float = 30.0, stable_s: float = 0.0
) -> Any:
    """Poll the report until it has `complete` complete packets (or, with `stable_s`, until its packet count
    stops changing for that long after being non-zero); returns it."""
    import grpc as _grpc

    deadline = time.monotonic() + timeout_s
    last_packets, since = -1, time.monotonic()
    report = None
    while time.monotonic() < deadline:
        cluster.check_running()
        try:
            report = get_report(cluster, trace)
        except _grpc.RpcError:
            report = None
        if report is not None:
            # every segment has counted the complete packets: a packet's later segments may fall into the
            # next 1 s window, which closes a second later
            if (
                complete
                and report.complete >= complete
                and all(
                    s.count + s.incomplete >= report.complete
                    for s in [*report.segments, report.end_to_end]
                    if not re.fullmatch(r"hop\d+", getattr(s, "from"))  # placeholders: path not known yet
                )
            ):
                return report
            if stable_s:
                if report.packets != last_packets:
                    last_packets, since = report.packets, time.monotonic()
                elif report.packets and time.monotonic() - since >= stable_s:
                    return report
        time.sleep(0.5)
    raise RuntimeError(f"report of {trace} did not reach {complete} complete packets: {report}")
