"""Grafana cannot run here: every Flux query of every provisioned dashboard (and of the `trace` variable) runs
against the real InfluxDB, filled by a real trace, with Grafana's macros substituted, and must return data."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from influxdb_client import InfluxDBClient

pytestmark = pytest.mark.kernel  # traced_influx's agents load BPF here

REPO = Path(__file__).resolve().parents[2]
GRAFANA = REPO / "deploy" / "grafana"
DASHBOARDS = sorted((GRAFANA / "dashboards").glob("*.json"))
# What Grafana puts in place of its Flux macros for a "last hour" view.
MACROS = {"v.timeRangeStart": "-1h", "v.timeRangeStop": "now()", "v.windowPeriod": "5s"}


def stored_report(traced_influx: Any) -> dict[str, Any]:
    """`hoptrace report --json` of the traced trace over the last hour, as the dashboards' ground truth."""
    from hoptrace.results.report_view import report_from_proto
    from hoptrace.results.store import read_report

    data = read_report(
        traced_influx.trace,
        url=traced_influx.url,
        bucket=traced_influx.bucket,
        since="1h",
        path=traced_influx.hops,
    )
    return report_from_proto(data)


def panels(board: dict[str, Any]) -> list[dict[str, Any]]:
    """Every panel, rows' nested panels included."""
    found = []
    for panel in board.get("panels", []):
        found.append(panel)
        found.extend(panel.get("panels", []))
    return found


def flux_queries() -> list[tuple[str, str]]:
    """(dashboard/panel/refId, Flux) of every target of every dashboard."""
    queries = []
    for path in DASHBOARDS:
        board = json.loads(path.read_text())
        for panel in panels(board):
            for target in panel.get("targets", []):
                queries.append((f"{path.stem} / {panel['title']} / {target['refId']}", target["query"]))
    return queries


def substitute(query: str, trace: str, bucket: str) -> str:
    """The query as Grafana sends it: template variables and time macros filled in."""
    query = query.replace("${trace}", trace).replace("${bucket}", bucket)
    for macro, value in MACROS.items():
        query = query.replace(macro, value)
    assert "${" not in query and "v." not in re.sub(r'"[^"]*"', "", query), query
    return query


def run_flux(url: str, query: str) -> list[list[dict[str, Any]]]:
    """Tables (each a list of records' values) of a Flux query."""
    with InfluxDBClient(url=url, token="", org="-", timeout=60_000) as client:
        return [[record.values for record in table.records] for table in client.query_api().query(query)]


def test_dashboards_are_provisioned_with_a_trace_variable_and_the_flux_datasource():
    assert [path.name for path in DASHBOARDS] == [
        "hoptrace-actions.json",
        "hoptrace-agents.json",
        "hoptrace-latency.json",
        "hoptrace-loss-throughput.json",
    ]
    datasource = yaml.safe_load((GRAFANA / "datasources" / "influxdb.yaml").read_text())["datasources"][0]
    assert datasource["type"] == "influxdb" and datasource["jsonData"]["version"] == "Flux"
    provider = yaml.safe_load((GRAFANA / "dashboards" / "provider.yaml").read_text())["providers"][0]
    assert provider["type"] == "file" and provider["options"]["path"].endswith("/hoptrace")
    uids = set()
    for path in DASHBOARDS:
        board = json.loads(path.read_text())
        uids.add(board["uid"])
        names = [variable["name"] for variable in board["templating"]["list"]]
        assert "trace" in names, path
        for panel in panels(board):
            assert panel["datasource"]["uid"] == datasource["uid"], (path, panel["title"])
            assert panel["targets"], (path, panel["title"])
    assert len(uids) == len(DASHBOARDS)
    titles = " ".join(
        panel["title"].lower() for path in DASHBOARDS for panel in panels(json.loads(path.read_text()))
    )
    for topic in (
        "decomposition",
        "percentiles",
        "loss",
        "jitter",
        "throughput",
        "tracer",
        "lost_events",
        "clock",
        "hop counts",
        "hop histograms",
        "event counts",
        "event histograms",
        "recorded values",
    ):
        assert topic in titles, topic


def test_trace_variable_lists_the_traced_trace(traced_influx):
    board = json.loads((GRAFANA / "dashboards" / "hoptrace-latency.json").read_text())
    variable = next(v for v in board["templating"]["list"] if v["name"] == "trace")
    tables = run_flux(traced_influx.url, substitute(variable["query"], "", traced_influx.bucket))
    values = {record["_value"] for table in tables for record in table}
    assert traced_influx.trace in values, values


@pytest.mark.parametrize(("where", "query"), flux_queries(), ids=[where for where, _ in flux_queries()])
def test_every_dashboard_query_returns_series(traced_influx, where, query):
    tables = run_flux(traced_influx.url, substitute(query, traced_influx.trace, traced_influx.bucket))
    series = [table for table in tables if table]
    assert series, f"{where}: no series\n{query}"
    values = [record.get("_value") for table in series for record in table]
    assert any(value is not None for value in values) or any(
        len(record) > 3 for table in series for record in table
    ), f"{where}: only empty values"


def test_dashboard_sketch_percentiles_use_the_collectors_bucket_width():
    """The dashboards turn bucket fields into values with the collector's gamma, written out in Flux."""
    from hoptrace.collector.sketch import GAMMA

    sketched = [query for _, query in flux_queries() if "b[pnz]" in query]
    assert len(sketched) == 4, "the decomposition's three percentiles and the table read the sketches"
    for query in sketched:
        assert re.findall(r"\d+\.\d{10,}", query) == [repr(GAMMA)] * 2, query


def test_dashboard_table_agrees_with_the_report(traced_influx):
    """The percentiles table merges the same sketches as `hoptrace report`: the same count, mean and max,
    and the same p50/p90/p99 (the report rounds them to whole ns)."""

    board = json.loads((GRAFANA / "dashboards" / "hoptrace-latency.json").read_text())
    table = next(p for p in panels(board) if p["title"].startswith("Segment percentiles"))
    query = substitute(table["targets"][0]["query"], traced_influx.trace, traced_influx.bucket)
    rows = {row["segment"]: row for t in run_flux(traced_influx.url, query) for row in t}
    report = stored_report(traced_influx)
    assert len(rows) == len(report["segments"]) == len(traced_influx.hops) - 1
    for segment in report["segments"]:
        row = rows[f"{segment['from']}>{segment['to']}"]
        assert segment["count"] > 0 and row["count"] == segment["count"], (row, segment)
        assert row["max"] == segment["max_ns"]
        assert abs(row["mean"] - segment["mean_ns"]) <= 1e-6 * abs(segment["mean_ns"]) + 1e-6
        for key in ("p50", "p90", "p99"):
            assert abs(row[key] - segment[f"{key}_ns"]) <= 0.5, (key, row, segment)


def actions_panel(title_start: str) -> dict[str, Any]:
    board = json.loads((GRAFANA / "dashboards" / "hoptrace-actions.json").read_text())
    return next(p for p in panels(board) if p["title"].startswith(title_start))


def panel_bars(traced_influx: Any, title_start: str) -> dict[str, int]:
    """A bar gauge panel of the actions dashboard as Grafana draws it: one bar per row, label -> value."""
    query = substitute(
        actions_panel(title_start)["targets"][0]["query"], traced_influx.trace, traced_influx.bucket
    )
    tables = run_flux(traced_influx.url, query)
    assert len(tables) == 1, f"{title_start}: one table, one bar per row ({len(tables)} tables)"
    return {row["label"]: row["_value"] for row in tables[0]}


def test_actions_dashboard_shows_the_reports_hop_counts_histograms_and_events(traced_influx):
    """Each panel of the actions dashboard returns what was written: the event probe's count and histogram
    equal the datagrams sent; the hops' counts and histograms equal `hoptrace report`'s (the kernel counted
    the burst too, which the receiver may not all get)."""
    sent = traced_influx.event_sent
    data = stored_report(traced_influx)
    deadline = time.monotonic() + 30  # event results come with the agents' counters, every second
    while time.monotonic() < deadline and sum(e["count"] for e in data["events"]) < sent:
        time.sleep(1)
        data = stored_report(traced_influx)

    (event,) = data["events"]
    assert (event["name"], event["node"], event["count"]) == ("wire-frames", "host-a", sent), event
    events = panel_bars(traced_influx, "Event counts by key")
    assert events == {f"wire-frames @ host-a: cpu {cpu}": n for cpu, n in event["by"].items()}, events
    assert sum(events.values()) == sent
    # One frame size, one log2 bucket: 1203 bytes are in [1024, 2047].
    assert panel_bars(traced_influx, "Event histograms") == {"wire-frames @ host-a: len <= 2047": sent}

    hops = {h["hop"]: h for h in data["hops"]}
    wire = hops["b-wire-in"]
    counts = panel_bars(traced_influx, "Hop counts by key")
    assert counts == {f"b-wire-in @ host-b: cpu {c['key']}": c["count"] for c in wire["counts"]}, counts
    assert sum(counts.values()) >= 300  # at least the steady datagrams, all delivered
    histograms = panel_bars(traced_influx, "Hop histograms")
    expected = {
        f"{hop} @ {g['node']}: {g['field']} <= {b['le']}" + (" ns" if g["field"] == "latency" else ""): b[
            "count"
        ]
        for hop in ("b-wire-in", "a-veth-in")
        for g in hops[hop]["histograms"]
        for b in g["buckets"]
    }
    assert histograms == expected, histograms
    assert {label.split(":")[1].split("<=")[0].strip() for label in histograms} == {"len", "latency"}
    assert sum(v for k, v in histograms.items() if k.startswith("b-wire-in")) == sum(counts.values())

    # Over time: the windows of each count add up to the same totals.
    over_time = actions_panel("Hop counts over time")["targets"][0]["query"]
    tables = run_flux(traced_influx.url, substitute(over_time, traced_influx.trace, traced_influx.bucket))
    summed = {f"b-wire-in @ host-b: cpu {t[0]['key']}": sum(r["_value"] for r in t) for t in tables if t}
    assert summed == counts, summed


def test_actions_dashboard_shows_the_reports_recorded_values(traced_influx):
    """The recorded-values table: at b-wire-in every traced datagram's wire frame and TTL, so min = max = the
    sent size and the sent TTL, one row per field, its packets = what the hop's in-kernel count counted (the
    steady datagrams and the burst), and every number the same as `hoptrace report`'s."""

    query = substitute(
        actions_panel("Hop recorded values")["targets"][0]["query"], traced_influx.trace, traced_influx.bucket
    )
    tables = run_flux(traced_influx.url, query)
    assert len(tables) == 1, f"one table, one row per (hop, node, field) ({len(tables)} tables)"
    rows = {(r["hop"], r["node"], r["field"]): r for r in tables[0]}
    assert set(rows) == {("b-wire-in", "host-b", "len"), ("b-wire-in", "host-b", "ttl")}, rows
    report = stored_report(traced_influx)
    wire = next(h for h in report["hops"] if h["hop"] == "b-wire-in")
    counted = sum(c["count"] for c in wire["counts"])
    assert counted >= 300, wire["counts"]  # at least the steady datagrams, all delivered
    for field, sent, unit in (
        ("len", traced_influx.traced_frame, "bytes"),
        ("ttl", traced_influx.traced_ttl, ""),
    ):
        row = rows[("b-wire-in", "host-b", field)]
        assert (row["min"], row["max"], row["last"], row["mean"]) == (sent, sent, sent, float(sent)), row
        assert row["packets"] == counted, (row, counted)
        assert (row["unit"] or "") == unit, row  # an empty string arrives as null (an empty cell)
        (recorded,) = [r for r in wire["recorded"] if r["field"] == field]
        assert {k: recorded[k] for k in ("node", "count", "min", "max", "last")} == {
            "node": row["node"],
            "count": row["packets"],
            "min": row["min"],
            "max": row["max"],
            "last": row["last"],
        }, (recorded, row)
        assert abs(recorded["mean"] - row["mean"]) < 1e-9, (recorded, row)


def test_actions_dashboard_shows_the_events_recorded_arguments(traced_influx):
    """The event recorded-arguments table: `wire-frames` records net_dev_xmit's len of the frames it matched
    (one size), so hits = the datagrams sent and min = max = last = mean = the frame's length, the same as
    `hoptrace report`'s events[].recorded."""

    sent = traced_influx.event_sent
    query = substitute(
        actions_panel("Event recorded arguments")["targets"][0]["query"],
        traced_influx.trace,
        traced_influx.bucket,
    )
    deadline = time.monotonic() + 30  # event results come with the agents' counters, every second
    while True:
        tables = run_flux(traced_influx.url, query)
        rows = {(r["event"], r["node"], r["arg"]): r for t in tables for r in t}
        row = rows.get(("wire-frames", "host-a", "len"))
        if (row and row["hits"] >= sent) or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert len(tables) == 1 and set(rows) == {("wire-frames", "host-a", "len")}, rows
    frame = traced_influx.event_frame
    assert (row["hits"], row["min"], row["max"], row["last"], row["mean"]) == (
        sent,
        frame,
        frame,
        frame,
        frame,
    )
    report = stored_report(traced_influx)
    (event,) = report["events"]
    (recorded,) = event["recorded"]
    assert {k: recorded[k] for k in ("arg", "count", "min", "max", "last")} == {
        "arg": "len", "count": row["hits"], "min": row["min"], "max": row["max"], "last": row["last"],
    }  # fmt: skip
