"""Reading a component's Prometheus /metrics (the collector's, an agent's) in tests and benchmarks."""

from __future__ import annotations

import re
import urllib.request

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")


def scrape(addr: str, timeout_s: float = 5.0) -> dict[str, float]:
    """GET http://ADDR/metrics: {"name{labels}": value}, labels as printed (comments left out)."""
    with urllib.request.urlopen(f"http://{addr}/metrics", timeout=timeout_s) as resp:
        text = resp.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if m and not line.startswith("#"):
            out[m.group(1) + (m.group(2) or "")] = float(m.group(3))
    return out
