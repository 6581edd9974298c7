"""What the vNetTracer case studies (bench/case_*.py) share: a traced TwoHostTopology, extra containers on
host-a's bridge, sockperf, iperf3 and the per-segment report of each run.

Each case builds everything it uses and removes it in ``finally`` blocks: namespaces, processes, the local
cluster (dispatcher, collector, one agent per emulated host) and its InfluxDB.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from hoptrace.lab.localcluster import LocalCluster, writable_bpf_cache
from hoptrace.lab.processes import start_influxd
from hoptrace.lab.topology import Overlay, TwoHostTopology, add_container
from hoptrace.lab.waiting import WaitTimeout, wait_until
from hoptrace.lab.workloads import sockperf as run_sockperf
from hoptrace.lab.workloads import wait_listening
from hoptrace.v1 import trace_pb2

REPO = Path(__file__).resolve().parents[1]

SOCKPERF_PORT = 11111
# sockperf's count of the messages its client sent in the whole run, warm-up included: every one a packet
# of the traced flow.
SENT_MESSAGES = re.compile(r"\[Total Run\].*\bSentMessages=(\d+)")
# How long a report may take to account for a flow's packets (the last second's window is written about 4 s
# after the flow ends: the join window, 2 s, and a window's own second).
REPORT_TIMEOUT_S = 30


@contextlib.contextmanager
def traced_topology(overlay: Overlay) -> Iterator[tuple[TwoHostTopology, LocalCluster]]:
    """A fresh TwoHostTopology, InfluxDB, dispatcher, collector and an agent per host; removed after.

    The dispatcher keeps its compiled BPF objects in `make demo`'s cache (BPF_CACHE_DIR): no case measures
    a compile."""
    topo = TwoHostTopology("cs" + secrets.token_hex(2), overlay=overlay)
    influx = cluster = None
    extra: list[str] = []
    try:
        topo.create()
        influx = start_influxd()
        cluster = LocalCluster(influx_url=influx.url, bpf_cache_dir=writable_bpf_cache())
        cluster.start_on(topo)
        topo.extra_netns = extra  # type: ignore[attr-defined]
        yield topo, cluster
    finally:
        if cluster:
            cluster.stop()
        if influx:
            influx.stop()
        topo.destroy()
        for ns in extra:
            subprocess.run(["ip", "netns", "del", ns], check=False, capture_output=True)


def extra_container(topo: TwoHostTopology, index: int) -> str:
    """Container ``c{index}`` (index >= 3) on host-a's bridge, 198.18.1.{index}; deleted with the topology."""
    ns = add_container(topo, f"c{index}", f"198.18.1.{index}", f"02:00:c6:12:01:{index:02x}")
    topo.extra_netns.append(ns)  # type: ignore[attr-defined]
    return ns


def spec(name: str, topo: TwoHostTopology, hops: list[tuple[str, str, str, str, str]], **flt: Any) -> Any:
    """A TraceSpec of the sockperf flow c1 -> c2 (UDP) through ``hops`` (name, node, at, dev, netns)."""
    filt = {"protocol": "udp", "src": topo.addr("c1"), "dst": topo.addr("c2"), "dst_port": SOCKPERF_PORT}
    filt.update(flt)
    return trace_pb2.TraceSpec(
        name=name,
        filter=trace_pb2.Filter(**filt),
        sample=1,
        hops=[
            trace_pb2.HopSpec(name=n, node=node, at=at, dev=dev, netns=ns) for n, node, at, dev, ns in hops
        ],
    )


def sockperf(
    topo: TwoHostTopology, seconds: float, mps: int, client: str = "c1", server: str = "c2", **popen: Any
) -> dict[str, float]:
    """A sockperf UDP ping-pong ``client`` -> ``server``: sockperf's own average and percentiles (µs), and
    ``sent``, the messages its client sent (the packets a trace of the flow must account for).

    ``server_prefix`` / ``client_prefix``: a command put before sockperf (e.g. ``("taskset", "-c", "1")``);
    ``client_args``: extra ping-pong arguments; ``on_server_up``: called with the server's pid once it
    listens, before the client starts.
    """
    out = run_sockperf(
        topo, "ping-pong", seconds, "--mps", str(mps), *popen.pop("client_args", ()),
        client=client, server=server, server_prefix=popen.pop("server_prefix", ()),
        client_prefix=popen.pop("client_prefix", ()), on_server_up=popen.pop("on_server_up", None),
    )  # fmt: skip
    result: dict[str, float] = {}
    if m := SENT_MESSAGES.search(out):
        result["sent"] = int(m.group(1))
    if m := re.search(r"avg-latency=([\d.]+)", out):
        result["avg_us"] = float(m.group(1))
    for pct, value in re.findall(r"percentile ([\d.]+) =\s+([\d.]+)", out):
        result[f"p{pct}_us"] = float(value)
    return result


@contextlib.contextmanager
def iperf3_load(topo: TwoHostTopology, flows: list[tuple[str, int]], seconds: float) -> Iterator[None]:
    """TCP iperf3 flows to host-b's wire0 address: (netns, parallel streams) each, one server port each."""
    procs: list[subprocess.Popen[Any]] = []
    try:
        for i, _ in enumerate(flows):
            procs.append(topo.popen("host-b", "iperf3", "-s", "-p", str(5201 + i), stdout=subprocess.DEVNULL))
        for i, _ in enumerate(flows):
            wait_listening(topo, "host-b", "tcp", 5201 + i)
        for i, (ns, streams) in enumerate(flows):
            procs.append(
                subprocess.Popen(
                    [
                        *("ip", "netns", "exec", ns, "iperf3", "-c", topo.addr("host-b")),
                        *("-p", str(5201 + i), "-t", str(int(seconds)), "-P", str(streams)),
                    ],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )
        if flows:
            time.sleep(1)  # pacing: the load runs at full speed before the measured flow starts
        yield
    finally:
        for proc in reversed(procs):
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
                try:
                    proc.wait(5)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()


def report(
    cluster: LocalCluster, name: str, app: dict[str, float], timeout_s: float = REPORT_TIMEOUT_S
) -> dict[str, Any]:
    """``hoptrace report NAME --json`` for the last 10 minutes, once it accounts for the flow ``app`` (a
    ``sockperf`` result) sent: each of its ``sent`` datagrams a packet, complete or not, and every segment
    counted for every complete one. The collector writes a second's window once the join window after it
    has closed, seconds after the flow ends. Raises WaitTimeout, with the counts, past ``timeout_s``
    (scaled): a report that misses packets of the flow is no result.
    """
    sent = int(app.get("sent", 0))
    latest: dict[str, Any] = {}

    def accounted() -> bool:
        out = cluster.hoptrace("report", name, "--since", "10m", "--json")
        latest.clear()
        latest.update(json.loads(out.stdout))
        segments = [*latest["segments"], latest["end_to_end"]]
        return 0 < sent <= latest["packets"] and all(s["count"] >= latest["complete"] for s in segments)

    try:
        wait_until(accounted, f"report {name} accounting for the {sent} datagrams sent", timeout_s, 0.5)
    except WaitTimeout as timeout:
        counts = f"{latest.get('packets')} packets, {latest.get('complete')} complete"
        raise WaitTimeout(f"{timeout} ({counts})") from None
    return latest


def require_root() -> None:
    """The cases build namespaces and load BPF programs."""
    if os.geteuid() != 0:
        sys.exit("run as root (namespaces, BPF): sudo .venv/bin/python bench/case_....py")
