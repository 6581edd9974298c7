"""One duration syntax for every flag and field: a number with a unit, or several (``1h30m``).

Units: ``ns``, ``us`` (or ``µs``), ``ms``, ``s``, ``m``, ``h``, ``d``, ``w``; a bare number is in seconds
(a caller may choose another unit, as the delay box does with microseconds, tc's). The same words as Go's
time.ParseDuration (which the agent's flags use), plus ``d`` and ``w``.

A duration is at most 10 years (MAX_DURATION_NS): a time range that long already reaches before any stored
result, and a longer one ends before year 1, where dates and timestamps overflow.
"""

from __future__ import annotations

import re

_UNIT_NS = {"ns": 1, "us": 1_000, "µs": 1_000, "ms": 1_000_000, "s": 10**9}
_UNIT_NS["m"] = 60 * _UNIT_NS["s"]
_UNIT_NS["h"] = 60 * _UNIT_NS["m"]
_UNIT_NS["d"] = 24 * _UNIT_NS["h"]
_UNIT_NS["w"] = 7 * _UNIT_NS["d"]
_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h|d|w)")
_NUMBER = re.compile(r"\d+(?:\.\d*)?|\.\d+")
MAX_DURATION_NS = 3650 * _UNIT_NS["d"]
MAX_DURATION_TEXT = "10 years (3650d)"


def parse_duration_ns(text: str, bare_unit: str = "s") -> int:
    """Nanoseconds of `text` (``"250us"``, ``"1.5s"``, ``"1h30m"``, ``"10"`` = 10 `bare_unit`); ValueError
    naming the text when it is not a duration (a sign is never part of one) or when it is longer than
    MAX_DURATION_NS."""
    value = text.strip()
    if _NUMBER.fullmatch(value):
        total = float(value) * _UNIT_NS[bare_unit]
    else:
        pos, total = 0, 0.0
        for match in _PART.finditer(value):
            if match.start() != pos:
                break
            total += float(match.group(1)) * _UNIT_NS[match.group(2)]
            pos = match.end()
        if pos != len(value) or not value:
            raise ValueError(f"{text!r} is not a duration: use e.g. 500ms, 30s, 10m, 1h30m")
    if total > MAX_DURATION_NS:  # also a number too large for a float (inf)
        raise ValueError(f"{text!r} is longer than the limit of {MAX_DURATION_TEXT}")
    return round(total)


def parse_duration(text: str) -> float:
    """Seconds of `text` (see parse_duration_ns)."""
    return parse_duration_ns(text) / 1e9
