"""What the collector wrote to InfluxDB, read back directly: the tests' and benchmarks' view of the store
(the product reads it only through hoptrace.results.store)."""

from __future__ import annotations

from typing import Any

from influxdb_client import InfluxDBClient

BUCKET = "hoptrace/autogen"  # LocalCluster's default
# Collector flags that keep every packet as an exemplar (one hop_latency point per packet and segment), for
# tests and benchmarks that compare packet by packet with a ground truth.
EVERY_PACKET = ("--exemplar-every", "1")


def flux(influx_url: str, query: str) -> list[dict[str, Any]]:
    """Run a Flux query; returns every record's values."""
    with InfluxDBClient(url=influx_url, token="", org="-", timeout=30_000) as client:
        tables = client.query_api().query(query)
    return [record.values for table in tables for record in table.records]


def segment_counts(influx_url: str, trace: str) -> dict[str, int]:
    """Packets counted per segment of a trace (end_to_end included): the `count` of its `segment_stats`
    windows summed over time and collectors, from InfluxDB itself."""
    rows = flux(
        influx_url,
        f'from(bucket: "{BUCKET}") |> range(start: -1h) '
        f'|> filter(fn: (r) => r._measurement == "segment_stats" and r.trace == "{trace}" '
        f'and r._field == "count") |> group(columns: ["segment"]) |> sum()',
    )
    return {row["segment"]: int(row["_value"]) for row in rows}


def distinct_packets(influx_url: str, trace: str) -> dict[str, int]:
    """Distinct packet IDs in hop_latency per segment: what "no packet missing" is about. hop_latency holds
    the exemplars: every packet only with the collector's `--exemplar-every 1` (EVERY_PACKET)."""
    rows = flux(
        influx_url,
        f'from(bucket: "{BUCKET}") |> range(start: -1h) '
        f'|> filter(fn: (r) => r._measurement == "hop_latency" and r.trace == "{trace}" '
        f'and r._field == "packet_id") |> group(columns: ["segment"]) |> distinct() |> count()',
    )
    return {row["segment"]: int(row["_value"]) for row in rows}


def segment_latencies(influx_url: str, trace: str, segment: str) -> dict[int, int]:
    """packet_id -> latency_ns of one segment, from InfluxDB (the exemplars: every packet only with the
    collector's `--exemplar-every 1`, EVERY_PACKET)."""
    rows = flux(
        influx_url,
        f'from(bucket: "{BUCKET}") |> range(start: -1h) '
        f'|> filter(fn: (r) => r._measurement == "hop_latency" and r.trace == "{trace}" '
        f'and r.segment == "{segment}") '
        f'|> pivot(rowKey: ["_time"], columnKey: ["_field"], valueColumn: "_value")',
    )
    return {int(row["packet_id"]): int(row["latency_ns"]) for row in rows}
