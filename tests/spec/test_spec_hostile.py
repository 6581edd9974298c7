"""Hostile and random specs: a clear error naming a field, or a valid spec; never a traceback, never
unbounded time or memory (docs/security.md, "Specs")."""

from __future__ import annotations

import json
import os
import re
import string
import time
import tracemalloc

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hoptrace.collector.catalog import TraceCatalog
from hoptrace.collector.catalog_sync import apply_spec_set
from hoptrace.spec.spec import (
    MAX_HOPS,
    MAX_REPORTED_ERRORS,
    FieldError,
    SpecError,
    load_spec,
    spec_from_data,
)
from hoptrace.v1 import trace_pb2

pytestmark = pytest.mark.unit  # pure code: make test-unit runs it without root

# "billion laughs": 9 levels of 9 aliases each, 376 bytes that expand to 9^9 strings.
BILLION_LAUGHS = 'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n' + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [{','.join(['*' + chr(97 + i)] * 9)}]\n" for i in range(8)
)
# A field path: "spec", "name", "filter.src", "hops", "hops[3].at", ... or an unknown key as written.
FIELD = re.compile(r"^(spec|name|sample|filter(\.\w+)?|hops(\[\d+\](\.\w+)?)?)$")


def refusal(text: str | bytes) -> SpecError:
    """load_spec's refusal of `text`, in bounded time and memory."""
    tracemalloc.start()
    # CPU time, not wall time: the bound is on the loader's work, whatever else the machine runs.
    started = time.process_time()
    try:
        with pytest.raises(SpecError) as caught:
            load_spec(text)
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    assert time.process_time() - started < 2.0, "took too long to refuse"
    assert peak < 64 << 20, f"refusing used {peak >> 20} MiB"
    return caught.value


def test_yaml_aliases_are_refused_before_expansion() -> None:
    error = refusal(BILLION_LAUGHS)
    assert [e.field for e in error.errors] == ["spec"]
    assert "YAML aliases (*a) are not allowed" in str(error) and "line 2" in str(error)


def test_deep_nesting_is_refused_not_a_recursion_error() -> None:
    for text in ("[" * 5000, '{"a":' * 5000 + "1" + "}" * 5000, "hops:\n" + "  - " * 40 + "x\n"):
        error = refusal(text)
        assert error.errors[0].field == "spec" and "nested more than" in str(error), str(error)


def test_binary_and_oversized_files_are_refused() -> None:
    assert "not UTF-8 text" in str(refusal(bytes(range(256)) * 4))
    assert "NUL bytes" in str(refusal("name: a\x00b\n"))
    assert "a spec is at most" in str(refusal("# " + "x" * (2 << 20)))


def test_too_many_hops_is_one_error_naming_the_limit() -> None:
    hops = [{"name": f"h{i}", "node": "nowhere", "at": "tc-egress", "dev": "eth0"} for i in range(10_000)]
    error = refusal(json.dumps({"name": "long", "hops": hops}))
    assert [str(e) for e in error.errors] == [f"hops: a path has at most {MAX_HOPS} hops, got 10000"]
    # the typed form (gRPC ApplyTrace) is refused the same way by validation
    with pytest.raises(SpecError, match=f"at most {MAX_HOPS} hops, got 65"):
        load_spec(json.dumps({"name": "long", "hops": hops[:65]}))


def test_error_messages_are_bounded() -> None:
    hops = [{"name": "", "node": "", "at": "nope"} for _ in range(MAX_HOPS)]
    error = refusal(json.dumps({"name": "Bad Name", "hops": hops}))
    assert len(error.errors) > MAX_REPORTED_ERRORS
    lines = str(error).splitlines()
    assert len(lines) == MAX_REPORTED_ERRORS + 1 and lines[-1].startswith("... and ")


def test_collector_catalog_survives_a_path_it_cannot_hold() -> None:
    """A path longer than the collector's catalog holds (65 hops) is skipped, and the collector's sync goes on
    following the next trace."""
    long_spec = trace_pb2.TraceSpec(name="long")
    for i in range(MAX_HOPS + 1):  # built as the proto: what an older dispatcher could send
        long_spec.hops.add(name=f"h{i}", node="n", at="xdp")
    ok = spec_from_data({"name": "ok", "hops": [{"name": "a", "node": "n", "at": "xdp", "dev": "eth0"}]})
    catalog = TraceCatalog()
    assert apply_spec_set(catalog, [long_spec, ok], set()) == {"long", "ok"}
    assert catalog.get("long") is None and catalog.get("ok") is not None


# ---- property-based: random documents --------------------------------------------------------------------

KEYS = ["name", "filter", "sample", "hops", "protocol", "src", "dst", "src_port", "dst_port", "node", "at",
        "dev", "netns", "cgroup", "x"]  # fmt: skip
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True),
    st.text(max_size=20),
    st.sampled_from(["tc-egress", "tracepoint:net:netif_receive_skb", "198.18.0.0/15", "udp", "fd00::1"]),
)
documents = st.recursive(
    scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=5), st.dictionaries(st.sampled_from(KEYS), children, max_size=6)
    ),
    max_leaves=40,
)


def check_outcome(text: str | bytes) -> None:
    """Valid, or a SpecError whose every error names a field; nothing else escapes."""
    started = time.process_time()
    try:
        load_spec(text)
    except SpecError as error:
        assert error.errors, "a SpecError without errors"
        for problem in error.errors:
            assert isinstance(problem, FieldError) and problem.reason, problem
            assert FIELD.match(problem.field) or problem.reason.startswith("unknown key"), problem
    assert time.process_time() - started < 1.0


# `make fuzz` raises the number of examples.
EXAMPLES = int(os.environ.get("HOPTRACE_FUZZ_EXAMPLES", "300"))


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(documents)
def test_random_documents_give_a_spec_or_field_errors(document: object) -> None:
    check_outcome(json.dumps(document))
    check_outcome(yaml.safe_dump(document))


@settings(max_examples=EXAMPLES, deadline=None)
@given(st.one_of(st.binary(max_size=300), st.text(alphabet=string.printable + "[]{}&*!|>%@`", max_size=300)))
def test_random_text_gives_a_spec_or_field_errors(text: str | bytes) -> None:
    check_outcome(text)
