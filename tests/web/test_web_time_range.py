"""A results range that holds no time (its end before its start) is the user's mistake, named in one line
with both ends, for the API (INVALID_ARGUMENT), the CLI (exit 1, `error: end ... is before start ...`) and the
web (400): it reached InfluxDB, and came back as UNAVAILABLE with InfluxDB's 500 and the Flux query. An end
alone takes the hour before it.

Real InfluxDB with what the collector writes, a real dispatcher reading it (the `glance` fixture)."""

from __future__ import annotations

import html
import os
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import grpc
import pytest
from stored_results import PACKETS, Glance, logged_in
from web_helpers import web_config

from hoptrace.v1 import api_pb2, api_pb2_grpc
from hoptrace.web import create_app

HOPTRACE = Path(sys.executable).parent / "hoptrace"
MINUTE_NS = 60 * 1_000_000_000
# A range whose end (20 minutes ago) is before its start (10 minutes ago), as each client writes it.
START_TEXT, END_TEXT = "10m", "20m"


def iso(ns: int) -> str:
    return datetime.fromtimestamp(ns // 1_000_000_000, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def api(glance: Glance) -> api_pb2_grpc.HoptraceStub:
    return api_pb2_grpc.HoptraceStub(grpc.insecure_channel(glance.dispatcher.address))


@pytest.mark.parametrize("method", ["GetReport", "GetPackets"])
def test_the_api_refuses_an_end_before_its_start_naming_both(glance: Glance, method: str) -> None:
    now = time.time_ns() // 1_000_000_000 * 1_000_000_000
    request = (api_pb2.GetReportRequest if method == "GetReport" else api_pb2.GetPacketsRequest)(
        trace=glance.trace
    )
    request.start.FromNanoseconds(now - 10 * MINUTE_NS)
    request.end.FromNanoseconds(now - 20 * MINUTE_NS)
    with pytest.raises(grpc.RpcError) as caught:
        getattr(api(glance), method)(request, timeout=30)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT, caught.value.details()
    end, start = iso(now - 20 * MINUTE_NS), iso(now - 10 * MINUTE_NS)
    assert caught.value.details() == f"end {end} is before start {start}: the range holds no time"


def test_an_end_alone_takes_the_hour_before_it(glance: Glance) -> None:
    """An end 2 h ago without a start: the hour before it (nothing stored there, so no such trace), not a
    Flux range from 1 h ago back to 2 h ago."""
    stub = api(glance)
    request = api_pb2.GetReportRequest(trace=glance.trace)
    request.end.FromNanoseconds(time.time_ns() - 120 * MINUTE_NS)
    with pytest.raises(grpc.RpcError) as caught:
        stub.GetReport(request, timeout=30)
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND, caught.value.details()
    request.end.FromNanoseconds(time.time_ns() + MINUTE_NS)  # the hour before a minute from now: the data
    assert stub.GetReport(request, timeout=30).packets == PACKETS


def hoptrace(glance: Glance, *args: str) -> subprocess.CompletedProcess:
    environ = {key: value for key, value in os.environ.items() if not key.startswith("HOPTRACE_")}
    command = [str(HOPTRACE), "--insecure", "--dispatcher", glance.dispatcher.address, *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=60, env=environ, check=False)


@pytest.mark.parametrize("command", ["report", "packets"])
def test_the_cli_says_the_end_is_before_the_start_in_one_line(glance: Glance, command: str) -> None:
    result = hoptrace(glance, command, glance.trace, "--start", START_TEXT, "--end", END_TEXT)
    assert result.returncode == 1, (result.returncode, result.stdout, result.stderr)
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: end "), result.stderr
    assert " is before start " in lines[0] and "Flux" not in lines[0] and "500" not in lines[0], lines
    # The same range the right way round reads the stored report.
    good = hoptrace(glance, command, glance.trace, "--start", END_TEXT, "--end", "0s", "--json")
    assert good.returncode == 0, good.stderr
    assert str(PACKETS) in good.stdout
    iso_start = iso(time.time_ns() - 30 * MINUTE_NS)
    good = hoptrace(glance, command, glance.trace, "--start", iso_start, "--json")
    assert good.returncode == 0, good.stderr
    bad_time = hoptrace(glance, command, glance.trace, "--end", "yesterday")
    assert bad_time.returncode == 2 and "argument --end: 'yesterday' is not a time" in bad_time.stderr


def test_the_web_answers_400_with_the_reason(glance: Glance) -> None:
    client = logged_in(create_app(web_config(DISPATCHER=glance.dispatcher.address)))
    query = f"start={START_TEXT}&end={END_TEXT}"
    for page in ("results", "results.json", "packets"):
        response = client.get(f"/traces/{glance.trace}/{page}?{query}")
        assert response.status_code == 400, (page, response.status_code, response.text)
        text = html.unescape(response.text)
        assert " is before start " in text and "Flux" not in text, (page, text)
    data = client.get(f"/traces/{glance.trace}/results.json?start=30m&end=0s").json
    assert data["report"]["packets"] == PACKETS
    page = client.get(f"/traces/{glance.trace}/results?start=30m&end=0s")
    assert page.status_code == 200
    assert "start=30m" in page.text and "end=0s" in page.text  # the poll and the packets link keep the range
    response = client.get(f"/traces/{glance.trace}/results?end=soon")
    assert response.status_code == 400 and "end: 'soon' is not a time" in html.unescape(response.text)
