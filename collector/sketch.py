"""Mergeable latency sketches: DDSketch's logarithmic buckets (Datadog's `ddsketch` mapping), stored in
InfluxDB as bucket counts, one integer field per non-empty bucket, so that summing the fields over time and
over collectors is the exact merge.

Bucket `k` holds the values in (gamma^(k-1), gamma^k], gamma = (1 + a) / (1 - a), a = RELATIVE_ACCURACY; its
representative value gamma^k * 2 / (1 + gamma) is within a (relative) of every value in it (DDSketch's
guarantee, `ddsketch.mapping.LogarithmicMapping`). A latency may be negative (a cross-node segment within
its clocks' bound) or zero: negative values go to buckets of their magnitude, zero to a bucket of its own.

Field names (a contract: `report.py` and the Grafana dashboards parse them):
* `bp<k>` - positive values in bucket k (k >= 0: latencies are whole nanoseconds, so >= 1);
* `bn<k>` - negative values whose magnitude is in bucket k;
* `bz`    - zeros.
The jitter sketch (|dT(i+1) - dT(i)|, never negative) uses `jp<k>` and `jz`.

Quantiles are nearest-rank (the value at sorted index ceil(q * n) - 1, as `aggregate.quantile` and Flux
`exact_selector`), read from the bucket that holds that rank: the answer is within RELATIVE_ACCURACY of the
exact nearest-rank value, whatever was merged.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping

from ddsketch.mapping import LogarithmicMapping

# Half of the 1 % the reports promise: leaves room for rounding to whole nanoseconds. A schema constant:
# sketches written with another accuracy do not merge with these.
RELATIVE_ACCURACY = 0.005
MAPPING = LogarithmicMapping(RELATIVE_ACCURACY)
GAMMA = MAPPING.gamma

LATENCY_PREFIX = "b"
JITTER_PREFIX = "j"


class LatencySketch:
    """Bucket counts of a set of latencies (ns): `positive[k]`, `negative[k]` (by magnitude), `zeros`."""

    __slots__ = ("positive", "negative", "zeros")

    def __init__(self) -> None:
        self.positive: Counter[int] = Counter()
        self.negative: Counter[int] = Counter()
        self.zeros = 0

    @classmethod
    def of(cls, values: Iterable[int]) -> LatencySketch:
        """The sketch of `values`."""
        sketch = cls()
        sketch.add(values)
        return sketch

    def add(self, values: Iterable[int]) -> None:
        """Count `values` into their buckets."""
        key = MAPPING.key
        pos: list[int] = []
        neg: list[int] = []
        zeros = 0
        for v in values:
            if v > 0:
                pos.append(v)
            elif v < 0:
                neg.append(-v)
            else:
                zeros += 1
        self.positive.update(map(key, pos))
        if neg:
            self.negative.update(map(key, neg))
        self.zeros += zeros

    @property
    def count(self) -> int:
        """How many values the sketch holds."""
        return sum(self.positive.values()) + sum(self.negative.values()) + self.zeros

    def merge(self, other: LatencySketch) -> None:
        """Add `other`'s counts to this sketch (exact: the buckets are the same everywhere)."""
        self.positive.update(other.positive)
        self.negative.update(other.negative)
        self.zeros += other.zeros

    def fields(self, prefix: str = LATENCY_PREFIX) -> dict[str, int]:
        """The InfluxDB fields of the sketch (non-empty buckets only)."""
        out = {f"{prefix}p{k}": n for k, n in sorted(self.positive.items()) if n}
        out.update({f"{prefix}n{k}": n for k, n in sorted(self.negative.items()) if n})
        if self.zeros:
            out[f"{prefix}z"] = self.zeros
        return out

    def add_field(self, name: str, count: int, prefix: str = LATENCY_PREFIX) -> bool:
        """Count one field read back from InfluxDB; False when `name` is not a bucket of `prefix`."""
        if not name.startswith(prefix) or len(name) < len(prefix) + 1:
            return False
        kind, rest = name[len(prefix)], name[len(prefix) + 1 :]
        if kind == "z" and not rest:
            self.zeros += count
            return True
        if kind not in "pn" or not rest.isdigit():
            return False
        (self.positive if kind == "p" else self.negative)[int(rest)] += count
        return True

    def quantile(self, q: float) -> int:
        """Nearest-rank quantile (within RELATIVE_ACCURACY of the exact one); 0 for an empty sketch."""
        n = self.count
        if n == 0:
            return 0
        rank = max(math.ceil(q * n) - 1, 0)  # 0-based index in sorted order
        seen = 0
        value = MAPPING.value
        for k in sorted(self.negative, reverse=True):  # most negative first
            seen += self.negative[k]
            if rank < seen:
                return -round(value(k))
        seen += self.zeros
        if rank < seen:
            return 0
        for k in sorted(self.positive):
            seen += self.positive[k]
            if rank < seen:
                return round(value(k))
        return round(value(max(self.positive))) if self.positive else 0


def sketch_from_fields(fields: Mapping[str, int], prefix: str = LATENCY_PREFIX) -> LatencySketch:
    """The sketch of InfluxDB fields `{name: count}` (other fields are ignored)."""
    sketch = LatencySketch()
    for name, count in fields.items():
        sketch.add_field(name, int(count), prefix)
    return sketch
