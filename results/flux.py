"""Flux, as the store writes it: quoted strings, time expressions, a query's records and a request's range."""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

from google.protobuf.timestamp_pb2 import Timestamp
from influxdb_client.client.flux_table import FluxRecord

from hoptrace.results.timerange import DEFAULT_RANGE_S

_DURATION = re.compile(r"^(\d+(ns|us|µs|ms|s|m|h|d|w))+$")


def flux_string(s: str) -> str:
    """`s` as a Flux string literal (quotes, backslashes and interpolations escaped)."""
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"').replace("${", "\\${") + '"'


def flux_time(value: str | datetime | Timestamp | None, default: str) -> str:
    """A Flux time expression: a duration like "10m" (meaning -10m), a datetime/Timestamp, or `default`."""
    if (
        value is None
        or value == ""
        or (isinstance(value, Timestamp) and not value.seconds and not value.nanos)
    ):
        return default
    if isinstance(value, Timestamp):
        dt = value.ToDatetime(tzinfo=UTC)
        return dt.strftime("%Y-%m-%dT%H:%M:%S") + f".{value.nanos:09d}Z"
    if isinstance(value, datetime):
        dt = value.astimezone(UTC)
        return dt.strftime("%Y-%m-%dT%H:%M:%S") + f".{dt.microsecond:06d}000Z"
    text = value.lstrip("-")
    if not _DURATION.match(text):
        raise ValueError(f"bad duration {value!r}: use e.g. 30s, 10m, 1h, 1h30m")
    return "-" + text


def request_range(request: Any) -> tuple[str, str]:
    """The Flux start and stop of a request with optional `start` and `end` (GetReport, GetPackets): unset
    end = now, unset start = DEFAULT_RANGE_S before the end. A start after the end is refused before this
    (hoptrace.results.timerange.range_problem): Flux would fail on it with an error of its own."""
    if request.HasField("start"):
        start = flux_time(request.start, "")
    elif request.HasField("end"):
        default = Timestamp()
        default.FromNanoseconds(request.end.ToNanoseconds() - DEFAULT_RANGE_S * 1_000_000_000)
        start = flux_time(default, "")
    else:
        start = f"-{DEFAULT_RANGE_S}s"
    stop = flux_time(request.end if request.HasField("end") else None, "now()")
    return start, stop


def records(query_api: Any, org: str, query: str) -> Iterator[FluxRecord]:
    """Every record of every table `query` returns."""
    for table in query_api.query(query, org=org):
        yield from table.records
