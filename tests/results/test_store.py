"""store.py and flux.py: the pieces of the Flux queries that need no InfluxDB (the queries run against a
real one in tests/collector/test_integration.py and test_sketch_store.py)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from google.protobuf.timestamp_pb2 import Timestamp

from hoptrace.results.flux import flux_time
from hoptrace.results.store import _order

pytestmark = pytest.mark.unit  # pure code: make test-unit runs it without root


def test_segment_order_from_path_or_chain() -> None:
    pairs = {"b>c": ("b", "c"), "a>b": ("a", "b"), "c>d": ("c", "d")}
    assert _order(pairs, None) == ["a>b", "b>c", "c>d"]
    assert _order(pairs, ["a", "b", "c", "d"]) == ["a>b", "b>c", "c>d"]
    assert _order({"b>c": ("b", "c")}, ["a", "b", "c"]) == ["a>b", "b>c"]


def test_flux_time() -> None:
    assert flux_time("10m", "-1h") == "-10m"
    assert flux_time("-1h30m", "-1h") == "-1h30m"
    assert flux_time(None, "now()") == "now()"
    assert flux_time(Timestamp(seconds=0), "now()") == "now()"
    assert flux_time(Timestamp(seconds=1_700_000_000, nanos=5), "") == "2023-11-14T22:13:20.000000005Z"
    assert flux_time(datetime(2024, 1, 2, 3, 4, 5, 6, tzinfo=UTC), "") == "2024-01-02T03:04:05.000006000Z"
    with pytest.raises(ValueError):
        flux_time("10 minutes); drop()", "-1h")
