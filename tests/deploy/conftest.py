"""Fixtures of the deployment tests: InfluxDB filled once per module by a real trace on the two-host VXLAN
topology (real dispatcher, collector and agents), for the Grafana dashboards' queries."""

from __future__ import annotations

import os
import secrets
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from hoptrace.lab.localcluster import LocalCluster
from hoptrace.lab.processes import udp_transfer
from hoptrace.lab.reference import vxlan_path_spec
from hoptrace.lab.topology import TwoHostTopology, netns_list

BUCKET = "hoptrace/autogen"
TRACE = "grafana-udp"
PORT = 11111


@dataclass
class TracedInflux:
    """InfluxDB after a real trace ran: its url, bucket, and the trace's name and hop names."""

    url: str
    bucket: str
    trace: str
    hops: list[str]


def _fresh_prefix() -> str:
    existing = {name.split("-", 1)[0] for name in netns_list()}
    while True:
        prefix = "hg" + secrets.token_hex(2)
        if prefix not in existing:
            return prefix


@pytest.fixture(scope="module")
def traced_influx(influxd) -> Iterator[TracedInflux]:
    """Run the c1 -> c2 VXLAN trace with steady traffic, then a burst that overflows host-a's deliberately
    tiny ring buffer (4 KiB: ~100 records), so the tracer's own loss (tracer_loss, lost_events) is real."""
    topo = TwoHostTopology(_fresh_prefix(), "vxlan").create()
    cluster = LocalCluster(influx_url=influxd.url, influx_bucket=BUCKET)
    try:
        cluster.start_dispatcher()
        cluster.start_collector("--join-window", "1")
        cluster.wait_listening()
        cluster.start_agent("host-a", topo.host_a, "--ringbuf-bytes", "4096")
        cluster.start_agent("host-b", topo.host_b)
        cluster.wait_agents(["host-a", "host-b"])
        spec = vxlan_path_spec(topo, TRACE, port=PORT)
        cluster.apply(spec)
        payloads = [os.urandom(64) for _ in range(300)]
        assert udp_transfer(topo, "c1", "c2", payloads, 4, PORT, gap_s=0.003) == payloads
        udp_transfer(topo, "c1", "c2", [os.urandom(64) for _ in range(5000)], 4, PORT, timeout_s=1.0)
        time.sleep(6)  # the join window closes, per-second windows close, the exporter flushes
        cluster.check_running()
        yield TracedInflux(influxd.url, BUCKET, TRACE, [hop.name for hop in spec.hops])
    finally:
        cluster.stop()
        topo.destroy()
