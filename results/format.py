"""How durations and times read in every view: one format for the CLI's tables, the web and the views."""

from __future__ import annotations

from datetime import UTC

from google.protobuf.timestamp_pb2 import Timestamp

# What a latency within its segment's clock bound reads as (its sign and size cannot be told from zero).
WITHIN_CLOCK_BOUND = "within clock bound"


def format_ns(ns: float) -> str:
    """Human-readable duration: 850ns, 12.3us, 4.56ms, 1.20s."""
    a = abs(ns)
    if a < 1_000:
        return f"{ns:.0f}ns"
    if a < 1_000_000:
        return f"{ns / 1e3:.1f}us"
    if a < 1_000_000_000:
        return f"{ns / 1e6:.2f}ms"
    return f"{ns / 1e9:.2f}s"


def timestamp_text(timestamp: Timestamp) -> str:
    """A Timestamp as ISO text to the second, "-" when unset."""
    if not timestamp.seconds and not timestamp.nanos:
        return "-"
    return timestamp.ToDatetime(tzinfo=UTC).isoformat(timespec="seconds")
