"""Fixtures of the deployment tests: InfluxDB filled once per module by a real trace on the two-host VXLAN
topology (real dispatcher, collector and agents), for the Grafana dashboards' queries. The trace has hop
actions (count by cpu, histogram of len and record of len and ttl at host-b's wire, histogram of latency at
host-a's bridge port) and an event probe that counts host-a's transmits of one odd frame size, so the actions
dashboard has results to read."""

from __future__ import annotations

import os
import secrets
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from hoptrace import kernel_abi
from hoptrace.lab.localcluster import LocalCluster
from hoptrace.lab.processes import udp_transfer
from hoptrace.lab.reference import vxlan_path_spec
from hoptrace.lab.topology import TwoHostTopology, netns_list
from hoptrace.spec import spec_from_data
from hoptrace.v1 import trace_pb2

BUCKET = "hoptrace/autogen"
TRACE = "grafana-udp"
PORT = 11111
EVENT = "wire-frames"
EVENT_SENT = 90
# Sent to a port the trace does not match (no ID written): the wire frame is the payload + 92 bytes
# (Ethernet, IPv4, UDP, VXLAN, inner headers). Odd and unlike the other tests' sizes, and counted on
# devices named wire0 only: tracepoints see every netns, where a loopback TCP segment (the tests' own HTTP
# and gRPC) can have any size.
EVENT_PAYLOAD = 1111
EVENT_FRAME = EVENT_PAYLOAD + 92
OTHER_PORT = 5555
TRACED_PAYLOAD = 64
# What b-wire-in records of every traced datagram: its VXLAN wire frame (payload + 92 bytes + the 4-byte ID
# the first hop appended after the UDP payload), and the TTL of its innermost IP header: c1 sends with Linux's
# default (net.ipv4.ip_default_ttl = 64), host-a routes it from br0 into vxlan0 (one decrement).
TRACED_FRAME = TRACED_PAYLOAD + 92 + kernel_abi.UDP_ID_LEN
SENT_TTL = 64
TRACED_TTL = SENT_TTL - 1


@dataclass
class TracedInflux:
    """InfluxDB after a real trace ran: its url, bucket, the trace's name and hop names, and what was sent."""

    url: str
    bucket: str
    trace: str
    hops: list[str]
    event_sent: int = EVENT_SENT
    event_frame: int = EVENT_FRAME
    traced_frame: int = TRACED_FRAME
    traced_ttl: int = TRACED_TTL


def _fresh_prefix() -> str:
    existing = {name.split("-", 1)[0] for name in netns_list()}
    while True:
        prefix = "hg" + secrets.token_hex(2)
        if prefix not in existing:
            return prefix


def with_actions_and_event(spec: trace_pb2.TraceSpec) -> trace_pb2.TraceSpec:
    """`spec` with count by cpu + histogram of len + record of len and ttl at b-wire-in, histogram of latency
    at a-veth-in, and the event probe `wire-frames` (count by cpu, histogram of len, record of len)."""
    hops = {hop.name: hop for hop in spec.hops}
    hops["b-wire-in"].actions.extend(
        [
            trace_pb2.ActionSpec(kind="timestamp"),
            trace_pb2.ActionSpec(kind="count", by="cpu"),
            trace_pb2.ActionSpec(kind="histogram", field="len"),
            trace_pb2.ActionSpec(kind="record", fields=["len", "ttl"]),
        ]
    )
    hops["a-veth-in"].actions.extend(
        [trace_pb2.ActionSpec(kind="timestamp"), trace_pb2.ActionSpec(kind="histogram", field="latency")]
    )
    event = {
        "name": EVENT,
        "node": "host-a",
        "tracepoint": "net:net_dev_xmit",
        "where": f'len == {EVENT_FRAME} and name == "wire0"',
        "actions": [{"count": {"by": "cpu"}}, {"histogram": "len"}, {"record": ["len"]}],
    }
    spec.events.extend(spec_from_data({"name": spec.name, "hops": [], "events": [event]}).events)
    return spec


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
        spec = with_actions_and_event(vxlan_path_spec(topo, TRACE, port=PORT))
        cluster.apply(spec)
        untraced = [os.urandom(EVENT_PAYLOAD) for _ in range(EVENT_SENT)]
        assert udp_transfer(topo, "c1", "c2", untraced, 4, OTHER_PORT, gap_s=0.003) == untraced
        payloads = [os.urandom(TRACED_PAYLOAD) for _ in range(300)]
        assert udp_transfer(topo, "c1", "c2", payloads, 4, PORT, gap_s=0.003) == payloads
        burst = [os.urandom(TRACED_PAYLOAD) for _ in range(5000)]
        udp_transfer(topo, "c1", "c2", burst, 4, PORT, timeout_s=1.0)
        time.sleep(6)  # the join window closes, per-second windows close, the exporter flushes
        cluster.check_running()
        yield TracedInflux(influxd.url, BUCKET, TRACE, [hop.name for hop in spec.hops])
    finally:
        cluster.stop()
        topo.destroy()
