"""sketch.py: nearest-rank percentiles within 1 % of the exact ones, merges that equal the whole."""

from __future__ import annotations

import math
import random
from collections import Counter

import pytest

from hoptrace.collector.schema import JITTER_PREFIX
from hoptrace.collector.sketch import (
    GAMMA,
    MAPPING,
    RELATIVE_ACCURACY,
    SORTED_RUN,
    LatencySketch,
    bucket_keys,
    sketch_from_fields,
    sorted_bucket_counts,
)
from hoptrace.common.stats import quantile

pytestmark = pytest.mark.unit  # pure code: make test-unit runs it without root

QS = (0.0, 0.01, 0.25, 0.5, 0.9, 0.99, 0.999, 1.0)


def distributions() -> dict[str, list[int]]:
    rng = random.Random(14)
    return {
        # a veth hop: a few us with a long tail
        "lognormal": [max(1, round(rng.lognormvariate(math.log(2_000), 0.6))) for _ in range(20_000)],
        # two modes three orders apart (a queue that sometimes fills)
        "bimodal": [
            rng.randint(800, 1_200) if rng.random() < 0.9 else rng.randint(400_000, 900_000)
            for _ in range(20_000)
        ],
        # a cross-node segment within its clock bound: negative, zero and positive
        "around zero": [rng.randint(-400, 400) for _ in range(10_000)],
        "tiny": [1, 2, 3],
    }


@pytest.mark.parametrize("name", list(distributions()))
def test_percentiles_within_one_percent_of_the_exact_nearest_rank(name: str) -> None:
    values = distributions()[name]
    exact_sorted = sorted(values)
    sketch = LatencySketch.of(values)
    assert sketch.count == len(values)
    assert LatencySketch.of_sorted(exact_sorted).fields() == sketch.fields()
    for q in QS:
        exact = quantile(exact_sorted, q)
        got = sketch.quantile(q)
        # within the relative accuracy, plus half a nanosecond of rounding to whole ns
        assert abs(got - exact) <= RELATIVE_ACCURACY * abs(exact) + 0.5, (name, q, got, exact)
        assert abs(got - exact) <= 0.01 * abs(exact) + 0.5, (name, q, got, exact)


def test_merging_parts_is_the_sketch_of_the_whole_and_fields_round_trip() -> None:
    values = distributions()["lognormal"] + distributions()["around zero"]
    random.Random(1).shuffle(values)
    whole = LatencySketch.of(values)
    merged = LatencySketch()
    for part in range(0, len(values), 997):  # uneven parts, like windows and collectors
        merged.merge(sketch_from_fields(LatencySketch.of(values[part : part + 997]).fields()))
    assert merged.fields() == whole.fields()
    assert [merged.quantile(q) for q in QS] == [whole.quantile(q) for q in QS]
    # the jitter sketch has its own prefix: the latency's fields are not read as jitter and back
    jitter = LatencySketch.of([5, 0, 7])
    fields = {**whole.fields(), **jitter.fields(JITTER_PREFIX), "count": 3, "below_bound_count": 1}
    assert sketch_from_fields(fields, JITTER_PREFIX).fields(JITTER_PREFIX) == jitter.fields(JITTER_PREFIX)
    assert sketch_from_fields(fields).fields() == whole.fields()


def test_inlined_bucket_keys_are_the_librarys() -> None:
    rng = random.Random(3)
    values = [rng.randint(1, 10**10) for _ in range(50_000)] + [1, 2, 3, 1000, 10**12]
    values += [round(GAMMA**k) for k in range(0, 4_000, 7)]  # near bucket edges
    assert bucket_keys(values) == [MAPPING.key(v) for v in values]
    # long sorted runs are counted bucket by bucket: the same counts
    values.sort()
    assert sorted_bucket_counts(values) == Counter(MAPPING.key(v) for v in values)
    assert (
        len(values) >= SORTED_RUN
        and LatencySketch.of_sorted(values).fields() == LatencySketch.of(values).fields()
    )
    dense = sorted(rng.randint(1, 3_000) for _ in range(20_000))  # every integer of many buckets
    assert sorted_bucket_counts(dense, 5) == Counter(MAPPING.key(v) for v in dense[5:])


def test_empty_sketch() -> None:
    assert LatencySketch().quantile(0.5) == 0 and LatencySketch().count == 0 and not LatencySketch().fields()
