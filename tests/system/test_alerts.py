"""Metrics users alert on, scraped during a traced flow; the shipped alert rules checked against them."""

from __future__ import annotations

import urllib.request
from pathlib import Path

import promql_parser
import yaml
from prometheus_client.parser import text_string_to_metric_families
from system_helpers import running_cluster, wait_report

from hoptrace.lab.reference import vxlan_path_spec

ALERTS = Path(__file__).resolve().parents[2] / "deploy" / "prometheus" / "alerts.yaml"
PACKETS = 200


def scrape(address: str) -> dict[str, list]:
    """/metrics of a component: samples by sample name (histogram parts under their own names); a family
    without samples yet (a counter of what has not happened) is listed with none."""
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=5) as response:
        text = response.read().decode()
    samples: dict[str, list] = {}
    for family in text_string_to_metric_families(text):
        if family.type == "counter":
            samples.setdefault(family.name + "_total", [])
        for sample in family.samples:
            samples.setdefault(sample.name, []).append(sample)
    return samples


def selected_metrics(expr: str) -> set[str]:
    """The metric names an alert expression selects (it must parse as PromQL)."""
    names: set[str] = set()

    def visit(node: object) -> None:
        if isinstance(node, promql_parser.VectorSelector) and node.name:
            names.add(node.name)

    promql_parser.walk(promql_parser.parse(expr), visit)
    return names


def test_segment_metrics_count_every_packet_and_every_alert_selects_real_series(topology, influxd):
    from hoptrace.lab.processes import udp_transfer

    spec = vxlan_path_spec(topology, "alerting")
    hops = [hop.name for hop in spec.hops]
    with running_cluster(topology, influxd.url) as cluster:
        cluster.apply(spec)
        payloads = [bytes([i % 256]) * 64 for i in range(PACKETS)]
        assert udp_transfer(topology, "c1", "c2", payloads, 4, 11111, 0.002) == payloads
        wait_report(cluster, "alerting", PACKETS)
        collector = scrape(cluster.metrics_addr("collector"))
        agents = [scrape(cluster.metrics_addr(f"agent-{node}")) for node in ("host-a", "host-b")]

    counts = {
        s.labels["segment"]: s.value
        for s in collector["hoptrace_segment_latency_seconds_count"]
        if s.labels["trace"] == "alerting"
    }
    segments = [f"{a}>{b}" for a, b in zip(hops, hops[1:], strict=False)]
    assert counts == {**dict.fromkeys(segments, PACKETS), "end_to_end": PACKETS}
    for segment in segments:
        buckets = [
            s for s in collector["hoptrace_segment_latency_seconds_bucket"] if s.labels["segment"] == segment
        ]
        values = [s.value for s in sorted(buckets, key=lambda s: float(s.labels["le"]))]
        assert values == sorted(values) and values[-1] == PACKETS, (segment, values)
        assert values[0] < PACKETS, f"{segment}: every packet under 1 us?"
    lost = {s.labels["segment"]: s.value for s in collector["hoptrace_segment_lost_packets_total"]}
    assert set(lost) >= set(segments) and not any(lost.values()), lost

    rules = [rule for group in yaml.safe_load(ALERTS.read_text())["groups"] for rule in group["rules"]]
    assert len(rules) >= 4
    scraped = set(collector).union(*agents)
    for rule in rules:
        missing = selected_metrics(rule["expr"]) - scraped
        assert not missing, f"alert {rule['alert']} selects {missing}, which nothing exports"
