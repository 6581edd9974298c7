"""clock.py and catalog.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hoptrace.collector.catalog import TraceCatalog
from hoptrace.collector.clock import ClockAligner
from hoptrace.v1 import records_pb2, trace_pb2

pytestmark = pytest.mark.unit  # pure code: make test-unit runs it without root


def test_master_time_formula_and_latest_mapping_wins() -> None:
    c = ClockAligner()
    assert c.to_master("n1", 1_000) == 1_000  # no clock yet: offset 0
    c.update("n1", records_pb2.NodeClock(monotonic_to_realtime_ns=5_000, offset_ns=300, bound_ns=20))
    assert c.to_master("n1", 1_000) == 1_000 + 5_000 - 300
    assert c.update("n1", None).delta_ns == 4_700  # a batch without a clock keeps the last one
    c.update("n1", records_pb2.NodeClock(monotonic_to_realtime_ns=6_000))
    assert c.delta_ns("n1") == 6_000 and c.bound_ns("n1") == 0
    assert c.delta_ns("n2") == 0
    c.update("n2", records_pb2.NodeClock(offset_ns=-50))
    assert c.wall_to_master("n2", 1_000) == 1_050


def test_catalog_set_learn_and_files(tmp_path: Path) -> None:
    c = TraceCatalog()
    c.learn_hop("t", 1, "b", "n2")
    c.learn_hop("t", 0, "a", "n1")
    p = c.get("t")
    assert p is not None and not p.known and p.hop_names == ("a", "b")
    c.set_trace("t", ["x", "y", "z"], ["n1", "n1", "n2"])
    c.learn_hop("t", 0, "other", "n9")  # explicit paths win
    p = c.get("t")
    assert p is not None and p.known and p.hop_names == ("x", "y", "z") and p.hop_node(2) == "n2"
    spec = trace_pb2.TraceSpec(
        name="s", hops=[trace_pb2.HopSpec(name="h0", node="n"), trace_pb2.HopSpec(name="h1")]
    )
    c.set_spec(spec)
    assert c.get("s").hop_names == ("h0", "h1")  # type: ignore[union-attr]
    with pytest.raises(ValueError):
        c.set_trace("bad", ["a", "a"])

    (tmp_path / "t.json").write_text(
        json.dumps({"traces": [{"name": "j", "hops": [{"name": "p", "node": "n"}]}]})
    )
    (tmp_path / "t.yaml").write_text("name: y\nhops:\n  - {name: q, node: n1}\n  - {name: r, node: n2}\n")
    c.load_file(tmp_path / "t.json")
    c.load_file(tmp_path / "t.yaml")
    assert c.get("j").hop_names == ("p",)  # type: ignore[union-attr]
    assert c.get("y").hop_nodes == ("n1", "n2")  # type: ignore[union-attr]
