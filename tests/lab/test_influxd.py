"""The InfluxDB fixture: influxdb-client writes and Flux-reads a point through InfluxDB 1.8's v2 API."""

from __future__ import annotations

import time
import uuid

from influxdb_client import InfluxDBClient, Point
from influxdb_client.client.write_api import SYNCHRONOUS

from hoptrace.lab.processes import InfluxServer


def test_write_and_flux_query_round_trip(influxd: InfluxServer) -> None:
    trace = f"t-{uuid.uuid4().hex[:8]}"
    now_ns = time.time_ns()
    with InfluxDBClient(url=influxd.url, token=influxd.token, org=influxd.org) as client:
        point = Point("hop_latency").tag("trace", trace).tag("hop", "a-wire0").field("p50_ns", 123456)
        point = point.time(now_ns)
        client.write_api(write_options=SYNCHRONOUS).write(bucket=influxd.bucket, record=point)
        flux = f'''
            from(bucket: "{influxd.bucket}")
              |> range(start: -1h)
              |> filter(fn: (r) => r._measurement == "hop_latency" and r.trace == "{trace}")
        '''
        tables = client.query_api().query(flux, org=influxd.org)
    rows = [record for table in tables for record in table.records]
    assert len(rows) == 1
    assert rows[0].get_field() == "p50_ns" and rows[0].get_value() == 123456
    assert rows[0].values["hop"] == "a-wire0"
    assert int(rows[0].get_time().timestamp() * 1e6) == now_ns // 1000


def test_influxql_sees_the_database(influxd: InfluxServer) -> None:
    answer = influxd.query_v1("SHOW DATABASES", method="GET")
    names = [row[0] for row in answer["results"][0]["series"][0]["values"]]
    assert "hoptrace" in names
