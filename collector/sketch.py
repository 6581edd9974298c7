"""Mergeable latency sketches: DDSketch's logarithmic buckets (Datadog's `ddsketch` mapping), stored in
InfluxDB as bucket counts, one integer field per non-empty bucket, so that summing the fields over time and
over collectors is the exact merge.

Bucket `k` holds the values in (gamma^(k-1), gamma^k], gamma = (1 + a) / (1 - a), a = RELATIVE_ACCURACY; its
representative value gamma^k * 2 / (1 + gamma) is within a (relative) of every value in it (DDSketch's
guarantee, `ddsketch.mapping.LogarithmicMapping`). A latency may be negative (a cross-node segment within
its clocks' bound) or zero: negative values go to buckets of their magnitude, zero to a bucket of its own.

Field names (a contract: `hoptrace.results.store` and the Grafana dashboards parse them; prefixes in
`schema.py`):
* `bp<k>` - positive values in bucket k (k >= 0: latencies are whole nanoseconds, so >= 1);
* `bn<k>` - negative values whose magnitude is in bucket k;
* `bz`    - zeros.
The jitter sketch (|dT(i+1) - dT(i)|, never negative) uses `jp<k>` and `jz`.

Quantiles are nearest-rank (the value at sorted index ceil(q * n) - 1, as `common.stats.quantile` and Flux
`exact_selector`), read from the bucket that holds that rank: the answer is within RELATIVE_ACCURACY of the
exact nearest-rank value, whatever was merged.
"""

from __future__ import annotations

import bisect
import math
from collections import Counter
from collections.abc import Iterable, Mapping

from ddsketch.mapping import LogarithmicMapping

from hoptrace.collector.schema import LATENCY_PREFIX

# Half of the 1 % the reports promise: leaves room for rounding to whole nanoseconds. A schema constant:
# sketches written with another accuracy do not merge with these.
RELATIVE_ACCURACY = 0.005
MAPPING = LogarithmicMapping(RELATIVE_ACCURACY)
GAMMA = MAPPING.gamma

_MULTIPLIER = MAPPING._multiplier  # noqa: SLF001 - the mapping's own constant, for the inlined key()


def bucket_keys(values: list[int]) -> list[int]:
    """`MAPPING.key(v)` of each positive value, inlined (the same float operations, a list at a time:
    about 3x faster than a method call per value)."""
    if MAPPING._offset:  # noqa: SLF001 - LogarithmicMapping(a) has none; keep key()'s result otherwise
        return [MAPPING.key(v) for v in values]
    log, ceil, multiplier = math.log, math.ceil, _MULTIPLIER
    return [ceil(log(v, 2) * multiplier) for v in values]


# From this many sorted values on, counting bucket by bucket (a few key() calls and a bisection per bucket)
# beats one key() per value: a window holds a few hundred buckets at most.
SORTED_RUN = 2048


def _key(v: int) -> int:
    return math.ceil(math.log(v, 2) * _MULTIPLIER) if not MAPPING._offset else MAPPING.key(v)  # noqa: SLF001


def sorted_bucket_counts(values: list[int], lo: int = 0) -> dict[int, int]:
    """{key: count} of the positive integers `values[lo:]`, sorted ascending: the same as counting
    `MAPPING.key(v)` of each, found bucket by bucket. key() is non-decreasing over the integers, so each
    bucket is a run; its last integer is found from gamma^k and checked with key() itself."""
    counts: dict[int, int] = {}
    n = len(values)
    i = lo
    while i < n:
        k = _key(values[i])
        top = max(values[i], int(GAMMA**k))  # about the bucket's upper bound; made exact below
        while _key(top + 1) <= k:
            top += 1
        while _key(top) > k:
            top -= 1
        j = bisect.bisect_right(values, top, lo=i)
        counts[k] = j - i
        i = j
    return counts


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

    @classmethod
    def of_sorted(cls, values: list[int]) -> LatencySketch:
        """The sketch of integer `values` sorted in ascending order: split by sign with two bisections, and
        a long positive run counted bucket by bucket (`sorted_bucket_counts`)."""
        sketch = cls()
        zero = bisect.bisect_left(values, 0)
        positive = bisect.bisect_right(values, 0, lo=zero)
        if zero:
            sketch.negative.update(bucket_keys([-v for v in values[:zero]]))
        sketch.zeros = positive - zero
        if len(values) - positive >= SORTED_RUN:
            sketch.positive.update(sorted_bucket_counts(values, positive))
        else:
            sketch.positive.update(bucket_keys(values[positive:]))
        return sketch

    def add(self, values: Iterable[int]) -> None:
        """Count `values` into their buckets."""
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
        self.positive.update(bucket_keys(pos))
        if neg:
            self.negative.update(bucket_keys(neg))
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
