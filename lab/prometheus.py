"""Reading a component's Prometheus /metrics (the collector's, an agent's) in tests and benchmarks."""

from __future__ import annotations

import re
import urllib.request

_SAMPLE = re.compile(r"^([a-z_]+(?:\{[^}]*\})?) (\S+)$")


def scrape(addr: str) -> dict[str, float]:
    """GET http://ADDR/metrics: {"name{labels}": value} (comments left out)."""
    with urllib.request.urlopen(f"http://{addr}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if m and not line.startswith("#"):
            out[m.group(1)] = float(m.group(2))
    return out
