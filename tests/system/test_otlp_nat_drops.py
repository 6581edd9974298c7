"""The OpenTelemetry export of translations and drops, read back from a real Jaeger (`make jaeger`): on the
two-host VXLAN topology, a flow to a Service address (host-a's nftables DNAT + masquerade, the topology of
test_nat_following) has a `nat` event on the segment where host-a rewrote it, with the tuples the hops saw;
a flow an nftables rule drops part of on host-b's wire has, for every packet it dropped, an ERROR span for
the segment it was lost in with the kernel's reason and function in a `drop` event."""

from __future__ import annotations

import json
import socket
import time
import urllib.parse
import urllib.request
from datetime import UTC, datetime
from typing import Any

import pytest
from system_helpers import UdpSender, running_cluster, wait_report
from test_nat_following import (
    SERVICE,
    UDP_BACKEND_PORT,
    UDP_SERVICE_PORT,
    Flow,
    counted_packets,
    service_spec,
    service_topology,  # noqa: F401 - a fixture
)
from test_otlp_export import jaeger  # noqa: F401 - a fixture

from hoptrace.collector.records import ID_SEQ_MASK
from hoptrace.lab.otel import Jaeger
from hoptrace.lab.reference import vxlan_path_spec
from hoptrace.lab.waiting import wait_until

pytestmark = pytest.mark.kernel

CLIENT_PORT = 40123  # the client's own port: masquerade keeps it (no other flow holds it)
DATAGRAMS = 130  # IDs 1, 65 and 129 describe their addresses
DROP_PORT = 11121
DROP_PER_MILLE = 100


def _value(v: dict[str, Any]) -> Any:
    (kind, value), *_ = v.items()
    return int(value) if kind == "intValue" else value


def _attributes(items: list[dict[str, Any]]) -> dict[str, Any]:
    return {a["key"]: _value(a["value"]) for a in items}


def jaeger_traces(backend: Jaeger, name: str, since: datetime) -> dict[str, list[dict[str, Any]]]:
    """Every trace of hoptrace trace `name` (its root span's name) Jaeger holds since `since`, by trace ID:
    its spans, with attributes and events' attributes decoded (the find API: /api/v3/traces)."""
    query = urllib.parse.urlencode(
        {
            "query.service_name": "hoptrace",
            "query.operation_name": name,
            "query.start_time_min": since.isoformat().replace("+00:00", "Z"),
            "query.start_time_max": datetime.now(UTC).isoformat().replace("+00:00", "Z"),
            "query.num_traces": 1000,
        }
    )
    url = f"http://127.0.0.1:{backend.query_port}/api/v3/traces?{query}"
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            answer = json.loads(response.read())
    except urllib.error.HTTPError as err:
        if err.code == 404:
            return {}
        raise
    out: dict[str, list[dict[str, Any]]] = {}
    for rs in answer.get("result", {}).get("resourceSpans", []):
        for ss in rs.get("scopeSpans", []):
            for span in ss.get("spans", []):
                span["attributes"] = _attributes(span.get("attributes", []))
                for event in span.get("events", []):
                    event["attributes"] = _attributes(event.get("attributes", []))
                out.setdefault(span["traceId"], []).append(span)
    return out


def otlp_args(backend: Jaeger, *more: str) -> list[str]:
    return ["--otlp-endpoint", backend.otlp_endpoint, "--otlp-insecure", *more]


@pytest.mark.timeout(120)
def test_a_translation_is_a_nat_event_on_its_segment(service_topology, influxd, jaeger) -> None:  # noqa: F811
    topology = service_topology
    flow = Flow("udp", 4)
    spec = service_spec(topology, flow)
    hops = [h.name for h in spec.hops]
    since = datetime.now(UTC)
    # every packet an exemplar, every exemplar a trace
    args = otlp_args(jaeger, "--otlp-sample", "all", "--exemplar-every", "1")
    with running_cluster(topology, influxd.url, collector_args=args) as cluster:
        cluster.apply(spec)
        with (
            topology.socket("c2", socket.AF_INET, socket.SOCK_DGRAM) as backend,
            topology.socket("c1", socket.AF_INET, socket.SOCK_DGRAM) as client,
        ):
            backend.bind((topology.addr("c2"), UDP_BACKEND_PORT))
            backend.settimeout(2)
            client.bind((topology.addr("c1"), CLIENT_PORT))
            for n in range(DATAGRAMS):
                client.sendto(n.to_bytes(4, "big"), (SERVICE[4], UDP_SERVICE_PORT))
                time.sleep(0.002)
            received = [backend.recv(64) for _ in range(DATAGRAMS)]
        assert received == [n.to_bytes(4, "big") for n in range(DATAGRAMS)]
        assert counted_packets(topology, flow) == DATAGRAMS
        wait_report(cluster, spec.name, DATAGRAMS)

        def all_traces() -> dict | None:
            cluster.check_running()
            found = jaeger_traces(jaeger, spec.name, since)
            whole = {k: v for k, v in found.items() if len(v) == len(hops)}
            return whole if len(whole) == DATAGRAMS else None

        traces = wait_until(all_traces, f"{DATAGRAMS} traces of {len(hops)} spans in jaeger", 30, 0.5)

    before = {
        "network.transport.before": "udp",
        "source.address.before": topology.addr("c1"),
        "source.port.before": CLIENT_PORT,
        "destination.address.before": SERVICE[4],
        "destination.port.before": UDP_SERVICE_PORT,
    }
    after = {  # masqueraded out of vxlan0 to host-a's own address there
        "network.transport.after": "udp",
        "source.address.after": topology.addr("host-a", 4, "vxlan0"),
        "source.port.after": CLIENT_PORT,
        "destination.address.after": topology.addr("c2"),
        "destination.port.after": UDP_BACKEND_PORT,
    }
    translated = f"{hops[1]}>{hops[2]}"
    own = 0
    for spans in traces.values():
        (root,) = [s for s in spans if not s.get("parentSpanId")]
        packet_id = root["attributes"]["hoptrace.packet_id"]
        describes = (packet_id & ID_SEQ_MASK) % 64 == 1
        own += describes
        for span in spans:
            if span is root or span["name"] != translated:
                assert not span.get("events"), span  # no translation anywhere else
                continue
            (event,) = span["events"]
            assert event["name"] == "nat"
            assert int(event["timeUnixNano"]) == int(span["startTimeUnixNano"])
            attributes = event["attributes"]
            of = attributes.pop("hoptrace.nat.addresses_of")
            described = attributes.pop("hoptrace.nat.packet_id")
            assert attributes == {"hoptrace.nat.kind": "DNAT+SNAT", **before, **after}, span
            if describes:
                assert (of, described) == ("packet", packet_id)
            else:  # the last packet that described its addresses before this one left
                assert of == "trace" and (described & ID_SEQ_MASK) % 64 == 1, (packet_id, described)
    assert own == 3


@pytest.mark.timeout(120)
def test_a_dropped_packet_is_an_error_span_with_its_drop(topology, influxd, jaeger) -> None:  # noqa: F811
    spec = vxlan_path_spec(topology, "otlp-drops", port=DROP_PORT, tc_only=True)
    spec.drops = True
    hops = [h.name for h in spec.hops]
    lost_in = "b-wire-in>b-vxlan-in"
    since = datetime.now(UTC)
    topology.drop_flow_on_wire(DROP_PER_MILLE, DROP_PORT)
    try:
        with running_cluster(
            topology, influxd.url, collector_args=otlp_args(jaeger, "--otlp-drops")
        ) as cluster:
            cluster.apply(spec)
            sender = UdpSender(topology, "c1", "c2", DROP_PORT, rate_pps=400).start()
            wait_until(lambda: sender.sent >= 300, "300 datagrams sent", 10)
            sent = sender.stop()
            dropped = topology.dropped_on_wire()
            assert 0 < dropped < sent

            def lost_traces() -> dict | None:
                cluster.check_running()
                found = jaeger_traces(jaeger, spec.name, since)
                lost = {
                    k: v
                    for k, v in found.items()
                    if any(s["name"] == lost_in for s in v) and len(v) == hops.index("b-wire-in") + 2
                }
                return lost if len(lost) >= dropped else None

            traces = wait_until(lost_traces, f"{dropped} dropped packets' traces in jaeger", 30, 0.5)
    finally:
        topology.stop_dropping()
    assert len(traces) == dropped  # each dropped packet once, none of the others
    reached = [f"{a}>{b}" for a, b in zip(hops, hops[1 : hops.index("b-wire-in") + 1], strict=False)]
    for spans in traces.values():
        by_name = {s["name"]: s for s in spans}
        root = by_name.pop(spec.name)
        assert root["attributes"]["hoptrace.complete"] is False
        assert set(by_name) == {*reached, lost_in}
        for name in reached:
            assert by_name[name].get("status", {}).get("code") in (None, 0, "STATUS_CODE_UNSET"), by_name[
                name
            ]
        lost = by_name[lost_in]
        assert lost["status"]["message"] == "NETFILTER_DROP", lost["status"]
        assert lost["status"]["code"] in (2, "STATUS_CODE_ERROR"), lost["status"]
        (event,) = lost["events"]
        assert event["name"] == "drop"
        assert event["attributes"] == {
            "hoptrace.drop.reason": "NETFILTER_DROP",
            "hoptrace.drop.function": "nft_do_chain",
            "hoptrace.drop.node": "host-b",
        }
        # lost after its time at b-wire-in, where the rule sits (wire0's ingress, after tc's)
        wire = by_name[reached[-1]]
        at = int(wire["startTimeUnixNano"]) + wire["attributes"]["hoptrace.latency_ns"]
        assert int(lost["startTimeUnixNano"]) == at
        assert int(event["timeUnixNano"]) == int(lost["endTimeUnixNano"]) >= int(lost["startTimeUnixNano"])
        assert int(root["endTimeUnixNano"]) == int(event["timeUnixNano"])
