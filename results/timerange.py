"""The time range of a results query (GetReport, GetPackets): times as users write them and the one check of a
range, made by the dispatcher before any query runs, so that an empty range is the user's mistake named in one
line (INVALID_ARGUMENT), never the store's failure.

A time is an ISO 8601 time (``2025-03-01T14:05:00Z``; without a zone it is UTC) or a duration ago (``10m``:
ten minutes before now, hoptrace.common.durations). An unset start is DEFAULT_RANGE_S before the end's now;
an unset end is now.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

from hoptrace.common.durations import parse_duration_ns

DEFAULT_RANGE_S = 3600  # GetReport's and GetPackets' range when the request sets no start
_NS = 1_000_000_000


def parse_time(text: str, now_ns: int | None = None) -> int:
    """Nanoseconds since the epoch of `text`: an ISO 8601 time (UTC when it names no zone) or a duration
    before `now_ns` (default: now). ValueError naming the text and both forms otherwise."""
    value = text.strip()
    now = time.time_ns() if now_ns is None else now_ns
    try:
        return now - parse_duration_ns(value)
    except ValueError as error:
        if "longer than the limit" in str(error):
            raise
    try:
        moment = datetime.fromisoformat(value.replace("z", "Z"))
    except ValueError:
        raise ValueError(
            f"{text!r} is not a time: use an ISO 8601 time in UTC (2025-03-01T14:05:00Z) or a duration"
            " ago (10m)"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    delta = moment - datetime(1970, 1, 1, tzinfo=UTC)
    return (delta.days * 86_400 + delta.seconds) * _NS + delta.microseconds * 1_000


def utc_text(ns: int) -> str:
    """`ns` since the epoch as an ISO 8601 UTC time to the second, or finer when it has a fraction
    (2025-03-01T14:05:00Z, 2025-03-01T14:05:00.250000Z)."""
    moment = datetime.fromtimestamp(ns // _NS, tz=UTC)
    fraction = ns % _NS
    text = moment.strftime("%Y-%m-%dT%H:%M:%S")
    return f"{text}.{fraction // 1000:06d}Z" if fraction >= 1000 else f"{text}Z"


def range_problem(start_ns: int | None, end_ns: int | None, now_ns: int | None = None) -> str | None:
    """Why the range from `start_ns` to `end_ns` (None: the defaults) holds no time, None when it holds
    some. An unset start is DEFAULT_RANGE_S before the end: only a start set at or after the end fails."""
    if start_ns is None:
        return None
    now = time.time_ns() if now_ns is None else now_ns
    end = now if end_ns is None else end_ns
    end_said = f"end {utc_text(end)}" if end_ns is not None else f"end (now, {utc_text(end)})"
    if end < start_ns:
        return f"{end_said} is before start {utc_text(start_ns)}: the range holds no time"
    if end == start_ns:
        return f"{end_said} is the start: the range holds no time"
    return None


def request_range_problem(request: Any, now_ns: int | None = None) -> str | None:
    """range_problem of a GetReportRequest or GetPacketsRequest (its optional `start` and `end`)."""
    start = request.start.ToNanoseconds() if request.HasField("start") else None
    end = request.end.ToNanoseconds() if request.HasField("end") else None
    return range_problem(start, end, now_ns)
