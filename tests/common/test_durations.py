"""The one duration syntax of every flag and field (hoptrace.common.durations)."""

from __future__ import annotations

import pytest

from hoptrace.common.durations import parse_duration, parse_duration_ns

pytestmark = pytest.mark.unit  # pure code: make test-unit runs it without root


@pytest.mark.parametrize(
    ("text", "ns"),
    [
        ("3", 3 * 10**9),
        ("3s", 3 * 10**9),
        ("500ms", 500 * 10**6),
        ("250us", 250_000),
        ("250µs", 250_000),
        ("40ns", 40),
        ("1.5m", 90 * 10**9),
        ("1h30m", 5400 * 10**9),
        ("2d", 2 * 86400 * 10**9),
        ("1w", 7 * 86400 * 10**9),
        (" 10m ", 600 * 10**9),
        ("0", 0),
    ],
)
def test_durations_a_user_types(text: str, ns: int) -> None:
    assert parse_duration_ns(text) == ns
    assert parse_duration(text) == ns / 1e9


@pytest.mark.parametrize("text", ["", "3 days", "ten minutes", "-1s", "1x", "s", "1h-30m", "1.2.3s"])
def test_what_is_not_a_duration_is_refused_by_name(text: str) -> None:
    with pytest.raises(ValueError, match="is not a duration"):
        parse_duration_ns(text)


def test_a_bare_number_can_mean_another_unit() -> None:
    """The delay box reads a bare number in microseconds, as tc does."""
    assert parse_duration_ns("40", bare_unit="us") == 40_000


@pytest.mark.parametrize("text", ["999999999h", "3651d", "522w", "9" * 400, "1" + "0" * 400 + "s"])
def test_a_duration_longer_than_ten_years_is_refused_with_the_limit(text: str) -> None:
    """A range that long would start before year 1 (OverflowError in datetime, a 500 in the web)."""
    with pytest.raises(ValueError, match=r"is longer than the limit of 10 years \(3650d\)"):
        parse_duration_ns(text)


def test_ten_years_is_still_a_duration() -> None:
    assert parse_duration("3650d") == 3650 * 86400
