"""What the full-system tests share: a running cluster on a topology, traffic, and InfluxDB queries."""

from __future__ import annotations

import json
import os
import re
import socket
import statistics
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from hoptrace.lab.influx import (  # noqa: F401
    BUCKET,  # noqa: F401
    EVERY_PACKET,
    distinct_packets,
    flux,
    segment_counts,
    segment_latencies,
)
from hoptrace.lab.localcluster import LocalCluster
from hoptrace.lab.waiting import WaitTimeout, wait_until


@dataclass
class UdpSender:
    """Sends numbered UDP datagrams from one role to another's address until stopped (a background flow)."""

    topo: Any
    src: str
    dst: str
    port: int
    rate_pps: float = 200.0
    family: int = 4
    sent: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> UdpSender:
        """Start sending in a thread."""
        sock = self.topo.socket(
            self.src, socket.AF_INET if self.family == 4 else socket.AF_INET6, socket.SOCK_DGRAM
        )
        target = (self.topo.addr(self.dst, self.family), self.port)

        def loop() -> None:
            gap = 1.0 / self.rate_pps
            next_at = time.monotonic()
            while not self._stop.is_set():
                sock.sendto(self.sent.to_bytes(8, "big") + os.urandom(56), target)
                self.sent += 1
                next_at += gap
                delay = next_at - time.monotonic()
                if delay > 0:
                    self._stop.wait(delay)
            sock.close()

        self._thread = threading.Thread(target=loop, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> int:
        """Stop and return how many datagrams were sent."""
        self._stop.set()
        if self._thread:
            self._thread.join(5)
        return self.sent


def report(cluster: LocalCluster, trace: str) -> dict[str, Any]:
    """`hoptrace report NAME --json`, parsed."""
    result = cluster.hoptrace("report", trace, "--since", "30m", "--json")
    return json.loads(result.stdout)


def recorded_segments(report: dict[str, Any], hop: str) -> tuple[int, int]:
    """(records, segments) of the skbs of several segments at `hop`: its recorded gso_segs count and sum."""
    for h in report.get("hops", []):
        if h["hop"] == hop:
            for r in h.get("recorded", []):
                if r["field"] == "gso_segs":
                    return r["count"], round(r["mean"] * r["count"])
    return 0, 0


def wait_report(cluster: LocalCluster, trace: str, packets: int, timeout_s: float = 30.0) -> dict[str, Any]:
    """Poll the report until it has `packets` complete packets, counted in every segment (the join window and
    export take a moment, and a packet's later segments may fall into the next 1 s window, closed later)."""
    last = [""]

    def complete_report() -> dict[str, Any] | None:
        cluster.check_running()
        result = cluster.hoptrace("report", trace, "--since", "30m", "--json", check=False)
        if result.returncode != 0:  # no data yet is an error answer too
            last[0] = result.stderr
            return None
        data = json.loads(result.stdout)
        complete = data.get("complete", 0)
        # (not the placeholders hop<i> > hop<j> of windows written before the collector knew the path)
        segments = [
            s
            for s in [*data.get("segments", []), data.get("end_to_end", {})]
            if not re.fullmatch(r"hop\d+", s.get("from", ""))
        ]
        if complete >= packets and all(
            s.get("count", 0) + s.get("incomplete", 0) >= complete for s in segments
        ):
            return data
        last[0] = result.stdout
        return None

    try:
        return wait_until(
            complete_report, f"report of {trace} with {packets} complete packets", timeout_s, 0.2
        )
    except WaitTimeout as timeout:
        raise AssertionError(f"{timeout}: {last[0]}") from None


def p50(values: list[int]) -> float:
    """The median."""
    return statistics.median(values)


@contextmanager
def running_cluster(
    topo: Any,
    influx_url: str,
    agent_args: dict[str, list[str]] | None = None,
    collector_args: Sequence[str] = (),
) -> Iterator[LocalCluster]:
    """Dispatcher, collector and an agent per emulated host on `topo`; all stopped afterwards.

    `agent_args` adds flags per node, e.g. {"host-b": ["--clock-offset", "3.7ms"]}; `collector_args` adds
    collector flags, e.g. EVERY_PACKET (one hop_latency point per packet, for per-packet ground truth).
    """
    with LocalCluster(influx_url=influx_url) as cluster:  # its workdir removed unless the test failed
        yield cluster.start_on(topo, ["--join-window", "1", *collector_args], agent_args)
